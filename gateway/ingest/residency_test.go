package ingest

import (
	"testing"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/kvgroups"
)

func storedIn(group int, keys ...uint64) engines.Event {
	return engines.Event{Kind: engines.BlockStored, BlockHashes: keys, Medium: "GPU", HasGroupIdx: true, GroupIdx: group,
		SpecKind: "full_attention", TokenIDs: make([]uint32, 16*len(keys)), BlockSize: 16}
}

func removedIn(group int, keys ...uint64) engines.Event {
	return engines.Event{Kind: engines.BlockRemoved, BlockHashes: keys, Medium: "GPU", HasGroupIdx: true, GroupIdx: group}
}

// TestPresenceResidency: under a contract with the presence rule (vLLM v0.26+), a repeated store of
// a block its group holds (kv_cache_report_mode="full" re-emitting a prefix-cache hit) is not a
// second copy, so the one eviction ends residency; a key stays while another full-attention group
// holds it; a clear resets the rule's state. Under v0.25.1's copies rule the same stream leaves
// the evicted key resident, which is what the presence rule exists to prevent.
func TestPresenceResidency(t *testing.T) {
	stream := []engines.Event{
		storedIn(0, 1, 2),
		storedIn(0, 1, 2), // full report mode: the same blocks, reused from the prefix cache
		removedIn(0, 1),   // the only copy of 1 is evicted
		storedIn(0, 3),
		storedIn(1, 3), // a second full-attention group holds 3 too
		removedIn(0, 3),
	}
	apply := func(release string) map[uint64]int {
		s, snap, _ := streamInto(t, Config{Family: "vllm", Release: release})
		for i := range stream {
			b := engines.Batch{Events: stream[i : i+1]}
			s.batch(0, uint64(i), 0, &b)
		}
		return snap()
	}
	if got, want := apply("v0.30.0"), map[uint64]int{2: 1, 3: 1}; !equalCounts(got, want) {
		t.Errorf("presence (v0.30.0): got %s, want %s", fmtCounts(got), fmtCounts(want))
	}
	if got, want := apply("v0.25.1"), map[uint64]int{1: 1, 2: 2, 3: 1}; !equalCounts(got, want) {
		t.Errorf("copies (v0.25.1): got %s, want %s", fmtCounts(got), fmtCounts(want))
	}

	s, snap, _ := streamInto(t, Config{Family: "vllm", Release: "v0.30.0"})
	b := engines.Batch{Events: []engines.Event{storedIn(0, 9), {Kind: engines.AllBlocksCleared}, storedIn(0, 9)}}
	s.batch(0, 0, 0, &b)
	if got := snap(); !equalCounts(got, map[uint64]int{9: 1}) {
		t.Errorf("after a clear the re-stored key must count once: %s", fmtCounts(got))
	}
	// Ranks are separate engines: each holds its own copy.
	r1 := engines.Batch{Events: []engines.Event{storedIn(0, 9)}}
	s.batch(1, 0, 0, &r1)
	if got := snap(); !equalCounts(got, map[uint64]int{9: 2}) {
		t.Errorf("two ranks: %s", fmtCounts(got))
	}
}

// TestPresenceOverflowClears: the rule's per-key state is bounded by MaxMapped, past which the
// endpoint is cleared rather than growing without limit.
func TestPresenceOverflowClears(t *testing.T) {
	s, snap, _ := streamInto(t, Config{Family: "vllm", Release: "v0.28.0", MaxMapped: 3})
	b := engines.Batch{Events: []engines.Event{storedIn(0, 1, 2, 3), storedIn(0, 4)}}
	s.batch(0, 0, 0, &b)
	if got := snap(); len(got) != 0 {
		t.Errorf("overflow must clear the endpoint: %s", fmtCounts(got))
	}
}

