package route

import (
	"container/list"
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvexact/kvexact/gateway/hashcore"
)

// The key cache: exact reuse of the block keys of an earlier prompt's unchanged id prefix.
//
// A block's key (and full digest) is a function of the binding (algorithm, seed, block size, bigram
// pages), the request's extras (LoRA name, cache_salt) and the token ids up to the end of that block:
// nothing after it enters. So two prompts of one key space whose ids agree on their first t tokens
// have the same keys and digests for their first NumBlocks(t) blocks. The cache keeps recent
// prompts' ids, their keys, and the full digest at every checkpoint (every checkpointTokens tokens,
// in whole blocks). A prompt that agrees with one of them on at least one checkpoint's ids — compared
// in full, never by a hash of them; the key space compared field by field — copies the keys up to
// the deepest checkpoint inside the common prefix and hashes on from there, chained on that
// checkpoint's digest (hashcore.KeysFrom): bit for bit what hashing it whole gives. A multi-turn
// request's ids extend the previous request's, so only its new turn (and at most one checkpoint's
// blocks) is hashed. Fingerprints of the ids at each checkpoint only find the candidate; a
// fingerprint collision costs a comparison, never a wrong key.

// DefaultKeyCacheBytes bounds the key cache unless configured: about 140 distinct 100k-token
// prompts (ids, keys and checkpoints ≈ 4.7 B per token at block size 16).
const DefaultKeyCacheBytes = 64 << 20

// checkpointTokens is about how far apart checkpoints are (at least one block): the most a hit
// hashes again of what the cache already held, and the shortest prompt the cache keeps.
const checkpointTokens = 256

// keyEntryOverhead approximates an entry's bookkeeping (list element, headers), and
// checkpointOverhead a checkpoint's map slot, bytes.
const (
	keyEntryOverhead   = 256
	checkpointOverhead = 32
)

// KeyCache remembers recently keyed prompts (ids, block keys, checkpoint digests) for every key
// space, bounded by bytes, least recently used dropped first. Safe for concurrent use; a nil
// *KeyCache hashes every prompt whole.
type KeyCache struct {
	max        int64
	seed       maphash.Seed
	stepTokens int    // checkpoint spacing, checkpointTokens (tests lower it)
	fpMask     uint64 // bits of a fingerprint kept, all (tests narrow it to force collisions)

	mu    sync.Mutex
	at    map[uint64]*keyEntry // fingerprint at a checkpoint → the latest entry holding that prefix
	lru   list.List            // of *keyEntry, most recent first
	bytes int64

	hits, misses, evictions, reused atomic.Uint64
}

// keySpace is everything besides the ids that a prompt's keys depend on: a difference in any field
// is a different key space, and its entries are never reused.
type keySpace struct {
	algo      hashcore.Algorithm
	blockSize int
	seed      string
	seeded    bool
	bigram    bool
	lora      string
	salt      string
	tagged    bool
	loraPath  string
}

type keyEntry struct {
	space keySpace
	// Never modified once stored.
	ids     []uint32
	keys    []uint64
	fps     []uint64 // fps[c-1]: fingerprint of the space and the ids of checkpoint c's blocks
	digests []byte   // checkpoint c's digest (of its last block) at (c-1)·DigestLen
	size    int64
	el      *list.Element
}

// NewKeyCache returns a cache of at most maxBytes; nil when maxBytes ≤ 0 (no cache).
func NewKeyCache(maxBytes int64) *KeyCache {
	if maxBytes <= 0 {
		return nil
	}
	return &KeyCache{max: maxBytes, seed: maphash.MakeSeed(), stepTokens: checkpointTokens, fpMask: ^uint64(0), at: map[uint64]*keyEntry{}}
}

// KeyCacheStats counts a cache's lookups, reused blocks and evictions since it was made.
type KeyCacheStats struct {
	// Hits and Misses count prompts of at least one checkpoint; ReusedBlocks the keys copied
	// instead of hashed.
	Hits, Misses, ReusedBlocks, Evictions uint64
	Bytes, MaxBytes                       int64
	Entries                               int
}

