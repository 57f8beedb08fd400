package sim

import (
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/hashcore"
)

// policy is how one family's block pool behaves where engines differ.
type policy struct {
	// dedup keeps one copy per key (radix-tree engines: SGLang, TensorRT-LLM). vLLM keeps every
	// copy a request computes and announces each one (BlockHashToBlockMap).
	dedup bool
	// leafFirst evicts only blocks no cached block chains on (radix trees evict leaves).
	leafFirst bool
	// mergeStored appends a stored run to the previous stored event of the same step when it
	// continues that event's chain (SGLang v0.5.18 coalescing; TensorRT-LLM's one event per store).
	mergeStored bool
	// mergeRemoved merges consecutive removals of one step into one event (SGLang, TensorRT-LLM);
	// vLLM sends one BlockRemoved per evicted hash.
	mergeRemoved bool
	// reportReuse re-emits BlockStored for the prefix-cache hits of every admitted request (vLLM
	// kv_cache_report_mode="full"): the same event shape, no new copy.
	reportReuse bool
	// nullBlock keeps one block of the pool out of use, as vLLM's BlockPool does (its null block,
	// block 0): --num-gpu-blocks-override N caches at most N − 1 blocks.
	nullBlock bool
	// groupTagged puts the KV-cache group (group_idx 0) on removals as on stores (vLLM).
	groupTagged bool
}

// block is one physical KV block.
type block struct {
	key      uint64
	hashed   bool  // holds a cached key (full block, or a TensorRT-LLM partial block)
	partial  bool  // TensorRT-LLM partial block (fewer tokens than the block size)
	free     bool  // on the free (evictable) list
	ref      int32 // running requests holding it
	prev     int32 // free-list links
	next     int32
	parent   int32 // cached block it chains on (-1 at the root); leafFirst bookkeeping
	children int32 // cached blocks chaining on it
}

// seq is one request's view of the pool: the physical blocks it holds in chain order and the
// keys of its full blocks so far.
type seq struct {
	blocks  []int32
	keys    []uint64
	tokens  []uint32
	ex      *hashcore.Extras
	session string // SGLang session_id of the request
	storedN int    // leading blocks whose keys are cached (hit, stored or shared)
	// winFrom, winTo: the blocks [winFrom, winTo) the request holds in the sliding-window group.
	winFrom, winTo int
	hitN           int  // leading blocks that were prefix-cache hits at admission
	offN           int  // blocks past hitN loaded from the offload tier at admission
	skipRead       bool // the request reads no prefix-cache hit (genReq.skipRead)
	reserve        int  // blocks still reserved for this request
}

// storedFunc builds a BlockStored event for blocks [first, last) of s (all full, freshly cached).
type storedFunc func(s *seq, first, last int) engines.Event

// cache is one engine core's block pool with prefix caching: a fixed number of physical blocks,
// a free list evicted from the head (least recently freed first), a key index, and the events the
// engine would publish for every change. Not safe for concurrent use: the rank's lock guards it.
type cache struct {
	pol        policy
	bs         int
	blocks     []block
	head, tail int32
	nfree      int
	reserved   int
	used       int // blocks with ref > 0
	index      map[uint64][]int32
	copies     int // hashed blocks (cached copies)
	onStored   storedFunc
	pending    []engines.Event
	win        *windowGroup // a hybrid model's sliding-window group, nil for one group
	off        *offloadTier // vLLM's CPU offloading tier, nil without one

	queriedTokens uint64 // prefix-cache queried tokens (vllm:prefix_cache_queries_total)
	hitTokens     uint64 // prefix-cache hit tokens (vllm:prefix_cache_hits_total)
}

func newCache(capacity, blockSize int, pol policy, onStored storedFunc) *cache {
	if pol.nullBlock && capacity > 1 {
		capacity--
	}
	c := &cache{pol: pol, bs: blockSize, blocks: make([]block, capacity), head: -1, tail: -1,
		index: make(map[uint64][]int32), onStored: onStored}
	for i := range c.blocks {
		c.blocks[i].parent = -1
		c.pushTail(int32(i))
	}
	return c
}

func (c *cache) capacity() int { return len(c.blocks) }

