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

// Home placement (loadLaw.missPlacement "home"): a miss goes to the prompt's home, the eligible
// endpoint with the highest rendezvous (highest-random-weight) hash of the prompt's home key, so a
// prompt evicted everywhere comes back to the engine that held it, whose lower tiers may still
// hold it and whose working set it already was, instead of adding itself to another's. The home
// depends only on the key and the eligible endpoints' names: nothing is remembered per prompt,
// and an endpoint leaving moves only the prompts whose home it was. A home at or over the hard
// law's load cap (loadCaps: ⌈(1+ε)·(in flight + 1)·its capacity share⌉, without the holder's
// floor, which would let a home run capFloor requests while the others idle) places by headroom.

// homeKey is the key of the prompt's first minMatchTokens' worth of blocks (at least one): the
// shortest prefix KV-exact counts as a hit, so prompts that share it would follow each other to
// one endpoint as hits anyway, and a deeper key would send them to different homes. ok is false
// for a prompt with no full block.
func (rt *Router) homeKey(keys []uint64) (uint64, bool) {
	if len(keys) == 0 {
		return 0, false
	}
	return keys[max(rt.minBlocks(len(keys)), 1)-1], true
}

// home is the position among cands of the prompt's home: the highest rendezvous weight of key
// and the endpoint's name (its ID is a position in the rule's list, which a reordered rule would
// shift), ties to the lowest position.
func home(eps []*Endpoint, key uint64) int {
	best, bestW := 0, uint64(0)
	for i, e := range eps {
		if w := rendezvous(key, e.Name); i == 0 || w > bestW {
			best, bestW = i, w
		}
	}
	return best
}

// rendezvous is the weight of endpoint name for key: FNV-1a of the name, mixed with the key by
// the splitmix64 finalizer, so every bit of either moves the weight.
func rendezvous(key uint64, name string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h = (h ^ uint64(name[i])) * 1099511628211
	}
	z := key ^ h
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// placeHome is home placement's choice: the home, unless it is at or over the hard law's cap
// (-1: place by headroom).
func placeHome(cands []Scored, eps []*Endpoint, key uint64, pct int) int {
	h := home(eps, key)
	if cands[h].Load >= loadCaps(cands, pct)[h] {
		return -1
	}
	return h
}

// placeMiss is the KV-exact tier's answer to a miss under headroom or home placement: the miss is
// still counted (the decision records it), but the endpoint is chosen by home (when keyed), else
// by load, then KV headroom. The evidence shows each candidate's load, fill and capacity.
func (rt *Router) placeMiss(s *scores, keys []uint64, d *Decision) *Endpoint {
	if len(s.cands) == 0 {
		return nil
	}
	fill := make([]int, len(s.cands))
	for i, e := range s.eps {
		fill[i] = rt.cfg.Index.Resident(e.ID) + rt.predict.size(e.ID)
	}
	pos := -1
	if key, ok := rt.homeKey(keys); ok && rt.law.MissHome {
		pos = placeHome(s.cands, s.eps, key, rt.law.FactorPct)
	}
	if pos < 0 {
		pos = place(s.cands, fill, rt.tiePlace.Add(1)-1)
	}
	w := s.eps[pos]
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
