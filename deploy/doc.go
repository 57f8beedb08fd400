// Package deploy holds the Kubernetes manifests, the Grafana dashboard and an Envoy configuration
// in front of the Endpoint Picker (envoy/envoy.yaml.tmpl, run as it is by gateway/epp's tests); its test decodes every manifest strictly into the real Kubernetes, Gateway API
// and inference-extension Go types and checks every metric the dashboard queries exists.
package deploy
