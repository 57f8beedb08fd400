package sim

import (
	"container/list"

	"github.com/kvexact/kvexact/engines"
)

// windowGroup imitates the sliding-window KV-cache group of a hybrid vLLM (group 1, beside the
// full-attention cache as group 0): every full block a request computes is cached in it too, but
// the request lets go of the blocks that fall out of its window while it runs (vLLM's
// remove_skipped_blocks), so under pressure those are evicted long before full attention's copies.
// A prefix hit needs full attention's blocks and the group's blocks covering the window before the
// hit (the rule below, written from SlidingWindowManager.find_longest_cache_hit; gateway/kvgroups
// is not used, so the simulator checks the gateway rather than echoing it). Simplifications: one
// copy per key, and a pool of its own (vLLM's groups share one block pool).
type windowGroup struct {
	window   int // tokens
	bs       int
	capacity int // blocks this group may cache
	keys     map[uint64]*windowBlock
	free     *list.List // keys of unreferenced blocks, least recently freed first
	c        *cache     // the step's events go to its pending list
}

type windowBlock struct {
	ref  int
	elem *list.Element // in free when ref == 0
}

func newWindowGroup(window, bs, capacity int, c *cache) *windowGroup {
	return &windowGroup{window: window, bs: bs, capacity: max(capacity, 1), keys: map[uint64]*windowBlock{}, free: list.New(), c: c}
}

// need is the number of contiguous blocks before a hit the window reads.
func (w *windowGroup) need() int { return ceilDiv(max(w.window-1, 0), w.bs) }

// hit lowers full attention's n leading hits of keys to the longest prefix this group accepts.
func (w *windowGroup) hit(keys []uint64, n int) int {
	need, run := w.need(), 0
	for j := n - 1; j >= 0; j-- {
		if w.keys[keys[j]] == nil {
			run = 0
			continue
		}
		if run++; run >= need {
			return j + run
		}
	}
	return run
}

// admit holds the window's blocks before the request's hit.
func (w *windowGroup) admit(s *seq) {
	s.winFrom = max(s.hitN-w.need(), 0)
	s.winTo = s.winFrom
	for j := s.winFrom; j < s.hitN; j++ {
		w.hold(s.keys[j])
		s.winTo = j + 1
	}
}

// store caches the request's blocks up to upto (its computed full blocks), then lets go of those
// the next token's window no longer reads.
func (w *windowGroup) store(s *seq, upto int, stored storedFunc) {
	first := s.winTo
	for j := first; j < upto; j++ {
		w.hold(s.keys[j])
	}
	if upto > first {
		ev := stored(s, first, upto)
		ev.GroupIdx, ev.HasGroupIdx = 1, true
		ev.SpecKind, ev.SlidingWin = "sliding_window", w.window
		w.c.pending = append(w.c.pending, ev)
		s.winTo = upto
	}
	// get_num_skipped_tokens: computed − window + 1 tokens are out of the window.
	skipped := max(upto*w.bs-w.window+1, 0) / w.bs
	for ; s.winFrom < min(skipped, s.winTo); s.winFrom++ {
		w.unhold(s.keys[s.winFrom])
	}
	w.evict()
}

// release lets go of everything the request holds, its last blocks first (evicted first).
func (w *windowGroup) release(s *seq) {
	for j := s.winTo - 1; j >= s.winFrom; j-- {
		w.unhold(s.keys[j])
	}
	s.winFrom, s.winTo = 0, 0
	w.evict()
}

func (w *windowGroup) hold(k uint64) {
	b := w.keys[k]
	if b == nil {
		b = &windowBlock{}
		w.keys[k] = b
	}
	if b.ref == 0 && b.elem != nil {
		w.free.Remove(b.elem)
		b.elem = nil
	}
	b.ref++
}

func (w *windowGroup) unhold(k uint64) {
	b := w.keys[k]
	if b == nil || b.ref == 0 {
		return
	}
	if b.ref--; b.ref == 0 {
		b.elem = w.free.PushBack(k)
	}
}

// evict drops unreferenced blocks, oldest freed first, while the group holds more than its pool.
func (w *windowGroup) evict() {
	for len(w.keys) > w.capacity && w.free.Len() > 0 {
		k := w.free.Remove(w.free.Front()).(uint64)
		delete(w.keys, k)
		w.c.pending = append(w.c.pending, engines.Event{Kind: engines.BlockRemoved, BlockHashes: []uint64{k},
			Medium: engines.MediumGPU, GroupIdx: 1, HasGroupIdx: true})
	}
}

// clear forgets every cached key (AllBlocksCleared covers every group); held blocks stay held.
func (w *windowGroup) clear() {
	for k, b := range w.keys {
		if b.ref == 0 {
			delete(w.keys, k)
		}
	}
	w.free.Init()
}

// removed is the group's eviction of every unreferenced block, one removal each.
func (w *windowGroup) removeAll() {
	for w.free.Len() > 0 {
		k := w.free.Remove(w.free.Front()).(uint64)
		delete(w.keys, k)
		w.c.pending = append(w.c.pending, engines.Event{Kind: engines.BlockRemoved, BlockHashes: []uint64{k},
			Medium: engines.MediumGPU, GroupIdx: 1, HasGroupIdx: true})
	}
}
