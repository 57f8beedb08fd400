package sglang

import "github.com/kvexact/kvexact/engines"

// LoadGauges: SGLang's scheduler metrics (sglang/srt/observability/metrics_collector.py, served
// with --enable-metrics), one sample per tensor/data-parallel rank.
func (family) LoadGauges() engines.LoadGauges {
	return engines.LoadGauges{Path: "/metrics", Running: []string{"sglang:num_running_reqs"}, Waiting: []string{"sglang:num_queue_reqs"}}
}
