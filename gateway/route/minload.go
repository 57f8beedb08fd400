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
	if len(cands) == 0 {
		return nil
	}
	best, n := cands[0].Load(), 0
	for _, c := range cands {
		switch l := c.Load(); {
		case l < best:
			best, n = l, 1
		case l == best:
			n++
		}
	}
	k := int((tie.Add(1) - 1) % uint64(n))
	for _, c := range cands {
		if c.Load() == best {
			if k == 0 {
				return c
			}
			k--
		}
	}
	return cands[0]
}
