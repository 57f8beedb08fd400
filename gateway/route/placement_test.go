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
// round robin takes the first tied endpoint, the full one.
func TestMissPlacementHeadroom(t *testing.T) {
	keys := keysN(19)
	for _, placement := range []string{"headroom", "selector"} {
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
			if placement == "selector" {
				if d.Tier != "selector:least-load" || d.Target.Name != "a" {
					t.Fatalf("selector placement: tier %s target %s", d.Tier, d.Target.Name)
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
}
