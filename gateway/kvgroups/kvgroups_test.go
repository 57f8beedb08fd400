package kvgroups

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// chain is a prompt of n keys: key i is 1000+i.
func chain(n int) []uint64 {
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = uint64(1000 + i)
	}
	return keys
}

func pick(keys []uint64, idx ...int) []uint64 {
	out := make([]uint64, 0, len(idx))
	for _, i := range idx {
		out = append(out, keys[i])
	}
	return out
}

func span(a, b int) []int {
	var out []int
	for i := a; i < b; i++ {
		out = append(out, i)
	}
	return out
}

// TestSlidingWindowTail: full attention holds 10 blocks; the sliding-window group (window 48
// tokens = ceil(47/16) = 3 blocks) holds only some. The hit ends after the last run of 3 held
// blocks within the full prefix, or is the run from block 0 when there is none.
func TestSlidingWindowTail(t *testing.T) {
	keys := chain(12)
	for _, c := range []struct {
		name  string
		swa   []int
		full  int
		want  int
		limit string
	}{
		{"all held", span(0, 12), 10, 10, "full_attention"},
		{"tail evicted", span(0, 6), 10, 6, "group 1 (sliding_window, window 48)"},
		{"window tail only", span(5, 10), 10, 10, "full_attention"},
		{"hole inside the window", []int{0, 1, 2, 3, 4, 5, 6, 7, 9}, 10, 8, "group 1 (sliding_window, window 48)"},
		{"no run of three, run from 0", []int{0, 1, 4, 5, 7, 8}, 10, 2, "group 1 (sliding_window, window 48)"},
		{"nothing held", nil, 10, 0, "group 1 (sliding_window, window 48)"},
		{"full prefix bounds", span(0, 12), 4, 4, "full_attention"},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := New(16)
			e := x.Endpoint(0)
			e.Learn(0, Spec{Kind: KindFull, BlockSize: 16})
			e.Learn(1, Spec{Kind: KindSlidingWindow, Window: 48, BlockSize: 16})
			e.Store(0, 1, pick(keys, c.swa...), true)
			r, ok := x.Hit(0, keys, c.full)
			if !ok || r.Blocks != c.want || r.Limit != c.limit {
				t.Errorf("hit %+v ok %v, want %d limited by %q", r, ok, c.want, c.limit)
			}
		})
	}
}

// TestNotHybrid: an endpoint with full-attention groups only, or none learned, keeps the
// inventory's score (ok false), so the router's one-index path stays.
func TestNotHybrid(t *testing.T) {
	x := New(16)
	if _, ok := x.Hit(0, chain(4), 3); ok {
		t.Error("an empty index answered a hit")
	}
	e := x.Endpoint(0)
	e.Learn(0, Spec{Kind: KindFull, BlockSize: 16})
	e.Learn(1, Spec{Kind: KindNone, BlockSize: 16})
	if _, ok := x.Hit(0, chain(4), 3); ok || x.Hybrid() {
		t.Error("full + cross attention is treated as hybrid")
	}
	e.Learn(2, Spec{Kind: KindMamba, BlockSize: 16})
	if _, ok := x.Hit(0, chain(4), 3); !ok || !x.Hybrid() {
		t.Error("a Mamba group did not make the endpoint hybrid")
	}
	x.RemoveEndpoint(0)
	if x.Hybrid() {
		t.Error("removing the endpoint left the index hybrid")
	}
}

// TestMambaCheckpoint: the hit is the last checkpointed block within the full prefix; a Mamba
// group of 4-key blocks (block size 64 over 16-token keys) checkpoints at key 4j+3, and the full
// prefix is aligned down to the 4-key scheduler block.
func TestMambaCheckpoint(t *testing.T) {
	keys := chain(16)
	x := New(16)
	e := x.Endpoint(3)
	e.Learn(0, Spec{Kind: KindFull, BlockSize: 16})
	e.Learn(1, Spec{Kind: KindMamba, BlockSize: 64})
	e.Store(0, 1, pick(keys, 3, 7), false) // coarse blocks 0 and 1 checkpointed
	for _, c := range []struct{ full, want int }{{16, 8}, {10, 8}, {7, 4}, {3, 0}} {
		r, _ := x.Hit(3, keys, c.full)
		if r.Blocks != c.want {
			t.Errorf("full %d: hit %+v, want %d", c.full, r, c.want)
		}
	}
	// A removal drops the checkpoint: the hit falls back to the previous one.
	e.Remove(0, 1, pick(keys, 7))
	if r, _ := x.Hit(3, keys, 16); r.Blocks != 4 || r.Limit != "group 1 (mamba)" {
		t.Errorf("after removal: %+v, want 4 limited by the Mamba group", r)
	}
}

