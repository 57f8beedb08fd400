package route

import (
	"context"

	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/rules"
)

// A tier is one rung of a rule's ladder: it picks an endpoint for the request or passes. KV-exact
// says why it passed (a Miss, counted and explained); the other tiers pass when they have nothing to
// go on. An error ends the decision (admission's shed or park deadline).
type tier interface {
	pick(ctx context.Context, c *choice) (pick, error)
}

// pick is a tier's answer: the endpoint and the tier name the decision records, or a pass (ep nil),
// with KV-exact's Miss and its detail.
type pick struct {
	ep     *Endpoint
	tier   string
	miss   Miss
	reason string
}

// passed is a pass that says why.
func passed(m Miss, reason string) pick { return pick{miss: m, reason: reason} }

// choice is one decision in the making: what the tiers read, and the decision they fill in
// (KV-exact writes its evidence there whether it picks or passes). It is a field of that decision.
type choice struct {
	req *Request
	// retry holds the endpoints this request may not use (connect failed, adapter not listed).
	retry inventory.Mask
	// cands are the ladder's candidates: the non-excluded endpoints of its role, narrowed by
	// admission to those under their in-flight cap.
	cands []*Endpoint
	d     *Decision
	// pin is the session tier's pin; the decode pick follows it too.
	pin    sessionPin
	pinned bool
}

// ladder is a rule's tiers in the order they are tried, over the endpoints of one role.
type ladder struct {
	role  Role
	tiers []tier
}

// newLadder builds the tiers a rule's mode and endpoints call for ([x]: when the rule enables it):
//
//	single pool, kvExactMode 3: kv-exact, selector
//	single pool, kvExactMode 0: kv-exact off, selector
//	P/D, kvExactMode 1: [admission], session, [trie], kv-exact, min-load, rescue
//	P/D, kvExactMode 0: [admission], session, [trie], kv-exact off, min-load, rescue
//
// A prefill winner then gets its decode endpoint (decode.go); a rescue winner serves alone.
func (rt *Router) newLadder(sel Selector) ladder {
	r := rt.rule
	if !rt.pd {
		kv := tier(kvExactOffTier{})
		if r.KVExactMode == rules.KVExactPool {
			kv = kvExactTier{rt: rt, role: RoleNormal}
		}
		return ladder{role: RoleNormal, tiers: []tier{kv, selectorTier{sel: sel, name: TierSelector + ":" + sel.Name()}}}
	}
	var ts []tier
	if rt.admission != nil {
		ts = append(ts, admissionTier{rt: rt})
	}
	ts = append(ts, sessionTier{s: rt.sessions})
	if rt.trie != nil {
		ts = append(ts, trieTier{t: rt.trie, thresholdPct: r.Trie.ThresholdPct, balanceAbs: r.Trie.BalanceAbs})
	}
	if r.KVExactMode == rules.KVExactPD {
		// Admission may have closed KV-exact's winner: it must be one of the ladder's candidates.
		ts = append(ts, kvExactTier{rt: rt, role: RolePrefill, amongCands: true})
	} else {
		ts = append(ts, kvExactOffTier{})
	}
	ts = append(ts, minLoadTier{tie: &rt.tieMinLoad}, rescueTier{rt: rt})
	return ladder{role: RolePrefill, tiers: ts}
}

// climb tries the ladder's tiers in order until one picks; the KV-exact tier's miss is recorded
// on the decision as it passes.
func (rt *Router) climb(ctx context.Context, c *choice) error {
	for _, t := range rt.ladder.tiers {
		p, err := t.pick(ctx, c)
		if err != nil {
			return err
		}
		if p.miss != MissNone {
			rt.miss(c.d, p.miss, p.reason)
		}
		if p.ep != nil {
			c.d.Target, c.d.Tier = p.ep, p.tier
			return nil
		}
	}
	return nil
}
