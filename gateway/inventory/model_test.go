package inventory

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// TestModel runs thousands of random operations against the index and the naive map index and
// requires the same resident counts after every step, and the same scores and snapshots
// throughout. A small key universe makes keys shared by many endpoints and re-stored often; a few
// wide-range keys make shards grow and shrink.
func TestModel(t *testing.T) {
	for _, tc := range []struct {
		seed            uint64
		capacity, eps   int
		universe, batch int
		steps           int
	}{
		{1, 0, 5, 400, 40, 6000},
		{2, 25, 5, 400, 40, 6000},
		{3, 7, 12, 400, 40, 6000},
		{4, 0, 40, 400, 40, 4000},
		{5, 300, 3, 400, 40, 6000},
		// Tens of thousands of keys: shards grow and shrink, FIFOs compact.
		{6, 0, 4, 60000, 800, 800},
		{7, 3000, 4, 60000, 800, 800},
	} {
		t.Run(fmt.Sprintf("seed%d_cap%d_eps%d_keys%d", tc.seed, tc.capacity, tc.eps, tc.universe), func(t *testing.T) {
			runModel(t, tc.seed, tc.capacity, tc.eps, tc.universe, tc.batch, tc.steps)
		})
	}
}

func runModel(t *testing.T, seed uint64, capacity, neps, universe, batch, steps int) {
	if raceEnabled {
		steps /= 5
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	ix := New(Config{CapacityPerEndpoint: capacity})
	ref := newNaive(capacity)
	ids := addEndpoints(t, ix, neps)
	names := 0
	key := func() uint64 {
		if rng.IntN(10) == 0 {
			return rng.Uint64()
		}
		return uint64(rng.IntN(universe))
	}
	keys := func(n int) []uint64 {
		ks := make([]uint64, n)
		for i := range ks {
			ks[i] = key()
		}
		return ks
	}
	check := func(step int) {
		t.Helper()
		for i, id := range ids {
			if got, want := ix.Resident(id), ref.res[id]; got != want {
				t.Fatalf("step %d: endpoint %d resident %d, want %d", step, i, got, want)
			}
		}
	}
	var all Mask
	for _, id := range ids {
		all.Set(id)
	}
	var got, want []Score
	for step := 0; step < steps; step++ {
		id := ids[rng.IntN(len(ids))]
		switch r := rng.IntN(100); {
		case r < 45:
			ks := keys(1 + rng.IntN(batch))
			must(t, ix.Store(id, ks))
			ref.store(id, ks)
		case r < 85:
			ks := keys(1 + rng.IntN(batch*3/2))
			if rng.IntN(2) == 0 { // remove keys the endpoint holds, as an engine would
				snap := ref.snapshot(id)
				for i := range ks {
					if len(snap) > 0 {
						ks[i] = snap[rng.IntN(len(snap))].Key
					}
				}
			}
			must(t, ix.Remove(id, ks))
			ref.remove(id, ks)
		case r < 88:
			must(t, ix.Clear(id))
			ref.clear(id)
		case r < 89: // a rule update replaces an endpoint
			must(t, ix.RemoveEndpoint(id))
			ref.clear(id)
			names++
			nid, err := ix.AddEndpoint(fmt.Sprintf("new%d", names))
			must(t, err)
			if nid != id {
				t.Fatalf("replacement got id %d, want %d", nid, id)
			}
		default:
			prompt := keys(1 + rng.IntN(60))
			if rng.IntN(2) == 0 { // a prompt the first endpoint holds a prefix of
				snap := ref.snapshot(ids[0])
				for i := range prompt[:len(prompt)/2] {
					if len(snap) > 0 {
						prompt[i] = snap[rng.IntN(len(snap))].Key
					}
				}
			}
			got = ix.Score(prompt, all, got)
			want = ref.score(prompt, all, want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("step %d: score (-want +got):\n%s", step, diff)
			}
		}
		check(step)
		if step%500 == 0 || step == steps-1 {
			for i, id := range ids {
				if diff := cmp.Diff(ref.snapshot(id), ix.Snapshot(id), cmpopts.EquateEmpty()); diff != "" {
					t.Fatalf("step %d: endpoint %d snapshot (-want +got):\n%s", step, i, diff)
				}
			}
		}
	}
	st := ix.Stats()
	if st.Retirements != ref.retired || st.UnknownRemoves != ref.unknown {
		t.Errorf("retirements %d unknown %d, want %d %d", st.Retirements, st.UnknownRemoves, ref.retired, ref.unknown)
	}
	if capacity == 0 && st.Retirements != 0 {
		t.Errorf("retirements without a cap: %d", st.Retirements)
	}
	// Clearing everything empties the table: no key, node or FIFO entry is leaked.
	for _, id := range ids {
		must(t, ix.Clear(id))
	}
	if st := ix.Stats(); st.Keys != 0 || st.Resident != 0 || st.OverflowNodes != 0 {
		t.Errorf("after clearing all: %+v", st)
	}
}
