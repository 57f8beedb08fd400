// Package deploy holds the Kubernetes manifests and the Grafana dashboard (YAML and JSON files
// beside this one); its test decodes every manifest strictly into the real Kubernetes, Gateway API
// and inference-extension Go types and checks every metric the dashboard queries exists.
package deploy
