package route

import (
	"context"
	"errors"
	"github.com/kvexact/kvexact/internal/promtest"
	"github.com/prometheus/client_golang/prometheus"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/rules"
)

type fixedKeyer struct {
	keys []uint64
	miss Miss
}

func (k fixedKeyer) Keys(context.Context, *Request) ([]uint64, int, Miss, string) {
	return k.keys, 0, k.miss, string(k.miss)
}

type fixture struct {
	rt  *Router
	eps []*Endpoint
	inv *inventory.Index
}

// newFixture builds a router over endpoints with the given roles and a rule edited by mod.
func newFixture(t *testing.T, roles []Role, mode int, keyer Keyer, mod func(r *rules.Rule)) *fixture {
	t.Helper()
	r := &rules.Rule{Name: "r", Engine: rules.EngineRef{Family: "vllm", Release: "v0.25.1"}, KVExactMode: mode}
	for i, role := range roles {
		r.Endpoints = append(r.Endpoints, rules.Endpoint{Name: string(rune('a' + i)), Address: "http://127.0.0.1:1", Role: string(role)})
	}
	zero := 0
	r.LoadLaw.ColdStartSeedN = &zero
	if mod != nil {
		mod(r)
	}
	if err := r.Normalize(); err != nil {
		t.Fatal(err)
	}
	inv := inventory.New(inventory.Config{})
	var eps []*Endpoint
	var cert inventory.Mask
	for i, e := range r.Endpoints {
		id, err := inv.AddEndpoint(e.Name)
		if err != nil {
			t.Fatal(err)
		}
		cert.Set(id)
		eps = append(eps, &Endpoint{ID: id, Index: i, Name: e.Name, Role: Role(e.Role), Weight: e.Weight, Capacity: 1, Health: health.NewEndpoint(e.Name, e.Address, health.BreakerConfig{})})
	}
	rt, err := New(Config{Rule: r, Endpoints: eps, Index: inv, Keyer: keyer, Certified: cert})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{rt: rt, eps: eps, inv: inv}
}

var prompt = &Request{Model: "m", Prompt: "hello", AffinityText: "hello"}

func keysN(n int) []uint64 {
	k := make([]uint64, n)
	for i := range k {
		k[i] = uint64(1000 + i)
	}
	return k
}

func TestPoolKVHitAndSelectorFallback(t *testing.T) {
	keys := keysN(8)
	f := newFixture(t, []Role{RoleNormal, RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keys}, func(r *rules.Rule) {
		r.PredictOnRoute = ttl(0) // off: the cold decision must not count as cached (predict_test.go)
		r.LoadLaw.MissPlacement = "selector"
	})
	ctx := context.Background()
	// Nothing cached: no_worker, the selector decides (headroom placement: placement_test.go).
	d, err := f.rt.Route(ctx, prompt, inventory.Mask{})
	if err != nil || d.Miss != MissNoWorker || d.Tier != "selector:rr" {
		t.Fatalf("cold: %+v %v", d, err)
	}
	d.Release()
	// b holds 6 of 8 blocks, c holds 2: b wins.
	f.inv.Store(f.eps[1].ID, keys[:6])
	f.inv.Store(f.eps[2].ID, keys[:2])
	d, err = f.rt.Route(ctx, prompt, inventory.Mask{})
	if err != nil || d.Tier != TierKVExact || d.Target.Name != "b" || d.Score != 6 || d.Blocks != 8 {
		t.Fatalf("warm: %+v %v", d, err)
	}
	if d.Endpoints[1].Overlap != 6 || d.Endpoints[1].Prefix != 6 || d.Endpoints[2].Overlap != 2 {
		t.Fatalf("evidence wrong: %+v", d.Endpoints)
	}
	if f.eps[1].Active() != 1 {
		t.Fatal("load unit not taken")
	}
	d.Release()
	d.Release()
	if f.eps[1].Active() != 0 {
		t.Fatal("release not exactly once")
	}
	// Connect failure on b: the retry excludes it and the second-best (c) wins, not round robin.
	d, _ = f.rt.Route(ctx, prompt, inventory.MaskOf(f.eps[1].ID))
	if d.Tier != TierKVExact || d.Target.Name != "c" {
		t.Fatalf("retry: %+v", d)
	}
	d.Release()
	// Admin down b and c: the holder is excluded → miss excluded, selector picks a.
	f.eps[1].Health.SetAdminDown(true)
	f.eps[2].Health.SetAdminDown(true)
	d, _ = f.rt.Route(ctx, prompt, inventory.Mask{})
	if d.Miss != MissExcluded || d.Target.Name != "a" {
		t.Fatalf("excluded: %+v", d)
	}
	d.Release()
}

