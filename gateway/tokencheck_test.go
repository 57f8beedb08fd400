package gateway

import (
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/exactness"
)

// TestTokenCheckOutcomes: the check's verdict per window. A resident deepest block is reproduced
// and resets the run; absent with blocks stored and none removed is not reproduced; absent with
// nothing stored, or with any removal, retirement or clear in the window, is inconclusive and
// leaves the run alone; TokenDriftChecks not-reproduced in a row set the token_drift hold.
func TestTokenCheckOutcomes(t *testing.T) {
	g, rt := tokenCheckRule(t, 2, 100)
	g.opts.TokenDriftChecks = 2
	x := rt.epExact[1]
	id := x.ep.ID
	held, absent := uint64(1)<<40|7, uint64(1)<<63
	check := func(key uint64, window func()) {
		t.Helper()
		before, _ := endpointCounters(rt.index, id)
		window()
		x.mu.Lock()
		x.tokenPending++
		x.mu.Unlock()
		g.finishTokenCheck(rt, x, key, 4, before, time.Now(), time.Second)
	}
	stored := func() {
		if err := rt.index.Store(id, []uint64{uint64(time.Now().UnixNano())}); err != nil {
			t.Fatal(err)
		}
	}
	nothing := func() {}
	removed := func() {
		stored()
		if err := rt.index.Remove(id, []uint64{uint64(1)<<40 | 3}); err != nil {
			t.Fatal(err)
		}
	}
	cleared := func() {
		stored()
		if err := rt.index.Clear(id); err != nil {
			t.Fatal(err)
		}
		stored()
	}
	want := func(rep, not, inc uint64, run int, suspended bool) {
		t.Helper()
		x.mu.Lock()
		tc, r := x.tokens, x.tokenRun
		x.mu.Unlock()
		if tc.Reproduced != rep || tc.NotReproduced != not || tc.Inconclusive != inc || r != run || x.held(exactness.TokenDrift) != suspended {
			t.Fatalf("got %+v run %d held %v; want reproduced %d, not %d, inconclusive %d, run %d, held %v", tc, r, x.held(exactness.TokenDrift), rep, not, inc, run, suspended)
		}
	}
	check(held, stored)
	want(1, 0, 0, 0, false)
	check(absent, stored)
	want(1, 1, 0, 1, false)
	check(absent, nothing) // no event in the window: events lag
	want(1, 1, 1, 1, false)
	check(absent, removed) // the block may have been evicted
	want(1, 1, 2, 1, false)
	check(held, stored) // resets the run
	want(2, 1, 2, 0, false)
	check(absent, stored)
	want(2, 2, 2, 1, false)
	check(absent, cleared)
	want(2, 2, 3, 1, false)
	check(absent, stored)
	want(2, 3, 3, 2, true)
	if r := x.ep.Fenced(); r == "" || !x.held(exactness.TokenDrift) {
		t.Fatalf("not fenced: %q", r)
	}
	// The operator's clear lifts it and restarts the run.
	if st, err := g.ClearExactHold("pool", "e1", "token_drift"); err != nil || st.State != "eligible" || x.ep.Fenced() != "" {
		t.Fatalf("clear: %+v %v", st, err)
	}
	want(2, 3, 3, 0, false)
}
