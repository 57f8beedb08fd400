package sim

import (
	"testing"

	"github.com/kvexact/kvexact/engines"
)

// TestVLLMBlockPool pins the block pool rules real vLLM showed in the differential test
// (gateway/vllme2e TestSimulatorHeldToEngine): the null block is never usable, a freed block
// holding no cached key is reused before any cached block is evicted, and removals carry the
// KV-cache group as stores do.
func TestVLLMBlockPool(t *testing.T) {
	if c := newCache(5, 4, policyFor("sglang"), nil); c.capacity() != 5 {
		t.Fatalf("sglang pool of 5: %d usable blocks, want 5 (no null block)", c.capacity())
	}
	c := newCache(5, 4, policyFor("vllm"), func(s *seq, first, last int) engines.Event {
		return engines.Event{Kind: engines.BlockStored, BlockHashes: append([]uint64(nil), s.keys[first:last]...)}
	})
	if c.capacity() != 4 {
		t.Fatalf("vllm pool of 5 blocks: %d usable, want 4 (one is the null block)", c.capacity())
	}
	run := func(keys []uint64, tokens int) []engines.Event {
		t.Helper()
		s := &seq{keys: keys}
		if !c.admit(s, tokens, tokens) {
			t.Fatalf("%d tokens not admitted (%d free)", tokens, c.nfree)
		}
		if !c.grow(s, tokens) {
			t.Fatalf("%d tokens: pool exhausted", tokens)
		}
		c.store(s, tokens/c.bs)
		c.release(s)
		return c.take()
	}
	// Two requests of one full block and a partial one each: each frees one cached block and one
	// block without a key.
	run([]uint64{0xa}, 6)
	run([]uint64{0xb}, 6)
	// Two blocks needed, four free: the two keyless ones are taken, nothing is evicted.
	for _, ev := range run([]uint64{0xc1, 0xc2}, 8) {
		if ev.Kind == engines.BlockRemoved {
			t.Fatalf("evicted %x while blocks without a key were free", ev.BlockHashes)
		}
	}
	if keys := c.snapshot(); keys[0xa] != 1 || keys[0xb] != 1 {
		t.Fatalf("cached after the third request: %v, want 0xa and 0xb kept", keys)
	}
	// Four blocks: the pool evicts, least recently freed first, each removal in group 0.
	var removed []uint64
	for _, ev := range run([]uint64{0xd1, 0xd2, 0xd3, 0xd4}, 16) {
		if ev.Kind != engines.BlockRemoved {
			continue
		}
		if !ev.HasGroupIdx || ev.GroupIdx != 0 {
			t.Fatalf("removal %x without group_idx 0: %+v", ev.BlockHashes, ev)
		}
		removed = append(removed, ev.BlockHashes...)
	}
	if want := []uint64{0xa, 0xb, 0xc2, 0xc1}; len(removed) != 4 || removed[0] != want[0] || removed[1] != want[1] || removed[2] != want[2] || removed[3] != want[3] {
		t.Fatalf("removed %x, want %x (least recently freed first, a request's tail before its prefix)", removed, want)
	}
}
