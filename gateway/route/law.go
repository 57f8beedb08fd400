package route

import "github.com/kvexact/kvexact/gateway/rules"

// Bounded-load laws (routing-semantics §6): given each candidate's cache score and load, pick the
// KV-exact winner so that cache affinity never piles every request onto one hot endpoint. All maths
// is integer, so the same inputs always give the same winner.

// Scored is one candidate as a law sees it.
type Scored struct {
	// Index is the candidate's position in the rule's endpoint order (ties resolve to the lowest).
	Index int
	// Score is the cache score that drives selection (overlap or prefix depth, in blocks).
	Score int
	// Load is the gateway's own in-flight count for the endpoint (active + queued).
	Load int
	// Capacity is the endpoint's KV capacity share (blocks × weight), at least 1.
	Capacity int
	// Ahead and Rates are what the ttft law needs besides (ttft.go): the uncached prompt tokens
	// of the gateway's requests in flight there that have not shown a first token, and the
	// endpoint's learned rates (zero: DefaultRates); AheadHit those requests' prompt tokens
	// predicted cached there, and Assumed how many blocks of Score predict-on-route assumed
	// (not confirmed by the engine's events). The other laws leave them unset.
	Ahead    int
	AheadHit HitTokens
	Assumed  int
	Rates    Rates
	// EngineWaiting is the requests the engine reported waiting beyond the gateway's own
	// (Endpoint.EngineWaiting), queued ahead like Ahead at the endpoint's typical request size.
	EngineWaiting int
	// Slots is the engine's running-request limit (Endpoint.Slots; 0: unknown, no slot wait).
	Slots int
	// Lower is what lower tiers serve past the GPU prefix (lower.go) and LowerCredit the part of
	// Score it earned; the ttft law prices Lower at the tiers' transfer rates instead.
	Lower       LowerHit
	LowerCredit int
}

// LawKind names a bounded-load law.
type LawKind string

const (
	LawOff      LawKind = "off"      // pure argmax score
	LawHard     LawKind = "hard"     // argmax among under-cap candidates
	LawSoft     LawKind = "soft"     // lowest uncached·1000 + λ·load cost
	LawAdaptive LawKind = "adaptive" // hard with ε growing with total load
	LawTTFT     LawKind = "ttft"     // lowest predicted time to first token (ttft.go)
)

// Law is a configured bounded-load law.
type Law struct {
	Kind LawKind
	// FactorPct is (1+ε)·100 for the hard law (175 for the default ε = 0.75).
	FactorPct int
	// Lambda is the soft law's load penalty.
	Lambda int
	// SpillRelief lets an over-cap winner spill to an under-cap endpoint with zero score.
	SpillRelief bool
	// CapFloor is the hard laws' least cap for a holder of the prompt — a candidate whose score is at
	// least half the prompt's blocks (values below 1 count as 1). An engine batches several
	// sequences, so a holder with fewer than CapFloor requests in flight is not overloaded, and
	// spilling its request would at least double the request's prefill. A shallower match (a
	// shared instruction of a few blocks) gets no floor: with one, the few endpoints holding such
	// a prefix soaked up every request up to the floor and the deep holders, busy with them,
	// spilled (docs/routing.md, The load law at pool scale).
	CapFloor int
	// BlockSize is the rule's block size in tokens: the ttft law counts prefill in tokens (the
	// router sets it from the rule; 0 counts one token a block).
	BlockSize int
	// MissHeadroom places a KV-exact miss by KV headroom (placement.go) instead of passing it to
	// the rule's selector (loadLaw.missPlacement "headroom", and "home" when the home is over its
	// cap). The ttft law leaves it off.
	MissHeadroom bool
	// MissHome sends a KV-exact miss to the prompt's home endpoint first (loadLaw.missPlacement
	// "home", placement.go): a prompt evicted everywhere comes back where it lived.
	MissHome bool
	// MissLast sends a KV-exact miss to the endpoint its prompt was last routed to
	// (loadLaw.missPlacement "last", lastseen.go), else leaves it to the rule's selector.
	MissLast bool
}

// LawOf is the law a normalized rule's loadLaw configures: the router's, and the benchmark
// oracle's, so both decide by the same fields.
func LawOf(l rules.LoadLaw) Law {
	law := Law{Kind: LawKind(l.Kind), FactorPct: 175, Lambda: l.Lambda, CapFloor: 1}
	if l.Epsilon != nil {
		law.FactorPct = int(100*(1+*l.Epsilon) + 0.5)
	}
	if l.SpillRelief != nil {
		law.SpillRelief = *l.SpillRelief
	}
	if l.CapFloor != nil {
		law.CapFloor = *l.CapFloor
	}
	placed := law.Kind != LawTTFT
	law.MissHeadroom = placed && (l.MissPlacement == "headroom" || l.MissPlacement == "home")
	law.MissHome = placed && l.MissPlacement == "home"
	law.MissLast = placed && l.MissPlacement == "last"
	return law
}

// Verdict is a law's choice.
type Verdict struct {
	// Pos is the position of the winner in the slice passed to Pick, -1 when nothing qualifies.
	Pos int
	// Spill is true when the winner is not the global argmax (load moved the request).
	Spill bool
	// Caps are the per-candidate load caps the hard laws used (nil for off/soft), for evidence.
	Caps []int
	// TTFT are the ttft law's per-candidate predictions (nil for the other laws), for evidence.
	TTFT []TTFTParts
}

