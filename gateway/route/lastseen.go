package route

import (
	"container/list"
	"sync"
)

// Last placement (loadLaw.missPlacement "last"): a miss goes to the endpoint its prompt last went
// to, as SGLang's approximate tree sends an evicted prompt back to the engine whose tree still
// names it. Each engine then keeps a stable share of the working set; placing every eviction by
// least load instead scatters the working sets, and each engine evicts more (docs/routing.md,
// Miss placement). The memory is keyed like home placement (homeKey: the prompt's first
// minMatchTokens' blocks) and bounded: lastSeenCap entries at most, the least recently routed
// forgotten first, so it does not grow with traffic.

// lastSeenCap bounds the remembered prompts of one rule: 16,384 keys (each a map slot and a list
// element, about 100 bytes: under 2 MB), far more than the shared prefixes a pool's KV holds.
const lastSeenCap = 1 << 14

// lastSeen is an LRU from a prompt's home key to the Endpoint.Index it was last routed to.
type lastSeen struct {
	limit int

	mu    sync.Mutex
	byKey map[uint64]*list.Element
	order list.List // of *lastEntry, most recently routed first
}

type lastEntry struct {
	key uint64
	ep  int // Endpoint.Index
}

func newLastSeen(limit int) *lastSeen {
	return &lastSeen{limit: max(limit, 1), byKey: make(map[uint64]*list.Element)}
}

// get returns the endpoint key last went to. It does not refresh the entry: only a routed
// request does (put), so an Explain changes nothing.
func (l *lastSeen) get(key uint64) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.byKey[key]; ok {
		return e.Value.(*lastEntry).ep, true
	}
	return 0, false
}

// put records that key went to endpoint ep and makes it the most recent; at the limit the least
// recent entry is forgotten and its element reused.
func (l *lastSeen) put(key uint64, ep int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.byKey[key]; ok {
		e.Value.(*lastEntry).ep = ep
		l.order.MoveToFront(e)
		return
	}
	if l.order.Len() >= l.limit {
		e := l.order.Back()
		old := e.Value.(*lastEntry)
		delete(l.byKey, old.key)
		old.key, old.ep = key, ep
		l.order.MoveToFront(e)
		l.byKey[key] = e
		return
	}
	l.byKey[key] = l.order.PushFront(&lastEntry{key: key, ep: ep})
}

func (l *lastSeen) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.order.Len()
}

// placeLast is last placement's choice among the law's candidates: the endpoint the prompt last
// went to, unless it is no longer a candidate (gone, unhealthy, excluded) or at or over the hard
// law's cap (loadCaps, without the holder's floor); -1 leaves the miss to the rule's selector.
func placeLast(cands []Scored, eps []*Endpoint, ep int, pct int) int {
	for i, e := range eps {
		if e.Index != ep {
			continue
		}
		if cands[i].Load >= loadCaps(cands, pct)[i] {
			return -1
		}
		return i
	}
	return -1
}

// remember records where a routed decision went, under last placement.
func (rt *Router) remember(d *Decision) {
	if rt.last == nil || d.dry || d.Target == nil {
		return
	}
	if k, ok := rt.homeKey(d.keys[:d.hit]); ok {
		rt.last.put(k, d.Target.Index)
	}
}

// placeRemembered is the KV-exact tier's answer to a miss under last placement: the remembered
// endpoint (placeLast), nil when there is none or it may not take the miss.
func (rt *Router) placeRemembered(s *scores, keys []uint64) *Endpoint {
	k, ok := rt.homeKey(keys)
	if !ok || len(s.cands) == 0 {
		return nil
	}
	ep, ok := rt.last.get(k)
	if !ok {
		return nil
	}
	if pos := placeLast(s.cands, s.eps, ep, rt.law.FactorPct); pos >= 0 {
		return s.eps[pos]
	}
	return nil
}
