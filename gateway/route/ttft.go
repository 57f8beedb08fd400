package route

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The ttft law (LawTTFT) predicts each candidate's time to first token and picks the lowest:
//
//	TTFT_i = gateway_i + fixed_i + (uncached_i + evicted_i(hit_i)) · prefill_i
//	       + queue_i · ((ahead_i + evicted_i(aheadHit_i)) · prefill_i + load_i · interference_i) + slot_i
//
// gateway_i is the gateway's own time from a request's arrival to its upstream send (reading the
// body, tokenizing, hashing, routing): the client's time to first token holds it, the receipts'
// (timed from the upstream send) do not, so it is learned apart, from the time each receipt's
// request spent in the gateway before it was sent (Decision.Sent). It is about the same on every
// candidate, so it rarely moves a decision; it makes the prediction the time a client sees.
//
// fixed_i is what every request costs however little it computes (HTTP, tokenization, scheduling,
// one engine step, sampling): a full cache hit still takes it. ahead_i is the prefill work queued
// ahead of the request there: the uncached prompt tokens of the requests the gateway has in flight
// on the endpoint that have not yet shown a first token (Endpoint.ahead), plus, when the engine's
// load gauges are scraped, the requests the engine reports waiting beyond those (work other
// replicas or clients sent it), each priced at the endpoint's typical request (requestTokens_i).
// uncached_i is the request's own prefill there: its prompt's blocks past
// the endpoint's cached prefix (the score), in tokens, and the tokens of its partial last block,
// which no engine caches and every engine computes. load_i · interference_i is decode
// interference: each request in flight occupies a batch slot and a share of every engine step.
// queue_i is how much of that work a new request actually waits for: 1 when the engine computes
// queued prefills one after another, less when it overlaps them (the simulated engines run up to
// MaxConcurrency requests side by side, so below that nothing waits). The interference is learned
// as if that share were 1 (the fit's line) but used scaled by it; using it unscaled, as learned,
// measured worse on the simulated pool (docs/benchmarks/ttft.md, *The gateway's own time*): the
// learned interference is biased there, and a share near 0 hides it. prefill_i, interference_i
// and queue_i are the endpoint's own rates (Rates), learned from its receipts (Decision.Receipt);
// a fixed cost or prefill rate its receipts do not measure yet is its rule's endpoints' (familyRates).
// evicted_i(h) is the part of a predicted GPU hit h the engine is expected to compute anyway: a
// hit the engine evicted before the request ran is prefilled like any uncached token. A hit has
// two parts, the blocks the engine's events confirmed and those predict-on-route assumed past
// them, which are lost far more often (the engine evicted them, or never kept them, before their
// events could say so), so each part has its own share (Rates.Evicted, Rates.EvictedAssumed),
// learned from each receipt's cached_tokens against its predicted hit. hit_i is the request's
// predicted hit there, aheadHit_i those of the requests queued ahead (Endpoint.AheadHit): under
// KV pressure their evictions are queued prefill too.
// slot_i is the wait for a running slot (slotWait): an engine runs at most slots_i requests at
// once (Endpoint.Slots), and with load_i at or past it a new request starts only when running
// ones finish — a wait that grows by a whole request's service time every slots_i requests in
// line, which no share of the linear queue term describes.
// Ties go to the larger exact hit, then to the lower position.

// Rates are an endpoint's service rates as the ttft law uses them.
type Rates struct {
	// Fixed is what a request costs besides its prefill and its queue: a full hit's TTFT.
	Fixed time.Duration `json:"fixed"`
	// Prefill is the time to prefill one uncached prompt token.
	Prefill time.Duration `json:"prefillPerToken"`
	// Interference is the time each request in flight adds to a new request's first token.
	Interference time.Duration `json:"interference"`
	// Queue is the share of the queued work (queued prefill and interference) a new request
	// waits for: 1 for an engine that serializes it.
	Queue float64 `json:"queue"`
	// Decode is a request's time from its first token to the end of its answer: what a running
	// request still holds its slot for after its prefill (slotWait).
	Decode time.Duration `json:"decode"`
	// Transfer is the time to load one token's KV from each lower tier (lower.go).
	Transfer TransferRates `json:"transferPerToken"`
	// RequestTokens is the median prompt tokens a request here computes: the work of each request
	// the engine reports waiting that the gateway does not know the prompt of.
	RequestTokens int `json:"requestTokens"`
	// Gateway is the gateway's own time from a request's arrival to its upstream send, which the
	// client's time to first token holds and the receipts' does not.
	Gateway time.Duration `json:"gateway,omitempty"`
	// Evicted is the share of a request's predicted GPU hit tokens that the engine's events
	// confirmed and that it computed anyway, EvictedAssumed that of the tokens predict-on-route
	// assumed cached past them (0: every predicted hit is served from cache).
	Evicted        float64 `json:"evictedHit"`
	EvictedAssumed float64 `json:"evictedAssumedHit"`
}

