package route

// zeroHitRun is how many consecutive zero-overlap lookups against a non-empty inventory make the
// watchdog warn (and its metric count).
const zeroHitRun = 50

// watch is the zero-hit watchdog: a long run of lookups that find nothing while the inventory is
// not empty usually means a parity leg differs (seed, algorithm, block size, tokenizer). It warns
// once per transition and counts every occurrence. found is the best score of any endpoint.
//
// It is a hint, not evidence on any endpoint's exactness machine: a run of prompts nobody sent
// before looks the same, so it fences nothing. The legs it suspects have their own evidence there
// (the live parity watch, the verification probes, the realized-shortfall rule), which fences the
// endpoint that drifted.
func (rt *Router) watch(found int, anyResident bool) {
	if found > 0 || !anyResident {
		rt.zeroHits.Store(0)
		rt.watchdog.Store(false)
		return
	}
	if rt.zeroHits.Add(1) >= zeroHitRun {
		if rt.cfg.Metrics != nil {
			rt.cfg.Metrics.zeroHit(rt.rule.Name)
		}
		if !rt.watchdog.Swap(true) {
			rt.cfg.Log.Warn("KV-exact found no cached block for 50 consecutive prompts while the inventory is not empty: check seed, hash algorithm, block size, tokenizer and chat template (ctk certify); nothing is fenced by this warning, it ends at the next prompt that finds a cached block", "rule", rt.rule.Name)
		}
	}
}
