package ingest

import (
	"testing"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
	"github.com/kvexact/kvexact/engines/sglang"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/inventory"
)

// streamInto builds the socket-free half of a source (the path every message takes after the
// sequence window) writing into a fresh inventory.
func streamInto(t *testing.T, cfg Config) (*pipeline, func() map[uint64]int, map[string]int) {
	t.Helper()
	cfg.defaults()
	idx := inventory.New(inventory.Config{})
	ep, err := idx.AddEndpoint("ep")
	if err != nil {
		t.Fatal(err)
	}
	skips := map[string]int{}
	cfg.Trace = func(tr Trace) {
		if tr.Type == "skip" {
			skips[tr.Reason] += tr.Count
		}
	}
	fam, err := registry.Lookup(cfg.Family)
	if err != nil {
		t.Fatal(err)
	}
	s := newPipeline(cfg, fam, Into(idx, ep, nil, "r", "ep", nil))
	snap := func() map[uint64]int {
		m := map[uint64]int{}
		for _, kc := range idx.Snapshot(ep) {
			m[kc.Key] = kc.Count
		}
		return m
	}
	return s, snap, skips
}

// TestRouterBindingSGLangSamples rehashes SGLang's own events into router keys: coalesced stores
// split by block size, a continuation chained from its parent's router key, a salted root that
// must not collide with the unsalted prompt, removals resolved through the engine-id map, bigram
// pages skipped.
func TestRouterBindingSGLangSamples(t *testing.T) {
	pay := loadPayloads(t, sampleFile(t, "sglang/v0.5.18/events-samples.json"))
	s, snap, skips := streamInto(t, Config{Family: "sglang", Binding: BindingRouter, BlockSize: 4})
	dec := func(name string) engines.Batch {
		b, err := sglang.DecodeBatch(pay[name])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return b
	}
	keys := func(parent uint64, toks []uint32, extras [][]any) []uint64 {
		k, err := hashcore.RouterKeys(parent, toks, 4, extras, nil)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	root := dec("stored_root_prompt_coalesced")
	cont := dec("stored_continuation_and_unrelated")
	salted := dec("stored_salted_with_metadata")
	rootKeys := keys(0, root.Events[0].TokenIDs, nil)
	contKeys := keys(rootKeys[len(rootKeys)-1], cont.Events[0].TokenIDs, nil)
	unrelKeys := keys(0, cont.Events[1].TokenIDs, nil)
	saltKeys := keys(0, salted.Events[0].TokenIDs, [][]any{{"tenant-a"}})
	if saltKeys[0] == rootKeys[0] {
		t.Fatal("salted and unsalted roots share a router key")
	}
	for seq, name := range []string{"startup_all_blocks_cleared", "stored_root_prompt_coalesced",
		"stored_continuation_and_unrelated", "stored_salted_with_metadata"} {
		b := dec(name)
		s.batch(0, uint64(seq), 0, &b)
	}
	want := setOf(append(append(append(append([]uint64{}, rootKeys...), contKeys...), unrelKeys...), saltKeys...)...)
	if got := snap(); !equalCounts(got, want) {
		t.Fatalf("after stores: got %s, want %s", fmtCounts(got), fmtCounts(want))
	}
	b := dec("removed_coalesced_eviction")
	s.batch(0, 4, 0, &b)
	want = setOf(append(append([]uint64{}, unrelKeys...), saltKeys...)...)
	if got := snap(); !equalCounts(got, want) {
		t.Fatalf("after removal: got %s, want %s", fmtCounts(got), fmtCounts(want))
	}
	b = dec("stored_bigram_eagle_dp1")
	s.batch(1, 0, 0, &b)
	if skips["bigram"] != 1 || !equalCounts(snap(), want) {
		t.Errorf("bigram pages: skips %v, inventory %s", skips, fmtCounts(snap()))
	}
	// A store whose parent the map never saw cannot be chained: dropped, counted.
	orphan := cont
	orphan.Events = orphan.Events[:1]
	s.batch(0, 5, 0, &orphan)
	if skips["unknown_parent"] != 1 {
		t.Errorf("unknown parents: %d, want 1", skips["unknown_parent"])
	}
}

// TestVLLMGroupsAndMedia: only full-attention groups and the GPU medium are indexed; a removal in
// a sliding-window group does not touch the full group's copy; copies are reference counted.
func TestVLLMGroupsAndMedia(t *testing.T) {
	pay := loadPayloads(t, sampleFile(t, "vllm/v0.25.1/events-samples.json"))
	s, snap, skips := streamInto(t, Config{Family: "vllm"})
	b, err := vllm.DecodeBatch(pay["mixed_mm_sliding_window_dp1"])
	if err != nil {
		t.Fatal(err)
	}
	var full []uint64
	for _, ev := range b.Events {
		if ev.Kind == engines.BlockStored && ev.SpecKind == "full_attention" {
			full = ev.BlockHashes
		}
	}
	s.batch(1, 0, 0, &b)
	if got := snap(); !equalCounts(got, setOf(full...)) {
		t.Fatalf("got %s, want the full-attention group's blocks once each %v", fmtCounts(got), full)
	}
	if skips["group_kind"] != 2 {
		t.Errorf("group_kind skips: %d, want 2 (sliding store and removal)", skips["group_kind"])
	}
	cpu := engines.Batch{DPRank: 1, HasDPRank: true, Events: []engines.Event{
		{Kind: engines.BlockStored, BlockHashes: []uint64{77}, Medium: "CPU", TokenIDs: make([]uint32, 32), BlockSize: 32},
		{Kind: engines.BlockStored, BlockHashes: full[:1], Medium: "GPU", HasGroupIdx: true, SpecKind: "full_attention", TokenIDs: make([]uint32, 32), BlockSize: 32},
		{Kind: engines.BlockRemoved, BlockHashes: full[:1], Medium: "CPU"},
	}}
	s.batch(1, 1, 0, &cpu)
	want := setOf(full...)
	want[full[0]] = 2
	if got := snap(); !equalCounts(got, want) || skips["medium"] != 2 {
		t.Errorf("media: got %s (medium skips %d), want %s", fmtCounts(got), skips["medium"], fmtCounts(want))
	}
}

func TestSeqWindowVerdicts(t *testing.T) {
	var w seqWindow
	step := func(seq, digest uint64, replay bool, want Verdict) {
		t.Helper()
		v, _ := w.Check(seq, digest, replay)
		if v != want {
			t.Fatalf("seq %d: %v, want %v", seq, v, want)
		}
		if v.Clears() {
			w.Reset()
		}
		if v.Applies() {
			w.Accept(seq, digest, replay)
		}
	}
	step(5, 1, false, First)
	step(6, 2, false, Next)
	step(6, 2, false, Duplicate)
	step(6, 3, false, Restart)
	step(7, 4, false, Next)
	step(7+Window+1, 5, false, GapKept)
	step(7+Window+1+Window+2, 6, false, GapCleared)
	step(3, 7, false, Regression)
	// After a replay 0..200, live copies anywhere in that range are duplicates.
	w.Reset()
	for s := uint64(0); s <= 200; s++ {
		step(s, s*10, true, map[bool]Verdict{true: First, false: Next}[s == 0])
	}
	step(10, 100, false, Duplicate)
	step(201, 2010, false, Next)
	step(10, 100, false, Regression) // live passed the replay: its memory is gone
	// A replayed sequence this rank never applied (it was missed) is stale, not a regression.
	w.Reset()
	step(0, 1, false, First)
	step(2, 3, false, GapKept)
	step(1, 2, true, Stale)
	if got := w.ResumeFrom(); got != 0 {
		t.Errorf("ResumeFrom with last 2: %d, want 0", got)
	}
	w.Accept(1000, 1, false)
	if got := w.ResumeFrom(); got != 1000+1-Window {
		t.Errorf("ResumeFrom with last 1000: %d, want %d", got, 1000+1-Window)
	}
}

func TestExpandRanks(t *testing.T) {
	got, err := ExpandRanks("ipc:///tmp/kv", 2)
	if err != nil || got[0] != "ipc:///tmp/kv" || got[1] != "ipc:///tmp/kv_dp1" {
		t.Errorf("ipc: %v %v", got, err)
	}
	if _, err := ExpandRanks("tcp://h:65535", 2); err == nil {
		t.Error("port overflow accepted")
	}
	if _, err := ExpandRanks("udp://h:1", 1); err == nil {
		t.Error("udp accepted")
	}
}