// DefaultRates start an endpoint's estimator before any receipt from its model arrived: no fixed
// cost, the simulated engines' prefill (200 µs a token), no interference (an engine batches its
// running requests into each step, so a request in flight adds at most its share of one; the
// simulated engines add none, and the line's receipts measure it where it is not), lower tiers
// that load a token's KV in a tenth (host memory) and half (storage, a shared store) of its
// prefill time, and 512 computed tokens a request.
var DefaultRates = Rates{Prefill: 200 * time.Microsecond, Queue: 1,
	Transfer: TransferRates{CPU: 20 * time.Microsecond, Disk: 100 * time.Microsecond, Shared: 100 * time.Microsecond}, RequestTokens: 512}

// TTFTParts is one candidate's predicted time to first token and its parts, in milliseconds, as
// /admin/explain shows them.
type TTFTParts struct {
	// AheadTokens are the uncached prompt tokens queued ahead there, OwnTokens the request's own.
	AheadTokens int `json:"aheadTokens"`
	OwnTokens   int `json:"ownTokens"`
	// EvictedTokens and AheadEvictedTokens are the predicted hit tokens of the request and of
	// those queued ahead that the endpoint is expected to compute anyway (Rates.Evicted and
	// Rates.EvictedAssumed), priced in OwnMS and AheadMS.
	EvictedTokens      int `json:"evictedTokens,omitempty"`
	AheadEvictedTokens int `json:"aheadEvictedTokens,omitempty"`
	// LowerTokens are the request's tokens the endpoint loads from lower tiers instead.
	LowerTokens int `json:"lowerTokens,omitempty"`
	// EngineWaiting is the requests the engine reported waiting beyond the gateway's own,
	// EngineWaitingTokens their work at Rates.RequestTokens each (queued like AheadTokens).
	EngineWaiting       int `json:"engineWaiting,omitempty"`
	EngineWaitingTokens int `json:"engineWaitingTokens,omitempty"`
	// Slots is the engine's running-request limit the slot wait used (0: unknown, no wait).
	Slots int `json:"slots,omitempty"`
	// GatewayMS (the gateway's own time before the upstream send), FixedMS, AheadMS (the
	// gateway's and the engine's queued prefill), OwnMS, TransferMS, InterferenceMS and SlotWaitMS
	// (the wait for a running slot) add up to TotalMS.
	GatewayMS      float64 `json:"gatewayMs,omitempty"`
	FixedMS        float64 `json:"fixedMs"`
	AheadMS        float64 `json:"aheadMs"`
	OwnMS          float64 `json:"ownMs"`
	TransferMS     float64 `json:"transferMs,omitempty"`
	InterferenceMS float64 `json:"interferenceMs"`
	SlotWaitMS     float64 `json:"slotWaitMs,omitempty"`
	TotalMS        float64 `json:"totalMs"`
	// Rates are the endpoint's rates the prediction used.
	Rates Rates `json:"rates"`
	// total is TotalMS in integer time: the law compares it, so equal work ties exactly; slot
	// the slot wait, which a receipt removes before it learns the queue.
	total, slot time.Duration
}

