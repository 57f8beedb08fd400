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
// more at DecodePerToken each, holding the slot throughout. It keeps, per endpoint, the requests
// in flight as the engine does: the running ones with the moment they got their slot, the rest
// in FIFO order with their service times. A request gets its slot when one of those in flight
// really ends (done), not when it was predicted to: on a loaded machine every step overruns, and
// predicted ends all in the past made a deep queue look free (its next slot "any moment"), so
// the oracle piled onto it. Greedy: each arrival is placed without regard to the ones after it (a
// request that takes the last free slot of a warm endpoint may cost the next, deeper holder more
// than it gains), so it is the best one-step decision with perfect state, not the optimum over
// the whole run. KV-block waits are not modelled (the pools' KV cache holds every request of a
// full batch).
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
	running  []map[uint64]ttftJob
	queued   [][]ttftJob // FIFO
	next     uint64
	now      func() time.Time
	scratchE []time.Time
}

// ttftJob is a request in flight: its service time as predicted at its arrival, and for a running
// one the moment it got its slot.
type ttftJob struct {
	id    uint64
	svc   time.Duration
	start time.Time
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
		pending: mapsOf[int](n), running: mapsOf[ttftJob](n), queued: make([][]ttftJob, n), now: now}
	return o
}

// startAt is when a request arriving now on endpoint i gets a slot: the running requests end at
// their start plus service time (one that overran ends any moment), and each queued one takes the
// first slot to free, in order.
func (o *ttftOracle) startAt(i int, now time.Time) time.Time {
	if len(o.running[i])+len(o.queued[i]) < o.slots {
		return now
	}
	free := o.scratchE[:0]
	for _, j := range o.running[i] {
		free = append(free, later(j.start.Add(j.svc), now))
	}
	for len(free) < o.slots {
		free = append(free, now)
	}
	slices.SortFunc(free, func(a, b time.Time) int { return a.Compare(b) })
	for _, j := range o.queued[i] {
		// The earliest slot goes to j; it frees again after j's service.
		free[0] = free[0].Add(j.svc)
		for k := 1; k < len(free) && free[k].Before(free[k-1]); k++ {
			free[k], free[k-1] = free[k-1], free[k]
		}
	}
	o.scratchE = free
	return free[0]
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
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
	best, bestTTFT, bestHit, bestLoad, bestHeld := -1, time.Duration(0), 0, 0, 0
	var bestSvc time.Duration
	n := len(o.running)
	for r := range n {
		// Ties rotate: the first index no longer takes every first sighting.
		i := (int(o.next) + r) % n
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
		load, held := len(o.running[i])+len(o.queued[i]), 0
		for _, c := range cache {
			held += c
		}
		// Equal TTFTs (a prompt held nowhere, several slots free) go to the deeper hit, then to the
		// endpoint with the fewest requests in flight (it keeps the most free slots for the next
		// arrivals), then to the one holding the fewest blocks (its placement evicts the least).
		if best < 0 || ttft < bestTTFT || (ttft == bestTTFT && (hit > bestHit || hit == bestHit &&
			(load < bestLoad || load == bestLoad && held < bestHeld))) {
			best, bestTTFT, bestHit, bestLoad, bestHeld = i, ttft, hit, load, held
			bestSvc = pre + time.Duration(o.maxTok-1)*o.decode
		}
	}
	o.next++
	j := ttftJob{id: o.next, svc: bestSvc, start: now}
	if len(o.running[best]) < o.slots && len(o.queued[best]) == 0 {
		o.running[best][j.id] = j
	} else {
		o.queued[best] = append(o.queued[best], j)
	}
	for _, k := range keys {
		o.pending[best][k]++
	}
	return ticket{idx: best, predicted: bestHit * o.bs, keys: keys, job: o.next}
}

func (o *ttftOracle) done(t ticket) {
	o.mu.Lock()
	defer o.mu.Unlock()
	i := t.idx
	if _, ok := o.running[i][t.job]; ok {
		delete(o.running[i], t.job)
	} else {
		// It ran before the model gave it a slot (requests reach the engine a little out of order).
		o.queued[i] = slices.DeleteFunc(o.queued[i], func(j ttftJob) bool { return j.id == t.job })
	}
	now := o.now()
	for len(o.running[i]) < o.slots && len(o.queued[i]) > 0 {
		j := o.queued[i][0]
		o.queued[i] = o.queued[i][1:]
		j.start = now
		o.running[i][j.id] = j
	}
	for _, k := range t.keys {
		if o.pending[t.idx][k]--; o.pending[t.idx][k] <= 0 {
			delete(o.pending[t.idx], k)
		}
	}
}
