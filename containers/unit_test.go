package containers_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/containers"
	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
)

// TestVLLMCPURefusesOffload: a container engine with an offload tier is refused before anything
// starts, naming the field (the offload spec's folder is not bound into the container).
func TestVLLMCPURefusesOffload(t *testing.T) {
	var h *containers.Harness // never reached: the refusal comes first
	_, _, err := h.StartVLLMCPU(context.Background(), &vllmpool.Env{}, nil, vllmpool.Spec{Name: "E0", Model: "m", OffloadBlocks: 64}, time.Second)
	if err == nil || !strings.Contains(err.Error(), "OffloadBlocks (64)") {
		t.Fatalf("StartVLLMCPU with OffloadBlocks: %v, want a refusal naming OffloadBlocks", err)
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP kvexact_ingest_gaps_total Sequence discontinuities.
# TYPE kvexact_ingest_gaps_total counter
kvexact_ingest_gaps_total{decision="kept",endpoint="E0",rank="0",rule="pool"} 2
kvexact_ingest_gaps_total{decision="cleared",endpoint="E0",rank="0",rule="pool"} 1
kvexact_ingest_gaps_total{decision="kept",endpoint="E1",rank="0",rule="pool"} 5
kvexact_rule_exact_enabled{binding="",reason="no certificate loaded (run \"ctk certify\", then, {x}=y)\nnext",rule="pool"} 0
up 1
h_bucket{le="+Inf"} +Inf
`
	m, err := containers.ParseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Sum("kvexact_ingest_gaps_total", map[string]string{"endpoint": "E0"}); got != 3 {
		t.Fatalf("E0 gaps = %v, want 3", got)
	}
	if got := m.Sum("kvexact_ingest_gaps_total", map[string]string{"decision": "kept"}); got != 7 {
		t.Fatalf("kept gaps = %v, want 7", got)
	}
	if got := m.Sum("up", nil); got != 1 {
		t.Fatalf("up = %v", got)
	}
	for _, s := range m {
		if s.Name == "kvexact_rule_exact_enabled" {
			if want := "no certificate loaded (run \"ctk certify\", then, {x}=y)\nnext"; s.Labels["reason"] != want || s.Labels["rule"] != "pool" {
				t.Fatalf("labels %q", s.Labels)
			}
		}
	}
	if _, err := containers.ParseMetrics(strings.NewReader(`bad{x="y} 1`)); err == nil {
		t.Fatal("unterminated label accepted")
	}
}

func TestCheckStaticRejectsDynamic(t *testing.T) {
	exe, err := os.Executable() // the test binary: cgo-linked, dynamic
	if err != nil {
		t.Fatal(err)
	}
	if err := containers.CheckStatic(exe); err == nil {
		t.Skip("this test binary happens to be static; nothing to check")
	}
}