// predictTTFT is c's prediction for a prompt of promptTokens tokens, queryBlocks full blocks of bs
// tokens and a partial last block of the rest (promptTokens below queryBlocks·bs: none). The
// partial block is never cached, so the engine computes its tokens wherever the request goes
// (vLLM computes every uncached prompt token: tokens cost, not blocks). The blocks lower tiers
// serve are neither prefilled nor free: each costs its tier's transfer. The GPU hits, the
// request's and those queued ahead, cost the share of their tokens the endpoint's receipts say
// it computed anyway (Rates.Evicted).
func predictTTFT(c Scored, queryBlocks, promptTokens, bs int) TTFTParts {
	bs = max(bs, 1)
	gpu := min(max(c.Score-c.LowerCredit, 0), queryBlocks)
	assumed := min(c.Assumed, gpu)
	own := max(queryBlocks-gpu-c.Lower.Blocks(), 0)*bs + max(promptTokens-queryBlocks*bs, 0)
	r := c.Rates
	if r == (Rates{}) {
		r = DefaultRates
	}
	p := TTFTParts{AheadTokens: c.Ahead, OwnTokens: own, LowerTokens: c.Lower.Blocks() * bs, Rates: r,
		EngineWaiting: c.EngineWaiting, EngineWaitingTokens: c.EngineWaiting * r.RequestTokens, Slots: c.Slots,
		EvictedTokens: r.evictedOf(HitTokens{Confirmed: (gpu - assumed) * bs, Assumed: assumed * bs}), AheadEvictedTokens: r.evictedOf(c.AheadHit)}
	var transfer time.Duration
	for i, n := range c.Lower {
		transfer += time.Duration(n*bs) * r.Transfer.of(i)
	}
	ahead := time.Duration(c.Ahead+p.EngineWaitingTokens+p.AheadEvictedTokens) * r.Prefill
	self, inter := time.Duration(own+p.EvictedTokens)*r.Prefill, time.Duration(c.Load)*r.Interference
	ahead, inter = time.Duration(float64(ahead)*r.Queue), time.Duration(float64(inter)*r.Queue)
	p.slot = slotWait(c.Load, c.Slots, r)
	p.total = r.Gateway + r.Fixed + ahead + self + transfer + inter + p.slot
	p.GatewayMS = ms(r.Gateway)
	p.FixedMS, p.AheadMS, p.OwnMS, p.TransferMS, p.InterferenceMS, p.TotalMS = ms(r.Fixed), ms(ahead), ms(self), ms(transfer), ms(inter), ms(p.total)
	p.SlotWaitMS = ms(p.slot)
	return p
}

// slotWait is how long a new request waits for a running slot on an engine that runs at most
// slots requests at once with load in flight (load already holds the engine's reported requests
// beyond the gateway's own, Endpoint.Load). Below the limit it waits for none. At it, the slots
// are busy with requests of service time T (the fixed cost, a typical request's prefill and its
// decode) at ages spread evenly over T, so the first to finish does so after T/(slots+1) on
// average and the j-th after j·T/(slots+1); the w = load − slots requests waiting ahead take
// the first w slots that free, and each full round of slots of them costs a whole T more.
func slotWait(load, slots int, r Rates) time.Duration {
	if slots <= 0 || load < slots {
		return 0
	}
	t := r.Fixed + time.Duration(r.RequestTokens)*r.Prefill + r.Decode
	w := load - slots
	return time.Duration(w/slots)*t + time.Duration(w%slots+1)*t/time.Duration(slots+1)
}

// HitTokens are predicted GPU hit tokens: those the engine's events confirmed, and those
// predict-on-route assumed past them.
type HitTokens struct{ Confirmed, Assumed int }

