package route

import (
	"context"
	"fmt"

	"github.com/kvexact/kvexact/gateway/inventory"
)

// kvExactTier is KV-exact: the prompt's block keys through the guard ladder (keys.go), every
// endpoint of the role scored against the inventory with its evidence (score.go, evidence.go), the
// zero-hit watchdog (watchdog.go), the load law's winner among the eligible (law.go), then
// cold-start seeding (coldstart.go). It passes with the Miss of the first guard that fails.
type kvExactTier struct {
	rt   *Router
	role Role // RoleNormal in a single pool, RolePrefill in P/D
	// amongCands: the winner must also be one of the ladder's candidates, else the tier passes
	// (without a miss: the law did pick, admission had closed it).
	amongCands bool
}

func (t kvExactTier) pick(ctx context.Context, c *choice) (pick, error) {
	rt, d := t.rt, c.d
	keys, m, reason := rt.promptKeys(ctx, c.req, d)
	if m != MissNone {
		return passed(m, reason), nil // an engine whose keys carry no adapter misses lora first
	}
	uncert, lora := rt.adapterUncertified(c.req.Model)
	if lora != "" && rt.allOfRole(uncert, t.role) {
		return passed(MissAdapterUncertified, fmt.Sprintf("no endpoint's certificate proved adapter %q (LoRA name %q): %s", c.req.Model, lora, rt.adapterLift(c.req.Model))), nil
	}
	var uncertWhy string
	if lora != "" {
		uncertWhy = fmt.Sprintf("%s: its certificate did not prove the adapter with LoRA name %q (%s)", ExcludedAdapterUncertified, lora, rt.adapterLift(c.req.Model))
	}
	// Scored up to the engine's hit cap: the blocks past it are recomputed whoever holds them.
	s := rt.score(keys[:d.hit], t.role, c.retry, rt.adapterAbsent(c.req.Model), uncert, uncertWhy, c.req.RanksUnpinned, d)
	if !d.dry {
		rt.watch(s.confirmed, s.anyResident)
	}
	if m, reason := s.miss(rt.minBlocks(d.hit)); m != MissNone {
		var w *Endpoint
		switch {
		case rt.law.MissLast:
			w = rt.placeRemembered(&s, keys[:d.hit])
		case rt.law.MissHeadroom:
			w = rt.placeMiss(&s, keys[:d.hit], d)
		}
		if w == nil || (t.amongCands && !contains(c.cands, w)) {
			return passed(m, reason), nil
		}
		return pick{ep: w, tier: TierPlacement, miss: m, reason: reason}, nil
	}
	v := rt.law.PickPrompt(s.cands, len(keys), d.tokens)
	if v.Pos < 0 {
		return passed(MissNoWorker, "the load law found no candidate"), nil
	}
	w := s.eps[v.Pos]
	d.Score, d.Spill = s.cands[v.Pos].Score, v.Spill
	d.noteWinner(w, s.eps, v.Caps, v.TTFT)
	w = rt.seedCold(w, s.eps, d)
	if t.amongCands && !contains(c.cands, w) {
		return pick{}, nil
	}
	for _, ev := range d.Endpoints {
		if ev.Name == w.Name && ev.Rank != nil && (ev.Prefix > 0 || ev.Overlap > 0) {
			d.Rank = ev.Rank
		}
	}
	return pick{ep: w, tier: TierKVExact}, nil
}

// kvExactOffTier holds KV-exact's place on a rule whose kvExactMode is 0: it always passes, so the
// decision says why KV-exact did not run.
type kvExactOffTier struct{}

func (kvExactOffTier) pick(context.Context, *choice) (pick, error) {
	return passed(MissModeOff, "kvExactMode is 0"), nil
}

// allOfRole reports whether m holds every endpoint of role.
func (rt *Router) allOfRole(m inventory.Mask, role Role) bool {
	for _, e := range rt.eps {
		if e.Role == role && !m.Has(e.ID) {
			return false
		}
	}
	return true
}
