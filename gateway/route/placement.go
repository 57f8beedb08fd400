package route

// Miss placement (loadLaw.missPlacement "headroom"): a prompt that no eligible endpoint holds, or
// holds below minMatchTokens, goes to the least-loaded endpoint, and among equally loaded ones to
// the one whose KV cache is least full, where its blocks are least likely to evict blocks still in
// use. The least-load selector round-robins those ties, so it could put several new prefixes on
// one engine whose KV cache they overflow while another stood half empty (docs/routing.md, Miss
// placement).

// place picks, among the least-loaded candidates, the one whose KV cache is least full: fill[i]
// (resident plus predicted blocks) over its capacity, compared by cross-multiplication. Genuine
// ties (same load, same fill ratio) go round robin: the tie-th of them, modulo their number, so
// a burst that no event or prediction has yet told apart spreads like the least-load selector's.
// Load comes first: choosing by headroom among all the candidates under the hard law's cap put
// new prompts behind up to 1.75× the mean load (docs/routing.md, Miss placement).
func place(cands []Scored, fill []int, tie uint64) int {
	// better reports whether i beats j: less load, else a lower fill ratio (without division).
	better := func(i, j int) (bool, bool) {
		a, b := cands[i], cands[j]
		if a.Load != b.Load {
			return a.Load < b.Load, false
		}
		lhs := int64(fill[i]) * int64(max(b.Capacity, 1))
		rhs := int64(fill[j]) * int64(max(a.Capacity, 1))
		return lhs < rhs, lhs == rhs
	}
	best, n := 0, 1
	for i := 1; i < len(cands); i++ {
		switch win, eq := better(i, best); {
		case win:
			best, n = i, 1
		case eq:
			n++
		}
	}
	k := int(tie % uint64(n))
	for i := range cands {
		if _, eq := better(i, best); eq || i == best {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return best
}

// placeMiss is the KV-exact tier's answer to a miss under headroom placement: the miss is still
// counted (the decision records it), but the endpoint is chosen by load, then KV headroom. The
// evidence shows each candidate's load, fill and capacity.
func (rt *Router) placeMiss(s *scores, d *Decision) *Endpoint {
	if len(s.cands) == 0 {
		return nil
	}
	fill := make([]int, len(s.cands))
	for i, e := range s.eps {
		fill[i] = rt.cfg.Index.Resident(e.ID) + rt.predict.size(e.ID)
	}
	w := s.eps[place(s.cands, fill, rt.tiePlace.Add(1)-1)]
	j := 0
	for i, e := range s.eps {
		for d.Endpoints[j].Name != e.Name {
			j++
		}
		ev := &d.Endpoints[j]
		ev.Fill, ev.Capacity = fill[i], s.cands[i].Capacity
	}
	return w
}
