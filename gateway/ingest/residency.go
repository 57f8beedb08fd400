package ingest

// presence is the "presence" residency rule (contracts.Events.Residency; the family's
// EventResidency says which releases have it): per rank, which indexed KV-cache groups hold each
// key. A store of a key its group already holds changes nothing: an engine may re-emit
// BlockStored for blocks reused from the prefix cache (kv_cache_report_mode="full"), and nothing
// on the wire tells a re-emission from a new copy, so counting every store would leave a
// key resident after its only copy is evicted (a false hit that lasts until the next clear). The
// price is the other way round and safe: two copies of one hash in one group end at the first
// removal (a false miss until the next store). The inventory sees each key at most once per rank.
type presence struct {
	ranks map[int]map[uint64]uint64 // rank → key → bit set of the groups holding it
	n     int
}

// groupBit is the bit of a KV-cache group: groups beyond 63 share the last bit (no engine has that
// many; sharing only merges their presence, it never invents a copy).
func groupBit(group int) uint64 {
	if group < 0 || group > 63 {
		group = 63
	}
	return 1 << uint(group)
}

// filter rewrites one update under the rule: stores pass for keys no group of the rank held,
// removals for keys no group of the rank holds any more; clears reset everything.
func (p *presence) filter(u Update, group int, keys []uint64) []uint64 {
	out := keys[:0]
	switch u.Op {
	case OpClear:
		clear(p.ranks)
		p.n = 0
		return nil
	case OpStore:
		held := p.ranks[u.Rank]
		if held == nil {
			held = map[uint64]uint64{}
			p.ranks[u.Rank] = held
		}
		bit := groupBit(group)
		for _, k := range u.Keys {
			m, ok := held[k]
			if m&bit != 0 {
				continue // this group already holds it: a re-emission, not a second copy
			}
			held[k] = m | bit
			if !ok {
				p.n++
				out = append(out, k)
			}
		}
	case OpRemove:
		held := p.ranks[u.Rank]
		bit := groupBit(group)
		for _, k := range u.Keys {
			m, ok := held[k]
			if !ok || m&bit == 0 {
				continue
			}
			if m &^= bit; m != 0 {
				held[k] = m
				continue
			}
			delete(held, k)
			p.n--
			out = append(out, k)
		}
	}
	return out
}
