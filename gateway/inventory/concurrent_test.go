package inventory

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// TestConcurrent runs writers on several endpoints over one shared key range (so they share slots,
// overflow chains and shard resizes), endpoint churn, and readers that must always see a pinned
// endpoint's keys exactly. Run it under -race. Each writer's endpoint ends in the state a
// sequential replay of its own operations gives, whatever the interleaving.
func TestConcurrent(t *testing.T) {
	for _, capacity := range []int{0, 500} {
		t.Run(fmt.Sprintf("cap%d", capacity), func(t *testing.T) { runConcurrent(t, capacity) })
	}
}

func runConcurrent(t *testing.T, capacity int) {
	const (
		writers  = 4
		batches  = 250
		universe = 30000
	)
	ix := New(Config{CapacityPerEndpoint: capacity})
	pinnedEP, err := ix.AddEndpoint("pinned")
	must(t, err)
	pinned := make([]uint64, 300)
	for i := range pinned {
		pinned[i] = uint64(i * 97 % universe)
	}
	must(t, ix.Store(pinnedEP, pinned))
	ids := addEndpoints(t, ix, writers)

	// Each writer's operations are a pure function of its seed, replayed later on the naive index.
	type step struct {
		kind int
		keys []uint64
	}
	plan := func(w int) []step {
		rng := rand.New(rand.NewPCG(uint64(w), 77))
		steps := make([]step, batches)
		for i := range steps {
			ks := make([]uint64, 1+rng.IntN(64))
			for j := range ks {
				ks[j] = uint64(rng.IntN(universe))
			}
			kind := rng.IntN(100)
			steps[i] = step{kind: kind, keys: ks}
		}
		return steps
	}
	apply := func(id EndpointID, s step) error {
		switch {
		case s.kind < 55:
			return ix.Store(id, s.keys)
		case s.kind < 98:
			return ix.Remove(id, s.keys)
		default:
			return ix.Clear(id)
		}
	}

	var wg sync.WaitGroup
	var stop atomic.Bool
	errs := make(chan error, 16)
	for w := range writers {
		wg.Go(func() {
			for _, s := range plan(w) {
				if err := apply(ids[w], s); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var readers sync.WaitGroup
	for r := range 2 {
		readers.Go(func() {
			mask := MaskOf(append([]EndpointID{pinnedEP}, ids...)...)
			var out []Score
			for i := 0; !stop.Load(); i++ {
				out = ix.Score(pinned, mask, out)
				if out[0].Endpoint != pinnedEP || out[0].Overlap != len(pinned) || out[0].Prefix != len(pinned) {
					errs <- fmt.Errorf("reader %d: pinned endpoint scored %+v, want %d", r, out[0], len(pinned))
					return
				}
				if i%50 == 0 {
					snap := ix.Snapshot(ids[i%writers])
					for j := 1; j < len(snap); j++ {
						if snap[j-1].Key >= snap[j].Key || snap[j].Count <= 0 {
							errs <- fmt.Errorf("snapshot not sorted or has empty counts")
							return
						}
					}
					_ = ix.Stats()
					_ = ix.Endpoints()
				}
			}
		})
	}
	readers.Go(func() { // a rule update adding and removing an endpoint over and over
		for i := 0; !stop.Load(); i++ {
			id, err := ix.AddEndpoint(fmt.Sprintf("churn%d", i))
			if err != nil {
				errs <- err
				return
			}
			_ = ix.Store(id, pinned[:50])
			_ = ix.RemoveEndpoint(id)
		}
	})
	wg.Wait()
	stop.Store(true)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for w := range writers {
		ref := newNaive(capacity)
		for _, s := range plan(w) {
			switch {
			case s.kind < 55:
				ref.store(0, s.keys)
			case s.kind < 98:
				ref.remove(0, s.keys)
			default:
				ref.clear(0)
			}
		}
		if diff := cmp.Diff(ref.snapshot(0), ix.Snapshot(ids[w]), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("writer %d (-want +got):\n%s", w, diff)
		}
	}
	if got := ix.Snapshot(pinnedEP); len(got) != len(pinned) {
		t.Errorf("pinned endpoint holds %d keys, want %d", len(got), len(pinned))
	}
}
