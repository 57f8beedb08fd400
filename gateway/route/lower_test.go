package route

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/rules"
)

// tierFixture is a two-endpoint pool with a host-memory and a storage tier.
type tierFixture struct {
	rt        *Router
	eps       []*Endpoint
	gpu       *inventory.Index
	cpu, disk *inventory.Index
}

func newTierFixture(t *testing.T, keys []uint64, law string) *tierFixture {
	return newTierFixtureRanks(t, keys, law, nil)
}

func newTierFixtureRanks(t *testing.T, keys []uint64, law string, ranks *Ranks) *tierFixture {
	t.Helper()
	r := &rules.Rule{Name: "r", Engine: rules.EngineRef{Family: "vllm", Release: "v0.33.0"}, KVExactMode: 3}
	for _, n := range []string{"a", "b"} {
		r.Endpoints = append(r.Endpoints, rules.Endpoint{Name: n, Address: "http://127.0.0.1:1", Role: string(RoleNormal)})
	}
	zero := 0
	r.LoadLaw.ColdStartSeedN = &zero
	r.LoadLaw.Kind = law
	r.PredictOnRoute = ttl(0)
	if err := r.Normalize(); err != nil {
		t.Fatal(err)
	}
	f := &tierFixture{gpu: inventory.New(inventory.Config{}), cpu: inventory.New(inventory.Config{}), disk: inventory.New(inventory.Config{})}
	var cert inventory.Mask
	for i, e := range r.Endpoints {
		id, err := f.gpu.AddEndpoint(e.Name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.cpu.AddEndpoint(e.Name); err != nil {
			t.Fatal(err)
		}
		if _, err := f.disk.AddEndpoint(e.Name); err != nil {
			t.Fatal(err)
		}
		cert.Set(id)
		f.eps = append(f.eps, &Endpoint{ID: id, Index: i, Name: e.Name, Role: RoleNormal, Capacity: 1, Health: health.NewEndpoint(e.Name, e.Address, health.BreakerConfig{})})
	}
	rt, err := New(Config{Rule: r, Endpoints: f.eps, Index: f.gpu, Keyer: fixedKeyer{keys: keys}, Certified: cert, Ranks: ranks,
		Lower: []LowerIndex{{Tier: engines.TierCPU, Index: f.cpu}, {Tier: engines.TierDisk, Index: f.disk}}})
	if err != nil {
		t.Fatal(err)
	}
	f.rt = rt
	return f
}

func evidenceOf(d *Decision, name string) EndpointEvidence {
	for _, ev := range d.Endpoints {
		if ev.Name == name {
			return ev
		}
	}
	return EndpointEvidence{}
}

// TestLowerHitContinuesTheGPUPrefix: the blocks past the GPU prefix count on the nearest tier
// holding each, up to the first block no tier holds; a host copy of a GPU block adds nothing, and
// the evidence names each tier's blocks.
func TestLowerHitContinuesTheGPUPrefix(t *testing.T) {
	keys := keysN(64)
	f := newTierFixture(t, keys, "hard")
	a := f.eps[0].ID
	f.gpu.Store(a, keys[:10])
	f.cpu.Store(a, keys[:40])    // its first 10 are also on the GPU
	f.disk.Store(a, keys[30:44]) // 30..39 nearer on the CPU
	f.cpu.Store(a, keys[45:50])  // after the gap at 44: not loadable
	d, err := f.rt.Explain(context.Background(), prompt)
	if err != nil {
		t.Fatal(err)
	}
	ev := evidenceOf(d, "a")
	want := []TierBlocks{{"cpu", 30}, {"disk", 4}}
	if ev.Prefix != 10 || !slices.Equal(ev.Tiers, want) || ev.LowerBlocks() != 34 {
		t.Fatalf("a: prefix %d tiers %+v, want 10 and %+v", ev.Prefix, ev.Tiers, want)
	}
	if evb := evidenceOf(d, "b"); evb.Tiers != nil {
		t.Fatalf("b holds nothing but shows tiers %+v", evb.Tiers)
	}
}

// TestLowerCredit: a tier block earns the share of its prefill the transfer saves.
func TestLowerCredit(t *testing.T) {
	r := Rates{Prefill: 200 * time.Microsecond, Transfer: TransferRates{CPU: 20 * time.Microsecond, Disk: 200 * time.Microsecond, Shared: 0}}
	for _, c := range []struct {
		h    LowerHit
		want int
	}{
		{LowerHit{10, 0, 0}, 9},  // 10 · 0.9
		{LowerHit{0, 10, 0}, 0},  // as slow as prefill: nothing
		{LowerHit{0, 0, 10}, 10}, // free: a GPU block each
		{LowerHit{1, 0, 0}, 0},   // rounded down
		{LowerHit{}, 0},
	} {
		if got := lowerCredit(c.h, r); got != c.want {
			t.Errorf("%v: credit %d, want %d", c.h, got, c.want)
		}
	}
	if got := lowerCredit(LowerHit{60, 0, 0}, Rates{}); got != 54 {
		t.Errorf("default rates: credit %d, want 54", got)
	}
}

// TestHardLawPrefersAHostHitToAMiss: under the default law an endpoint whose host memory holds
// the prompt beats one holding a shorter GPU prefix, and loses to a GPU prefix as deep.
func TestHardLawPrefersAHostHitToAMiss(t *testing.T) {
	keys := keysN(64)
	f := newTierFixture(t, keys, "hard")
	a, b := f.eps[0].ID, f.eps[1].ID
	f.gpu.Store(a, keys[:20])
	f.cpu.Store(b, keys[:60])
	d, err := f.rt.Explain(context.Background(), prompt)
	if err != nil {
		t.Fatal(err)
	}
	if d.Target != f.eps[1] || d.Score != 54 {
		t.Fatalf("target %s score %d, want b with 60 host blocks credited 54 (%+v)", d.TargetN, d.Score, d.Endpoints)
	}
	f.gpu.Store(a, keys[20:60])
	if d, _ = f.rt.Explain(context.Background(), prompt); d.Target != f.eps[0] || d.Score != 60 {
		t.Fatalf("target %s score %d, want a's 60 GPU blocks", d.TargetN, d.Score)
	}
}

// TestTTFTLawPricesTheTransfer: hand computations with DefaultRates (prefill 200 µs, host
// transfer 20 µs a token), 64 blocks of 16 tokens.
func TestTTFTLawPricesTheTransfer(t *testing.T) {
	law := Law{Kind: LawTTFT, BlockSize: 16}
	// a: 10 on the GPU, 50 on the host (Score counts them held): own 4 blocks = 64 tokens · 0.2 =
	// 12.8 ms, transfer 800 tokens · 0.02 = 16 ms → 28.8. b: 40 on the GPU: own 384 · 0.2 = 76.8.
	a := Scored{Score: 60, LowerCredit: 50, Lower: LowerHit{50, 0, 0}, Capacity: 1}
	b := Scored{Index: 1, Score: 40, Capacity: 1}
	v := law.Pick([]Scored{a, b}, 64)
	if v.Pos != 0 || math.Abs(v.TTFT[0].TotalMS-28.8) > 1e-9 || math.Abs(v.TTFT[0].TransferMS-16) > 1e-9 || v.TTFT[0].LowerTokens != 800 || math.Abs(v.TTFT[1].TotalMS-76.8) > 1e-9 {
		t.Fatalf("got pos %d %+v, want a at 28.8 ms (16 of transfer) against 76.8", v.Pos, v.TTFT)
	}
	// The same hit on storage (100 µs a token): 12.8 + 80 = 92.8 > 76.8 → b.
	a.Lower = LowerHit{0, 50, 0}
	if v = law.Pick([]Scored{a, b}, 64); v.Pos != 1 || math.Abs(v.TTFT[0].TotalMS-92.8) > 1e-9 {
		t.Fatalf("storage: pos %d %+v, want b (a at 92.8 ms)", v.Pos, v.TTFT)
	}
}

// TestEstimatorLearnsTransfer: receipts of idle requests loading from one tier teach that tier's
// transfer rate and leave the prefill rate alone; a receipt mixing tiers or loading few tokens
// teaches nothing.
func TestEstimatorLearnsTransfer(t *testing.T) {
	e := newEstimator(DefaultRates)
	for range 9 {
		// 100 computed at 200 µs + 512 loaded at 30 µs.
		e.observe(Receipt{TTFT: 100*200*time.Microsecond + 512*30*time.Microsecond, Computed: 100, Lower: [nLower]int{512, 0, 0}})
	}
	e.observe(Receipt{TTFT: time.Second, Computed: 100, Lower: [nLower]int{512, 0, 0}}) // an outlier
	e.observe(Receipt{TTFT: time.Second, Computed: 100, Lower: [nLower]int{300, 300, 0}})
	e.observe(Receipt{TTFT: time.Second, Computed: 100, Lower: [nLower]int{0, 100, 0}})
	r := e.Rates()
	if r.Transfer.CPU != 30*time.Microsecond || r.Transfer.Disk != DefaultRates.Transfer.Disk || r.Prefill != DefaultRates.Prefill {
		t.Fatalf("rates %+v, want host transfer 30µs and the rest at their seed", r)
	}
}

// TestLowerTiersOfADataParallelEndpointNotScored: lower tiers are indexed per endpoint, so a
// data-parallel endpoint, scored by one rank, gets no lower-tier credit its rank may not have.
func TestLowerTiersOfADataParallelEndpointNotScored(t *testing.T) {
	keys := keysN(64)
	ranks := NewRanks(inventory.Config{})
	if err := ranks.Add(0, "a", 2); err != nil {
		t.Fatal(err)
	}
	f := newTierFixtureRanks(t, keys, "hard", ranks)
	f.eps[0].RankHeader = "X-Data-Parallel-Rank"
	a := f.eps[0].ID
	f.gpu.Store(a, keys[:10])
	_ = ranks.Store(a, 0, keys[:10])
	f.cpu.Store(a, keys[10:40])
	d, err := f.rt.Explain(context.Background(), prompt)
	if err != nil {
		t.Fatal(err)
	}
	if ev := evidenceOf(d, "a"); ev.Prefix != 10 || ev.Tiers != nil || ev.Rank == nil {
		t.Fatalf("a: prefix %d tiers %+v rank %v, want its rank's 10 GPU blocks and no lower tier", ev.Prefix, ev.Tiers, ev.Rank)
	}
}
