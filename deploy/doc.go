// Package deploy holds the Kubernetes manifests — a Kustomize base (the gateway's pod) with two
// overlays, standalone (the gateway is the data plane) and picker (the gateway is an Envoy-based
// Gateway's Endpoint Picker) — a ServiceMonitor example (monitoring/), the Grafana dashboard, and an Envoy configuration in front of the
// Endpoint Picker (envoy/envoy.yaml.tmpl, run as it is by gateway/epp's tests).
//
// Kustomize rather than Helm: kubectl applies it as it is (kubectl apply -k), the manifests stay
// plain Kubernetes objects a reader can check against the API reference, and an operator's changes
// (image, namespace, endpoints) are overlays of their own instead of template values.
//
// Its tests render both overlays with Kustomize's own Go library, decode every object strictly into
// the real Kubernetes, Gateway API and inference-extension Go types (the ServiceMonitor into a local
// struct of the fields it uses), run the gateway image with each Deployment's user, mounts and modes
// and probe, ready-check and scrape it as the cluster would (container_test.go), and check that
// every metric the dashboard queries exists in the gateway's registry.
package deploy