// Stats returns the counters (zero for a nil cache).
func (c *KeyCache) Stats() KeyCacheStats {
	if c == nil {
		return KeyCacheStats{}
	}
	c.mu.Lock()
	b, n := c.bytes, c.lru.Len()
	c.mu.Unlock()
	return KeyCacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), ReusedBlocks: c.reused.Load(), Evictions: c.evictions.Load(), Bytes: b, MaxBytes: c.max, Entries: n}
}

// spaceOf is h's key space for a request with ex; ok is false for extras the space does not
// describe (multimodal items, prompt embeddings: the keyer never hashes those, they are misses
// before it), which then bypass the cache.
func spaceOf(h *hashcore.Hasher, ex *hashcore.Extras) (keySpace, bool) {
	b := h.Binding()
	s := keySpace{algo: b.Algorithm, blockSize: b.BlockSize, bigram: b.Bigram}
	if b.Seed != nil {
		s.seed, s.seeded = *b.Seed, true
	}
	if ex != nil {
		if len(ex.MM) > 0 || ex.PromptEmbeds != nil {
			return keySpace{}, false
		}
		s.lora, s.salt, s.tagged, s.loraPath = ex.LoRAName, ex.CacheSalt, ex.Tagged, ex.LoRAPath
	}
	return s, true
}

// Keys returns h.Keys(ids, ex), reusing an earlier prompt's keys for the common id prefix, and
// remembers this prompt for the next.
func (c *KeyCache) Keys(h *hashcore.Hasher, ids []uint32, ex *hashcore.Extras) ([]uint64, error) {
	space, ok := spaceOf(h, ex)
	if c == nil || !ok {
		return h.Keys(ids, ex, nil)
	}
	step := max(1, c.stepTokens/space.blockSize) // blocks per checkpoint
	n := h.NumBlocks(len(ids))
	fps := c.fingerprints(space, ids, n/step, step)
	if len(fps) == 0 {
		return h.Keys(ids, ex, nil)
	}
	e, common := c.find(space, ids, fps, step)
	from := 0 // the first block hashed
	var parent []byte
	dl := space.algo.DigestLen()
	if e != nil {
		cp := min(h.NumBlocks(common)/step, len(e.fps)) // the deepest checkpoint inside the common prefix
		from = cp * step
		parent = e.digests[(cp-1)*dl : cp*dl]
		c.hits.Add(1)
		c.reused.Add(uint64(from))
	} else {
		c.misses.Add(1)
	}
	keys := make([]uint64, n)
	copy(keys, e.keysOf(from))
	digests := make([]byte, (n-from)*dl)
	if _, err := h.KeysFrom(ids, ex, from, parent, keys[from:from], digests); err != nil {
		return nil, err
	}
	if e != nil && common == len(ids) { // this prompt is (a prefix of) the entry: nothing new to keep
		return keys, nil
	}
	ne := &keyEntry{space: space, ids: append([]uint32(nil), ids...), keys: append([]uint64(nil), keys...), fps: fps, digests: make([]byte, len(fps)*dl)}
	for cp := 1; cp <= len(fps); cp++ {
		if b := cp*step - 1; b < from {
			copy(ne.digests[(cp-1)*dl:], e.digests[(cp-1)*dl:cp*dl])
		} else {
			copy(ne.digests[(cp-1)*dl:], digests[(b-from)*dl:(b-from+1)*dl])
		}
	}
	ne.size = 4*int64(len(ne.ids)) + 8*int64(len(ne.keys)) + int64(len(fps))*(8+int64(dl)+checkpointOverhead) + keyEntryOverhead
	var dominated *keyEntry
	if e != nil && common == len(e.ids) { // the entry's prompt is a prefix of this one's: this one replaces it
		dominated = e
	}
	c.put(ne, dominated)
	return keys, nil
}

