package route

// seedCold is cold-start seeding (loadLaw.coldStartSeedN, coldStartMinBlocks): every Nth KV-exact
// hit goes to the lowest-index candidate other than the winner w holding fewer than the minimum of
// blocks, so a new endpoint starts learning prefixes instead of staying empty forever. Explain
// neither seeds nor counts.
func (rt *Router) seedCold(w *Endpoint, cands []*Endpoint, d *Decision) *Endpoint {
	n := *rt.rule.LoadLaw.ColdStartSeedN
	if n <= 0 || d.dry || rt.hits.Add(1)%uint64(n) != 0 {
		return w
	}
	for _, e := range cands {
		if e != w && rt.cfg.Index.Resident(e.ID) < rt.rule.LoadLaw.ColdStartMinBlocks {
			d.Seeded = true
			return e
		}
	}
	return w
}
