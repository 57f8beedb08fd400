package main

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

// TestDecisionSummary: the drive's reading of decision headers counts the deciding tier with
// KV-exact's miss, each endpoint KV-exact could not choose with its reason (excluded, or not
// certified), and the ttft law's error against the realized TTFT of the winner only.
func TestDecisionSummary(t *testing.T) {
	var s decisionSummary
	for _, h := range []string{
		`{"target":"e0","tier":"kv-exact","score":3,"endpoints":[{"name":"e0","eligible":true,"ttft":{"totalMs":30}},{"name":"e1","eligible":false},{"name":"e2","excluded":"fenced: unverified since restart at 2026-12-02T04:47:21Z: the engine cleared its cache"}]}`,
		`{"target":"e2","tier":"selector:least-load","miss":"no_worker","endpoints":[{"name":"e0","eligible":true,"ttft":{"totalMs":99}},{"name":"e1","eligible":true},{"name":"e2","eligible":true,"ttft":{"totalMs":10}}]}`,
		`{"target":"e0","tier":"kv-exact","endpoints":[{"name":"e0","eligible":true},{"name":"e2","excluded":"fenced: unverified since restart at 2026-12-02T04:47:25Z: the engine cleared its cache"}]}`,
	} {
		var d decisionHeader
		if err := json.Unmarshal([]byte(h), &d); err != nil {
			t.Fatal(err)
		}
		s.note(d, 20*time.Millisecond)
	}
	s.note(decisionHeader{}, time.Millisecond) // no header: not counted
	if s.n != 3 {
		t.Fatalf("n = %d, want 3", s.n)
	}
	if got := s.tiers.String(); got != "kv-exact 2, selector:least-load (kv-exact missed: no_worker) 1" {
		t.Fatalf("tiers %q", got)
	}
	if got := s.ineligible.String(); got != "e2: fenced: unverified since restart 2, e1: not certified 1" {
		t.Fatalf("ineligible %q", got)
	}
	// e0 won the first (30 ms predicted, 20 realized: +0.5), e2 the second (10 ms: -0.5).
	if len(s.ttftErr) != 2 || math.Abs(s.ttftErr[0]-0.5) > 1e-9 || math.Abs(s.ttftErr[1]+0.5) > 1e-9 {
		t.Fatalf("ttft errors %v, want [0.5 -0.5]", s.ttftErr)
	}
}

// TestSpreadOf pins the summary's mean and range, and quantile's nearest rank.
func TestSpreadOf(t *testing.T) {
	if got := spreadOf([]float64{1, 2, 6}, "%.1f"); got != "3.0 [1.0 – 6.0]" {
		t.Fatalf("spreadOf = %q", got)
	}
	if got := spreadOf(nil, "%.1f"); got != "-" {
		t.Fatalf("spreadOf(nil) = %q", got)
	}
	if q := quantile([]float64{5, 1, 3, 2, 4}, 0.5); q != 3 {
		t.Fatalf("median = %v", q)
	}
}
