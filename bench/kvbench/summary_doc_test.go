package kvbench

import (
	"strings"
	"testing"
)

// TestSummaryTable: one row per routing target kind with its count and where it was missed, one
// per overhead target, each with its section's anchor.
func TestSummaryTable(t *testing.T) {
	rep := &Report{Targets: []Target{
		{Name: "cached ratio ≥ 2× round-robin", Workload: "rag", Load: 0.6, Evaluated: true},
		{Name: "cached ratio ≥ 2× round-robin", Workload: "system-prompt", Load: 0.6, Evaluated: true, Met: true},
		{Name: "oracle is an upper bound", Workload: "rag", Load: 0.6, Evaluated: true, Met: true},
	}}
	ov := &Overhead{Proxy: []ProxyRound{{}}, RatioVsNginx: 0.5, LatencyRate: 1000,
		AddedLatency: map[string]AddedLatency{"gateway": {P50us: 100, P99us: 1200}}}
	var b strings.Builder
	writeSummary(&b, rep, ov, nil)
	out := b.String()
	for _, want := range []string{
		"| cached ratio ≥ 2× round-robin | met in 1 of 2 | **missed** at rag 0.6 |",
		"| oracle is an upper bound | met in 1 of 1 | met |",
		"| Proxy throughput vs nginx | [details](#proxy-throughput-round-robin-vs-nginx-proxy_pass-vs-direct) | gateway ≥ 0.45 × nginx req/s | 0.50 × (median of 1 rounds) | met |",
		"| added p99 ≤ 1 ms at 1000 req/s | +1200 µs p99, +100 µs p50 | **missed** |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "| figure |") != 1 {
		t.Fatalf("want one table:\n%s", out)
	}
}
