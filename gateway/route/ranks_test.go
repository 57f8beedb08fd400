package route

import (
	"testing"

	"github.com/kvexact/kvexact/gateway/inventory"
)

// TestRanksScore: pinned, an endpoint scores its best rank (ties to the lowest); unpinned, the
// least any rank holds; a clear clears every rank; an endpoint without ranks is not scored here.
func TestRanksScore(t *testing.T) {
	r := NewRanks(inventory.Config{})
	if err := r.Add(7, "e7", 3); err != nil {
		t.Fatal(err)
	}
	if err := r.Add(8, "e8", 1); err != nil || r.Of(8) != nil {
		t.Fatalf("one rank registers nothing: %v %v", err, r.Of(8))
	}
	keys := []uint64{1, 2, 3, 4}
	_ = r.Store(7, 0, []uint64{1, 2})
	_ = r.Store(7, 1, []uint64{1, 2, 3})
	_ = r.Store(7, 2, []uint64{1, 2, 3})
	if s, rank, ok := r.score(7, keys, true, true); !ok || rank != 1 || s.Prefix != 3 || s.Endpoint != 7 {
		t.Fatalf("pinned: %+v rank %d ok %v, want prefix 3 on rank 1", s, rank, ok)
	}
	if s, rank, ok := r.score(7, keys, false, true); !ok || rank != -1 || s.Prefix != 2 || s.Overlap != 2 {
		t.Fatalf("unpinned: %+v rank %d, want what every rank holds (2)", s, rank)
	}
	_ = r.RemoveKeys(7, 1, []uint64{3})
	if _, rank, _ := r.score(7, keys, true, true); rank != 2 {
		t.Fatalf("after rank 1 evicted its third block the best rank is 2, got %d", rank)
	}
	r.Clear(7)
	if s, _, _ := r.score(7, keys, true, true); s.Overlap != 0 {
		t.Fatalf("a clear leaves %+v", s)
	}
	if _, _, ok := r.score(8, keys, true, true); ok {
		t.Fatal("an endpoint without ranks was scored by rank")
	}
	r.Remove(7)
	if r.Of(7) != nil {
		t.Fatal("removed endpoint keeps its ranks")
	}
}
