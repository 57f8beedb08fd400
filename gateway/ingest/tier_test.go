package ingest

import (
	"testing"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
	"github.com/kvexact/kvexact/engines/sglang"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/gateway/inventory"
)

// tiered is a pipeline writing the GPU into one inventory and each lower tier into its own.
type tiered struct {
	p     *pipeline
	idx   map[engines.Tier]*inventory.Index
	ep    inventory.EndpointID
	skips map[string]int
}

func newTiered(t *testing.T, cfg Config) *tiered {
	t.Helper()
	cfg.defaults()
	tt := &tiered{idx: map[engines.Tier]*inventory.Index{}, skips: map[string]int{}}
	cfg.Trace = func(tr Trace) {
		if tr.Type == "skip" {
			tt.skips[tr.Reason] += tr.Count
		}
	}
	for _, tier := range append([]engines.Tier{engines.TierGPU}, engines.LowerTiers...) {
		tt.idx[tier] = inventory.New(inventory.Config{})
		ep, err := tt.idx[tier].AddEndpoint("ep")
		if err != nil {
			t.Fatal(err)
		}
		tt.ep = ep
	}
	apply := Into(tt.idx[engines.TierGPU], tt.ep, nil, "r", "ep", nil)
	for _, tier := range engines.LowerTiers {
		apply = IntoTier(apply, tier, tt.idx[tier], tt.ep, nil)
	}
	fam, err := registry.Lookup(cfg.Family)
	if err != nil {
		t.Fatal(err)
	}
	tt.p = newPipeline(cfg, fam, apply)
	return tt
}

func (tt *tiered) snap(tier engines.Tier) map[uint64]int {
	m := map[uint64]int{}
	for _, kc := range tt.idx[tier].Snapshot(tt.ep) {
		m[kc.Key] = kc.Count
	}
	return m
}

// tierEvents are the offloading connectors' sequence for two blocks A, B of one request: computed
// on the GPU, offloaded (a self-describing chunk store of both hashes, re-announced once more by a
// second chunk overlapping the shared prefix), then evicted from the GPU while the host copy stays,
// and one of the host copies removed. Medium is the release's host-tier name.
func tierEvents(medium string, a, b uint64) [][]engines.Event {
	toks := make([]uint32, 8)
	full := func(ev engines.Event) engines.Event {
		ev.GroupIdx, ev.HasGroupIdx, ev.SpecKind = 0, true, "full_attention"
		return ev
	}
	return [][]engines.Event{
		{full(engines.Event{Kind: engines.BlockStored, BlockHashes: []uint64{a, b}, TokenIDs: toks, BlockSize: 4, Medium: "GPU"})},
		{full(engines.Event{Kind: engines.BlockStored, BlockHashes: []uint64{a, b}, TokenIDs: toks, BlockSize: 4, Medium: medium}),
			full(engines.Event{Kind: engines.BlockStored, BlockHashes: []uint64{a}, TokenIDs: toks[:4], BlockSize: 4, Medium: medium})},
		{full(engines.Event{Kind: engines.BlockRemoved, BlockHashes: []uint64{a, b}, Medium: "GPU"})},
		{full(engines.Event{Kind: engines.BlockRemoved, BlockHashes: []uint64{a}, Medium: medium})},
	}
}