// ---- free list ----

func (c *cache) pushTail(i int32) {
	b := &c.blocks[i]
	b.free, b.prev, b.next = true, c.tail, -1
	if c.tail >= 0 {
		c.blocks[c.tail].next = i
	} else {
		c.head = i
	}
	c.tail = i
	c.nfree++
}

func (c *cache) pushHead(i int32) {
	b := &c.blocks[i]
	b.free, b.prev, b.next = true, -1, c.head
	if c.head >= 0 {
		c.blocks[c.head].prev = i
	} else {
		c.tail = i
	}
	c.head = i
	c.nfree++
}

func (c *cache) unlink(i int32) {
	b := &c.blocks[i]
	if b.prev >= 0 {
		c.blocks[b.prev].next = b.next
	} else {
		c.head = b.next
	}
	if b.next >= 0 {
		c.blocks[b.next].prev = b.prev
	} else {
		c.tail = b.prev
	}
	b.free, b.prev, b.next = false, -1, -1
	c.nfree--
}

// ---- index ----

// lookupCopy returns a cached block holding key, preferring one already in use (taking it then
// costs no free block), or -1.
func (c *cache) lookupCopy(key uint64) int32 {
	ids := c.index[key]
	if len(ids) == 0 {
		return -1
	}
	for _, id := range ids {
		if c.blocks[id].ref > 0 {
			return id
		}
	}
	return ids[0]
}

func (c *cache) indexAdd(key uint64, id int32) {
	c.index[key] = append(c.index[key], id)
	c.copies++
}

func (c *cache) indexDel(key uint64, id int32) {
	ids := c.index[key]
	for j, x := range ids {
		if x == id {
			ids = append(ids[:j], ids[j+1:]...)
			break
		}
	}
	if len(ids) == 0 {
		delete(c.index, key)
	} else {
		c.index[key] = ids
	}
	c.copies--
}

// ---- events ----

func (c *cache) emitRemoved(key uint64) {
	if c.pol.mergeRemoved && len(c.pending) > 0 {
		last := &c.pending[len(c.pending)-1]
		if last.Kind == engines.BlockRemoved {
			last.BlockHashes = append(last.BlockHashes, key)
			return
		}
	}
	ev := engines.Event{Kind: engines.BlockRemoved, BlockHashes: []uint64{key}, Medium: engines.MediumGPU}
	if c.pol.groupTagged {
		ev.GroupIdx, ev.HasGroupIdx = 0, true
	}
	c.pending = append(c.pending, ev)
}

func (c *cache) emitStored(ev engines.Event) {
	if c.pol.mergeStored && len(c.pending) > 0 {
		last := &c.pending[len(c.pending)-1]
		if last.Kind == engines.BlockStored && ev.HasParent && len(last.BlockHashes) > 0 &&
			last.BlockHashes[len(last.BlockHashes)-1] == ev.Parent && last.BlockSize == ev.BlockSize &&
			last.CacheSalt == ev.CacheSalt && last.SessionID == ev.SessionID && (last.BlockTokens == nil) == (ev.BlockTokens == nil) {
			last.BlockHashes = append(last.BlockHashes, ev.BlockHashes...)
			last.TokenIDs = append(last.TokenIDs, ev.TokenIDs...)
			if last.BlockTokens != nil {
				last.BlockTokens = append(last.BlockTokens, ev.BlockTokens...)
				last.CacheLevels = append(last.CacheLevels, ev.CacheLevels...)
				last.Priorities = append(last.Priorities, ev.Priorities...)
			}
			if last.HasExtraKeys {
				last.ExtraKeys = append(last.ExtraKeys, ev.ExtraKeys...)
			}
			return
		}
	}
	c.pending = append(c.pending, ev)
}

// take returns and clears the events of the current step.
func (c *cache) take() []engines.Event {
	ev := c.pending
	c.pending = nil
	return ev
}

// ---- allocation ----

// evictable reports whether free block i may be reused now.
func (c *cache) evictable(i int32) bool {
	return !c.pol.leafFirst || c.blocks[i].children == 0
}

