package route

import (
	"fmt"
	"testing"
)

func eps(n int, weights ...int) []*Endpoint {
	var out []*Endpoint
	for i := 0; i < n; i++ {
		w := 1
		if i < len(weights) {
			w = weights[i]
		}
		out = append(out, &Endpoint{Index: i, Name: fmt.Sprintf("e%d", i), Weight: w, Capacity: 1})
	}
	return out
}

func TestRoundRobinAndWeighted(t *testing.T) {
	all := eps(3, 1, 2, 3)
	rr, _ := NewSelector("rr", all, 0, 0, 0)
	wrr, _ := NewSelector("wrr", all, 0, 0, 0)
	count := map[string]map[string]int{"rr": {}, "wrr": {}}
	for i := 0; i < 60; i++ {
		count["rr"][rr.Pick(&Request{}, all).Name]++
		count["wrr"][wrr.Pick(&Request{}, all).Name]++
	}
	if count["rr"]["e0"] != 20 || count["rr"]["e1"] != 20 || count["rr"]["e2"] != 20 {
		t.Errorf("rr not even: %v", count["rr"])
	}
	if count["wrr"]["e0"] != 10 || count["wrr"]["e1"] != 20 || count["wrr"]["e2"] != 30 {
		t.Errorf("wrr not proportional to weights 1:2:3: %v", count["wrr"])
	}
	if _, err := NewSelector("random", all, 0, 0, 0); err == nil {
		t.Error("unknown selector accepted")
	}
}

func TestCHWBLAffinityAndBound(t *testing.T) {
	all := eps(4)
	s, _ := NewSelector("chwbl", all, 64, 1.25, 256)
	r := &Request{Model: "m", AffinityText: "You are a helpful assistant. Shared system prompt."}
	first := s.Pick(r, all)
	for i := 0; i < 20; i++ {
		if got := s.Pick(r, all); got != first {
			t.Fatalf("same key moved from %s to %s with no load", first.Name, got.Name)
		}
	}
	// Different keys spread over the ring.
	spread := map[string]bool{}
	for i := 0; i < 64; i++ {
		spread[s.Pick(&Request{Model: "m", AffinityText: fmt.Sprintf("prompt %d", i)}, all).Name] = true
	}
	if len(spread) < 3 {
		t.Fatalf("64 keys landed on only %d endpoints", len(spread))
	}
	// Load the preferred endpoint past the bound: the key walks to the next one.
	first.active.Store(10)
	if got := s.Pick(r, all); got == first {
		t.Fatal("bounded load ignored")
	}
	first.active.Store(0)
	// Excluded endpoints are not in cands: the key moves, and comes back when they return.
	var others []*Endpoint
	for _, e := range all {
		if e != first {
			others = append(others, e)
		}
	}
	if got := s.Pick(r, others); got == first {
		t.Fatal("picked an excluded endpoint")
	}
	if got := s.Pick(r, all); got != first {
		t.Fatal("affinity not restored")
	}
}

// TestLeastLoadRoomTable: the least-load selector with room set picks the least-loaded candidate,
// among equally loaded ones the one holding the fewest blocks, and round-robins what is still tied.
// Each case lists the picks of successive calls.
func TestLeastLoadRoomTable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		load   []int64
		blocks []int // nil: no room function (the selector of a rule without KV-exact)
		want   []string
	}{
		{"tied load, fewest blocks wins", []int64{1, 1, 1}, []int{80, 20, 40}, []string{"e1", "e1", "e1"}},
		{"untied, least load wins whatever it holds", []int64{2, 0, 1}, []int{0, 96, 0}, []string{"e1", "e1"}},
		{"room only among the least loaded", []int64{0, 0, 1}, []int{60, 50, 0}, []string{"e1", "e1"}},
		{"all equal: round robin", []int64{0, 0, 0}, []int{30, 30, 30}, []string{"e0", "e1", "e2", "e0"}},
		{"equal rooms among the tied: round robin over those", []int64{0, 0, 0}, []int{10, 30, 10}, []string{"e0", "e2", "e0"}},
		{"no room: round robin over the equally loaded", []int64{0, 0, 0}, nil, []string{"e0", "e1", "e2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			all := eps(len(tc.load))
			for i, e := range all {
				e.active.Store(tc.load[i])
			}
			s := &leastLoad{}
			if tc.blocks != nil {
				s.room = func(e *Endpoint) int { return tc.blocks[e.Index] }
			}
			for i, want := range tc.want {
				if got := s.Pick(&Request{}, all); got.Name != want {
					t.Fatalf("pick %d = %s, want %s", i, got.Name, want)
				}
			}
		})
	}
}

// TestLeastLoadAllocatesNothing: the least-load pick runs on every miss of a default rule, so it
// allocates nothing at any pool size, with or without room.
func TestLeastLoadAllocatesNothing(t *testing.T) {
	all := eps(64)
	for _, room := range []func(*Endpoint) int{nil, func(e *Endpoint) int { return 64 - e.Index }} {
		s := &leastLoad{room: room}
		if n := testing.AllocsPerRun(100, func() { s.Pick(&Request{}, all) }); n != 0 {
			t.Errorf("a pick over 64 candidates (room set: %v) allocates %.0f times, want 0", room != nil, n)
		}
	}
}
