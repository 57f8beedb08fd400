package sim

import (
	"container/list"

	"github.com/kvexact/kvexact/engines"
)

// offloadTier is vLLM's OffloadingConnector with its CPU backend, as the released v0.31.0 package
// shows it (vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py and events.py,
// vllm/v1/kv_offload/cpu/manager.py and policies/lru.py; docs/simulator.md):
//
//   - write-through: the blocks a request computes are stored to host memory as the GPU caches
//     them (OffloadingConnectorScheduler._build_store_jobs offers each scheduled chunk), one copy
//     per block hash (CPUOffloadingManager.prepare_store stores only the keys its policy does not
//     hold); a block already on the host is not stored again;
//   - the host evicts its least recently used block when full (LRUCachePolicy.evict); once a
//     request finishes its blocks are ranked from its last to its first (LRUCachePolicy.
//     on_request_finished takes them reversed), so of a prompt the host evicts the last blocks
//     first, as the GPU does. The simulator ranks them so when they are stored or loaded; v0.31.0
//     ranks a store's new blocks in offer order when it inserts them (the first the least recent)
//     and a load's not at all until the request finishes (only the tiering manager calls touch);
//   - a request's lookup continues the GPU prefix on the host (_maximal_prefix_lookup: the chunks
//     past the GPU hit that the host holds, from the first): they are loaded (a transfer, not a
//     prefill) into fresh GPU blocks, which the GPU then caches as it caches computed ones, and
//     engines count them in cached_tokens (vllm/v1/metrics/stats.py: num_cached_tokens is the
//     local plus the external hit);
//   - every host store is announced with medium "CPU" in the self-describing form, one
//     BlockStored per block (OffloadingEventsTracker._take_stored_event: its hash, parent, tokens
//     and block size as the GPU's store gives them, extra_keys None as _build_event_metadata
//     defers them), in the step that made it (the engine announces a store when its transfer
//     completes, complete_store, a step or two later: the simulator's transfer is instant);
//   - the room a store needs is evicted before it and announced as one BlockRemoved (medium
//     CPU, group 0) carrying every block evicted for it (prepare_store queues one removal event
//     for all it evicted; the offer's own keys are protected from the eviction), as real v0.31.0
//     publishes a host eviction (vectors/vllm/v0.31.0/offload-samples.json);
//   - a plain cache reset (/reset_prefix_cache) keeps the host's copies and announces nothing
//     for them, as real v0.31.0 does (docs/vllm-engine.md, finding 13): a prompt still loads
//     from the host afterwards; /reset_prefix_cache?reset_external=true empties the host too
//     (OffloadingConnectorScheduler.reset_cache → CPUOffloadingManager.reset_cache drops every
//     chunk), again with only the one AllBlocksCleared; both answer {"success": true}.
//     gateway/vllme2e's TestSimulatorOffloadResetsHeldToEngine holds the two resets to the real
//     engine.
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

// hits is how many of keys, from the first, the host holds; they are touched from the last to
// the first (the policy's touch takes them reversed), so a prompt's first block is the most
// recently used.
func (o *offloadTier) hits(keys []uint64) int {
	n := 0
	for n < len(keys) {
		if _, ok := o.keys[keys[n]]; !ok {
			break
		}
		n++
	}
	o.touchReversed(keys[:n])
	return n
}

// touchReversed makes keys (those the host holds) the most recently used, the first of them
// last: vLLM's LRU policy ranks a request's blocks in reverse (touch, on_request_finished), so a
// prompt's last blocks are evicted first (vectors/vllm/v0.31.0/offload-samples.json).
func (o *offloadTier) touchReversed(keys []uint64) {
	for i := len(keys) - 1; i >= 0; i-- {
		if el, ok := o.keys[keys[i]]; ok {
			o.lru.MoveToBack(el)
		}
	}
}

// store offloads blocks [first, last) of s, announcing each newly stored block and the room they
// needed on c's pending events. As the manager's prepare_store, which the scheduler
// calls once per request and step with every block to offload: the blocks already on the host
// are kept out of the eviction, the room the others need is evicted first (least recently used
// first) and announced as ONE BlockRemoved carrying every block evicted (the engine publishes it
// in the step that schedules the store, before the host stores it announces when the transfer
// ends), and when the host cannot make that room (too few blocks outside the store) nothing is
// stored. The store's blocks are then ranked as the request's (touchReversed).
func (o *offloadTier) store(c *cache, s *seq, first, last int) {
	keys := s.keys[first:last]
	fresh := 0
	for _, k := range keys {
		if _, ok := o.keys[k]; !ok {
			fresh++
		}
	}
	if fresh == 0 {
		o.touchReversed(keys)
		return
	}
	if need := o.lru.Len() + fresh - o.cap; need > 0 {
		if need > o.lru.Len()-(len(keys)-fresh) {
			return // prepare_store returns None: an allocation failure, the blocks are not offloaded
		}
		protected := make(map[uint64]bool, len(keys)-fresh)
		for _, k := range keys {
			if _, ok := o.keys[k]; ok {
				protected[k] = true
			}
		}
		gone := make([]uint64, 0, need)
		for el := o.lru.Front(); len(gone) < need; {
			next := el.Next()
			if k := el.Value.(uint64); !protected[k] {
				o.lru.Remove(el)
				delete(o.keys, k)
				gone = append(gone, k)
			}
			el = next
		}
		ev := engines.Event{Kind: engines.BlockRemoved, BlockHashes: gone, Medium: mediumCPU}
		if c.pol.groupTagged {
			ev.GroupIdx, ev.HasGroupIdx = 0, true
		}
		c.pending = append(c.pending, ev)
	}
	for i := first; i < last; i++ {
		key := s.keys[i]
		if _, ok := o.keys[key]; ok {
			continue
		}
		o.keys[key] = o.lru.PushBack(key)
		if c.onStored != nil {
			// One BlockStored per block, its own parent, as the tracker announces a chunk
			// (blocks_per_chunk 1); vLLM defers the offload events' extra keys (extra_keys None).
			ev := c.onStored(s, i, i+1)
			ev.Medium = mediumCPU
			ev.ExtraKeys, ev.HasExtraKeys = nil, false
			c.pending = append(c.pending, ev)
		}
	}
	o.touchReversed(keys)
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