// Pick applies the law. queryBlocks is the prompt's block count (the soft law's "uncached" is
// queryBlocks − score). cands must be in endpoint order.
func (l Law) Pick(cands []Scored, queryBlocks int) Verdict {
	return l.PickPrompt(cands, queryBlocks, 0)
}

// PickPrompt is Pick for a prompt of promptTokens tokens: the ttft law also prices the tokens
// past its last full block, which every engine computes (0, or fewer than queryBlocks full
// blocks hold: a prompt that ends on a block boundary).
func (l Law) PickPrompt(cands []Scored, queryBlocks, promptTokens int) Verdict {
	if len(cands) == 0 {
		return Verdict{Pos: -1}
	}
	best := argmax(cands, func(int) bool { return true })
	switch l.Kind {
	case LawOff, "":
		return Verdict{Pos: best}
	case LawSoft:
		return l.soft(cands, queryBlocks, best)
	case LawTTFT:
		return l.ttft(cands, queryBlocks, promptTokens, best)
	case LawAdaptive:
		total := 0
		for _, c := range cands {
			total += c.Load
		}
		pct := clamp(175+125*(total-16)/10, 175, 300)
		return l.hard(cands, queryBlocks, best, pct)
	default:
		return l.hard(cands, queryBlocks, best, l.FactorPct)
	}
}

// argmax returns the position with the highest score among those ok accepts; ties go to the
// least loaded, then to the lowest position. -1 when none is accepted.
func argmax(cands []Scored, ok func(pos int) bool) int {
	pos := -1
	for i, c := range cands {
		if !ok(i) {
			continue
		}
		if pos < 0 || c.Score > cands[pos].Score || (c.Score == cands[pos].Score && c.Load < cands[pos].Load) {
			pos = i
		}
	}
	return pos
}

// leastLoaded returns the least-loaded accepted position (lowest position on ties), -1 if none.
func leastLoaded(cands []Scored, ok func(pos int) bool) int {
	pos := -1
	for i, c := range cands {
		if ok(i) && (pos < 0 || c.Load < cands[pos].Load) {
			pos = i
		}
	}
	return pos
}

// hard: cap_i = ceil(pct · (totalLoad + 1) · capacity_i / (100 · totalCap)), at least 1, and at least
// CapFloor for a holder (2·score_i ≥ queryBlocks). The winner is the
// best score among candidates under their cap; if no under-cap candidate has a positive score, the
// least-loaded under-cap candidate takes it when spill relief is on (else the least-loaded with a
// positive score keeps the affinity); if every candidate is over its cap, the least-loaded one with
// a positive score.
func (l Law) hard(cands []Scored, queryBlocks, best, pct int) Verdict {
	caps := loadCaps(cands, pct)
	under := func(i int) bool { return cands[i].Load < caps[i] }
	for i, c := range cands {
		if queryBlocks > 0 && 2*c.Score >= queryBlocks {
			caps[i] = max(caps[i], l.CapFloor)
		}
	}
	pos := argmax(cands, under)
	switch {
	case pos >= 0 && cands[pos].Score > 0:
	case pos >= 0 && l.SpillRelief:
		pos = leastLoaded(cands, under)
	default:
		pos = leastLoaded(cands, func(i int) bool { return cands[i].Score > 0 })
	}
	if pos < 0 {
		pos = best
	}
	return Verdict{Pos: pos, Spill: pos != best, Caps: caps}
}

// loadCaps are the hard law's caps without the holder's floor: cap_i = ceil(pct · (totalLoad + 1)
// · capacity_i / (100 · totalCap)), at least 1 (pct below 100 counts as 175). The + 1 is the
// request being placed: consistent hashing with bounded loads bounds a bin by ⌈(1+ε)·m/n⌉ of the m
// balls including the one it places (HAProxy's hash-balance-factor counts "the one we're about to
// make" the same way). Without it the cap was the bound for one request fewer, which at low load
// is a whole request per endpoint: with 2 in flight on 4 engines the cap was 1, so an engine
// running one request was over it and a prefix it held was recomputed on an idle one.
func loadCaps(cands []Scored, pct int) []int {
	if pct < 100 {
		pct = 175
	}
	totalLoad, totalCap := 1, 0
	for _, c := range cands {
		totalLoad += c.Load
		totalCap += max(c.Capacity, 1)
	}
	caps := make([]int, len(cands))
	for i, c := range cands {
		num := int64(pct) * int64(totalLoad) * int64(max(c.Capacity, 1))
		den := int64(100) * int64(totalCap)
		caps[i] = int(max((num+den-1)/den, 1))
	}
	return caps
}

// soft: cost_i = (queryBlocks − score_i)·1000 + λ·load_i·meanCap/capacity_i; lowest cost wins, ties
// to the lower position. With no load the soft law equals argmax.
func (l Law) soft(cands []Scored, queryBlocks, best int) Verdict {
	lambda := int64(max(l.Lambda, 1))
	totalCap := int64(0)
	for _, c := range cands {
		totalCap += int64(max(c.Capacity, 1))
	}
	n := int64(len(cands))
	pos, bestCost := -1, int64(0)
	for i, c := range cands {
		uncached := int64(max(queryBlocks-c.Score, 0))
		cost := uncached*1000 + lambda*int64(c.Load)*totalCap/(n*int64(max(c.Capacity, 1)))
		if pos < 0 || cost < bestCost {
			pos, bestCost = i, cost
		}
	}
	return Verdict{Pos: pos, Spill: cands[pos].Score < cands[best].Score}
}

func clamp(v, lo, hi int) int { return min(max(v, lo), hi) }