// keysOf is the entry's first n keys (none for a nil entry).
func (e *keyEntry) keysOf(n int) []uint64 {
	if e == nil {
		return nil
	}
	return e.keys[:n]
}

// tokensOf is how many ids the first blocks blocks of space read (a bigram page reads one more).
func (s keySpace) tokensOf(blocks int) int {
	t := blocks * s.blockSize
	if s.bigram && blocks > 0 {
		t++
	}
	return t
}

// fingerprints hashes space and ids up to each of the first n checkpoints.
func (c *KeyCache) fingerprints(space keySpace, ids []uint32, n, step int) []uint64 {
	if n == 0 {
		return nil
	}
	var h maphash.Hash
	h.SetSeed(c.seed)
	h.WriteString(string(space.algo))
	h.WriteString("\x00" + strconv.Itoa(space.blockSize) + "\x00" + strconv.FormatBool(space.bigram) + "\x00" + strconv.FormatBool(space.seeded) + "\x00")
	for _, s := range []string{space.seed, space.lora, space.salt} {
		h.WriteString(strconv.Itoa(len(s)) + ":")
		h.WriteString(s)
	}
	fps := make([]uint64, n)
	prev := 0
	for cp := 1; cp <= n; cp++ {
		t := space.tokensOf(cp * step)
		h.Write(idBytes(ids[prev:t]))
		fps[cp-1] = h.Sum64() & c.fpMask
		prev = t
	}
	return fps
}

// find returns the entry agreeing with ids on the most checkpoints and the length of their common
// id prefix (nil, 0 when none agrees on one), most recently used first.
func (c *KeyCache) find(space keySpace, ids []uint32, fps []uint64, step int) (*keyEntry, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for cp := len(fps); cp >= 1; cp-- {
		e := c.at[fps[cp-1]]
		if e == nil || e.space != space || len(e.fps) < cp || e.fps[cp-1] != fps[cp-1] {
			continue
		}
		t := space.tokensOf(cp * step)
		if !equalIDs(e.ids[:t], ids[:t]) {
			continue // a fingerprint collision
		}
		c.lru.MoveToFront(e.el)
		return e, t + commonPrefix(e.ids[t:], ids[t:])
	}
	return nil, 0
}

// put stores e, drops dominated (an entry e makes useless), then the least recently used entries
// beyond the bound.
func (c *KeyCache) put(e, dominated *keyEntry) {
	if e.size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e.el = c.lru.PushFront(e)
	c.bytes += e.size
	for _, fp := range e.fps {
		c.at[fp] = e
	}
	if dominated != nil && dominated.el.Value != nil {
		c.remove(dominated)
	}
	for c.bytes > c.max {
		c.remove(c.lru.Back().Value.(*keyEntry))
		c.evictions.Add(1)
	}
}

// remove drops e and the checkpoints that still lead to it.
func (c *KeyCache) remove(e *keyEntry) {
	c.lru.Remove(e.el)
	e.el.Value = nil // removed: a second remove (an entry dominated twice) is a no-op
	c.bytes -= e.size
	for _, fp := range e.fps {
		if c.at[fp] == e {
			delete(c.at, fp)
		}
	}
}

// idBytes views ids as bytes (for hashing and comparing; the byte order is the machine's, the same
// on both sides).
func idBytes(ids []uint32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(ids))), 4*len(ids))
}

func equalIDs(a, b []uint32) bool { return string(idBytes(a)) == string(idBytes(b)) }

// commonPrefix is the length of the longest common prefix of a and b: equal chunks are compared
// as memory, then the differing chunk id by id.
func commonPrefix(a, b []uint32) int {
	n := min(len(a), len(b))
	const chunk = 256
	i := 0
	for i+chunk <= n && equalIDs(a[i:i+chunk], b[i:i+chunk]) {
		i += chunk
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}
