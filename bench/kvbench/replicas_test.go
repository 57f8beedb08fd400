package kvbench

import (
	"slices"
	"testing"
	"time"
)

func TestUpstreamsTried(t *testing.T) {
	for in, want := range map[string][]string{
		"":                                      nil,
		"127.0.0.1:1":                           {"127.0.0.1:1"},
		"127.0.0.1:1, 127.0.0.1:2":              {"127.0.0.1:1", "127.0.0.1:2"},
		"127.0.0.1:1, 127.0.0.1:2 : 10.0.0.1:3": {"127.0.0.1:1", "127.0.0.1:2", "10.0.0.1:3"},
	} {
		if got := upstreamsTried(in); !slices.Equal(got, want) {
			t.Errorf("upstreamsTried(%q) = %q, want %q", in, got, want)
		}
	}
	if got := lastUpstream("127.0.0.1:1, 127.0.0.1:2"); got != "127.0.0.1:2" {
		t.Errorf("lastUpstream = %q, want the replica that answered", got)
	}
}

func TestNginxDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "1s", 400 * time.Millisecond: "1s", 2 * time.Second: "2s", 2600 * time.Millisecond: "3s"} {
		if got := nginxDuration(d); got != want {
			t.Errorf("nginxDuration(%v) = %s, want %s", d, got, want)
		}
	}
}

func TestAnalyzeFailover(t *testing.T) {
	kill := time.Unix(100, 0)
	at := func(ms int) time.Time { return kill.Add(time.Duration(ms) * time.Millisecond) }
	const dead, live = "127.0.0.1:2", "127.0.0.1:3"
	rs := []Result{
		{Status: 200, Upstream: live, E2E: time.Second},                         // before, served
		{Status: 502, Upstream: dead, E2E: 300 * time.Millisecond},              // in flight on the dead one
		{Status: 502, Upstream: dead, E2E: 5 * time.Millisecond},                // sent at the kill instant on a kept-alive connection
		{Status: 200, Upstream: dead + ", " + live, E2E: 50 * time.Millisecond}, // tried, refused, retried
		{Status: 200, Upstream: live},
		{Status: 200, Upstream: dead + ", " + live}, // the re-probe after fail_timeout
	}
	sent := []time.Time{at(-900), at(-100), at(0), at(40), at(900), at(2100)}
	f := AnalyzeFailover(rs, sent, kill, dead)
	if f.SentAfterKill != 4 || f.InFlightFailed != 1 || f.FailedAfterKill != 1 {
		t.Errorf("sent after %d, in-flight failed %d, failed after %d; want 4, 1, 1", f.SentAfterKill, f.InFlightFailed, f.FailedAfterKill)
	}
	if !slices.Equal(f.DeadTriesMs, []float64{0, 40, 2100}) || f.ExcludedAfterMs != 0 || f.Retried != 2 {
		t.Errorf("dead tries %v, excluded after %v, retried %d; want [0 40 2100], 0, 2", f.DeadTriesMs, f.ExcludedAfterMs, f.Retried)
	}
	if f.LastErrorMs != 200 { // the in-flight one ended 200 ms after the kill
		t.Errorf("last error %v ms after the kill, want 200", f.LastErrorMs)
	}
}

func TestSummarizeReplicas(t *testing.T) {
	cells := []ReplicaCell{
		{Replicas: 2, CachedRatio: 0.5, TTFT: Percentiles{P90: 100}, Served: []int{10, 30}, CPUus: []float64{400, 200}},
		{Replicas: 1, CachedRatio: 0.6, TTFT: Percentiles{P90: 90}, Served: []int{40}, CPUus: []float64{300}, Errors: 1},
		{Replicas: 2, CachedRatio: 0.7, TTFT: Percentiles{P90: 140}, Served: []int{20, 0}, CPUus: []float64{100, 0}},
		{Replicas: 2, CachedRatio: 0.4, TTFT: Percentiles{P90: 120}, Served: []int{20, 20}, CPUus: []float64{300, 300}},
	}
	s := SummarizeReplicas(cells)
	if len(s) != 2 || s[0].Replicas != 1 || s[1].Replicas != 2 {
		t.Fatalf("summary %+v: want 1 then 2 replicas", s)
	}
	two := s[1]
	if two.Rounds != 3 || two.CachedRatio != 0.5 || two.CachedRange != [2]float64{0.4, 0.7} || two.TTFTp90 != 120 || two.TTFTp90Range != [2]float64{100, 140} {
		t.Errorf("2 replicas: %+v", two)
	}
	// A replica that served nothing has no CPU per request: medians of {400,200,100,300,300} and of
	// the per-cell weighted means {250,100,300}.
	if two.CPUusPerReq != 300 || two.CPUusAllPerReq != 250 {
		t.Errorf("CPU per request %v per replica, %v over all; want 300, 250", two.CPUusPerReq, two.CPUusAllPerReq)
	}
	if s[0].Errors != 1 {
		t.Errorf("1 replica: errors %d, want 1", s[0].Errors)
	}
}
