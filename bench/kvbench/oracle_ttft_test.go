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
	for len(o.running[0]) > 0 {
		for id := range o.running[0] {
			o.done(ticket{idx: 0, job: id, keys: keys})
		}
	}
	if len(o.pending[0]) != 0 || len(o.queued[0]) != 0 {
		t.Fatalf("pending left: %v", o.pending[0])
	}
	if t6 := o.pick(q, keys); t6.idx != 0 {
		t.Fatalf("after done: %+v", t6)
	}
}

// An engine that runs late: its first request overruns (no done) while more queue behind it. The
// engine is FIFO with 1 slot, so each queued request still needs its whole service time (0.1 ms
// prefill + 2 decode steps of 2 ms = 4.1 ms) after the overrunning one ends. The oracle used to
// read the queue off the ends it predicted at each arrival, all in the past by then, and saw a free
// slot; it now waits for the true ends (done).
func TestTTFTOracleWaitsForTrueEnds(t *testing.T) {
	keys := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	caches := []map[uint64]int{{1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1}, {}}
	now := time.Unix(100, 0)
	o := newTTFTOracleOf(2, func(i int) map[uint64]int { return caches[i] }, 16, 1, 100*time.Microsecond, 2*time.Millisecond, 3, func() time.Time { return now })
	q := &Request{Tokens: make([]uint32, 129)}
	// Every 10 ms one more arrives and nothing ends. On endpoint 0 the k-th (k ≥ 2) waits for the
	// k − 2 queued ahead of it, 4.1 ms each, then prefills 0.1 ms: 0.1, 4.2, 8.3, 12.4 ms, under
	// endpoint 1's 12.9 ms uncached prefill; the 6th would wait 16.4 ms: endpoint 1.
	var got []int
	var first ticket
	for k := range 6 {
		tk := o.pick(q, keys)
		if k == 0 {
			first = tk
		}
		got = append(got, tk.idx)
		now = now.Add(10 * time.Millisecond)
	}
	if want := []int{0, 0, 0, 0, 0, 1}; !slices.Equal(got, want) {
		t.Fatalf("placements %v, want %v", got, want)
	}
	// The overrunning request ends: the next one gets its slot at that moment and ends 4.1 ms on.
	o.done(first)
	if len(o.running[0]) != 1 || len(o.queued[0]) != 3 {
		t.Fatalf("after done: %d running, %d queued", len(o.running[0]), len(o.queued[0]))
	}
	if s := o.startAt(0, now); s.Sub(now) != 4100*time.Microsecond+3*4100*time.Microsecond {
		t.Fatalf("next slot on endpoint 0 in %v, want 16.4 ms", s.Sub(now))
	}
}

// smallCase is a few requests on 2 endpoints of 1 slot: 129-token prompts (8 blocks + 1 token),
// 100 µs a prefilled token, 2 decode steps of 1 ms.
type smallCase struct {
	held []map[uint64]int
	reqs []smallReq
}

type smallReq struct {
	at   time.Duration
	keys []uint64
}

const smallTokens, smallBS = 129, 16

// sum is the TTFTs' sum of placement place, the oracle's model run forward: FIFO on one slot, a
// prompt's blocks held once placed.
func (c smallCase) sum(place []int) time.Duration {
	free := make([]time.Duration, len(c.held))
	have := make([]map[uint64]bool, len(c.held))
	for i, h := range c.held {
		have[i] = map[uint64]bool{}
		for k := range h {
			have[i][k] = true
		}
	}
	var total time.Duration
	for r, q := range c.reqs {
		i, hit := place[r], 0
		for hit < len(q.keys) && have[i][q.keys[hit]] {
			hit++
		}
		start := max(q.at, free[i])
		pre := time.Duration(smallTokens-hit*smallBS) * 100 * time.Microsecond
		free[i] = start + pre + 2*time.Millisecond
		total += start - q.at + pre
		for _, k := range q.keys {
			have[i][k] = true
		}
	}
	return total
}

// greedy is the ttft oracle's placements, each request picked at its arrival.
func (c smallCase) greedy() []int {
	t0 := time.Unix(100, 0)
	now := t0
	o := newTTFTOracleOf(len(c.held), func(i int) map[uint64]int { return c.held[i] }, smallBS, 1, 100*time.Microsecond, time.Millisecond, 3, func() time.Time { return now })
	var got []int
	for _, q := range c.reqs {
		now = t0.Add(q.at)
		got = append(got, o.pick(&Request{Tokens: make([]uint32, smallTokens)}, q.keys).idx)
	}
	return got
}

