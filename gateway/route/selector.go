package route

import (
	"context"
	"encoding/binary"
	"fmt"
	"sort"
	"sync/atomic"

	"github.com/zeebo/xxh3"
)

// selectorTier is the single pool's last rung: the rule's selector picks among the candidates.
type selectorTier struct {
	sel  Selector
	name string // TierSelector + ":" + sel.Name(), built once
}

func (t selectorTier) pick(_ context.Context, c *choice) (pick, error) {
	return pick{ep: t.sel.Pick(c.req, c.cands), tier: t.name}, nil
}

// A Selector is a rule's load-balancing policy: the whole decision when KV-exact is off or misses
// in a single pool. It picks among candidates already filtered by health, in endpoint order.
type Selector interface {
	// Name is the rule's selector value (rr, wrr, least-load, chwbl).
	Name() string
	// Pick returns the chosen candidate, or nil when cands is empty.
	Pick(r *Request, cands []*Endpoint) *Endpoint
}

// NewSelector builds the named selector for a rule's endpoints (all of them, excluded or not, so
// that the CHWBL ring and WRR schedule stay stable while health changes).
func NewSelector(name string, all []*Endpoint, chwblReplication int, chwblLoadFactor float64, prefixChars int) (Selector, error) {
	switch name {
	case "rr", "":
		return &roundRobin{}, nil
	case "wrr":
		return &weightedRR{}, nil
	case "least-load":
		return &leastLoad{}, nil
	case "chwbl":
		return newCHWBL(all, chwblReplication, chwblLoadFactor, prefixChars), nil
	}
	return nil, fmt.Errorf("selector %q is not one of rr, wrr, least-load, chwbl", name)
}

type roundRobin struct{ next atomic.Uint64 }

func (s *roundRobin) Name() string { return "rr" }

func (s *roundRobin) Pick(_ *Request, cands []*Endpoint) *Endpoint {
	if len(cands) == 0 {
		return nil
	}
	return cands[(s.next.Add(1)-1)%uint64(len(cands))]
}

// weightedRR is smooth weighted round robin over a counter: endpoint i owns weight_i consecutive
// slots of each cycle, interleaved by taking slot k of the cycle modulo the total weight.
type weightedRR struct{ next atomic.Uint64 }

func (s *weightedRR) Name() string { return "wrr" }

func (s *weightedRR) Pick(_ *Request, cands []*Endpoint) *Endpoint {
	if len(cands) == 0 {
		return nil
	}
	total := 0
	for _, c := range cands {
		total += max(c.Weight, 1)
	}
	// Interleave: slot k visits endpoints in order, each while its credit for this round lasts.
	k := int((s.next.Add(1) - 1) % uint64(total))
	maxW := 0
	for _, c := range cands {
		maxW = max(maxW, max(c.Weight, 1))
	}
	for round := 0; round < maxW; round++ {
		for _, c := range cands {
			if max(c.Weight, 1) > round {
				if k == 0 {
					return c
				}
				k--
			}
		}
	}
	return cands[0]
}

// leastLoad picks the lowest active + queued; among ties the fewest blocks held when room is set
// (a KV-exact rule's inventory under missPlacement fewest-blocks: Router.New), then round robin.
type leastLoad struct {
	tie  atomic.Uint64
	room func(*Endpoint) int
}

func (s *leastLoad) Name() string { return "least-load" }

func (s *leastLoad) Pick(_ *Request, cands []*Endpoint) *Endpoint {
	return minLoadRoom(cands, &s.tie, s.room)
}

// chwbl is consistent hashing with bounded loads: a ring of virtual nodes per endpoint (weight ×
// replication); a request's key (model + leading prompt text, else conversation, else none) lands
// on the ring and walks clockwise to the first candidate whose load is within loadFactor × the mean.
// Requests without a key go round-robin.
type chwbl struct {
	ring        []vnode
	loadFactor  float64
	prefixChars int
	rr          roundRobin
}

type vnode struct {
	hash uint64
	ep   int // Endpoint.Index
}

func newCHWBL(all []*Endpoint, replication int, loadFactor float64, prefixChars int) *chwbl {
	s := &chwbl{loadFactor: loadFactor, prefixChars: prefixChars}
	var buf [8]byte
	for _, e := range all {
		n := replication * max(e.Weight, 1)
		for j := 0; j < n; j++ {
			binary.LittleEndian.PutUint64(buf[:], uint64(j))
			h := xxh3.HashString(e.Name + "#" + string(buf[:]))
			s.ring = append(s.ring, vnode{hash: h, ep: e.Index})
		}
	}
	sort.Slice(s.ring, func(i, j int) bool { return s.ring[i].hash < s.ring[j].hash })
	return s
}

func (s *chwbl) Name() string { return "chwbl" }

// Key returns the affinity key of a request and whether it has one.
func (s *chwbl) key(r *Request) (uint64, bool) {
	switch {
	case r.AffinityText != "":
		t := r.AffinityText
		if len(t) > s.prefixChars {
			t = t[:s.prefixChars]
		}
		return xxh3.HashString(r.Model + "\x00" + t), true
	case r.ConversationID != "":
		return xxh3.HashString("conv\x00" + r.ConversationID), true
	case r.User != "":
		return xxh3.HashString("user\x00" + r.User), true
	}
	return 0, false
}

func (s *chwbl) Pick(r *Request, cands []*Endpoint) *Endpoint {
	if len(cands) == 0 {
		return nil
	}
	key, ok := s.key(r)
	if !ok || len(s.ring) == 0 {
		return s.rr.Pick(r, cands)
	}
	byIndex := make(map[int]*Endpoint, len(cands))
	total := 0
	for _, c := range cands {
		byIndex[c.Index] = c
		total += c.Load()
	}
	// Bound: ceil(loadFactor × (total+1) / n), counting this request.
	bound := int(s.loadFactor*float64(total+1)/float64(len(cands)) + 0.999999)
	start := sort.Search(len(s.ring), func(i int) bool { return s.ring[i].hash >= key })
	var first *Endpoint
	for i := 0; i < len(s.ring); i++ {
		v := s.ring[(start+i)%len(s.ring)]
		c, ok := byIndex[v.ep]
		if !ok {
			continue
		}
		if first == nil {
			first = c
		}
		if c.Load() < bound {
			return c
		}
	}
	return first
}
