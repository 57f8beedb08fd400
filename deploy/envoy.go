package deploy

import _ "embed"

// EnvoyTemplate is envoy/envoy.yaml.tmpl, the Envoy in front of the Endpoint Picker, for ctk epp to
// run as it is (text/template; AdminPort, ListenAddress, ListenPort, PickerAddress, PickerPort).
//
//go:embed envoy/envoy.yaml.tmpl
var EnvoyTemplate string
