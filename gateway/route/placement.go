package route

// Miss placement (loadLaw.missPlacement "headroom"): a prompt that no eligible endpoint holds, or
// holds below minMatchTokens, goes to the least-loaded endpoint, and among equally loaded ones to
// the one whose KV cache is least full, where its blocks are least likely to evict blocks still in
// use. The least-load selector round-robins those ties, so it could put several new prefixes on
// one engine whose KV cache they overflow while another stood half empty (docs/routing.md, Miss
// placement).

// place picks, among the least-loaded candidates, the one whose KV cache is least full: fill[i]
// (resident plus predicted blocks) over its capacity, compared by cross-multiplication; ties go to
// the lowest position. Load comes first: choosing by headroom among all the candidates under the
// hard law's cap put new prompts behind up to 1.75× the mean load and doubled TTFT p90 on the
// system-prompt workload (docs/routing.md, Miss placement).
func place(cands []Scored, fill []int) int {
	pos := -1
	for i, c := range cands {
		if pos < 0 {
			pos = i
			continue
		}
		b := cands[pos]
		// fill_i/cap_i < fill_b/cap_b without division.
		lhs := int64(fill[i]) * int64(max(b.Capacity, 1))
		rhs := int64(fill[pos]) * int64(max(c.Capacity, 1))
		if c.Load < b.Load || (c.Load == b.Load && lhs < rhs) {
			pos = i
		}
	}
	return pos
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
	w := s.eps[place(s.cands, fill)]
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
