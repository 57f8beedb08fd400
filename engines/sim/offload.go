package sim

import (
	"container/list"

	"github.com/kvexact/kvexact/engines"
)

// offloadTier is vLLM's OffloadingConnector with its CPU backend, as the released package shows
// it (vllm/distributed/kv_transfer/kv_connector/v1/offloading, v0.33.0; docs/simulator.md):
//
//   - write-through: the blocks a request computes are stored to host memory as the GPU caches
//     them (_build_store_jobs offloads each scheduled chunk), one copy per block hash (the
//     manager keys chunks by hash); a block already on the host is only touched;
//   - the host evicts its least recently used block when full;
//   - a request's lookup continues the GPU prefix on the host: the leading blocks past the GPU
//     hit that the host holds are loaded (a transfer, not a prefill) into fresh GPU blocks, which
//     the GPU then caches as it caches computed ones, and engines count them in cached_tokens
//     (vLLM's num_cached_tokens is local + external);
//   - every host store and eviction is announced with medium "CPU" in the self-describing form
//     (the same hashes, parent, tokens and block size as the GPU's store, extra_keys None as the
//     engine defers them; an eviction one BlockRemoved per block), in the step that made it (the
//     engine announces a store when its transfer completes, a step or two later: the
//     simulator's transfer is instant);
//   - a cache reset empties the host too (reset_cache evicts every stored chunk).
//
// Blocks are offloaded at the GPU's block size (blocks_per_chunk 1). Not safe for concurrent
// use: the rank's lock guards it with the cache.
type offloadTier struct {
	cap  int
	lru  *list.List // of uint64 keys, least recently used at the front
	keys map[uint64]*list.Element
}

func newOffloadTier(capacity int) *offloadTier {
	return &offloadTier{cap: capacity, lru: list.New(), keys: map[uint64]*list.Element{}}
}

// hits is how many of keys, from the first, the host holds; each is touched.
func (o *offloadTier) hits(keys []uint64) int {
	n := 0
	for n < len(keys) {
		el, ok := o.keys[keys[n]]
		if !ok {
			break
		}
		o.lru.MoveToBack(el)
		n++
	}
	return n
}

// store offloads blocks [first, last) of s, announcing each run of newly stored blocks and each
// eviction on c's pending events.
func (o *offloadTier) store(c *cache, s *seq, first, last int) {
	runStart := -1
	flush := func(end int) {
		if runStart >= 0 && c.onStored != nil {
			ev := c.onStored(s, runStart, end)
			ev.Medium = mediumCPU
			// vLLM defers the offload events' extra keys (OffloadingEventsTracker: extra_keys None).
			ev.ExtraKeys, ev.HasExtraKeys = nil, false
			c.pending = append(c.pending, ev)
		}
		runStart = -1
	}
	// The blocks already on the host are touched first, so the room the others need is never
	// taken from them (the manager filters stored keys out before it evicts).
	for i := first; i < last; i++ {
		if el, ok := o.keys[s.keys[i]]; ok {
			o.lru.MoveToBack(el)
		}
	}
	for i := first; i < last; i++ {
		key := s.keys[i]
		if _, ok := o.keys[key]; ok {
			flush(i)
			continue
		}
		for o.lru.Len() >= o.cap {
			flush(i) // the eviction is announced after the stores before it
			old := o.lru.Remove(o.lru.Front()).(uint64)
			delete(o.keys, old)
			ev := engines.Event{Kind: engines.BlockRemoved, BlockHashes: []uint64{old}, Medium: mediumCPU}
			if c.pol.groupTagged {
				ev.GroupIdx, ev.HasGroupIdx = 0, true
			}
			c.pending = append(c.pending, ev)
		}
		o.keys[key] = o.lru.PushBack(key)
		if runStart < 0 {
			runStart = i
		}
	}
	flush(last)
}

func (o *offloadTier) clear() {
	o.lru.Init()
	clear(o.keys)
}

func (o *offloadTier) snapshot() map[uint64]int {
	m := make(map[uint64]int, len(o.keys))
	for k := range o.keys {
		m[k] = 1
	}
	return m
}

// mediumCPU is vLLM's host-memory medium (MEDIUM_CPU).
const mediumCPU = "CPU"