// TestTierEventsPerRelease: each release's host-tier events, encoded in its wire layout and read
// back by its decoder, are indexed on their own tier: a GPU eviction leaves the host copy, repeated
// announcements are reference counted, the GPU index never sees a lower tier's block, and a clear
// empties every tier.
func TestTierEventsPerRelease(t *testing.T) {
	const a, b = 0x1111, 0x2222
	for _, c := range []struct {
		family, release, medium string
		tier                    engines.Tier
	}{
		{"vllm", "v0.19.0", "CPU", engines.TierCPU},
		{"vllm", "v0.23.0", "CPU", engines.TierCPU},
		{"vllm", "v0.25.1", "CPU", engines.TierCPU},
		{"vllm", "v0.33.0", "CPU", engines.TierCPU},
		{"vllm", "v0.33.0", "STORAGE", engines.TierDisk},
		{"sglang", "v0.5.18", "CPU_PINNED", engines.TierCPU},
		{"sglang", "v0.5.23", "CPU_PINNED", engines.TierCPU},
		{"sglang", "v0.5.23", "DISK", engines.TierDisk},
		{"sglang", "v0.5.23", "EXTERNAL", engines.TierShared},
	} {
		t.Run(c.family+"/"+c.release+"/"+c.medium, func(t *testing.T) {
			tt := newTiered(t, Config{Family: c.family, Release: c.release, Tiers: true})
			decode := wireRoundTrip(t, c.family, c.release)
			for i, evs := range tierEvents(c.medium, a, b) {
				bt := decode(engines.Batch{Events: evs})
				tt.p.batch(0, uint64(i), 0, &bt)
			}
			if got, want := tt.snap(c.tier), map[uint64]int{a: 1, b: 1}; !equalCounts(got, want) {
				t.Errorf("%s tier: %s, want %s", c.tier, fmtCounts(got), fmtCounts(want))
			}
			if got := tt.snap(engines.TierGPU); len(got) != 0 {
				t.Errorf("GPU after its eviction: %s, want empty (the host copy is not a GPU block)", fmtCounts(got))
			}
			for _, other := range engines.LowerTiers {
				if other != c.tier && len(tt.snap(other)) != 0 {
					t.Errorf("%s tier holds %s", other, fmtCounts(tt.snap(other)))
				}
			}
			clr := decode(engines.Batch{Events: []engines.Event{{Kind: engines.AllBlocksCleared}}})
			tt.p.batch(0, 9, 0, &clr)
			if got := tt.snap(c.tier); len(got) != 0 {
				t.Errorf("%s tier after a clear: %s", c.tier, fmtCounts(got))
			}
		})
	}
}

