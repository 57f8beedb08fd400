package inventory

import (
	"math"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
)

// Table geometry. Shards are chosen by the top bits of the mixed key; within a shard a slot is
// chosen by fast range reduction of the remaining bits, so slot counts need not be powers of two
// and a shard can grow by 5/4 instead of doubling (see the package doc for the memory budget).
const (
	shardBits  = 8
	nShards    = 1 << shardBits
	groupSlots = 6    // slots per group: 6 hash words and their meta fields fill one cache line
	minSlots   = 64   // smallest shard
	growth     = 1.25 // slot count ratio between two size levels
	maxLoad    = 0.9  // grow above this load
	minLoad    = 0.25 // shrink below this load (never below the shard's first level)
	nodeWords  = 7    // words per overflow node (7×8 + 8 = 64 bytes)
	headFirst  = 4    // a chain's head node spends words 0–3 on its residency bitmap
	nilNode    = ^uint32(0)
)

// A slot is 10 bytes: a word holding the key's mixed hash (the low 56 bits; the top 8 bits are
// the shard number, implied by the shard, so they are free) and a 16-bit field. Those 8 free bits
// and the 16-bit field form a 24-bit meta; zero means empty. Bit 23 clear: the key's only endpoint
// entry is inline — endpoint (8 bits), copy count (10 bits), FIFO entries pending (5 bits). Bit 23
// set: the low 23 bits index the first overflow node of the key's entry chain. Counts or pending
// entries too large for the inline form move the key to the overflow form.
const (
	hashMask      = 1<<(64-shardBits) - 1
	metaOverflow  = uint32(1) << 23
	maxNodes      = 1<<23 - 1 // node indexes fit in 23 bits; nilNode is out of range anyway
	inlineMaxCnt  = 1<<10 - 1
	inlineMaxPend = 1<<5 - 1
)

func packInline(ep EndpointID, c, p uint32) uint32 { return uint32(ep) | c<<8 | p<<18 }
func inlineEP(m uint32) EndpointID                 { return EndpointID(m & 0xFF) }
func inlineCount(m uint32) uint32                  { return m >> 8 & inlineMaxCnt }
func inlinePending(m uint32) uint32                { return m >> 18 & inlineMaxPend }
func fitsInline(ep EndpointID, c, p uint32) bool {
	return ep < MaxEndpoints && c <= inlineMaxCnt && p <= inlineMaxPend
}

// An overflow entry: endpoint (16 bits), pending (16 bits), count (32 bits). Zero means unused.
func packEnt(ep EndpointID, c, p uint32) uint64 { return uint64(ep) | uint64(p)<<16 | uint64(c)<<32 }
func entEP(e uint64) EndpointID                 { return EndpointID(e) }
func entPending(e uint64) uint32                { return uint32(e>>16) & 0xFFFF }
func entCount(e uint64) uint32                  { return uint32(e >> 32) }