// TestFixedPoint: two non-full groups lower each other's candidate until a pass changes nothing.
func TestFixedPoint(t *testing.T) {
	keys := chain(12)
	x := New(16)
	e := x.Endpoint(0)
	e.Learn(0, Spec{Kind: KindFull, BlockSize: 16})
	e.Learn(1, Spec{Kind: KindSlidingWindow, Window: 33, BlockSize: 16}) // 2 blocks
	e.Learn(2, Spec{Kind: KindMamba, BlockSize: 16})
	e.Store(0, 1, pick(keys, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9), true)
	e.Store(0, 2, pick(keys, 9, 5), true) // checkpoints at 10 and 6 blocks
	e.Remove(0, 1, pick(keys, 8))         // the window before 10 is broken: SWA says 8, Mamba then 6
	r, _ := x.Hit(0, keys, 12)
	if r.Blocks != 6 || r.Limit != "group 2 (mamba)" {
		t.Errorf("hit %+v, want 6 limited by the Mamba group", r)
	}
}

// TestRanks: each rank's groups are their own; the best rank wins.
func TestRanks(t *testing.T) {
	keys := chain(8)
	x := New(16)
	e := x.Endpoint(0)
	e.Learn(0, Spec{Kind: KindFull, BlockSize: 16})
	e.Learn(1, Spec{Kind: KindSlidingWindow, Window: 17, BlockSize: 16}) // 1 block
	e.Store(0, 1, pick(keys, 2), true)
	e.Store(1, 1, pick(keys, 5), true)
	if r, _ := x.Hit(0, keys, 8); r.Blocks != 6 {
		t.Errorf("hit %+v, want rank 1's 6", r)
	}
	e.Clear()
	if r, _ := x.Hit(0, keys, 8); r.Blocks != 0 || e.Len() != 0 {
		t.Errorf("after clear: %+v, %d entries", r, e.Len())
	}
}

// TestPresenceAndCopies: under presence a re-emitted store is not a second copy; under copies it is.
func TestPresenceAndCopies(t *testing.T) {
	keys := chain(2)
	for _, presence := range []bool{true, false} {
		x := New(16)
		e := x.Endpoint(0)
		e.Learn(1, Spec{Kind: KindSlidingWindow, Window: 17, BlockSize: 16})
		e.Store(0, 1, keys[:1], presence)
		e.Store(0, 1, keys[:1], presence)
		e.Remove(0, 1, keys[:1])
		r, _ := x.Hit(0, keys, 0) // no full group learned: the group alone decides
		if want := map[bool]int{true: 0, false: 1}[presence]; r.Blocks != want {
			t.Errorf("presence %v: hit %+v, want %d", presence, r, want)
		}
	}
}

// TestBadGeometry: a group whose block is no whole number of keys refuses any hit, saying why.
func TestBadGeometry(t *testing.T) {
	x := New(16)
	e := x.Endpoint(0)
	e.Learn(0, Spec{Kind: KindFull, BlockSize: 16})
	e.Learn(1, Spec{Kind: KindMamba, BlockSize: 24})
	r, ok := x.Hit(0, chain(4), 4)
	if !ok || r.Blocks != 0 || !strings.Contains(r.Limit, "block size 24 is not a multiple of 16") {
		t.Errorf("hit %+v ok %v", r, ok)
	}
}

// TestNeverAboveFull: whatever the groups hold, the hit never exceeds the full-attention prefix
// nor the prompt (random residency, the rule's invariant).
func TestNeverAboveFull(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	keys := chain(40)
	for i := 0; i < 500; i++ {
		x := New(16)
		e := x.Endpoint(0)
		e.Learn(0, Spec{Kind: KindFull, BlockSize: 16})
		e.Learn(1, Spec{Kind: KindSlidingWindow, Window: 1 + r.IntN(100), BlockSize: 16})
		e.Learn(2, Spec{Kind: KindMamba, BlockSize: 16 * (1 + r.IntN(3))})
		for g := 1; g <= 2; g++ {
			var held []int
			for j := range keys {
				if r.IntN(3) > 0 {
					held = append(held, j)
				}
			}
			e.Store(0, g, pick(keys, held...), true)
		}
		full := r.IntN(41)
		h, _ := x.Hit(0, keys, full)
		if h.Blocks < 0 || h.Blocks > full {
			t.Fatalf("case %d: hit %d above full prefix %d", i, h.Blocks, full)
		}
	}
}
