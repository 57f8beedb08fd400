package ingest

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/inventory"
)

// snapshotOf takes tt's snapshot, each tier read oldest first, through the codec.
func (tt *tiered) snapshotOf(t *testing.T) *Snapshot {
	t.Helper()
	s, err := tt.p.snapshot(func(tier engines.Tier) []inventory.KeyCount { return tt.idx[tier].Aged(tt.ep) })
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := s.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSnapshot(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// sameTiers fails unless a and b hold the same keys, counts and age order on every tier.
func sameTiers(t *testing.T, when string, a, b *tiered) {
	t.Helper()
	for _, tier := range append([]engines.Tier{engines.TierGPU}, engines.LowerTiers...) {
		pa, pb := a.idx[tier].Aged(a.ep), b.idx[tier].Aged(b.ep)
		if !slices.Equal(pa, pb) {
			t.Errorf("%s: %s tier: seeded %v, peer %v (oldest first)", when, tier, pb, pa)
		}
	}
}

// TestSnapshotCarriesLowerTiers: with lower tiers indexed, a replica loading a peer's snapshot
// holds the peer's residency on every tier, keys in the peer's age order (the capacity cap then
// retires the same keys), and, under the router binding, each tier's engine-id map: a later
// removal by engine id lands on the seeded replica as on the peer.
func TestSnapshotCarriesLowerTiers(t *testing.T) {
	for _, c := range []struct {
		name, family, release string
		binding               Binding
		cpu, disk             string
	}{
		{"sglang_router", "sglang", "v0.5.23", BindingRouter, "CPU_PINNED", "DISK"},
		{"vllm_engine_presence", "vllm", "v0.26.0", BindingEngine, "CPU", "STORAGE"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := Config{Family: c.family, Release: c.release, Binding: c.binding, BlockSize: 4, Tiers: true, Publish: []string{"x"}}
			toks := func(ids ...uint32) []uint32 {
				var out []uint32
				for _, id := range ids {
					out = append(out, id, id, id, id)
				}
				return out
			}
			full := func(ev engines.Event) engines.Event {
				ev.GroupIdx, ev.HasGroupIdx, ev.SpecKind, ev.BlockSize = 0, true, "full_attention", 4
				return ev
			}
			steps := [][]engines.Event{
				{full(engines.Event{Kind: engines.BlockStored, BlockHashes: []uint64{50, 20, 40}, TokenIDs: toks(5, 2, 4), Medium: "GPU"})},
				{full(engines.Event{Kind: engines.BlockStored, BlockHashes: []uint64{70, 60}, TokenIDs: toks(7, 6), Medium: c.cpu}),
					full(engines.Event{Kind: engines.BlockStored, BlockHashes: []uint64{30}, TokenIDs: toks(3), Medium: c.cpu}),
					full(engines.Event{Kind: engines.BlockStored, BlockHashes: []uint64{70}, TokenIDs: toks(7), Medium: c.cpu})},
				{full(engines.Event{Kind: engines.BlockRemoved, BlockHashes: []uint64{60}, Medium: c.cpu}),
					full(engines.Event{Kind: engines.BlockStored, BlockHashes: []uint64{60}, Parent: 30, HasParent: true, TokenIDs: toks(6), Medium: c.cpu}),
					full(engines.Event{Kind: engines.BlockStored, BlockHashes: []uint64{90, 80}, TokenIDs: toks(9, 8), Medium: c.disk})},
			}
			peer := newTiered(t, cfg)
			for i, evs := range steps {
				peer.p.batch(0, uint64(i), 0, &engines.Batch{Events: evs})
			}
			for _, tier := range []engines.Tier{engines.TierGPU, engines.TierCPU, engines.TierDisk} {
				if len(peer.snap(tier)) < 2 {
					t.Fatalf("peer's %s tier holds %s: the scenario lost its blocks", tier, fmtCounts(peer.snap(tier)))
				}
			}
			s := peer.snapshotOf(t)
			if len(s.Tiers) != len(engines.LowerTiers) {
				t.Fatalf("snapshot carries %d lower tiers, want %d", len(s.Tiers), len(engines.LowerTiers))
			}
			if c.binding == BindingRouter && len(s.Tiers[0].Mapped) == 0 {
				t.Fatal("router binding: the CPU tier's engine-id map is not in the snapshot")
			}
			seeded := newTiered(t, cfg)
			if why := seeded.p.mismatch(s, []*rankRun{{replay: "x"}}); why != "" {
				t.Fatalf("mismatch: %s", why)
			}
			seeded.p.load(s)
			sameTiers(t, "loaded", peer, seeded)

			// Later events resolve against the carried state: removals by engine id on each tier.
			later := []engines.Event{
				full(engines.Event{Kind: engines.BlockRemoved, BlockHashes: []uint64{70, 30}, Medium: c.cpu}),
				full(engines.Event{Kind: engines.BlockRemoved, BlockHashes: []uint64{80}, Medium: c.disk}),
				full(engines.Event{Kind: engines.BlockRemoved, BlockHashes: []uint64{20}, Medium: "GPU"}),
			}
			for _, tt := range []*tiered{peer, seeded} {
				tt.p.batch(0, 3, 0, &engines.Batch{Events: later})
			}
			sameTiers(t, "after removals", peer, seeded)
			if seeded.skips["unknown_block"] != 0 {
				t.Errorf("seeded replica: %d removals of unknown engine blocks", seeded.skips["unknown_block"])
			}

			plain := newTiered(t, Config{Family: c.family, Release: c.release, Binding: c.binding, BlockSize: 4, Publish: []string{"x"}})
			if why := plain.p.mismatch(s, []*rankRun{{replay: "x"}}); !strings.Contains(why, "lower tiers") {
				t.Errorf("a rule without lower tiers given a snapshot with them: %q, want a mismatch", why)
			}
			plain.p.batch(0, 0, 0, &engines.Batch{Events: steps[0]})
			if why := seeded.p.mismatch(plain.snapshotOf(t), []*rankRun{{replay: "x"}}); !strings.Contains(why, "lower tiers") {
				t.Errorf("a rule with lower tiers given a snapshot without them: %q, want a mismatch", why)
			}
		})
	}
}
