package route

import (
	"context"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/rules"
)

// TestPlaceTable: place picks the endpoint a hand computation picks — least load first, then the
// least fill/capacity, then the lowest position.
func TestPlaceTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		load []int
		fill []int
		cap  []int
		tie  uint64
		want int
	}{
		// 90/96 vs 10/96 vs 50/96: b.
		{"equal load, emptiest cache", []int{2, 2, 2}, []int{90, 10, 50}, []int{96, 96, 96}, 0, 1},
		// 40/48 > 40/96: the larger cache has more headroom for the same blocks.
		{"capacity counts", []int{0, 0}, []int{40, 40}, []int{48, 96}, 0, 1},
		// 30/96 < 40/96, but c is less loaded: load comes first.
		{"load first", []int{1, 1, 0}, []int{90, 30, 95}, []int{96, 96, 96}, 0, 2},
		// 30/60 = 48/96: a genuine tie; turn 0 of the round robin takes the first.
		{"equal ratio", []int{3, 3}, []int{30, 48}, []int{60, 96}, 0, 0},
		// The same tie, the next turn of the round robin.
		{"equal ratio, next turn", []int{3, 3}, []int{30, 48}, []int{60, 96}, 1, 1},
		// Three tied of four (b is fuller): turns 0, 1, 2, 3 give a, c, d, a.
		{"tie turn 2", []int{0, 0, 0, 0}, []int{0, 5, 0, 0}, []int{96, 96, 96, 96}, 2, 3},
		{"tie turn 3", []int{0, 0, 0, 0}, []int{0, 5, 0, 0}, []int{96, 96, 96, 96}, 3, 0},
		// A full cache one request less loaded still wins over an empty one: headroom never
		// buys queueing.
		{"one request less loaded", []int{4, 3}, []int{0, 96}, []int{96, 96}, 0, 1},
		// The real-vLLM case: three 19-block prefixes (57) on a, one on b, none on c and d, all
		// idle: the next prefix goes to c.
		{"spread prefixes", []int{0, 0, 0, 0}, []int{57, 19, 0, 0}, []int{96, 96, 96, 96}, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cands := make([]Scored, len(tc.load))
			for i := range cands {
				cands[i] = Scored{Index: i, Load: tc.load[i], Capacity: tc.cap[i]}
			}
			if got := place(cands, tc.fill, tc.tie); got != tc.want {
				t.Fatalf("place = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestMissPlacementHeadroom: a prompt nobody holds goes, under headroom placement, to the equally
// loaded endpoint whose cache is emptiest (resident blocks plus predicted ones), with the miss
// still recorded and the fill in the evidence; under selector placement the least-load selector's
// round robin takes the first tied endpoint, the full one; under fewest-blocks the selector breaks
// the load tie by the blocks each endpoint's GPU tier holds: the emptiest one.
func TestMissPlacementHeadroom(t *testing.T) {
	keys := keysN(19)
	for _, placement := range []string{"headroom", "selector", rules.MissFewestBlocks} {
		t.Run(placement, func(t *testing.T) {
			f := newFixture(t, []Role{RoleNormal, RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keys}, func(r *rules.Rule) {
				r.Selector = "least-load"
				r.LoadLaw.MissPlacement = placement
			})
			for _, e := range f.eps {
				e.Capacity = 96
			}
			other := make([]uint64, 80)
			for i := range other {
				other[i] = uint64(5000 + i)
			}
			f.inv.Store(f.eps[0].ID, other)      // a: 80 of 96 blocks
			f.inv.Store(f.eps[1].ID, other[:40]) // b: 40
			f.inv.Store(f.eps[2].ID, other[:20]) // c: 20
			ctx := context.Background()
			d, err := f.rt.Route(ctx, prompt, inventory.Mask{})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Release()
			if d.Miss != MissNoWorker {
				t.Fatalf("miss = %q, want no_worker", d.Miss)
			}
			if want := map[string]string{"selector": "a", rules.MissFewestBlocks: "c"}[placement]; want != "" {
				if d.Tier != "selector:least-load" || d.Target.Name != want {
					t.Fatalf("%s placement: tier %s target %s, want %s", placement, d.Tier, d.Target.Name, want)
				}
				return
			}
			if d.Tier != TierPlacement || d.Target.Name != "c" {
				t.Fatalf("headroom placement: tier %s target %s, want placement c", d.Tier, d.Target.Name)
			}
			if ev := d.Endpoints; ev[0].Fill != 80 || ev[1].Fill != 40 || ev[2].Fill != 20 || ev[2].Capacity != 96 {
				t.Fatalf("evidence: %+v", ev)
			}
			// c now has the prompt's 19 blocks predicted (39 of 96), and one request: the next
			// prompt nobody holds goes to b (40/96), the least full of the idle ones.
			k2 := keysN(40)[20:39]
			f.rt.cfg.Keyer = fixedKeyer{keys: k2}
			d2, err := f.rt.Route(ctx, prompt, inventory.Mask{})
			if err != nil {
				t.Fatal(err)
			}
			defer d2.Release()
			if d2.Target.Name != "b" || d2.Endpoints[2].Fill != 39 {
				t.Fatalf("second placement: target %s, evidence %+v", d2.Target.Name, d2.Endpoints)
			}
		})
	}
}

// TestMissPlacementRule: loadLaw.missPlacement defaults to rules.DefaultMissPlacement and rejects
// other values naming the field; the ttft law keeps its own answer to a miss.
func TestMissPlacementRule(t *testing.T) {
	r := &rules.Rule{Name: "r", Engine: rules.EngineRef{Family: "vllm", Release: "v0.25.1"}, KVExactMode: 3,
		Endpoints: []rules.Endpoint{{Name: "a", Address: "http://127.0.0.1:1"}}}
	if err := r.Normalize(); err != nil || r.LoadLaw.MissPlacement != rules.DefaultMissPlacement {
		t.Fatalf("default: %q %v", r.LoadLaw.MissPlacement, err)
	}
	r.LoadLaw.MissPlacement = "emptiest"
	if err := r.Normalize(); err == nil || !strings.Contains(err.Error(), "missPlacement") {
		t.Fatalf("bad value: %v", err)
	}
	if LawOf(rules.LoadLaw{Kind: "hard", MissPlacement: "headroom"}).MissHeadroom != true ||
		LawOf(rules.LoadLaw{Kind: "ttft", MissPlacement: "headroom"}).MissHeadroom {
		t.Fatal("MissHeadroom: on for the hard law, off for the ttft law")
	}
	if l := LawOf(rules.LoadLaw{Kind: "hard", MissPlacement: "home"}); !l.MissHome || !l.MissHeadroom {
		t.Fatalf("home: %+v, want MissHome and its headroom fallback", l)
	}
	if l := LawOf(rules.LoadLaw{Kind: "ttft", MissPlacement: "home"}); l.MissHome || l.MissHeadroom {
		t.Fatalf("home under the ttft law: %+v, want both off", l)
	}
	r.LoadLaw.MissPlacement = "home"
	if err := r.Normalize(); err != nil {
		t.Fatalf("home: %v", err)
	}
}

// homeEndpoints are endpoints named as a rule names them, in rule order.
func homeEndpoints(names ...string) []*Endpoint {
	eps := make([]*Endpoint, len(names))
	for i, n := range names {
		eps[i] = &Endpoint{ID: inventory.EndpointID(i), Index: i, Name: n, Capacity: 96}
	}
	return eps
}

// homeName is the name of key's home among eps.
func homeName(eps []*Endpoint, key uint64) string { return eps[home(eps, key)].Name }

// promptKey is the first block key of the i-th of a set of prompts: the block hashes a keyer
// produces, spread over the 64 bits.
func promptKey(i int) uint64 { return rendezvous(uint64(i), "prompt") }

// TestHomeTable: a prompt's home is a function of its key and the eligible endpoints' names alone:
// the same on every call and whatever the candidates' order; 48 prompts spread over 4 endpoints
// with each between 6 and 18 (12 ± 6: the tree's exact 12 is not the bar, but no endpoint gets
// half again or half of its share); an endpoint leaving moves only the prompts whose home it was,
// and those spread over the rest; one joining takes prompts only to itself.
func TestHomeTable(t *testing.T) {
	four := homeEndpoints("a", "b", "c", "d")
	reordered := homeEndpoints("c", "a", "d", "b")
	withoutC := homeEndpoints("a", "b", "d")
	withE := homeEndpoints("a", "b", "c", "d", "e")
	const prompts = 48
	per := map[string]int{}
	movedFromC := map[string]int{}
	for i := range prompts {
		k := promptKey(i)
		h := homeName(four, k)
		for range 3 {
			if got := homeName(four, k); got != h {
				t.Fatalf("prompt %d: home %s, then %s", i, h, got)
			}
		}
		if got := homeName(reordered, k); got != h {
			t.Fatalf("prompt %d: home %s, %s with the candidates reordered", i, h, got)
		}
		per[h]++
		switch got := homeName(withoutC, k); {
		case h == "c":
			movedFromC[got]++
		case got != h:
			t.Fatalf("prompt %d: home %s moved to %s when c left", i, h, got)
		}
		if got := homeName(withE, k); got != h && got != "e" {
			t.Fatalf("prompt %d: home %s moved to %s when e joined", i, h, got)
		}
	}
	for _, n := range []string{"a", "b", "c", "d"} {
		if per[n] < 6 || per[n] > 18 {
			t.Fatalf("homes of %d prompts over 4 endpoints: %v, want each within 12 ± 6", prompts, per)
		}
	}
	if len(movedFromC) < 2 {
		t.Fatalf("c's %d prompts all moved to one endpoint: %v", per["c"], movedFromC)
	}
}

// TestPlaceHomeCap: the home takes the miss while it is under the hard law's cap
// (⌈1.75·(in flight + 1)·capacity share⌉, no holder's floor), and at the cap the miss is placed
// by headroom (-1).
func TestPlaceHomeCap(t *testing.T) {
	eps := homeEndpoints("a", "b", "c", "d")
	key := promptKey(7)
	h := home(eps, key)
	for _, tc := range []struct {
		name     string
		homeLoad int
		other    int // every other endpoint's load
		want     bool
	}{
		// All idle: cap ⌈1.75·1/4⌉ = 1, the home runs 0.
		{"idle pool", 0, 0, true},
		// The home alone busy with one: cap ⌈1.75·2/4⌉ = 1, at it.
		{"home alone busy", 1, 0, false},
		// 3 + 3·2 = 9 in flight: cap ⌈1.75·10/4⌉ = 5, the home runs 3.
		{"home a little above the mean", 3, 2, true},
		// 5 + 3·2 = 11: cap ⌈1.75·12/4⌉ = 6, the home runs 5: still under.
		{"home under the cap", 5, 2, true},
		// 6 + 3·2 = 12: cap ⌈1.75·13/4⌉ = 6, at it.
		{"home at the cap", 6, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cands := make([]Scored, len(eps))
			for i := range cands {
				cands[i] = Scored{Index: i, Load: tc.other, Capacity: 96}
			}
			cands[h].Load = tc.homeLoad
			got := placeHome(cands, eps, key, 175)
			if (got == h) != tc.want || (!tc.want && got != -1) {
				t.Fatalf("placeHome = %d, home %d, want home: %v", got, h, tc.want)
			}
		})
	}
}

// TestMissPlacementHome: under home placement a prompt nobody holds goes to its home, not to the
// emptiest cache headroom placement would pick, and again there after the index forgot it; with
// the home over its cap it goes where headroom placement puts it. A prompt shorter than the
// minMatchTokens' blocks keys its home on its first block.
func TestMissPlacementHome(t *testing.T) {
	keys := keysN(19)
	f := newFixture(t, []Role{RoleNormal, RoleNormal, RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keys}, func(r *rules.Rule) {
		r.Selector = "least-load"
		r.LoadLaw.MissPlacement = "home"
		r.PredictOnRoute = ttl(0) // off: a placed prompt must stay a miss for the next request
	})
	for _, e := range f.eps {
		e.Capacity = 96
	}
	k, ok := f.rt.homeKey(keys)
	if !ok || k != keys[0] {
		t.Fatalf("home key %d %v, want the first block's %d (minMatchTokens 16: one block)", k, ok, keys[0])
	}
	h := home(f.eps, k)
	// The home's cache is the fullest and every other one empty: headroom would go elsewhere.
	other := make([]uint64, 80)
	for i := range other {
		other[i] = uint64(5000 + i)
	}
	f.inv.Store(f.eps[h].ID, other)
	ctx := context.Background()
	for round := range 2 {
		d, err := f.rt.Route(ctx, prompt, inventory.Mask{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Miss != MissNoWorker || d.Tier != TierPlacement || d.Target.Name != f.eps[h].Name {
			t.Fatalf("round %d: miss %q tier %s target %s, want no_worker placement %s", round, d.Miss, d.Tier, d.Target.Name, f.eps[h].Name)
		}
		d.Release()
	}
	// The home busy with one request, the rest idle: over its cap, headroom picks the first
	// empty idle endpoint.
	f.eps[h].active.Add(1)
	defer f.eps[h].active.Add(-1)
	d, err := f.rt.Route(ctx, prompt, inventory.Mask{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Release()
	want := 0
	if h == 0 {
		want = 1
	}
	if d.Tier != TierPlacement || d.Target.Name != f.eps[want].Name {
		t.Fatalf("home over its cap: tier %s target %s, want placement %s", d.Tier, d.Target.Name, f.eps[want].Name)
	}
}