// evictedOf is how many of h's tokens the engine is expected to compute anyway, to the nearest.
func (r Rates) evictedOf(h HitTokens) int {
	return int(float64(h.Confirmed)*r.Evicted + float64(h.Assumed)*r.EvictedAssumed + 0.5)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ttft picks the lowest predicted TTFT; ties to the larger score, then the lower position.
func (l Law) ttft(cands []Scored, queryBlocks, promptTokens, best int) Verdict {
	parts := make([]TTFTParts, len(cands))
	pos := -1
	for i, c := range cands {
		parts[i] = predictTTFT(c, queryBlocks, promptTokens, l.BlockSize)
		if pos < 0 || parts[i].total < parts[pos].total ||
			(parts[i].total == parts[pos].total && c.Score > cands[pos].Score) {
			pos = i
		}
	}
	return Verdict{Pos: pos, Spill: cands[pos].Score < cands[best].Score, TTFT: parts}
}

// rateWindow is how many receipts an estimate looks back over.
const rateWindow = 64

// estimator learns an endpoint's Rates from its receipts: each rate is the median of the last
// rateWindow per-receipt estimates, so a stalled response or a preempted request moves it by one
// rank, not by its size. Until a rate has samples it is its seed.
type estimator struct {
	mu           sync.Mutex
	fixed        samples
	requestTok   window
	prefill      samples
	interference window
	queue        window
	decode       window
	gateway      window
	// evicted and evictedAssumed hold each receipt's share of its confirmed and of its assumed
	// hit tokens the engine computed anyway.
	evicted, evictedAssumed window
	transfer                [nLower]window
	seed                    Rates
	cur                     atomic.Pointer[Rates]
	// ownFixed, ownPrefill, ownEvicted and ownAssumed say the fixed cost, the prefill rate and
	// the two evicted shares are measured from this endpoint's own receipts, not taken from its
	// seed or its family (familyRates).
	ownFixed, ownPrefill, ownEvicted, ownAssumed atomic.Bool
	// scratch holds fit's residuals and the line's slopes between every two samples, and the
	// windows' sorted copies (median).
	scratch [rateWindow + rateWindow*(rateWindow-1)/2]float64
}

// window is a ring of the last rateWindow samples.
type window struct {
	v    [rateWindow]float64
	n    int
	next int
}

func (w *window) add(x float64) {
	w.v[w.next] = x
	w.next = (w.next + 1) % rateWindow
	w.n = min(w.n+1, rateWindow)
}

// median sorts a copy of the samples in buf (at least rateWindow long), so a receipt allocates
// nothing.
func (w *window) median(buf []float64) (float64, bool) {
	if w.n == 0 {
		return 0, false
	}
	return medianOf(append(buf[:0], w.v[:w.n]...)), true
}

// mean is the samples' mean.
func (w *window) mean() (float64, bool) {
	if w.n == 0 {
		return 0, false
	}
	var t float64
	for _, x := range w.v[:w.n] {
		t += x
	}
	return t / float64(w.n), true
}

// samples is a ring of the last rateWindow receipts the fixed cost, the interference and the
// prefill rate are measured from, kept raw (time to first token net of the slot wait, computed
// tokens, load), so that each estimate is recomputed from the others' current values rather than
// frozen with the values they had when the receipt came: the first receipts of a new endpoint
// arrive while the prefill rate is still its seed, and a fixed cost measured against it stayed
// in the window for 64 receipts.
type samples struct {
	v    [rateWindow]sample
	n    int
	next int
}

type sample struct{ ttft, computed, load float64 }

func (s *samples) add(x sample) {
	s.v[s.next] = x
	s.next = (s.next + 1) % rateWindow
	s.n = min(s.n+1, rateWindow)
}

// medianOf is the median of buf, which it sorts.
func medianOf(buf []float64) float64 {
	slices.Sort(buf)
	if len(buf)%2 == 1 {
		return buf[len(buf)/2]
	}
	return (buf[len(buf)/2-1] + buf[len(buf)/2]) / 2
}

// line fits TTFT − computed · p = fixed + load · interference over the samples (receipts with
// nothing queued ahead): the Theil–Sen line (the interference the median of the slopes between
// samples at different loads, the fixed cost the median of what is left), robust to stalls as the
// medians are. Two guards keep a few waited receipts from setting the slope, which a median alone
// does not when a load holds one receipt (every slope to it is that receipt's): a sample far above
// the others (above the median residual by more than the median itself and waitSpread robust
// deviations: a slot, KV-block or host wait, which only ever adds time) takes no part in the line,
// and only loads held by at least minLinePerLoad of the kept samples give slopes. Without slopes
// the interference cannot be told from the fixed cost: it keeps itf when known (measured by other
// receipts) or when every sample is idle (nothing to tell apart), else the fixed cost takes it all
// (a seed's interference, a guess, would otherwise eat a fixed cost it exceeds).
func (s *samples) line(p, itf float64, known bool, buf []float64) (fixed, interference float64) {
	r := buf[:s.n]
	for i := range r {
		r[i] = s.v[i].ttft - s.v[i].computed*p
	}
	tmp := buf[s.n : 2*s.n]
	copy(tmp, r)
	m := medianOf(tmp)
	for i := range tmp {
		tmp[i] = abs(r[i] - m)
	}
	cut := m + max(m, 0) + waitSpread*1.4826*medianOf(tmp)
	// same[i] is how many kept samples share sample i's load (0: i is not kept).
	var same [rateWindow]int
	loaded := false
	for i := range s.n {
		loaded = loaded || s.v[i].load > 0
		if r[i] > cut {
			continue
		}
		for j := range s.n {
			if r[j] <= cut && s.v[j].load == s.v[i].load {
				same[i]++
			}
		}
	}
	slopes := buf[s.n:s.n]
	for i := range s.n {
		if same[i] < minLinePerLoad {
			continue
		}
		for j := i + 1; j < s.n; j++ {
			if dl := s.v[i].load - s.v[j].load; dl != 0 && same[j] >= minLinePerLoad {
				slopes = append(slopes, (r[i]-r[j])/dl)
			}
		}
	}
	switch {
	case len(slopes) > 0:
		itf = max(medianOf(slopes), 0)
	case !known && loaded:
		itf = 0
	}
	kept := buf[s.n:s.n]
	for i := range r {
		if same[i] > 0 {
			kept = append(kept, r[i]-s.v[i].load*itf)
		}
	}
	return max(medianOf(kept), 0), itf
}

// waitSpread is how many robust deviations (1.4826 · the median absolute deviation) above the
// median residual, besides the median itself, a line sample may lie before it counts as a wait;
// minLinePerLoad is how many kept samples a load needs before it gives the line a slope.
const (
	waitSpread     = 4
	minLinePerLoad = 2
)

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// fit recomputes the fixed cost, the interference and the prefill rate from their receipts: the
// fixed cost and the interference are the line through the receipts with nothing queued ahead
// (line), the prefill rate the median of (TTFT − fixed) / computed over the idle ones with many
// computed tokens; each reads the others' values, so they are iterated to their common solution
// (the line's receipts compute few tokens, so each round shrinks the error by their share of the
// prefill receipts' tokens: a few rounds settle it).
func (e *estimator) fit(next *Rates) {
	if e.fixed.n == 0 && e.prefill.n == 0 {
		return
	}
	f, itf, p := float64(next.Fixed), float64(next.Interference), float64(next.Prefill)
	for range 3 {
		if e.fixed.n > 0 {
			f, itf = e.fixed.line(p, itf, e.interference.n > 0, e.scratch[:])
		}
		if e.prefill.n == 0 {
			break
		}
		buf := e.scratch[:e.prefill.n]
		for i := range buf {
			x := e.prefill.v[i]
			buf[i] = max(x.ttft-f, 0) / x.computed
		}
		p = medianOf(buf)
	}
	next.Fixed, next.Interference, next.Prefill = time.Duration(f), time.Duration(itf), time.Duration(p)
}

func newEstimator(seed Rates) *estimator {
	e := &estimator{seed: seed}
	e.cur.Store(&seed)
	return e
}

// Rates is the current estimate.
func (e *estimator) Rates() Rates { return *e.cur.Load() }

// Receipt is what a response says about the endpoint that served it: its time to first token, the
// prompt tokens it computed (prompt − cached_tokens), the uncached tokens that were queued ahead
// (the gateway's own and the engine's reported waiting work) and the requests in flight there when
// it was routed, and the prompt tokens it was predicted to load from each lower tier (engines
// count them in cached_tokens); Decode is its time from the first token to the answer's end (0:
// not measured), SlotWait the wait for a running slot it was predicted (not part of the queue);
// Gateway the request's time in the gateway from its arrival to its upstream send (0: not
// measured), which TTFT (timed from the send) does not hold; Hit the prompt tokens the
// prediction expected the engine's GPU cache to serve, Cached the engine's cached_tokens.
type Receipt struct {
	TTFT     time.Duration
	Computed int
	Ahead    int
	Load     int
	Lower    [nLower]int
	Decode   time.Duration
	SlotWait time.Duration
	Gateway  time.Duration

	Hit    HitTokens
	Cached int
}

// minPrefillSample is the fewest computed tokens a receipt needs to measure the prefill rate: below
// it the fixed cost outweighs the prefill, and a receipt measures the fixed cost instead.
const minPrefillSample = 256

// observe adds one receipt. An idle one (nothing in flight) with enough computed tokens measures
// the prefill rate ((TTFT − fixed) / computed); one with few computed tokens, nothing queued ahead
// and no slot wait, idle or behind requests in flight that are past their prefill, measures the
// fixed cost and the interference: TTFT − computed · prefill = fixed + load · interference. The
// three are refitted together from their raw receipts at each receipt (fit), so none keeps a value
// measured against another's seed. One with more computed tokens routed behind requests in flight,
// or one that waited for a slot, measures, with its own prefill and the fixed cost removed, the
// rest: with nothing queued ahead, the interference per request in flight (used while the fit
// cannot tell it from the fixed cost); with prefill queued ahead, the share of the queued work it
// waited for. Every receipt's computed tokens feed RequestTokens, its decode time Decode, its time in the
// gateway Gateway; a receipt routed at the slot limit has its predicted slot wait removed first,
// so the queue share learns only the rest. A receipt with a predicted GPU hit and nothing
// loaded from lower tiers (whose tokens engines also count as cached) measures the evicted
// shares: the hit's tokens the engine did not serve (cached_tokens short of it) are the assumed
// ones first — they lie past the confirmed ones, and the engine's cache is a prefix — then the
// confirmed ones; each part's lost share, in [0, 1], is a sample of its rate, the mean over the
// window (the mean, not the median: a hit mostly survives whole or goes whole, and the law
// needs the expected work; the clamp bounds what one receipt can move a full window's mean by
// to 1/rateWindow).
func (e *estimator) observe(r Receipt) { e.observeIn(r, familyRates{}) }

// familyRates are the fixed cost and the prefill rate that the other endpoints of one rule (one
// model on one engine family, whose per-request and per-token costs are the same) measured from
// their own receipts (Router.familyRates): an endpoint whose receipts measure neither yet uses its
// family's in place of its seed. Under load most receipts are queued behind others or waited for
// a slot, so an endpoint can go a whole run without a receipt that measures the fixed cost (none
// queued ahead, few computed tokens) or the prefill rate (none in flight, many computed tokens),
// while its siblings have some; a seed (no fixed cost, 200 µs a token) is a guess.
type familyRates struct {
	fixed, prefill                               time.Duration
	evicted, assumed                             float64
	hasFixed, hasPrefill, hasEvicted, hasAssumed bool
}

// observeIn is observe, fam standing in for the rates e's own receipts do not measure yet.
func (e *estimator) observeIn(r Receipt, fam familyRates) {
	if r.TTFT <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	cur := e.Rates()
	lower, tier := 0, -1
	var transfer float64
	for i, n := range r.Lower {
		if n > 0 {
			lower, tier = lower+n, i
			transfer += float64(n) * float64(cur.Transfer.of(i))
		}
	}
	e.requestTok.add(float64(r.Computed))
	if h := r.Hit; h.Confirmed >= 0 && h.Assumed >= 0 && h.Confirmed+h.Assumed > 0 && lower == 0 {
		lost := h.Confirmed + h.Assumed - min(max(r.Cached, 0), h.Confirmed+h.Assumed)
		if h.Assumed > 0 {
			e.evictedAssumed.add(float64(min(lost, h.Assumed)) / float64(h.Assumed))
		}
		if h.Confirmed > 0 {
			e.evicted.add(float64(max(lost-h.Assumed, 0)) / float64(h.Confirmed))
		}
	}
	if r.Decode > 0 {
		e.decode.add(float64(r.Decode))
	}
	if r.Gateway > 0 {
		e.gateway.add(float64(r.Gateway))
	}
	rest := max(float64(r.TTFT)-float64(r.Computed)*float64(cur.Prefill)-float64(cur.Fixed)-float64(r.SlotWait), 0)
	raw := sample{ttft: max(float64(r.TTFT)-float64(r.SlotWait), 0), computed: float64(r.Computed), load: float64(r.Load)}
	switch {
	case r.Load == 0 && lower > 0:
		// A lower tier's transfer: measured only from a receipt whose loaded tokens all came from
		// one tier, enough of them to outweigh the fixed costs.
		if lower != r.Lower[tier] || lower < minPrefillSample {
			return
		}
		e.transfer[tier].add(rest / float64(lower))
	case r.Load == 0 && r.Computed >= minPrefillSample:
		e.prefill.add(raw)
	case lower == 0 && r.Ahead == 0 && r.SlotWait == 0 && r.Computed < minPrefillSample:
		// Few computed tokens, nothing queued ahead, no slot wait: the fixed cost and the
		// interference of the requests in flight (fit).
		e.fixed.add(raw)
	case r.Load > 0 && r.Ahead == 0:
		e.interference.add(max(rest-transfer, 0) / float64(r.Load))
	case r.Load > 0:
		// With no interference the queued work is the queued prefill alone: a prefill rate
		// learned at 0 leaves nothing to divide by, and the receipt teaches no share.
		if work := float64(r.Ahead)*float64(cur.Prefill) + float64(r.Load)*float64(cur.Interference); work > 0 {
			e.queue.add(max(rest-transfer, 0) / work)
		}
	}
	next := e.seed
	if fam.hasFixed && e.fixed.n == 0 {
		next.Fixed = fam.fixed
	}
	if fam.hasPrefill && e.prefill.n == 0 {
		next.Prefill = fam.prefill
	}
	if fam.hasEvicted && e.evicted.n == 0 {
		next.Evicted = fam.evicted
	}
	if fam.hasAssumed && e.evictedAssumed.n == 0 {
		next.EvictedAssumed = fam.assumed
	}
	buf := e.scratch[:]
	if m, ok := e.requestTok.median(buf); ok {
		next.RequestTokens = int(m)
	}
	if m, ok := e.interference.median(buf); ok {
		next.Interference = time.Duration(m)
	}
	if m, ok := e.queue.median(buf); ok {
		next.Queue = m
	}
	if m, ok := e.decode.median(buf); ok {
		next.Decode = time.Duration(m)
	}
	if m, ok := e.gateway.median(buf); ok {
		next.Gateway = time.Duration(m)
	}
	if m, ok := e.evicted.mean(); ok {
		next.Evicted = m
	}
	if m, ok := e.evictedAssumed.mean(); ok {
		next.EvictedAssumed = m
	}
	e.fit(&next)
	for i := range e.transfer {
		if m, ok := e.transfer[i].median(buf); ok {
			next.Transfer.set(i, time.Duration(m))
		}
	}
	e.ownFixed.Store(e.fixed.n > 0)
	e.ownPrefill.Store(e.prefill.n > 0)
	e.ownEvicted.Store(e.evicted.n > 0)
	e.ownAssumed.Store(e.evictedAssumed.n > 0)
	e.cur.Store(&next)
}

// familyRates is the median fixed cost, prefill rate and evicted shares over the rule's endpoints
// that measured them from their own receipts (the median: one endpoint's stalled receipts move
// it by one rank). It runs at every receipt, so up to familyOnStack endpoints it allocates
// nothing.
func (rt *Router) familyRates() familyRates {
	var fb, pb, vb, ab [familyOnStack]float64
	f, p, v, a := fb[:0], pb[:0], vb[:0], ab[:0]
	for _, e := range rt.eps {
		est := e.rates.Load()
		if est == nil {
			continue
		}
		r := est.Rates()
		if est.ownFixed.Load() {
			f = append(f, float64(r.Fixed))
		}
		if est.ownPrefill.Load() {
			p = append(p, float64(r.Prefill))
		}
		if est.ownEvicted.Load() {
			v = append(v, r.Evicted)
		}
		if est.ownAssumed.Load() {
			a = append(a, r.EvictedAssumed)
		}
	}
	var fam familyRates
	if fam.hasFixed = len(f) > 0; fam.hasFixed {
		fam.fixed = time.Duration(medianOf(f))
	}
	if fam.hasPrefill = len(p) > 0; fam.hasPrefill {
		fam.prefill = time.Duration(medianOf(p))
	}
	if fam.hasEvicted = len(v) > 0; fam.hasEvicted {
		fam.evicted = medianOf(v)
	}
	if fam.hasAssumed = len(a) > 0; fam.hasAssumed {
		fam.assumed = medianOf(a)
	}
	return fam
}

// familyOnStack is how many endpoints' rates familyRates gathers without allocating.
const familyOnStack = 64

// seedRates is the warm start of a new endpoint's estimator: the median of the rates its rule's
// other endpoints (the same model and engine family) learned, or DefaultRates when none has.
func (rt *Router) seedRates() Rates {
	var p, q, f, fx, rq, dc, gw, ev, ea []float64
	var tr [nLower][]float64
	for _, e := range rt.eps {
		if est := e.rates.Load(); est != nil {
			r := est.Rates()
			p, q, f = append(p, float64(r.Prefill)), append(q, float64(r.Interference)), append(f, r.Queue)
			fx, rq, dc = append(fx, float64(r.Fixed)), append(rq, float64(r.RequestTokens)), append(dc, float64(r.Decode))
			gw, ev, ea = append(gw, float64(r.Gateway)), append(ev, r.Evicted), append(ea, r.EvictedAssumed)
			for i := range tr {
				tr[i] = append(tr[i], float64(r.Transfer.of(i)))
			}
		}
	}
	if len(p) == 0 {
		return DefaultRates
	}
	mid := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	out := Rates{Fixed: time.Duration(mid(fx)), Prefill: time.Duration(mid(p)), Interference: time.Duration(mid(q)), Queue: mid(f),
		RequestTokens: int(mid(rq)), Decode: time.Duration(mid(dc)), Gateway: time.Duration(mid(gw)), Evicted: mid(ev), EvictedAssumed: mid(ea)}
	for i := range tr {
		out.Transfer.set(i, time.Duration(mid(tr[i])))
	}
	return out
}

// ratesOf is e's current estimate (DefaultRates, or its rule's, before its first receipt).
func (rt *Router) ratesOf(e *Endpoint) Rates {
	if est := e.rates.Load(); est != nil {
		return est.Rates()
	}
	return rt.seedRates()
}

// Receipt reports the response to a decision: its realized time to first token, its time from the
// first token to the answer's end (decode; 0 when not measured) and how many of its prompt tokens
// the engine served from cache (usage cached_tokens; promptTokens the prompt's).
// The serving endpoint's queued prefill drops by the decision's share (its prefill is over), its
// estimator learns from the receipt, and the prediction's error is observed. Only the first call
// counts; a dry decision, or one made under another law (which records no queue state to learn
// against), learns nothing.
func (d *Decision) Receipt(ttft, decode time.Duration, promptTokens, cachedTokens int) {
	if d == nil || d.rt == nil || d.Target == nil || !d.queued || d.received.Swap(true) {
		return
	}
	d.drain()
	rt := d.rt
	est := d.Target.rates.Load()
	if est == nil {
		est = newEstimator(rt.seedRates())
		if !d.Target.rates.CompareAndSwap(nil, est) {
			est = d.Target.rates.Load()
		}
	}
	est.observeIn(Receipt{TTFT: ttft, Computed: max(promptTokens-cachedTokens, 0), Ahead: d.aheadAt, Load: d.loadAt, Lower: d.lowerAt,
		Decode: decode, SlotWait: d.slotWaitAt, Gateway: d.gateway, Hit: d.hitAt, Cached: cachedTokens}, rt.familyRates())
	if rt.cfg.Metrics != nil {
		r := est.Rates()
		rt.cfg.Metrics.evictedHit(rt.rule.Name, d.Target.Name, r.Evicted, r.EvictedAssumed)
	}
	if d.ttftPredicted > 0 && rt.cfg.Metrics != nil {
		// The prediction holds the gateway's own time, the receipt's TTFT does not.
		rt.cfg.Metrics.ttftError(rt.rule.Name, d.Target.Name, ttft+d.gateway, d.ttftPredicted)
	}
}

// Sent reports that the request was sent upstream after gateway in the gateway since its arrival
// (its body read, tokenized, hashed and routed): the receipt teaches the target's estimator that
// time (Rates.Gateway), which the receipt's time to first token, timed from the send, does not
// hold. A retry's send replaces an earlier one's. Safe on nil; call it before Receipt, from the
// goroutine that calls Receipt. Only the single-endpoint path calls it: a P/D attempt never calls
// Receipt (its prefill leg is read whole, no first token is timed, and the decode leg's usage
// counts the pulled KV as cached), so no estimator would learn the gateway's time from it.
func (d *Decision) Sent(gateway time.Duration) {
	if d != nil {
		d.gateway = gateway
	}
}

// Rates is the endpoint's learned rates, false before its first receipt.
func (e *Endpoint) Rates() (Rates, bool) {
	if est := e.rates.Load(); est != nil {
		return est.Rates(), true
	}
	return Rates{}, false
}
