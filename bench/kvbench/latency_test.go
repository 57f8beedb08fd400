package kvbench

import (
	"testing"
	"time"
)

func TestPercentilesNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Microsecond)
	}
	if p50, p99 := percentiles(ds); p50 != 50 || p99 != 99 {
		t.Fatalf("p50 %v p99 %v, want 50 and 99", p50, p99)
	}
	if p50, p99 := percentiles([]time.Duration{7 * time.Microsecond}); p50 != 7 || p99 != 7 {
		t.Fatalf("one sample: %v %v", p50, p99)
	}
}

func TestAddedIsMedianOfDifferences(t *testing.T) {
	r := func(d, g float64) LatencyRound {
		return LatencyRound{Targets: map[string]LatencyFigure{"direct": {P50us: d, P99us: 2 * d}, "gateway": {P50us: g, P99us: 2 * g}}}
	}
	a := added([]LatencyRound{r(100, 150), r(300, 310), r(100, 400)})
	if g := a["gateway"]; g.P50us != 50 || g.P99us != 100 {
		t.Fatalf("added %+v, want p50 50 (differences 50, 10, 300), p99 100", g)
	}
	if _, ok := a["direct"]; ok {
		t.Fatal("direct added to itself")
	}
}

func TestParseWrkLatency(t *testing.T) {
	out := []byte(`Running 3s test @ http://127.0.0.1:1/v1/completions
  2 threads and 32 connections
  Latency Distribution
     50%  617.00us
     75%    1.02ms
     90%    1.50ms
     99%    2.31ms
  61234 requests in 3.00s, 20.00MB read
Requests/sec:  20411.33
`)
	p50, p99 := parseWrkLatency(out)
	if p50 != 617 || p99 != 2310 {
		t.Fatalf("p50 %v p99 %v", p50, p99)
	}
	r, err := parseWrk(out)
	if err != nil || r.P50us != 617 || r.Requests != 61234 {
		t.Fatalf("%+v %v", r, err)
	}
}