// TestV028SamplesResidency runs the v0.28 payload samples through a v0.28 endpoint's stream: the
// re-emission adds no copy, the CPU and STORAGE tiers never touch residency, the sliding-window
// group is not indexed, so the two default-seed keys end up resident once each on ranks 0 and 1.
func TestV028SamplesResidency(t *testing.T) {
	pay := loadPayloads(t, sampleFile(t, "vllm/v0.28.0/events-samples.json"))
	s, snap, skips := streamInto(t, Config{Family: "vllm", Release: "v0.28.0"})
	var keys []uint64
	for i, name := range []string{"stored_default_seed", "full_report_reemission", "storage_tier_stored_local", "cpu_and_storage_removed", "hybrid_sliding_window_dp1"} {
		b, err := vllm.DecodeBatch(pay[name])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if i == 0 {
			keys = b.Events[0].BlockHashes
		}
		s.batch(b.DPRank, uint64(i), 0, &b)
	}
	want := map[uint64]int{}
	for _, k := range keys {
		want[k] = 2 // rank 0 (once, despite the re-emission) and rank 1
	}
	if got := snap(); !equalCounts(got, want) {
		t.Errorf("got %s, want %s", fmtCounts(got), fmtCounts(want))
	}
	if skips["medium"] != 3 || skips["group_kind"] != 2 {
		t.Errorf("skips %v, want 3 medium (STORAGE store, CPU and STORAGE removals) and 2 group_kind", skips)
	}
}

// TestV028SamplesGroupResidency: with group residency, the sliding-window group's events of the
// v0.28 hybrid sample go to it instead of being skipped. Rank 1's sliding group then holds block 1
// only (it evicted block 0): the run ending at block 1 is shorter than the window's 256 blocks
// and does not start at block 0, so the engine hits nothing where full attention alone says 2.
func TestV028SamplesGroupResidency(t *testing.T) {
	pay := loadPayloads(t, sampleFile(t, "vllm/v0.28.0/events-samples.json"))
	groups := kvgroups.New(16)
	side := groups.Endpoint(0)
	s, snap, skips := streamInto(t, Config{Family: "vllm", Release: "v0.28.0", Groups: side})
	b, err := vllm.DecodeBatch(pay["hybrid_sliding_window_dp1"])
	if err != nil {
		t.Fatal(err)
	}
	s.batch(b.DPRank, 0, 0, &b)
	keys := b.Events[0].BlockHashes
	if got := snap(); !equalCounts(got, setOf(keys...)) {
		t.Errorf("inventory %s, want the full-attention group's two blocks", fmtCounts(got))
	}
	if skips["group_kind"] != 0 || side.Len() != 1 {
		t.Errorf("group_kind skips %d, group entries %d: want 0 and 1 (block 1 of the sliding group)", skips["group_kind"], side.Len())
	}
	if sp, ok := side.Spec(1); !ok || sp != (kvgroups.Spec{Kind: kvgroups.KindSlidingWindow, Window: 4096, BlockSize: 16}) {
		t.Errorf("group 1 spec %+v %v", sp, ok)
	}
	r, ok := groups.Hit(0, keys, 2)
	if !ok || r.Blocks != 0 || r.Limit != "group 1 (sliding_window, window 4096)" {
		t.Errorf("hit %+v ok %v, want 0 limited by the sliding group", r, ok)
	}
	// An engine clear empties the groups too.
	s.batch(b.DPRank, 1, 0, &engines.Batch{Events: []engines.Event{{Kind: engines.AllBlocksCleared}}})
	if side.Len() != 0 {
		t.Errorf("after AllBlocksCleared: %d group entries", side.Len())
	}
}

// TestGroupResidencyRouterBinding: under the router binding a sliding-window group's events are
// rehashed into router keys through the group's own key map: its removal of block 0 drops the
// group's copy only, the full-attention group's mapping and inventory entry stay.
func TestGroupResidencyRouterBinding(t *testing.T) {
	pay := loadPayloads(t, sampleFile(t, "vllm/v0.28.0/events-samples.json"))
	groups := kvgroups.New(16)
	side := groups.Endpoint(0)
	s, snap, skips := streamInto(t, Config{Family: "vllm", Release: "v0.28.0", Binding: BindingRouter, BlockSize: 16, Groups: side})
	b, err := vllm.DecodeBatch(pay["hybrid_sliding_window_dp1"])
	if err != nil {
		t.Fatal(err)
	}
	s.batch(b.DPRank, 0, 0, &b)
	if skips["group_kind"] != 0 || skips["unknown_block"] != 0 || side.Len() != 1 {
		t.Errorf("skips %v, group entries %d: want no skip and block 1 of the sliding group", skips, side.Len())
	}
	keys, err := hashcore.RouterKeys(0, b.Events[0].TokenIDs, 16, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := snap(); !equalCounts(got, setOf(keys...)) {
		t.Fatalf("inventory %s, want the full-attention group's two router keys %v", fmtCounts(got), keys)
	}
	if r, ok := groups.Hit(0, keys, 2); !ok || r.Blocks != 0 {
		t.Errorf("hit %+v %v, want 0 (the sliding group holds block 1 only)", r, ok)
	}
}