func TestPoolGuards(t *testing.T) {
	keys := keysN(8)
	for _, tc := range []struct {
		name  string
		keyer Keyer
		req   *Request
		mod   func(r *rules.Rule)
		store int
		want  Miss
	}{
		{"mode off", fixedKeyer{keys: keys}, prompt, func(r *rules.Rule) { r.KVExactMode = 0 }, 8, MissModeOff},
		{"empty text", fixedKeyer{keys: keys}, &Request{Model: "m"}, nil, 8, MissTextEmpty},
		{"no tokenizer", nil, prompt, nil, 8, MissTokenizer},
		{"tokenize failed", fixedKeyer{miss: MissTokenize}, prompt, nil, 8, MissTokenize},
		{"no blocks", fixedKeyer{keys: nil}, prompt, nil, 8, MissHashes},
		// minMatchTokens 64 at block size 16 needs 4 blocks; 3 cached → shallow.
		{"shallow", fixedKeyer{keys: keys}, prompt, func(r *rules.Rule) { v := 64; r.MinMatchTokens = &v }, 3, MissShallow},
		{"deep enough", fixedKeyer{keys: keys}, prompt, func(r *rules.Rule) { v := 64; r.MinMatchTokens = &v }, 4, MissNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, tc.keyer, tc.mod)
			f.inv.Store(f.eps[1].ID, keys[:tc.store])
			d, err := f.rt.Route(context.Background(), tc.req, inventory.Mask{})
			if err != nil {
				t.Fatal(err)
			}
			if d.Miss != tc.want {
				t.Fatalf("miss %q, want %q (%+v)", d.Miss, tc.want, d)
			}
			if tc.want == MissNone && d.Target.Name != "b" {
				t.Fatalf("hit went to %s", d.Target.Name)
			}
		})
	}
}

func TestNoCertificate(t *testing.T) {
	f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keysN(4)}, nil)
	f.inv.Store(f.eps[1].ID, keysN(4))
	f.rt.cfg.CertReason = "no certificate covers profile sha256:abcd"
	d, _ := f.rt.Route(context.Background(), prompt, inventory.Mask{})
	if d.Miss != MissNoCertificate || d.Tier == TierKVExact {
		t.Fatalf("uncertified rule ran Exact: %+v", d)
	}
	// Certified mask without b: b's blocks do not count.
	f.rt.cfg.CertReason = ""
	f.rt.cfg.Certified = inventory.MaskOf(f.eps[0].ID)
	d, _ = f.rt.Route(context.Background(), prompt, inventory.Mask{})
	if d.Miss != MissExcluded {
		t.Fatalf("uncertified endpoint scored: %+v", d)
	}
}

func TestLoadLawSpillsHotEndpoint(t *testing.T) {
	keys := keysN(8)
	f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keys}, nil)
	f.inv.Store(f.eps[0].ID, keys)
	f.inv.Store(f.eps[1].ID, keys[:4])
	var held []*Decision
	targets := map[string]int{}
	for i := 0; i < 10; i++ {
		d, err := f.rt.Route(context.Background(), prompt, inventory.Mask{})
		if err != nil {
			t.Fatal(err)
		}
		targets[d.Target.Name]++
		held = append(held, d)
	}
	// With ε = 0.75 and the default cap floor of 8 the hot endpoint a may carry at most
	// max(ceil(1.75·L/2), 8) of L in flight; b, a holder too, takes the rest.
	if targets["a"] == 10 || targets["b"] == 0 {
		t.Fatalf("bounded load did not spill: %v", targets)
	}
	if targets["a"] < targets["b"] {
		t.Fatalf("affinity lost: %v", targets)
	}
	for _, d := range held {
		d.Release()
	}
}

func TestColdStartSeeding(t *testing.T) {
	keys := keysN(4)
	f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keys}, func(r *rules.Rule) {
		n := 4
		r.LoadLaw.ColdStartSeedN = &n
	})
	f.inv.Store(f.eps[0].ID, keysN(40))
	seeded := 0
	for i := 0; i < 8; i++ {
		d, _ := f.rt.Route(context.Background(), prompt, inventory.Mask{})
		if d.Seeded {
			seeded++
			if d.Target.Name != "b" {
				t.Fatalf("seed went to %s", d.Target.Name)
			}
		}
		d.Release()
	}
	if seeded != 2 {
		t.Fatalf("seeded %d of 8 with N=4", seeded)
	}
}

