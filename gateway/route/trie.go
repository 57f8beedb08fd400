package route

import (
	"context"
	"sync"

	"github.com/zeebo/xxh3"
)

// prefixTrie is the gateway's own memory of which prefill endpoint served which prompt prefix
// (mode-1 tier 1). The prompt text is cut into fixed chunks; the chained hash of chunks 0..i names
// the trie node for the first i+1 chunks, and each node remembers the endpoints that served it. A
// lookup walks the chain as far as it matches and reports the deepest endpoint and the match rate.
// Size is bounded: when full, the oldest generation of nodes is dropped.
type prefixTrie struct {
	chunk    int
	maxNodes int

	mu   sync.Mutex
	cur  map[uint64][]int // node → endpoint indices, newest generation
	prev map[uint64][]int // older generation, dropped on the next rotation
}

func newPrefixTrie(chunk, maxNodes int) *prefixTrie {
	return &prefixTrie{chunk: chunk, maxNodes: maxNodes, cur: map[uint64][]int{}}
}

// nodes returns the chained chunk hashes of text (full chunks only, plus the tail).
func (t *prefixTrie) nodes(text string) []uint64 {
	var out []uint64
	var h uint64
	for i := 0; i < len(text); i += t.chunk {
		end := min(i+t.chunk, len(text))
		h = xxh3.HashStringSeed(text[i:end], h)
		out = append(out, h)
	}
	return out
}

// match returns, for the deepest matching node, its endpoints and the matched fraction in percent.
func (t *prefixTrie) match(text string) (eps []int, pct int) {
	nodes := t.nodes(text)
	if len(nodes) == 0 {
		return nil, 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	depth := 0
	for i, n := range nodes {
		e, ok := t.cur[n]
		if !ok {
			e, ok = t.prev[n]
		}
		if !ok {
			break
		}
		eps, depth = e, i+1
	}
	return eps, depth * 100 / len(nodes)
}

// insert records that endpoint ep served text.
func (t *prefixTrie) insert(text string, ep int) {
	nodes := t.nodes(text)
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range nodes {
		eps := t.cur[n]
		if eps == nil {
			eps = t.prev[n]
		}
		found := false
		for _, e := range eps {
			found = found || e == ep
		}
		if !found {
			eps = append(append([]int(nil), eps...), ep)
		}
		t.cur[n] = eps
	}
	if len(t.cur) >= t.maxNodes {
		t.prev, t.cur = t.cur, map[uint64][]int{}
	}
}

// trieTier picks the deepest candidate that served the prompt's text prefix, when the match covers
// at least thresholdPct of the text and the candidates' loads differ by at most balanceAbs (an
// imbalanced pool goes to min-load instead).
type trieTier struct {
	t            *prefixTrie
	thresholdPct int
	balanceAbs   int
}

func (t trieTier) pick(_ context.Context, c *choice) (pick, error) {
	if len(c.cands) == 0 || c.req.AffinityText == "" || t.imbalanced(c.cands) {
		return pick{}, nil
	}
	eps, pct := t.t.match(c.req.AffinityText)
	if pct < t.thresholdPct {
		return pick{}, nil
	}
	for i := len(eps) - 1; i >= 0; i-- {
		if p := byIndex(c.cands, eps[i]); p != nil {
			return pick{ep: p, tier: TierTrie}, nil
		}
	}
	return pick{}, nil
}

func (t trieTier) imbalanced(ps []*Endpoint) bool {
	lo, hi := ps[0].Active(), ps[0].Active()
	for _, p := range ps {
		lo, hi = min(lo, p.Active()), max(hi, p.Active())
	}
	return hi-lo > t.balanceAbs
}
