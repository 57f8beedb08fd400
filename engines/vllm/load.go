package vllm

import "github.com/kvexact/kvexact/engines"

// LoadGauges: vLLM's v1 metrics (vllm/v1/metrics/loggers.py), one sample per engine core and
// model name.
func (family) LoadGauges() engines.LoadGauges {
	return engines.LoadGauges{Path: "/metrics", Running: []string{"vllm:num_requests_running"}, Waiting: []string{"vllm:num_requests_waiting"}}
}
