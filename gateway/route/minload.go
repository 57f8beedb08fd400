package route

import (
	"context"
	"sync/atomic"
)

// minLoadTier picks the least-loaded candidate (genuine ties round-robin): the P/D ladder's answer
// when no affinity tier had anything to go on.
type minLoadTier struct{ tie *atomic.Uint64 }

func (t minLoadTier) pick(_ context.Context, c *choice) (pick, error) {
	return pick{ep: minLoad(c.cands, t.tie), tier: TierMinLoad}, nil
}

// minLoad returns the least-loaded candidate, breaking genuine ties round-robin.
func minLoad(cands []*Endpoint, tie *atomic.Uint64) *Endpoint {
	return minLoadRoom(cands, tie, nil)
}

// minLoadRoom returns the least-loaded candidate. With room (the blocks an endpoint holds) set,
// equally loaded candidates go to the one holding the fewest blocks, so new prefixes land where
// they evict least; remaining ties go round-robin. Room never overrides load.
func minLoadRoom(cands []*Endpoint, tie *atomic.Uint64, room func(*Endpoint) int) *Endpoint {
	if len(cands) == 0 {
		return nil
	}
	// Each candidate is read once, so both passes below see the same loads and rooms.
	type rank struct{ load, blocks int }
	var buf [16]rank
	rs := buf[:0]
	for _, c := range cands {
		r := rank{load: c.Load()}
		if room != nil {
			r.blocks = room(c)
		}
		rs = append(rs, r)
	}
	best, n := rs[0], 0
	for _, r := range rs {
		switch {
		case r.load < best.load || r.load == best.load && r.blocks < best.blocks:
			best, n = r, 1
		case r == best:
			n++
		}
	}
	k := int((tie.Add(1) - 1) % uint64(n))
	for i, r := range rs {
		if r == best {
			if k == 0 {
				return cands[i]
			}
			k--
		}
	}
	return cands[0]
}
