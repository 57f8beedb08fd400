package route

import (
	"github.com/kvexact/kvexact/gateway/inventory"
)

// scores is KV-exact's view of one role's endpoints for one prompt. Every endpoint is scored (the
// evidence shows them all), but only the eligible ones are the load law's candidates.
type scores struct {
	cands []Scored    // the law's candidates, in endpoint order
	eps   []*Endpoint // eps[i] is cands[i]'s endpoint
	best  int         // the best candidate score
	// holder is the best-scoring endpoint of the role, eligible or not, and holderScore its score:
	// an ineligible holder makes a miss "excluded" rather than "no_worker".
	holder      *Endpoint
	holderScore int
	// anyResident: some endpoint of the role holds blocks (the zero-hit watchdog's condition).
	anyResident bool
	// confirmed is the best score of the engines' events alone, predictions left out: the zero-hit
	// watchdog's, since the router's own predictions say nothing about parity.
	confirmed int
}

// score scores every endpoint of role against the prompt's keys and appends each one's evidence
// to d. Predict-on-route extends an endpoint's prefix with its predicted blocks; the rule's scoring
// says whether the overlap count or the prefix depth drives selection.
func (rt *Router) score(keys []uint64, role Role, retry, absent, uncert inventory.Mask, uncertWhy string, unpinned bool, d *Decision) scores {
	var mask inventory.Mask
	n := 0
	for _, e := range rt.eps {
		if e.Role == role {
			mask.Set(e.ID)
			n++
		}
	}
	found := rt.cfg.Index.Score(keys, mask, nil)
	byID := make(map[inventory.EndpointID]inventory.Score, len(found))
	for _, s := range found {
		byID[s.Endpoint] = s
	}
	// Sized once: growing them endpoint by endpoint cost an allocation per doubling.
	out := scores{cands: make([]Scored, 0, n), eps: make([]*Endpoint, 0, n)}
	d.Endpoints = make([]EndpointEvidence, 0, n)
	for _, e := range rt.eps {
		if e.Role != role {
			continue
		}
		s := byID[e.ID]
		// A data-parallel endpoint is scored by one rank: a request hits one rank's cache.
		rs, rank, dp := rt.cfg.Ranks.score(e.ID, keys, e.RankHeader != "" && !unpinned, rt.rule.Scoring == "prefix")
		if dp {
			s = rs
		}
		hit, hybrid := rt.hybridHit(e, keys, &s)
		confirmed := s.Overlap
		if rt.rule.Scoring == "prefix" {
			confirmed = s.Prefix
		}
		out.confirmed = max(out.confirmed, confirmed)
		var predicted int
		// Predictions are per endpoint, not per rank: a data-parallel endpoint scores the blocks
		// its ranks' events confirmed only.
		if rt.predict != nil && !dp && (!hybrid || hit.Blocks == s.Prefix) {
			s.Prefix, predicted = rt.predict.extend(e.ID, keys, s.Prefix)
			s.Overlap = max(s.Overlap, s.Prefix)
		}
		score := s.Overlap
		if rt.rule.Scoring == "prefix" {
			score = s.Prefix
		}
		ev := rt.evidence(e, s, predicted, retry, absent)
		var rates Rates
		if rt.law.Kind == LawTTFT {
			rates = rt.ratesOf(e)
		}
		var credit int
		// Lower tiers are indexed per endpoint, not per rank: a data-parallel endpoint's pinned rank
		// may not hold the host copy another rank offloaded, so its lower tiers are not scored.
		if len(rt.cfg.Lower) > 0 && !dp {
			ev.lower = rt.lowerHit(e, keys, s.Prefix)
			ev.Tiers = ev.lower.evidence()
			switch {
			case ev.lower.Blocks() == 0:
			case rt.law.Kind == LawTTFT:
				credit = ev.lower.Blocks() // the law prices them itself; the score says "held"
			default:
				credit = lowerCredit(ev.lower, rt.ratesOf(e))
			}
			score += credit
		}
		if rank >= 0 {
			ev.Rank = &rank
		}
		if uncert.Has(e.ID) && ev.Excluded == "" {
			ev.Excluded, ev.Eligible = uncertWhy, false
		}
		if hybrid && hit.Limit != "" {
			ev.FullPrefix, ev.Limit = hit.Full, hit.Limit
		}
		d.Endpoints = append(d.Endpoints, ev)
		if rt.cfg.Index.Resident(e.ID) > 0 {
			out.anyResident = true
		}
		if score > out.holderScore {
			out.holderScore, out.holder = score, e
		}
		if ev.Eligible {
			c := Scored{Index: e.Index, Score: score, Load: e.Load(), Capacity: max(e.Capacity, 1) * max(e.Weight, 1),
				Lower: ev.lower, LowerCredit: credit}
			if rt.law.Kind == LawTTFT {
				c.Ahead, c.AheadHit, c.Assumed, c.Rates = e.Ahead(), e.AheadHit(), predicted, rates
				c.EngineWaiting, c.Slots = e.EngineWaiting(), e.Slots()
			}
			out.cands = append(out.cands, c)
			out.eps = append(out.eps, e)
			out.best = max(out.best, score)
		}
	}
	return out
}

// hybridHit applies the engine's hit rule to an endpoint whose engine publishes KV-cache groups
// other than full attention (gateway/kvgroups): its prefix and overlap become the longest prefix
// every group accepts. Other endpoints keep the inventory's score (hybrid false).
func (rt *Router) hybridHit(e *Endpoint, keys []uint64, s *inventory.Score) (hit hybridResult, hybrid bool) {
	if rt.cfg.Groups == nil {
		return hit, false
	}
	r, ok := rt.cfg.Groups.Hit(e.ID, keys, s.Prefix)
	if !ok {
		return hit, false
	}
	hit = hybridResult{Blocks: r.Blocks, Full: s.Prefix, Limit: r.Limit}
	s.Prefix, s.Overlap = r.Blocks, r.Blocks
	return hit, true
}

// hybridResult is a hybrid endpoint's hit with the full-attention prefix it was cut from.
type hybridResult struct {
	Blocks, Full int
	Limit        string
}

// miss is the guard after scoring: some candidate must hold a prefix, at least need blocks deep.
func (s *scores) miss(need int) (Miss, string) {
	switch {
	case s.best <= 0 && s.holder != nil:
		return MissExcluded, "the endpoint holding the prefix (" + s.holder.Name + ") is excluded or not certified"
	case s.best <= 0:
		return MissNoWorker, "no endpoint holds any of the prompt's blocks"
	case s.best < need:
		return MissShallow, "best match is below minMatchTokens"
	}
	return MissNone, ""
}

// minBlocks is minMatchTokens in full blocks (rounded up), at most the blocks the prompt can hit.
func (rt *Router) minBlocks(blocks int) int {
	return min((rt.minMatch+rt.rule.BlockSize-1)/rt.rule.BlockSize, blocks)
}
