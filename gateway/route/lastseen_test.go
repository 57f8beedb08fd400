package route

import (
	"context"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/rules"
)

// TestPlaceLastTable: placeLast takes the remembered endpoint while it is a candidate under the
// hard law's cap (no holder's floor), else leaves the miss to the selector (-1).
func TestPlaceLastTable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		load  []int
		index []int // the candidates' Endpoint.Index (a gone endpoint is not among them)
		last  int
		want  int
	}{
		// In flight 6 (+1): cap ⌈1.75·7/4⌉ = 4; c runs 2 < 4 although the others run 1.
		{"remembered, under its cap", []int{1, 1, 2, 1}, []int{0, 1, 2, 3}, 2, 2},
		// In flight 4 (+1): cap ⌈1.75·5/4⌉ = 3; c runs 3.
		{"remembered, at its cap", []int{0, 0, 3, 1}, []int{0, 1, 2, 3}, 2, -1},
		// c over its cap of 3.
		{"remembered, over its cap", []int{0, 0, 4, 0}, []int{0, 1, 2, 3}, 2, -1},
		// Idle pool: cap 1 each, c runs nothing.
		{"remembered, idle pool", []int{0, 0, 0, 0}, []int{0, 1, 2, 3}, 2, 2},
		// Endpoint 2 left the candidates (unhealthy, excluded, removed).
		{"remembered endpoint gone", []int{0, 0, 0}, []int{0, 1, 3}, 2, -1},
		// Positions differ from indexes once one is gone: d (index 3) is at position 2.
		{"position is not the index", []int{0, 0, 0}, []int{0, 1, 3}, 3, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cands := make([]Scored, len(tc.load))
			eps := make([]*Endpoint, len(tc.load))
			for i := range cands {
				cands[i] = Scored{Index: tc.index[i], Load: tc.load[i], Capacity: 96}
				eps[i] = &Endpoint{Index: tc.index[i], Name: string(rune('a' + tc.index[i]))}
			}
			if got := placeLast(cands, eps, tc.last, 175); got != tc.want {
				t.Fatalf("placeLast = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestLastSeenBound: the memory holds its limit, forgets the least recently routed key one past
// it, and a put refreshes an entry (and moves it to its new endpoint).
func TestLastSeenBound(t *testing.T) {
	l := newLastSeen(3)
	for k := range uint64(3) {
		l.put(k, int(k))
	}
	if l.len() != 3 {
		t.Fatalf("at the limit: %d entries, want 3", l.len())
	}
	for k := range uint64(3) {
		if ep, ok := l.get(k); !ok || ep != int(k) {
			t.Fatalf("at the limit: key %d -> %d %v", k, ep, ok)
		}
	}
	l.put(0, 5) // refresh key 0: key 1 is now the least recent
	l.put(3, 3) // one past the limit
	if l.len() != 3 {
		t.Fatalf("one past the limit: %d entries, want 3", l.len())
	}
	if _, ok := l.get(1); ok {
		t.Fatal("key 1, the least recently routed, was not forgotten")
	}
	for k, want := range map[uint64]int{0: 5, 2: 2, 3: 3} {
		if ep, ok := l.get(k); !ok || ep != want {
			t.Fatalf("key %d -> %d %v, want %d", k, ep, ok, want)
		}
	}
	// get does not refresh: key 2 stays the least recent and goes next.
	l.get(2)
	l.put(4, 4)
	if _, ok := l.get(2); ok || l.len() != 3 {
		t.Fatalf("after a get and one more put: key 2 kept %v, %d entries", ok, l.len())
	}
}

// TestMissPlacementLast: under last placement a miss goes by the selector the first time, is
// remembered there, and comes back there while that endpoint is under its cap, even when the
// least-load selector would go elsewhere; at its cap or excluded the selector takes it again.
// Explain neither places by nor changes the memory.
func TestMissPlacementLast(t *testing.T) {
	keys := keysN(19)
	f := newFixture(t, []Role{RoleNormal, RoleNormal, RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keys}, func(r *rules.Rule) {
		r.Selector = "least-load"
		r.LoadLaw.MissPlacement = "last"
		r.PredictOnRoute = ttl(0) // off: a placed prompt must stay a miss for the next request
	})
	ctx := context.Background()
	route := func(retry inventory.Mask) *Decision {
		t.Helper()
		d, err := f.rt.Route(ctx, prompt, retry)
		if err != nil {
			t.Fatal(err)
		}
		d.Release()
		return d
	}
	d := route(inventory.Mask{})
	if d.Miss != MissNoWorker || !strings.HasPrefix(d.Tier, TierSelector) {
		t.Fatalf("first sighting: miss %q tier %s, want no_worker by the selector", d.Miss, d.Tier)
	}
	first := d.Target
	k, _ := f.rt.homeKey(keys)
	if ep, ok := f.rt.last.get(k); !ok || ep != first.Index {
		t.Fatalf("remembered %d %v, want %s's %d", ep, ok, first.Name, first.Index)
	}
	// first runs 2, the others 1: the selector would never pick it; its cap is ⌈1.75·6/4⌉ = 3.
	for _, e := range f.eps {
		e.active.Add(1)
	}
	first.active.Add(1)
	for range 2 {
		if d := route(inventory.Mask{}); d.Miss != MissNoWorker || d.Tier != TierPlacement || d.Target != first {
			t.Fatalf("remembered under its cap: miss %q tier %s target %s, want no_worker placement %s", d.Miss, d.Tier, d.Target.Name, first.Name)
		}
	}
	// first runs 4, the others 1: at its cap of ⌈1.75·8/4⌉ = 4, the selector picks the least loaded.
	first.active.Add(2)
	if d := route(inventory.Mask{}); !strings.HasPrefix(d.Tier, TierSelector) || d.Target == first {
		t.Fatalf("remembered at its cap: tier %s target %s, want the selector elsewhere", d.Tier, d.Target.Name)
	}
	first.active.Add(-2)
	for _, e := range f.eps {
		e.active.Add(-1)
	}
	first.active.Add(-1)
	// The selector's choice was remembered in its place; put first back and exclude it.
	f.rt.last.put(k, first.Index)
	var retry inventory.Mask
	retry.Set(first.ID)
	d = route(retry)
	if !strings.HasPrefix(d.Tier, TierSelector) || d.Target == first {
		t.Fatalf("remembered excluded: tier %s target %s, want the selector elsewhere", d.Tier, d.Target.Name)
	}
	moved := d.Target
	ex, err := f.rt.Explain(ctx, prompt)
	if err != nil {
		t.Fatal(err)
	}
	if ex.Target != moved || ex.Tier != TierPlacement {
		t.Fatalf("explain: tier %s target %s, want placement %s", ex.Tier, ex.Target.Name, moved.Name)
	}
	// first over its cap: the Explain goes by the selector elsewhere and must not remember it.
	f.rt.last.put(k, first.Index)
	first.active.Add(2)
	defer first.active.Add(-2)
	if ex, err := f.rt.Explain(ctx, prompt); err != nil || ex.Target == first {
		t.Fatalf("explain over the cap: %v, target %s", err, ex.Target.Name)
	}
	if ep, _ := f.rt.last.get(k); ep != first.Index || f.rt.last.len() != 1 {
		t.Fatalf("explain changed the memory: %d, %d entries", ep, f.rt.last.len())
	}
}

// TestMissPlacementLastRule: "last" is a valid missPlacement, the hard laws' MissLast without the
// headroom fallback, off under the ttft law; only then does the router keep the memory.
func TestMissPlacementLastRule(t *testing.T) {
	if l := LawOf(rules.LoadLaw{Kind: "hard", MissPlacement: "last"}); !l.MissLast || l.MissHeadroom || l.MissHome {
		t.Fatalf("last: %+v, want MissLast alone", l)
	}
	if l := LawOf(rules.LoadLaw{Kind: "ttft", MissPlacement: "last"}); l.MissLast {
		t.Fatalf("last under the ttft law: %+v, want off", l)
	}
	f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keysN(4)}, func(r *rules.Rule) { r.LoadLaw.MissPlacement = "last" })
	if f.rt.last == nil {
		t.Fatal("missPlacement last: no memory")
	}
	if f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keysN(4)}, nil); f.rt.last != nil {
		t.Fatal("the default placement keeps a memory")
	}
}
