package route

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvexact/kvexact/gateway/inventory"
)

// Ranks is a rule's per-rank residency for its data-parallel endpoints. Each rank of such an
// endpoint is an endpoint of Ranks' own index, fed from that rank's events, beside the rule's
// index (which keeps the union for everything else: capacity, snapshots, the other tiers). A
// request lands on one rank and hits only that rank's cache, so KV-exact scores a data-parallel
// endpoint by one rank: the rank holding most of the prompt when the gateway can send the request
// there (Endpoint.RankHeader), else the least any rank holds, since the engine picks the rank.
type Ranks struct {
	ix *inventory.Index

	mu  sync.RWMutex
	ids map[inventory.EndpointID][]inventory.EndpointID // endpoint → its ranks' ids, in rank order
	// n is len(ids), read without the lock: a rule without data-parallel endpoints (most) pays
	// one atomic load per scored endpoint.
	n atomic.Int32
}

// NewRanks returns an empty per-rank index; cfg is the rule's inventory configuration (its
// capacity applies per rank).
func NewRanks(cfg inventory.Config) *Ranks {
	return &Ranks{ix: inventory.New(cfg), ids: map[inventory.EndpointID][]inventory.EndpointID{}}
}

// Add registers endpoint ep (named name) with n ranks; n < 2 registers nothing (the rule's index
// is the rank's).
func (r *Ranks) Add(ep inventory.EndpointID, name string, n int) error {
	if n < 2 {
		return nil
	}
	ids := make([]inventory.EndpointID, 0, n)
	for i := 0; i < n; i++ {
		id, err := r.ix.AddEndpoint(fmt.Sprintf("%s/rank%d", name, i))
		if err != nil {
			for _, d := range ids {
				_ = r.ix.RemoveEndpoint(d)
			}
			return fmt.Errorf("data-parallel ranks of %s: %w", name, err)
		}
		ids = append(ids, id)
	}
	r.mu.Lock()
	r.ids[ep] = ids
	r.n.Store(int32(len(r.ids)))
	r.mu.Unlock()
	return nil
}

// Remove forgets endpoint ep's ranks (stop its event stream first).
func (r *Ranks) Remove(ep inventory.EndpointID) {
	if r == nil {
		return
	}
	r.mu.Lock()
	ids := r.ids[ep]
	delete(r.ids, ep)
	r.n.Store(int32(len(r.ids)))
	r.mu.Unlock()
	for _, id := range ids {
		_ = r.ix.RemoveEndpoint(id)
	}
}

// Of returns ep's rank ids (nil: not a data-parallel endpoint).
func (r *Ranks) Of(ep inventory.EndpointID) []inventory.EndpointID {
	if r == nil || r.n.Load() == 0 {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.ids[ep]
}

// Store, Remove and Clear apply one event update of ep's rank. A clear clears every rank, as it
// clears the union: an engine's clear, a gap or a restart seen on one rank says nothing about
// which of the others still hold their blocks.
func (r *Ranks) Store(ep inventory.EndpointID, rank int, keys []uint64) error {
	if id, ok := r.rank(ep, rank); ok {
		return r.ix.Store(id, keys)
	}
	return nil
}

func (r *Ranks) RemoveKeys(ep inventory.EndpointID, rank int, keys []uint64) error {
	if id, ok := r.rank(ep, rank); ok {
		return r.ix.Remove(id, keys)
	}
	return nil
}

func (r *Ranks) Clear(ep inventory.EndpointID) {
	for _, id := range r.Of(ep) {
		_ = r.ix.Clear(id)
	}
}

func (r *Ranks) rank(ep inventory.EndpointID, rank int) (inventory.EndpointID, bool) {
	ids := r.Of(ep)
	if rank < 0 || rank >= len(ids) {
		return 0, false
	}
	return ids[rank], true
}

// score is ep's score by one rank: with pin, the rank holding most of keys (by prefix when
// prefixScoring, else by overlap; ties to the lowest rank) and its index; without, the least any
// rank holds (rank -1). ok is false for an endpoint without ranks.
func (r *Ranks) score(ep inventory.EndpointID, keys []uint64, pin, prefixScoring bool) (s inventory.Score, rank int, ok bool) {
	ids := r.Of(ep)
	if len(ids) == 0 {
		return s, -1, false
	}
	var mask inventory.Mask
	for _, id := range ids {
		mask.Set(id)
	}
	found := r.ix.Score(keys, mask, nil)
	by := make(map[inventory.EndpointID]inventory.Score, len(found))
	for _, f := range found {
		by[f.Endpoint] = f
	}
	val := func(x inventory.Score) int {
		if prefixScoring {
			return x.Prefix
		}
		return x.Overlap
	}
	rank = -1
	for i, id := range ids {
		x := by[id]
		switch {
		case pin:
			if rank < 0 || val(x) > val(s) {
				s, rank = x, i
			}
		case i == 0:
			s = x
		default:
			s.Prefix, s.Overlap = min(s.Prefix, x.Prefix), min(s.Overlap, x.Overlap)
		}
	}
	s.Endpoint = ep
	return s, rank, true
}
