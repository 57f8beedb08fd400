package kvbench

import (
	"slices"
	"sync"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
)

// PolicyOracleTTFT is the greedy time-to-first-token bound: at each arrival, the endpoint with the
// lowest true TTFT given the simulators' true cache contents, the requests in flight on each one
// and the simulators' own service times.
const PolicyOracleTTFT = "oracle ttft"

// ttftOracle knows what the simulated engines do: a request waits FIFO for one of MaxConcurrency
// slots, then prefills its uncached tokens at PrefillPerToken each, then decodes MaxTokens − 1
// more at DecodePerToken each, holding the slot throughout. It keeps, per endpoint, the time each
// request in flight will give its slot back, so a new request's start is now while a slot is free,
// else the moment the (n − slots + 1)-th of the n in flight ends. Greedy: each arrival is placed
// without regard to the ones after it (a request that takes the last free slot of a warm endpoint
// may cost the next, deeper holder more than it gains), so it is the best one-step decision with
// perfect state, not the optimum over the whole run. KV-block waits are not modelled (the pools'
// KV cache holds every request of a full batch).
type ttftOracle struct {
	mu       sync.Mutex
	caches   func(i int) map[uint64]int
	hosts    func(i int) map[uint64]int // the offload tiers (nil: none), loaded at transfer each token
	transfer time.Duration
	bs       int
	slots    int
	prefill  time.Duration
	decode   time.Duration
	maxTok   int
	pending  []map[uint64]int // endpoint → key → requests in flight computing it
	ends     []map[uint64]time.Time
	next     uint64
	now      func() time.Time
	scratchE []time.Time
}

func newTTFTOracle(sims []*sim.Engine, maxTokens int) *ttftOracle {
	c := sims[0].Config()
	o := newTTFTOracleOf(len(sims), func(i int) map[uint64]int { return sims[i].CacheKeys(0) },
		c.BlockSize, c.MaxConcurrency, c.PrefillPerToken, c.DecodePerToken, maxTokens, time.Now)
	if c.OffloadBlocks > 0 {
		o.hosts, o.transfer = func(i int) map[uint64]int { return sims[i].OffloadKeys(0) }, c.OffloadPerToken
	}
	return o
}

func newTTFTOracleOf(n int, caches func(int) map[uint64]int, bs, slots int, prefill, decode time.Duration, maxTokens int, now func() time.Time) *ttftOracle {
	o := &ttftOracle{caches: caches, bs: bs, slots: max(slots, 1), prefill: prefill, decode: decode, maxTok: max(maxTokens, 1),
		pending: mapsOf[int](n), ends: make([]map[uint64]time.Time, n), now: now}
	for i := range o.ends {
		o.ends[i] = map[uint64]time.Time{}
	}
	return o
}

// startAt is when a request arriving now on endpoint i gets a slot.
func (o *ttftOracle) startAt(i int, now time.Time) time.Time {
	n := len(o.ends[i])
	if n < o.slots {
		return now
	}
	o.scratchE = o.scratchE[:0]
	for _, e := range o.ends[i] {
		o.scratchE = append(o.scratchE, e)
	}
	slices.SortFunc(o.scratchE, func(a, b time.Time) int { return a.Compare(b) })
	s := o.scratchE[n-o.slots]
	if s.Before(now) {
		return now // running late: its slot frees any moment
	}
	return s
}

func (o *ttftOracle) pick(q *Request, keys []uint64) ticket {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	tokens := len(q.Tokens)
	if tokens == 0 {
		tokens = len(keys) * o.bs
	}
	// The engine computes the prompt's last token: a prompt ending on a block boundary hits one
	// block less than it holds.
	hitCap := min(len(keys), (tokens-1)/o.bs)
	best, bestTTFT, bestHit := -1, time.Duration(0), 0
	var bestEnd time.Time
	for i := range o.ends {
		cache := o.caches(i)
		hit := 0
		for _, k := range keys[:hitCap] {
			if cache[k] <= 0 && o.pending[i][k] == 0 {
				break
			}
			hit++
		}
		off := 0
		if o.hosts != nil {
			off = hostRun(o.hosts(i), keys[hit:hitCap])
		}
		start := o.startAt(i, now)
		pre := time.Duration(tokens-(hit+off)*o.bs)*o.prefill + time.Duration(off*o.bs)*o.transfer
		hit += off
		ttft := start.Sub(now) + pre
		if best < 0 || ttft < bestTTFT || (ttft == bestTTFT && hit > bestHit) {
			best, bestTTFT, bestHit = i, ttft, hit
			bestEnd = start.Add(pre + time.Duration(o.maxTok-1)*o.decode)
		}
	}
	o.next++
	o.ends[best][o.next] = bestEnd
	for _, k := range keys {
		o.pending[best][k]++
	}
	return ticket{idx: best, predicted: bestHit * o.bs, keys: keys, job: o.next}
}

func (o *ttftOracle) done(t ticket) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.ends[t.idx], t.job)
	for _, k := range t.keys {
		if o.pending[t.idx][k]--; o.pending[t.idx][k] <= 0 {
			delete(o.pending[t.idx], k)
		}
	}
}
