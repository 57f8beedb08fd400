package trtllm

import "github.com/kvexact/kvexact/engines"

// LoadGauges: trtllm-serve reports its iteration statistics as JSON (/metrics), not as Prometheus
// gauges, so the gateway reads none: a replica's load for it is its own in-flight count.
func (family) LoadGauges() engines.LoadGauges { return engines.LoadGauges{} }
