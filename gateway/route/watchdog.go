package route

// zeroHitRun is how many consecutive zero-overlap lookups against a non-empty inventory make the
// watchdog warn (and its metric count).
const zeroHitRun = 50

// watch is the zero-hit watchdog: a long run of lookups that find nothing while the inventory is
// not empty usually means a parity leg differs (seed, algorithm, block size, tokenizer). It warns
// once per transition and counts every occurrence. found is the best score of any endpoint.
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
			rt.cfg.Log.Warn("KV-exact found no cached block for 50 consecutive prompts while the inventory is not empty: check seed, hash algorithm, block size, tokenizer and chat template (ctk certify)", "rule", rt.rule.Name)
		}
	}
}