func TestPDLadder(t *testing.T) {
	keys := keysN(8)
	// a, b prefill; c, d decode; e normal (rescue).
	f := newFixture(t, []Role{RolePrefill, RolePrefill, RoleDecode, RoleDecode, RoleNormal}, 1, fixedKeyer{keys: keys}, func(r *rules.Rule) { r.Trie.Enabled = true })
	ctx := context.Background()
	f.inv.Store(f.eps[1].ID, keys)
	f.inv.Store(f.eps[3].ID, keys) // decode endpoints are never KV candidates
	d, err := f.rt.Route(ctx, &Request{Model: "m", Prompt: "x", AffinityText: "x", ConversationID: "conv-1"}, inventory.Mask{})
	if err != nil || d.Tier != TierKVExact || d.Target.Name != "b" || d.Decode == nil || d.Decode.Role != RoleDecode {
		t.Fatalf("kv: %+v %v", d, err)
	}
	for _, ev := range d.Endpoints {
		if ev.Name == "d" {
			t.Fatal("decode endpoint scored as a KV candidate")
		}
	}
	decode := d.Decode.Name
	d.Release()
	// Same conversation: the session pins the pair.
	d, _ = f.rt.Route(ctx, &Request{Model: "m", Prompt: "y", ConversationID: "conv-1"}, inventory.Mask{})
	if d.Tier != TierSession || d.Target.Name != "b" || d.Decode.Name != decode {
		t.Fatalf("session: %+v", d)
	}
	d.Release()
	// Stickiness never overrides health.
	f.eps[1].Health.SetAdminDown(true)
	d, _ = f.rt.Route(ctx, &Request{Model: "m", Prompt: "y", ConversationID: "conv-1"}, inventory.Mask{})
	if d.Target.Name != "a" {
		t.Fatalf("session overrode health: %+v", d)
	}
	d.Release()
	f.eps[1].Health.SetAdminDown(false)
	// Trie: a prompt that shares most of its text with one routed before goes to the same prefill.
	long := ""
	for i := 0; i < 20; i++ {
		long += "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	}
	f2 := newFixture(t, []Role{RolePrefill, RolePrefill, RoleDecode}, 0, nil, func(r *rules.Rule) { r.Trie.Enabled = true })
	d1, _ := f2.rt.Route(ctx, &Request{Model: "m", Prompt: long, AffinityText: long}, inventory.Mask{})
	first := d1.Target.Name
	d1.Release()
	d2, _ := f2.rt.Route(ctx, &Request{Model: "m", Prompt: long + " more", AffinityText: long + " more"}, inventory.Mask{})
	if d2.Tier != TierTrie || d2.Target.Name != first {
		t.Fatalf("trie: %+v (first %s)", d2, first)
	}
	d2.Release()
	// No prefill left: rescue over the normal endpoint; nothing at all: 503.
	f.eps[0].Health.SetAdminDown(true)
	f.eps[1].Health.SetAdminDown(true)
	d, err = f.rt.Route(ctx, prompt, inventory.Mask{})
	if err != nil || d.Tier != TierRescue || d.Target.Name != "e" {
		t.Fatalf("rescue: %+v %v", d, err)
	}
	d.Release()
	f.eps[4].Health.SetAdminDown(true)
	if _, err := f.rt.Route(ctx, prompt, inventory.Mask{}); !errors.Is(err, ErrNoEndpoint) {
		t.Fatalf("want ErrNoEndpoint, got %v", err)
	}
}

func TestMinLoadTiesRoundRobin(t *testing.T) {
	f := newFixture(t, []Role{RolePrefill, RolePrefill, RoleDecode}, 0, nil, nil)
	seen := map[string]int{}
	for i := 0; i < 4; i++ {
		d, _ := f.rt.Route(context.Background(), &Request{Model: "m"}, inventory.Mask{})
		if d.Tier != TierMinLoad {
			t.Fatalf("tier %s", d.Tier)
		}
		seen[d.Target.Name]++
		d.Release()
	}
	if seen["a"] != 2 || seen["b"] != 2 {
		t.Fatalf("ties not round robin: %v", seen)
	}
	// Load breaks ties: hold one on a, the next goes to b.
	d, _ := f.rt.Route(context.Background(), &Request{Model: "m"}, inventory.Mask{})
	d2, _ := f.rt.Route(context.Background(), &Request{Model: "m"}, inventory.Mask{})
	if d.Target == d2.Target {
		t.Fatal("min-load ignored load")
	}
	d.Release()
	d2.Release()
}

func TestAdmission(t *testing.T) {
	ctx := context.Background()
	shed := newFixture(t, []Role{RolePrefill, RoleDecode}, 0, nil, func(r *rules.Rule) {
		r.Admission = rules.Admission{Enabled: true, MaxInflightPerEndpoint: 1, Mode: "shed"}
	})
	d, err := shed.rt.Route(ctx, prompt, inventory.Mask{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shed.rt.Route(ctx, prompt, inventory.Mask{}); !errors.Is(err, ErrShed) {
		t.Fatalf("want ErrShed, got %v", err)
	}
	d.Release()
	if d2, err := shed.rt.Route(ctx, prompt, inventory.Mask{}); err != nil {
		t.Fatalf("slot not freed: %v", err)
	} else {
		d2.Release()
	}

	park := newFixture(t, []Role{RolePrefill, RoleDecode}, 0, nil, func(r *rules.Rule) {
		r.Admission = rules.Admission{Enabled: true, MaxInflightPerEndpoint: 1, Mode: "park", MaxPark: rules.Duration(2 * time.Second)}
	})
	d, _ = park.rt.Route(ctx, prompt, inventory.Mask{})
	got := make(chan error, 1)
	go func() {
		d2, err := park.rt.Route(ctx, prompt, inventory.Mask{})
		if err == nil {
			d2.Release()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("parked request returned before a slot freed: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	d.Release()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("parked request failed: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("parked request not woken by the release")
	}
	short := newFixture(t, []Role{RolePrefill, RoleDecode}, 0, nil, func(r *rules.Rule) {
		r.Admission = rules.Admission{Enabled: true, MaxInflightPerEndpoint: 1, Mode: "park", MaxPark: rules.Duration(30 * time.Millisecond)}
	})
	d, _ = short.rt.Route(ctx, prompt, inventory.Mask{})
	if _, err := short.rt.Route(ctx, prompt, inventory.Mask{}); !errors.Is(err, ErrParkTimeout) {
		t.Fatalf("want ErrParkTimeout, got %v", err)
	}
	d.Release()
}

func TestReselectDecode(t *testing.T) {
	f := newFixture(t, []Role{RolePrefill, RoleDecode, RoleDecode}, 0, nil, nil)
	d, _ := f.rt.Route(context.Background(), prompt, inventory.Mask{})
	old := d.Decode
	old.Health.SetAdminDown(true)
	next := f.rt.ReselectDecode(d)
	if next == nil || next == old || old.Active() != 0 || next.Active() != 1 {
		t.Fatalf("decode not re-selected with its load unit: %+v", next)
	}
	d.Release()
	if next.Active() != 0 {
		t.Fatal("load unit leaked")
	}
}

func TestExplainChangesNothing(t *testing.T) {
	keys := keysN(4)
	f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keys}, nil)
	f.inv.Store(f.eps[1].ID, keys)
	d, err := f.rt.Explain(context.Background(), prompt)
	if err != nil || d.TargetN != "b" || d.Tier != TierKVExact {
		t.Fatalf("explain: %+v %v", d, err)
	}
	if f.eps[1].Active() != 0 || f.eps[1].Served() != 0 {
		t.Fatal("explain took load")
	}
	d.Release()
	if f.eps[1].Active() != 0 {
		t.Fatal("explain release changed load")
	}
}

func TestFencedEndpointNotAKVCandidate(t *testing.T) {
	keys := keysN(4)
	f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keys}, func(r *rules.Rule) { r.PredictOnRoute = ttl(0) }) // off: the first decision must not count as cached (predict_test.go)
	f.inv.Store(f.eps[1].ID, keys)
	f.eps[1].Fence("version changed to 0.26.0")
	d, _ := f.rt.Route(context.Background(), prompt, inventory.Mask{})
	if d.Tier == TierKVExact || d.Miss != MissExcluded || !strings.Contains(d.Endpoints[1].Excluded, "0.26.0") {
		t.Fatalf("fenced endpoint chosen by KV-exact: %+v", d)
	}
	d.Release()
	f.eps[1].Unfence()
	d, _ = f.rt.Route(context.Background(), prompt, inventory.Mask{})
	if d.Tier != TierKVExact || d.TargetN != "b" {
		t.Fatalf("unfenced endpoint not chosen: %+v", d)
	}
	d.Release()
}

func TestZeroHitWatchdog(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keysN(4)}, nil)
	f.rt.cfg.Metrics = NewMetrics(reg)
	// The inventory holds blocks, but never the prompt's: a parity leg differs.
	f.inv.Store(f.eps[0].ID, []uint64{1, 2, 3})
	count := func() float64 {
		return promtest.Value(t, reg, "kvexact_kv_exact_zero_hit_watchdog_total", map[string]string{"rule": "r"})
	}
	for i := 0; i < 49; i++ {
		d, _ := f.rt.Route(context.Background(), prompt, inventory.Mask{})
		d.Release()
	}
	if count() != 0 {
		t.Fatal("watchdog fired before 50 lookups")
	}
	for i := 0; i < 3; i++ {
		d, _ := f.rt.Route(context.Background(), prompt, inventory.Mask{})
		d.Release()
	}
	if count() != 3 || !f.rt.watchdog.Load() {
		t.Fatalf("watchdog count %v after 52 zero-hit lookups", count())
	}
	// One hit resets it.
	f.inv.Store(f.eps[1].ID, keysN(4))
	d, _ := f.rt.Route(context.Background(), prompt, inventory.Mask{})
	d.Release()
	if f.rt.watchdog.Load() || f.rt.zeroHits.Load() != 0 {
		t.Fatal("a hit did not reset the watchdog")
	}
}