// popFree takes a block off the free list, evicting its cached key (one removal event).
func (c *cache) popFree() int32 {
	i := c.head
	for i >= 0 && !c.evictable(i) {
		i = c.blocks[i].next
	}
	if i < 0 {
		return -1
	}
	c.unlink(i)
	b := &c.blocks[i]
	if b.hashed {
		c.indexDel(b.key, i)
		c.emitRemoved(b.key)
		if b.parent >= 0 {
			c.blocks[b.parent].children--
		}
		b.hashed, b.partial, b.parent = false, false, -1
	}
	return i
}

func (c *cache) hold(i int32) {
	b := &c.blocks[i]
	if b.free {
		c.unlink(i)
	}
	if b.ref == 0 {
		c.used++
	}
	b.ref++
}

// unhold gives back one reference; a block nobody holds joins the free list: at the tail when it
// holds a cached key (evicted least recently freed first), at the head when it holds none, so it is
// reused before any cached block is evicted (vLLM's free_blocks; radix trees evict only when no
// free page is left).
func (c *cache) unhold(i int32) {
	b := &c.blocks[i]
	b.ref--
	if b.ref == 0 {
		c.used--
		if b.hashed {
			c.pushTail(i)
		} else {
			c.pushHead(i)
		}
	}
}

// ---- request lifecycle ----

// hits is the number of leading prompt blocks found cached. At least one prompt token is always
// computed (vLLM, SGLang and TensorRT-LLM all cap the hit at prompt length − 1).
func (c *cache) hits(keys []uint64, promptLen int) int {
	limit := 0
	if promptLen > 0 {
		limit = (promptLen - 1) / c.bs
	}
	n := 0
	for n < len(keys) && n < limit && c.lookupCopy(keys[n]) >= 0 {
		n++
	}
	return n
}

// admit takes the prefix hits of s and reserves the blocks the rest of the request can need
// (totalTokens = prompt + max output). It returns false, changing nothing, when the pool cannot
// promise them yet.
func (c *cache) admit(s *seq, promptLen, totalTokens int) bool {
	n := c.hits(s.keys, promptLen)
	if s.skipRead {
		n = 0
	}
	if c.win != nil {
		n = c.win.hit(s.keys, n)
	}
	freeHits := 0
	copies := make([]int32, n)
	for i := 0; i < n; i++ {
		copies[i] = c.lookupCopy(s.keys[i])
		if c.blocks[copies[i]].ref == 0 {
			freeHits++
		}
	}
	need := ceilDiv(totalTokens, c.bs) - n
	if need < 0 {
		need = 0
	}
	if need+freeHits > c.nfree-c.reserved {
		return false
	}
	off := 0
	if c.off != nil && !s.skipRead {
		limit := 0
		if promptLen > 0 {
			limit = (promptLen - 1) / c.bs
		}
		if limit > n {
			off = c.off.hits(s.keys[n:min(limit, len(s.keys))])
		}
	}
	s.offN = off
	for _, id := range copies {
		c.hold(id)
	}
	s.blocks = append(s.blocks[:0], copies...)
	if c.pol.reportReuse && n > 0 && c.onStored != nil {
		c.emitStored(c.onStored(s, 0, n))
	}
	s.storedN, s.hitN, s.reserve = n, n, need
	if c.win != nil {
		c.win.admit(s)
	}
	c.reserved += need
	c.queriedTokens += uint64(promptLen)
	c.hitTokens += uint64(n * c.bs)
	return true
}

// fits reports whether a request of totalTokens could ever be admitted into an empty pool.
func (c *cache) fits(totalTokens int) bool { return ceilDiv(totalTokens, c.bs) <= len(c.blocks) }

// grow allocates blocks until s holds room for ntokens tokens.
func (c *cache) grow(s *seq, ntokens int) bool {
	for len(s.blocks)*c.bs < ntokens {
		i := c.popFree()
		if i < 0 {
			return false
		}
		c.hold(i)
		s.blocks = append(s.blocks, i)
		if s.reserve > 0 {
			s.reserve--
			c.reserved--
		}
	}
	return true
}