// mix is the murmur3 finalizer: block keys are usually hashes already, but tests and some engines
// use small or structured ids, and both the shard and the slot come from the high bits.
func mix(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

// group is 6 slots in one 64-byte cache line: 6 hash words and their 16-bit meta fields packed
// four to a word, so a probe touches one line and every field can be read atomically.
type group struct {
	words [groupSlots]uint64
	lo    [2]uint64
}

// ovNode is one link of a key's overflow chain. The head node's first four words are a bitmap of
// the endpoints whose count is positive — all a reader needs, in one cache line whatever the
// number of holders — and its last three words are entries; further nodes hold seven entries.
type ovNode struct {
	w    [nodeWords]uint64
	next uint32
	_    uint32
}

func firstEnt(idx, head uint32) int {
	if idx == head {
		return headFirst
	}
	return 0
}

// table is one published version of a shard's arrays. Its slice headers never change after
// publication; the writer mutates elements in place (atomically, inside the shard's seqlock) and
// publishes a new table when an array is reallocated.
type table struct {
	groups []group
	nslots uint64
	ovf    []ovNode
}

// slot returns slot i's 56-bit hash and 24-bit meta.
func (t *table) slot(i uint64) (uint64, uint32) {
	g := &t.groups[i/groupSlots]
	w := atomic.LoadUint64(&g.words[i%groupSlots])
	j := i % groupSlots
	l := atomic.LoadUint64(&g.lo[j/4]) >> (j % 4 * 16) & 0xFFFF
	return w & hashMask, uint32(w>>(64-shardBits))<<16 | uint32(l)
}

func (t *table) meta(i uint64) uint32 { _, m := t.slot(i); return m }

// setSlot writes slot i. Writer only: the read-modify-write of the shared lo word is safe because
// writers hold the shard lock.
func (t *table) setSlot(i, h uint64, m uint32) {
	g := &t.groups[i/groupSlots]
	atomic.StoreUint64(&g.words[i%groupSlots], h&hashMask|uint64(m>>16)<<(64-shardBits))
	t.setLo(g, i, m)
}

func (t *table) setMeta(i uint64, m uint32) {
	g := &t.groups[i/groupSlots]
	w := atomic.LoadUint64(&g.words[i%groupSlots])
	atomic.StoreUint64(&g.words[i%groupSlots], w&hashMask|uint64(m>>16)<<(64-shardBits))
	t.setLo(g, i, m)
}

func (t *table) setLo(g *group, i uint64, m uint32) {
	j := i % groupSlots
	sh := j % 4 * 16
	p := &g.lo[j/4]
	atomic.StoreUint64(p, atomic.LoadUint64(p)&^(0xFFFF<<sh)|uint64(m&0xFFFF)<<sh)
}

func (t *table) home(h uint64) uint64 {
	hi, _ := bits.Mul64(h<<shardBits, t.nslots)
	return hi
}

// dist is how far slot i is from the home slot of hash h (Robin Hood probe distance).
func (t *table) dist(h, i uint64) uint64 {
	hm := t.home(h)
	if i >= hm {
		return i - hm
	}
	return i + t.nslots - hm
}

// find returns the slot of the key with mixed hash h. It is safe on a table being mutated
// concurrently (readers call it inside a seqlock): every loop is bounded, every index in range.
func (t *table) find(h uint64) (uint64, bool) {
	i, m := t.lookup(h)
	return i, m != 0
}

// lookup returns the slot and meta of hash h, or a zero meta when absent.
func (t *table) lookup(h uint64) (uint64, uint32) {
	n := t.nslots
	h &= hashMask
	i := t.home(h)
	for d := uint64(0); d < n; d++ {
		hi, m := t.slot(i)
		if m == 0 {
			return 0, 0
		}
		if hi == h {
			return i, m
		}
		if t.dist(hi, i) < d {
			return 0, 0
		}
		if i++; i == n {
			i = 0
		}
	}
	return 0, 0
}

// insert places a hash known to be absent (Robin Hood: a richer resident yields its slot).
func (t *table) insert(h uint64, m uint32) {
	n := t.nslots
	h &= hashMask
	i := t.home(h)
	for d := uint64(0); ; d++ {
		hi, mi := t.slot(i)
		if mi == 0 {
			t.setSlot(i, h, m)
			return
		}
		if hd := t.dist(hi, i); hd < d {
			t.setSlot(i, h, m)
			h, m, d = hi, mi, hd
		}
		if i++; i == n {
			i = 0
		}
	}
}

// deleteAt empties slot i with backward shifting, so no tombstones accumulate.
func (t *table) deleteAt(i uint64) {
	n := t.nslots
	for {
		j := i + 1
		if j == n {
			j = 0
		}
		hj, mj := t.slot(j)
		if mj == 0 || t.dist(hj, j) == 0 {
			break
		}
		t.setSlot(i, hj, mj)
		i = j
	}
	t.setSlot(i, 0, 0)
}

// holders adds to out every endpoint whose copy count for key is positive. It reports false when
// it met a state no consistent table can have; the caller then retries.
func (t *table) holders(h uint64, out *Mask) bool {
	_, m := t.lookup(h)
	if m == 0 {
		return true
	}
	if m&metaOverflow == 0 {
		if inlineCount(m) > 0 {
			out.Set(inlineEP(m))
		}
		return true
	}
	idx := m &^ metaOverflow
	if int(idx) >= len(t.ovf) {
		return false
	}
	nd := &t.ovf[idx]
	for w := range out {
		out[w] = atomic.LoadUint64(&nd.w[w])
	}
	return true
}

// shard is one independently locked part of the table. Writers hold mu and make every visible
// mutation between two increments of seq (odd = writing); readers never take mu unless a writer
// keeps them out for many consecutive attempts.
type shard struct {
	mu        sync.Mutex
	seq       atomic.Uint64
	tab       atomic.Pointer[table]
	keys      atomic.Int64  // occupied slots
	nodes     atomic.Int64  // overflow nodes in use
	exhausted atomic.Uint64 // updates refused: no overflow node left
	level     int           // size level; slots = sizeAt(level)
	base      int           // first level (staggered per shard)
	free      uint32        // head of the free overflow-node list
	used      uint32        // overflow nodes handed out from the array's top
	_         [64]byte
}

// sizeAt is the slot count at a level; a growth step is nShards levels. Shard i starts at level
// i, i/nShards of a step above shard 0, so at any key count the shards sit at evenly spread points of their grow cycle and the
// average load stays near its mean instead of all shards dropping to 0.72 together.
func sizeAt(level int) uint64 {
	s := minSlots * math.Pow(growth, float64(level)/nShards)
	n := uint64(math.Ceil(s/groupSlots)) * groupSlots
	return n
}

func newTable(nslots uint64, ovf []ovNode) *table {
	return &table{groups: make([]group, nslots/groupSlots), nslots: nslots, ovf: ovf}
}

func (s *shard) init(i int) {
	s.base, s.level = i, i
	s.free = nilNode
	s.tab.Store(newTable(sizeAt(i), nil))
}

// holders reads key's holder set consistently.
func (s *shard) holders(h uint64, out *Mask) {
	for attempt := 0; attempt < 64; attempt++ {
		s1 := s.seq.Load()
		if s1&1 == 0 {
			*out = Mask{}
			ok := s.tab.Load().holders(h, out)
			if ok && s.seq.Load() == s1 {
				return
			}
		}
		if attempt >= 8 {
			runtime.Gosched()
		}
	}
	// A writer kept this shard busy for a long time (or was descheduled mid-write): wait for it.
	s.mu.Lock()
	*out = Mask{}
	s.tab.Load().holders(h, out)
	s.mu.Unlock()
}

// entry returns endpoint ep's (count, pending) at slot i. Writer side only.
func (t *table) entry(i uint64, ep EndpointID) (c, p uint32) {
	m := t.meta(i)
	if m&metaOverflow == 0 {
		if inlineEP(m) == ep {
			return inlineCount(m), inlinePending(m)
		}
		return 0, 0
	}
	head := m &^ metaOverflow
	for idx := head; idx != nilNode; idx = t.ovf[idx].next {
		for _, e := range t.ovf[idx].w[firstEnt(idx, head):] {
			if e != 0 && entEP(e) == ep {
				return entCount(e), entPending(e)
			}
		}
	}
	return 0, 0
}

type opKind uint8

const (
	opStore      opKind = iota // one more copy; a first copy adds a FIFO entry
	opRemove                   // one copy fewer, never below zero
	opRemoveHead               // opRemove for the key at the FIFO's head: a last copy leaves at once
	opPop                      // the endpoint's oldest FIFO entry for the key was consumed
	opTrim                     // the FIFO's head entry for the key is dropped if dead
	opCompact                  // the FIFO is being rebuilt without its dead entries
	opDrop                     // the endpoint forgets the key (clear)
)

func transition(op opKind, c, p uint32) (uint32, uint32) {
	switch op {
	case opStore:
		if c == 0 {
			return 1, p + 1
		}
		if c == math.MaxUint32 {
			return c, p
		}
		return c + 1, p
	case opRemove:
		if c == 0 {
			return c, p
		}
		return c - 1, p
	case opRemoveHead:
		if c == 1 && p == 1 {
			return 0, 0
		}
		if c == 0 {
			return c, p
		}
		return c - 1, p
	case opPop:
		switch {
		case p == 0:
			return c, p
		case p > 1:
			return c, p - 1
		default:
			return 0, 0
		}
	case opTrim:
		switch {
		case p == 0 || p == 1 && c > 0:
			return c, p
		case p > 1:
			return c, p - 1
		default:
			return 0, 0
		}
	case opCompact:
		switch {
		case p == 0:
			return c, p
		case p > 1:
			return c, p - 1
		case c > 0:
			return c, 1
		default:
			return 0, 0
		}
	default:
		return 0, 0
	}
}

// apply runs one (endpoint, key) transition and returns the entry before and after.
func (s *shard) apply(h uint64, ep EndpointID, op opKind) (c0, p0, c1, p1 uint32) {
	s.mu.Lock()
	t := s.tab.Load()
	i, found := t.find(h)
	if found {
		c0, p0 = t.entry(i, ep)
	}
	c1, p1 = transition(op, c0, p0)
	if c1 == c0 && p1 == p0 {
		s.mu.Unlock()
		return
	}
	if !found {
		if float64(s.keys.Load()+1) > maxLoad*float64(t.nslots) {
			t = s.resize(t, s.level+nShards)
		}
		if !fitsInline(ep, c1, p1) {
			var ok bool
			if t, ok = s.reserveNode(t); !ok {
				s.mu.Unlock()
				return c0, p0, c0, p0
			}
		}
		s.seq.Add(1)
		if fitsInline(ep, c1, p1) {
			t.insert(h, packInline(ep, c1, p1))
		} else {
			idx := s.allocNode(t)
			t.writeEnt(idx, &t.ovf[idx].w[headFirst], ep, c1, p1)
			t.insert(h, metaOverflow|idx)
		}
		s.seq.Add(1)
		s.keys.Add(1)
		s.mu.Unlock()
		return
	}
	if needsNode(t.meta(i), ep, c1, p1) {
		var ok bool
		if t, ok = s.reserveNode(t); !ok {
			s.mu.Unlock()
			return c0, p0, c0, p0
		}
	}
	s.seq.Add(1)
	deleted := s.setEntry(t, i, ep, c1, p1)
	s.seq.Add(1)
	if deleted {
		n := s.keys.Add(-1)
		if s.level > s.base && float64(n) < minLoad*float64(t.nslots) {
			lv := s.level
			for lv-nShards >= s.base && float64(n) < 0.6*float64(sizeAt(lv-nShards)) {
				lv -= nShards
			}
			t = s.resize(t, lv)
		}
	}
	if s.nodes.Load() == 0 && len(t.ovf) > 0 {
		s.free, s.used = nilNode, 0
		s.tab.Store(&table{groups: t.groups, nslots: t.nslots})
	}
	s.mu.Unlock()
	return
}

// read returns ep's entry for key under the shard lock (admin paths and tests).
func (s *shard) read(h uint64, ep EndpointID) (c, p uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tab.Load()
	if i, ok := t.find(h); ok {
		return t.entry(i, ep)
	}
	return 0, 0
}

// resize rebuilds the slot array at a new level and publishes it. The old table stays intact for
// readers still on it, so the rebuild happens outside the seqlock's write window.
func (s *shard) resize(t *table, level int) *table {
	for float64(s.keys.Load()+1) > maxLoad*float64(sizeAt(level)) {
		level += nShards
	}
	nt := newTable(sizeAt(level), t.ovf)
	for i := range t.nslots {
		if h, m := t.slot(i); m != 0 {
			nt.insert(h, m)
		}
	}
	s.level = level
	s.tab.Store(nt)
	return nt
}

// reserveNode makes sure one overflow node can be allocated without reallocating inside the
// write window. It fails only when the shard has used every node index (2^23 nodes, 512 MiB).
func (s *shard) reserveNode(t *table) (*table, bool) {
	if s.free != nilNode || int(s.used) < len(t.ovf) {
		return t, true
	}
	if len(t.ovf) >= maxNodes {
		s.exhausted.Add(1)
		return t, false
	}
	n := min(max(2*len(t.ovf), 16), maxNodes)
	ovf := make([]ovNode, n)
	copy(ovf, t.ovf)
	nt := &table{groups: t.groups, nslots: t.nslots, ovf: ovf}
	s.tab.Store(nt)
	return nt, true
}

// needsNode reports whether writing (ep, c, p) into a slot with meta m may allocate a node.
func needsNode(m uint32, ep EndpointID, c, p uint32) bool {
	if c == 0 && p == 0 {
		return false
	}
	if m&metaOverflow == 0 && inlineEP(m) == ep {
		return !fitsInline(ep, c, p)
	}
	return true
}

func (s *shard) allocNode(t *table) uint32 {
	var idx uint32
	if s.free != nilNode {
		idx = s.free
		s.free = t.ovf[idx].next
	} else {
		idx = s.used
		s.used++
	}
	atomic.StoreUint32(&t.ovf[idx].next, nilNode)
	s.nodes.Add(1)
	return idx
}

func (s *shard) freeChain(t *table, idx uint32) {
	for idx != nilNode {
		nd := &t.ovf[idx]
		next := nd.next
		for k := range nd.w {
			atomic.StoreUint64(&nd.w[k], 0)
		}
		atomic.StoreUint32(&nd.next, s.free)
		s.free = idx
		s.nodes.Add(-1)
		idx = next
	}
}

// writeEnt stores ep's entry in *slot of the chain headed by head and keeps the head's
// residency bitmap in step.
func (t *table) writeEnt(head uint32, slot *uint64, ep EndpointID, c, p uint32) {
	if c == 0 && p == 0 {
		atomic.StoreUint64(slot, 0)
	} else {
		atomic.StoreUint64(slot, packEnt(ep, c, p))
	}
	if ep >= MaxEndpoints {
		return
	}
	word := &t.ovf[head].w[ep/64]
	bit := uint64(1) << (ep % 64)
	if c > 0 {
		atomic.StoreUint64(word, *word|bit)
	} else {
		atomic.StoreUint64(word, *word&^bit)
	}
}

// setEntry writes ep's entry at slot i, moving the key between the inline and overflow forms and
// deleting it when no entry is left. It reports whether the slot was deleted. Call inside the
// write window with one node reserved.
func (s *shard) setEntry(t *table, i uint64, ep EndpointID, c, p uint32) bool {
	m := t.meta(i)
	zero := c == 0 && p == 0
	if m&metaOverflow == 0 {
		if inlineEP(m) == ep {
			if zero {
				t.deleteAt(i)
				return true
			}
			if fitsInline(ep, c, p) {
				t.setMeta(i, packInline(ep, c, p))
				return false
			}
			idx := s.allocNode(t)
			t.writeEnt(idx, &t.ovf[idx].w[headFirst], ep, c, p)
			t.setMeta(i, metaOverflow|idx)
			return false
		}
		if zero {
			return false
		}
		idx := s.allocNode(t)
		t.writeEnt(idx, &t.ovf[idx].w[headFirst], inlineEP(m), inlineCount(m), inlinePending(m))
		t.writeEnt(idx, &t.ovf[idx].w[headFirst+1], ep, c, p)
		t.setMeta(i, metaOverflow|idx)
		return false
	}
	head := m &^ metaOverflow
	var hole *uint64
	var last uint32
	done := false
	for idx := head; idx != nilNode; idx = t.ovf[idx].next {
		nd := &t.ovf[idx]
		for k := firstEnt(idx, head); k < nodeWords; k++ {
			e := nd.w[k]
			if e != 0 && entEP(e) == ep {
				t.writeEnt(head, &nd.w[k], ep, c, p)
				done = true
			} else if e == 0 && hole == nil {
				hole = &nd.w[k]
			}
		}
		last = idx
	}
	if !done && !zero {
		if hole == nil {
			idx := s.allocNode(t)
			atomic.StoreUint32(&t.ovf[last].next, idx)
			hole = &t.ovf[idx].w[0]
		}
		t.writeEnt(head, hole, ep, c, p)
	}
	// Normalize: back to inline when one entry fits, gone when none is left.
	var only uint64
	n := 0
	for idx := head; idx != nilNode && n < 2; idx = t.ovf[idx].next {
		for _, e := range t.ovf[idx].w[firstEnt(idx, head):] {
			if e != 0 {
				only = e
				n++
			}
		}
	}
	switch {
	case n == 0:
		s.freeChain(t, head)
		t.deleteAt(i)
		return true
	case n == 1 && fitsInline(entEP(only), entCount(only), entPending(only)):
		t.setMeta(i, packInline(entEP(only), entCount(only), entPending(only)))
		s.freeChain(t, head)
	}
	return false
}
