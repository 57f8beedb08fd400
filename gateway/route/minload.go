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
// they evict least; remaining ties go round-robin. Room never overrides load. Two passes read each
// candidate twice rather than keep a buffer, which would allocate past a few candidates; a load
// that moves between them falls back to the first candidate.
func minLoadRoom(cands []*Endpoint, tie *atomic.Uint64, room func(*Endpoint) int) *Endpoint {
	if len(cands) == 0 {
		return nil
	}
	type rank struct{ load, blocks int }
	rankOf := func(c *Endpoint) rank {
		r := rank{load: c.Load()}
		if room != nil {
			r.blocks = room(c)
		}
		return r
	}
	best, n := rankOf(cands[0]), 0
	for _, c := range cands {
		switch r := rankOf(c); {
		case r.load < best.load || r.load == best.load && r.blocks < best.blocks:
			best, n = r, 1
		case r == best:
			n++
		}
	}
	k := int((tie.Add(1) - 1) % uint64(n))
	for _, c := range cands {
		if rankOf(c) == best {
			if k == 0 {
				return c
			}
			k--
		}
	}
	return cands[0]
}