// wireRoundTrip encodes a batch in the release's layout and decodes it with the family's decoder.
func wireRoundTrip(t *testing.T, family, release string) func(engines.Batch) engines.Batch {
	return func(in engines.Batch) engines.Batch {
		t.Helper()
		var p []byte
		var err error
		switch family {
		case "vllm":
			var l vllm.Layout
			if l, err = vllm.LayoutForRelease(release); err == nil {
				p, err = vllm.EncodeBatch(in, l)
			}
		case "sglang":
			var l sglang.Layout
			if l, err = sglang.LayoutForRelease(release); err == nil {
				p, err = sglang.EncodeBatchLayout(in, l)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		var out engines.Batch
		if family == "vllm" {
			out, err = vllm.DecodeBatch(p)
		} else {
			out, err = sglang.DecodeBatch(p)
		}
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		return out
	}
}

// TestTierMediaSkipped: without Config.Tiers every lower tier is skipped as before; with it, a
// medium no release documents is still skipped, never guessed into a tier.
func TestTierMediaSkipped(t *testing.T) {
	ev := func(medium string) engines.Batch {
		return engines.Batch{Events: []engines.Event{{Kind: engines.BlockStored, BlockHashes: []uint64{5}, TokenIDs: make([]uint32, 4), BlockSize: 4, Medium: medium}}}
	}
	off := newTiered(t, Config{Family: "vllm", Release: "v0.33.0"})
	b := ev("CPU")
	off.p.batch(0, 0, 0, &b)
	if off.skips["medium"] != 1 || len(off.snap(engines.TierCPU)) != 0 {
		t.Errorf("tiers off: medium skips %d, cpu %s; want 1 and empty", off.skips["medium"], fmtCounts(off.snap(engines.TierCPU)))
	}
	on := newTiered(t, Config{Family: "vllm", Release: "v0.33.0", Tiers: true})
	b = ev("NVME")
	on.p.batch(0, 0, 0, &b)
	b = ev("cpu") // Mooncake's spelling
	on.p.batch(0, 1, 0, &b)
	if on.skips["medium"] != 1 || !equalCounts(on.snap(engines.TierCPU), map[uint64]int{5: 1}) {
		t.Errorf("tiers on: medium skips %d, cpu %s; want 1 and {5:1}", on.skips["medium"], fmtCounts(on.snap(engines.TierCPU)))
	}
}

// TestTierRouterBinding: under the router binding a host-tier store is rehashed from its tokens
// into the same router keys as the GPU's copy, chained through the tier's own key map, and its
// removal resolves there after the GPU's mapping is gone.
func TestTierRouterBinding(t *testing.T) {
	tt := newTiered(t, Config{Family: "sglang", Release: "v0.5.23", Binding: BindingRouter, BlockSize: 4, Tiers: true})
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	steps := [][]engines.Event{
		{{Kind: engines.BlockStored, BlockHashes: []uint64{10, 11}, TokenIDs: toks, BlockSize: 4, Medium: "GPU"}},
		{{Kind: engines.BlockStored, BlockHashes: []uint64{10}, TokenIDs: toks[:4], BlockSize: 4, Medium: "CPU_PINNED"},
			{Kind: engines.BlockStored, BlockHashes: []uint64{11}, Parent: 10, HasParent: true, TokenIDs: toks[4:], BlockSize: 4, Medium: "CPU_PINNED"}},
	}
	for i, evs := range steps {
		b := engines.Batch{Events: evs}
		tt.p.batch(0, uint64(i), 0, &b)
	}
	gpu, cpu := tt.snap(engines.TierGPU), tt.snap(engines.TierCPU)
	if len(gpu) != 2 || !equalCounts(gpu, cpu) {
		t.Fatalf("gpu %s, cpu %s: want the same two router keys", fmtCounts(gpu), fmtCounts(cpu))
	}
	for i, evs := range [][]engines.Event{
		{{Kind: engines.BlockRemoved, BlockHashes: []uint64{10, 11}, Medium: "GPU"}},
		{{Kind: engines.BlockRemoved, BlockHashes: []uint64{11}, Medium: "CPU_PINNED"}},
	} {
		b := engines.Batch{Events: evs}
		tt.p.batch(0, uint64(5+i), 0, &b)
	}
	if len(tt.snap(engines.TierGPU)) != 0 || len(tt.snap(engines.TierCPU)) != 1 || tt.skips["unknown_block"] != 0 {
		t.Errorf("after removals: gpu %s, cpu %s, unknown %d; want empty, one key, 0", fmtCounts(tt.snap(engines.TierGPU)), fmtCounts(tt.snap(engines.TierCPU)), tt.skips["unknown_block"])
	}
}

// TestTierStoreWithoutExtraKeysUnderRouterBinding: vLLM's offload stores publish extra_keys None;
// rehashed without them a salted block would take the unsalted prompt's router key, so under the
// router binding such a store is skipped (extra_keys), while one carrying its extra keys indexes.
func TestTierStoreWithoutExtraKeysUnderRouterBinding(t *testing.T) {
	tt := newTiered(t, Config{Family: "vllm", Release: "v0.33.0", Binding: BindingRouter, BlockSize: 4, Tiers: true})
	toks := []uint32{1, 2, 3, 4}
	b := engines.Batch{Events: []engines.Event{
		{Kind: engines.BlockStored, BlockHashes: []uint64{10}, TokenIDs: toks, BlockSize: 4, Medium: "CPU"},
		{Kind: engines.BlockStored, BlockHashes: []uint64{11}, TokenIDs: toks, BlockSize: 4, Medium: "CPU", HasExtraKeys: true, ExtraKeys: [][]any{{"salt"}}},
	}}
	tt.p.batch(0, 0, 0, &b)
	if tt.skips["extra_keys"] != 1 || len(tt.snap(engines.TierCPU)) != 1 {
		t.Fatalf("extra_keys skips %d, cpu %s: want 1 and the salted store alone", tt.skips["extra_keys"], fmtCounts(tt.snap(engines.TierCPU)))
	}
}
