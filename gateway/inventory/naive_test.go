package inventory

import (
	"slices"
	"sync"
)

// naiveIndex is the obvious implementation of the same rules: the oracle of the model test and the
// baseline of the benchmarks. order (kept only with a capacity) lists each endpoint's resident
// keys by the time they last became resident.
type naiveIndex struct {
	mu               sync.RWMutex
	cap              int
	m                map[uint64]map[EndpointID]int
	res              map[EndpointID]int
	order            map[EndpointID][]uint64
	retired, unknown uint64
}

func newNaive(capacity int) *naiveIndex {
	return &naiveIndex{cap: capacity, m: map[uint64]map[EndpointID]int{}, res: map[EndpointID]int{}, order: map[EndpointID][]uint64{}}
}

func (n *naiveIndex) store(ep EndpointID, keys []uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, k := range keys {
		eps := n.m[k]
		if eps == nil {
			eps = map[EndpointID]int{}
			n.m[k] = eps
		}
		eps[ep]++
		if eps[ep] == 1 {
			n.res[ep]++
			if n.cap > 0 {
				n.order[ep] = append(n.order[ep], k)
				if n.res[ep] > n.cap {
					old := n.order[ep][0]
					n.order[ep] = n.order[ep][1:]
					n.drop(old, ep)
					n.retired++
				}
			}
		}
	}
}

func (n *naiveIndex) drop(k uint64, ep EndpointID) {
	if eps := n.m[k]; eps != nil && eps[ep] > 0 {
		delete(eps, ep)
		n.res[ep]--
		if len(eps) == 0 {
			delete(n.m, k)
		}
	}
}

func (n *naiveIndex) remove(ep EndpointID, keys []uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, k := range keys {
		eps := n.m[k]
		if eps == nil || eps[ep] == 0 {
			n.unknown++
			continue
		}
		if eps[ep] == 1 {
			n.drop(k, ep)
			if n.cap > 0 {
				i := slices.Index(n.order[ep], k)
				n.order[ep] = slices.Delete(n.order[ep], i, i+1)
			}
		} else {
			eps[ep]--
		}
	}
}

func (n *naiveIndex) clear(ep EndpointID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, eps := range n.m {
		if eps[ep] > 0 {
			n.drop(k, ep)
		}
	}
	delete(n.order, ep)
}

func (n *naiveIndex) score(keys []uint64, mask Mask, out []Score) []Score {
	n.mu.RLock()
	defer n.mu.RUnlock()
	out = out[:0]
	for _, id := range mask.IDs(nil) {
		s := Score{Endpoint: id}
		gap := false
		for _, k := range keys {
			if n.m[k][id] > 0 {
				s.Overlap++
				if !gap {
					s.Prefix++
				}
			} else {
				gap = true
			}
		}
		out = append(out, s)
	}
	return out
}

func (n *naiveIndex) snapshot(ep EndpointID) []KeyCount {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var out []KeyCount
	for k, eps := range n.m {
		if c := eps[ep]; c > 0 {
			out = append(out, KeyCount{Key: k, Count: c})
		}
	}
	slices.SortFunc(out, func(a, b KeyCount) int {
		if a.Key < b.Key {
			return -1
		}
		if a.Key > b.Key {
			return 1
		}
		return 0
	})
	return out
}
