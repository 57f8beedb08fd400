package llamacpp

import "github.com/kvexact/kvexact/engines"

// LoadGauges: llama-server's /metrics (with --metrics): slots processing and requests deferred.
func (family) LoadGauges() engines.LoadGauges {
	return engines.LoadGauges{Path: "/metrics", Running: []string{"llamacpp:requests_processing"}, Waiting: []string{"llamacpp:requests_deferred"}}
}