// store caches the full blocks of s up to block index upto (exclusive), emitting the events.
func (c *cache) store(s *seq, upto int) {
	if upto > len(s.keys) {
		upto = len(s.keys)
	}
	if upto > len(s.blocks) {
		upto = len(s.blocks)
	}
	runStart := -1
	flush := func(end int) {
		if runStart >= 0 && c.onStored != nil {
			c.emitStored(c.onStored(s, runStart, end))
		}
		runStart = -1
	}
	if c.off != nil && upto > s.storedN {
		defer c.off.store(c, s, s.storedN, upto) // after the GPU's own store events
	}
	for i := s.storedN; i < upto; i++ {
		key := s.keys[i]
		if c.pol.dedup {
			if other := c.lookupCopy(key); other >= 0 {
				// Another request cached this block first: share it, give ours back.
				flush(i)
				own := s.blocks[i]
				c.hold(other)
				s.blocks[i] = other
				c.unhold(own)
				continue
			}
		}
		id := s.blocks[i]
		b := &c.blocks[id]
		b.key, b.hashed, b.partial = key, true, false
		b.parent = -1
		if i > 0 {
			b.parent = s.blocks[i-1]
			c.blocks[b.parent].children++
		}
		c.indexAdd(key, id)
		if runStart < 0 {
			runStart = i
		}
	}
	flush(upto)
	if upto > s.storedN {
		s.storedN = upto
	}
	if c.win != nil && c.onStored != nil {
		c.win.store(s, upto, c.onStored)
	}
}

// storePartial caches the trailing partial block of s under key (TensorRT-LLM), emitting ev.
func (c *cache) storePartial(s *seq, key uint64, ev engines.Event) {
	i := s.storedN
	if i >= len(s.blocks) {
		return
	}
	if c.pol.dedup && c.lookupCopy(key) >= 0 {
		return
	}
	id := s.blocks[i]
	b := &c.blocks[id]
	b.key, b.hashed, b.partial, b.parent = key, true, true, -1
	if i > 0 {
		b.parent = s.blocks[i-1]
		c.blocks[b.parent].children++
	}
	c.indexAdd(key, id)
	c.emitStored(ev)
}

// release frees every block s holds, tail first, so a request's last blocks are evicted before
// its prefix (vLLM's free order; radix trees evict leaves first anyway).
func (c *cache) release(s *seq) {
	for j := len(s.blocks) - 1; j >= 0; j-- {
		c.unhold(s.blocks[j])
	}
	s.blocks = s.blocks[:0]
	if c.win != nil {
		c.win.release(s)
	}
	c.reserved -= s.reserve
	s.reserve = 0
}

// clear drops every cached key (blocks in use stay allocated but lose their keys), the offload
// tier's included (a restart, or vLLM's reset with reset_external). It reports how many GPU copies
// were dropped.
func (c *cache) clear() int {
	n := c.clearGPU()
	if c.off != nil {
		c.off.clear()
	}
	return n
}

// clearGPU is clear without the offload tier: vLLM's plain /reset_prefix_cache keeps the host's
// copies (offload.go).
func (c *cache) clearGPU() int {
	n := c.copies
	for i := range c.blocks {
		b := &c.blocks[i]
		b.hashed, b.partial, b.parent, b.children = false, false, -1, 0
	}
	clear(c.index)
	c.copies = 0
	if c.win != nil {
		c.win.clear()
	}
	return n
}

// removeAll evicts every cached key of free blocks, one removal per copy (TensorRT-LLM has no
// clear event). Blocks in use keep theirs.
func (c *cache) removeAll() {
	for progress := true; progress; {
		progress = false
		for i := c.head; i >= 0; i = c.blocks[i].next {
			b := &c.blocks[i]
			if b.hashed && c.evictable(i) {
				c.indexDel(b.key, i)
				c.emitRemoved(b.key)
				if b.parent >= 0 {
					c.blocks[b.parent].children--
				}
				b.hashed, b.partial, b.parent = false, false, -1
				progress = true
			}
		}
	}
	if c.win != nil {
		c.win.removeAll()
	}
}

// snapshot returns key → number of cached copies.
func (c *cache) snapshot() map[uint64]int {
	m := make(map[uint64]int, len(c.index))
	for k, ids := range c.index {
		m[k] = len(ids)
	}
	return m
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