// best is the placement of least TTFT sum, by exhaustion (2 endpoints).
func (c smallCase) best() ([]int, time.Duration) {
	var best []int
	var bestSum time.Duration
	for m := range 1 << len(c.reqs) {
		place := make([]int, len(c.reqs))
		for r := range place {
			place[r] = m >> r & 1
		}
		if s := c.sum(place); best == nil || s < bestSum {
			best, bestSum = place, s
		}
	}
	return best, bestSum
}

func chain(from uint64, n int) []uint64 {
	ks := make([]uint64, n)
	for i := range ks {
		ks[i] = from + uint64(i)
	}
	return ks
}

func heldOf(keys []uint64) map[uint64]int {
	m := map[uint64]int{}
	for _, k := range keys {
		m[k] = 1
	}
	return m
}

// A tie the oracle broke wrong: endpoint 0 holds prompt P's 7 blocks, endpoint 1 nothing. Q (new
// everywhere) arrives at 0, P at 1 ms and P again at 2 ms. Q costs 12.9 ms on either endpoint; the
// oracle took the first index, so the first P computed its prompt whole on endpoint 1 rather than
// wait 13.9 ms, and the second waited on endpoint 0: 12.9 + 12.9 + 14.6 = 40.4 ms. Ties now go to
// the endpoint holding fewer blocks: Q on endpoint 1, both P on endpoint 0, 12.9 + 1.7 + 4.4 =
// 19.0 ms, the least of the 8 placements.
func TestTTFTOracleTieEvictsLeast(t *testing.T) {
	p := chain(1, 7)
	c := smallCase{held: []map[uint64]int{heldOf(p), {}}, reqs: []smallReq{
		{0, chain(101, 8)}, {time.Millisecond, append(p[:7:7], 201)}, {2 * time.Millisecond, append(p[:7:7], 301)}}}
	if got := c.sum([]int{0, 1, 0}); got != 40400*time.Microsecond {
		t.Fatalf("the first index's placement sums %v, want 40.4ms", got)
	}
	best, sum := c.best()
	if !slices.Equal(best, []int{1, 0, 0}) || sum != 19*time.Millisecond {
		t.Fatalf("optimum %v (%v), want [1 0 0] (19ms)", best, sum)
	}
	if got := c.greedy(); !slices.Equal(got, best) {
		t.Fatalf("oracle %v (%v), want the optimum %v", got, c.sum(got), best)
	}
}

// Where greedy stays short of the optimum, by exhaustion: endpoint 0 holds P, endpoint 1 holds R
// (7 blocks each). P arrives at 0 (endpoint 0, 1.7 ms), Q (new everywhere) at 0.5 ms, R at 1 ms.
// Greedy puts Q on the idle endpoint 1 (12.9 ms against 3.2 + 12.9 behind P), so R, behind Q there
// (14.4 + 1.7), computes its prompt whole on endpoint 0 (2.7 + 12.9): 1.7 + 12.9 + 15.6 = 30.2 ms.
// Q behind P and R on its holder is 1.7 + 16.1 + 1.7 = 19.5 ms: greedy's sum is 1.55× the
// optimum, and only knowing R's arrival when placing Q avoids it.
func TestTTFTOracleGreedyAgainstExhaustive(t *testing.T) {
	p, r := chain(1, 7), chain(11, 7)
	c := smallCase{held: []map[uint64]int{heldOf(p), heldOf(r)}, reqs: []smallReq{
		{0, append(p[:7:7], 201)}, {500 * time.Microsecond, chain(101, 8)}, {time.Millisecond, append(r[:7:7], 301)}}}
	if got := c.greedy(); !slices.Equal(got, []int{0, 1, 0}) || c.sum(got) != 30200*time.Microsecond {
		t.Fatalf("greedy %v (%v), want [0 1 0] (30.2ms)", got, c.sum(got))
	}
	if best, sum := c.best(); !slices.Equal(best, []int{0, 0, 1}) || sum != 19500*time.Microsecond {
		t.Fatalf("optimum %v (%v), want [0 0 1] (19.5ms)", best, sum)
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
