package kvbench

import (
	"slices"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/route"
)

// The ttft oracle on a constructed state: 2 endpoints, 1 slot each, 100 µs a token, 1 ms a
// decode step, 3 output tokens (2 decode steps), 16-token blocks.
func TestTTFTOracleIsTheHandComputation(t *testing.T) {
	keys := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	caches := []map[uint64]int{{1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1}, {}}
	now := time.Unix(100, 0)
	o := newTTFTOracleOf(2, func(i int) map[uint64]int { return caches[i] }, 16, 1, 100*time.Microsecond, time.Millisecond, 3, func() time.Time { return now })
	q := &Request{Tokens: make([]uint32, 129)} // 8 full blocks + 1 token: 7 cached on endpoint 0
	// Idle: endpoint 0 prefills 129 − 112 = 17 tokens (1.7 ms), endpoint 1 all 129 (12.9 ms) → 0.
	t1 := o.pick(q, keys)
	if t1.idx != 0 || t1.predicted != 7*16 {
		t.Fatalf("first: %+v", t1)
	}
	// Endpoint 0's one slot is busy until now + 1.7 + 2 = 3.7 ms, and it is computing block 8 too
	// (in flight counts as held): the same prompt there waits 3.7 ms and prefills 1 token, a
	// 3.8 ms TTFT, and holds the slot 2.1 ms. The k-th such request (k ≥ 2) waits
	// 3.7 + 2.1·(k−2) ms: 12.1 ms for the 6th (12.2 < 12.9 → 0), 14.2 for the 7th (→ 1).
	var got []int
	for range 6 {
		got = append(got, o.pick(q, keys).idx)
	}
	if want := []int{0, 0, 0, 0, 0, 1}; !slices.Equal(got, want) {
		t.Fatalf("second to seventh: %v, want %v", got, want)
	}
	// Done gives the slots back: with endpoint 0 empty again it wins.
	for id := range o.ends[0] {
		o.done(ticket{idx: 0, job: id, keys: keys})
	}
	if len(o.pending[0]) != 0 {
		t.Fatalf("pending left: %v", o.pending[0])
	}
	if t6 := o.pick(q, keys); t6.idx != 0 {
		t.Fatalf("after done: %+v", t6)
	}
}

func TestBurstTimeKeepsTheMeanRate(t *testing.T) {
	// 1 s of mean-rate time is 250 ms of bursts: one half-second period's 125 ms burst, then the
	// next period's whole burst.
	for _, c := range []struct {
		t    float64
		want time.Duration
	}{{0, 0}, {0.25, 62500 * time.Microsecond}, {0.5, burstPeriod}, {0.75, burstPeriod + 62500*time.Microsecond}, {2, 4 * burstPeriod}} {
		if got := burstTime(c.t); got != c.want {
			t.Errorf("burstTime(%g) = %v, want %v", c.t, got, c.want)
		}
	}
}

// TestOraclesReadTheHostTier: both oracles continue an endpoint's GPU prefix on its true offload
// tier — the ttft oracle at the transfer time (here a tenth of prefill), the hard-law oracle with
// the prefill share it saves — and predict the host blocks as cached, as the engine reports them.
func TestOraclesReadTheHostTier(t *testing.T) {
	keys := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	gpu := []map[uint64]int{{1: 1, 2: 1}, {1: 1, 2: 1, 3: 1, 4: 1}}
	host := []map[uint64]int{{3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 9: 1}, {}}
	now := time.Unix(100, 0)
	q := &Request{Tokens: make([]uint32, 129)}
	o := newTTFTOracleOf(2, func(i int) map[uint64]int { return gpu[i] }, 16, 1, 100*time.Microsecond, time.Millisecond, 3, func() time.Time { return now })
	o.hosts, o.transfer = func(i int) map[uint64]int { return host[i] }, 10*time.Microsecond
	// Endpoint 0: 2 on the GPU + 5 on the host: 17 tokens prefilled (1.7 ms) + 80 loaded (0.8 ms)
	// = 2.5 ms; endpoint 1: 4 on the GPU, 65 tokens prefilled = 6.5 ms → 0, 7 blocks cached.
	if t1 := o.pick(q, keys); t1.idx != 0 || t1.predicted != 7*16 {
		t.Fatalf("ttft oracle: %+v, want endpoint 0 with 112 tokens cached", t1)
	}
	h := newOracleOf(2, func(i int) map[uint64]int { return gpu[i] }, route.Law{Kind: route.LawHard, FactorPct: 175, CapFloor: 8}, 16, 512)
	h.hosts, h.saving = func(i int) map[uint64]int { return host[i] }, 0.9
	// Endpoint 0 scores 2 + ⌊5 · 0.9⌋ = 6 > endpoint 1's 4.
	if t2 := h.pick(q, keys); t2.idx != 0 || t2.predicted != 7*16 || h.cands[0].Score != 6 {
		t.Fatalf("hard-law oracle: %+v (score %d), want endpoint 0 scoring 6 with 112 tokens cached", t2, h.cands[0].Score)
	}
}
