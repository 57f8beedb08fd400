package route

import (
	"context"
	"testing"

	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/kvgroups"
	"github.com/kvexact/kvexact/gateway/rules"
)

// hybridFixture is a mode-3 router over two endpoints of a full + sliding-window model.
func hybridFixture(t *testing.T, keys []uint64) (*Router, *inventory.Index, *kvgroups.Index, []*Endpoint) {
	t.Helper()
	r := &rules.Rule{Name: "r", Engine: rules.EngineRef{Family: "vllm", Release: "v0.30.0"}, KVExactMode: 3, Scoring: "prefix"}
	for _, n := range []string{"a", "b"} {
		r.Endpoints = append(r.Endpoints, rules.Endpoint{Name: n, Address: "http://127.0.0.1:1"})
	}
	zero := 0
	r.LoadLaw.ColdStartSeedN = &zero
	r.PredictOnRoute = ttl(0) // the group hit rule alone: a routed prompt must not extend a prefix
	if err := r.Normalize(); err != nil {
		t.Fatal(err)
	}
	inv := inventory.New(inventory.Config{})
	groups := kvgroups.New(r.BlockSize)
	var eps []*Endpoint
	var cert inventory.Mask
	for i, e := range r.Endpoints {
		id, err := inv.AddEndpoint(e.Name)
		if err != nil {
			t.Fatal(err)
		}
		cert.Set(id)
		eps = append(eps, &Endpoint{ID: id, Index: i, Name: e.Name, Role: RoleNormal, Weight: 1, Capacity: 1, Health: health.NewEndpoint(e.Name, e.Address, health.BreakerConfig{})})
	}
	rt, err := New(Config{Rule: r, Endpoints: eps, Index: inv, Groups: groups, Keyer: fixedKeyer{keys: keys}, Certified: cert})
	if err != nil {
		t.Fatal(err)
	}
	return rt, inv, groups, eps
}

// TestHybridScoreFollowsTheEngine: endpoint a holds 8 full-attention blocks but its
// sliding-window group evicted everything after block 3; b holds 6 full blocks and the window's
// tail. The engine hits 4 blocks on a and 6 on b, so KV-exact picks b; scoring full attention
// alone (the path before group residency) would pick a for 8 blocks it would not reuse.
func TestHybridScoreFollowsTheEngine(t *testing.T) {
	keys := keysN(10)
	rt, inv, groups, eps := hybridFixture(t, keys)
	bs := rt.rule.BlockSize
	for i, full := range []int{8, 6} {
		if err := inv.Store(eps[i].ID, keys[:full]); err != nil {
			t.Fatal(err)
		}
		e := groups.Endpoint(eps[i].ID)
		e.Learn(0, kvgroups.Spec{Kind: kvgroups.KindFull, BlockSize: bs})
		e.Learn(1, kvgroups.Spec{Kind: kvgroups.KindSlidingWindow, Window: 3 * bs, BlockSize: bs}) // 3 blocks
	}
	groups.Endpoint(eps[0].ID).Store(0, 1, keys[0:4], true)
	groups.Endpoint(eps[1].ID).Store(0, 1, keys[3:6], true)
	d, err := rt.Route(context.Background(), prompt, inventory.Mask{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Release()
	if d.Tier != TierKVExact || d.TargetN != "b" || d.Score != 6 {
		t.Fatalf("decision %s → %s score %d, want kv-exact → b with 6 (%+v)", d.Tier, d.TargetN, d.Score, d.Endpoints)
	}
	a := d.Endpoints[0]
	if a.Prefix != 4 || a.FullPrefix != 8 || a.Limit != "group 1 (sliding_window, window 48)" {
		t.Errorf("a's evidence %+v, want prefix 4 cut from 8 by the sliding-window group", a)
	}
	if b := d.Endpoints[1]; b.Prefix != 6 || b.Limit != "full_attention" {
		t.Errorf("b's evidence %+v, want prefix 6 limited by full attention", b)
	}

	// Without group residency the router scores full attention alone and over-predicts a.
	rt.cfg.Groups = nil
	d2, err := rt.Route(context.Background(), prompt, inventory.Mask{})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Release()
	if d2.TargetN != "a" || d2.Score != 8 {
		t.Errorf("full-attention-only decision → %s score %d, want a with 8", d2.TargetN, d2.Score)
	}
}

// BenchmarkScoreGroups is one KV-exact decision over 16 endpoints holding 200 of a 256-block
// prompt: the inventory alone (no group residency), group residency with no hybrid endpoint
// (the production default for one-group models), and every endpoint a full + sliding-window
// model (window 128 tokens) whose groups hold the whole prefix.
func BenchmarkScoreGroups(b *testing.B) {
	keys := keysN(256)
	for _, v := range []string{"index-only", "groups-not-hybrid", "hybrid-swa"} {
		b.Run(v, func(b *testing.B) {
			r := &rules.Rule{Name: "r", Engine: rules.EngineRef{Family: "vllm", Release: "v0.30.0"}, KVExactMode: 3}
			for i := 0; i < 16; i++ {
				r.Endpoints = append(r.Endpoints, rules.Endpoint{Name: string(rune('a' + i)), Address: "http://127.0.0.1:1"})
			}
			zero := 0
			r.LoadLaw.ColdStartSeedN = &zero
			if err := r.Normalize(); err != nil {
				b.Fatal(err)
			}
			inv := inventory.New(inventory.Config{})
			groups := kvgroups.New(r.BlockSize)
			var eps []*Endpoint
			var cert inventory.Mask
			for i, e := range r.Endpoints {
				id, _ := inv.AddEndpoint(e.Name)
				cert.Set(id)
				_ = inv.Store(id, keys[:200])
				if v == "hybrid-swa" {
					g := groups.Endpoint(id)
					g.Learn(0, kvgroups.Spec{Kind: kvgroups.KindFull, BlockSize: r.BlockSize})
					g.Learn(1, kvgroups.Spec{Kind: kvgroups.KindSlidingWindow, Window: 128, BlockSize: r.BlockSize})
					g.Store(0, 1, keys[:200], true)
				}
				eps = append(eps, &Endpoint{ID: id, Index: i, Name: e.Name, Role: RoleNormal, Weight: 1, Capacity: 1, Health: health.NewEndpoint(e.Name, e.Address, health.BreakerConfig{})})
			}
			cfg := Config{Rule: r, Endpoints: eps, Index: inv, Keyer: fixedKeyer{keys: keys}, Certified: cert}
			if v != "index-only" {
				cfg.Groups = groups
			}
			rt, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				d, err := rt.Route(ctx, prompt, inventory.Mask{})
				if err != nil {
					b.Fatal(err)
				}
				d.Release()
			}
		})
	}
}
