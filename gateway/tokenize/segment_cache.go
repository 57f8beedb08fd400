package tokenize

import (
	"container/list"
	"strings"
	"sync"
	"sync/atomic"
)

// The segment cache: exact reuse of a prompt's earlier tokenization.
//
// Encode cuts the text at its added tokens first (leftmost-longest over the whole text, lstrip /
// rstrip / single_word decided there) and then turns each text segment between two added tokens
// into ids by a function of that segment alone: normalization, the normalized added-token split,
// pre-tokenization and BPE all run on the segment and see nothing of its neighbours (HF's
// AddedVocabulary.extract_and_normalize does the same). So with the cut always made afresh over the
// whole text, remembering segment → ids is memoizing a pure function: exact by construction, as long
// as every component really is segment-local (segmentLocal below; a component it does not know turns
// the cache off for that tokenizer). A multi-turn chat rendering has an added token between turns,
// so its unchanged earlier turns are segments seen before; an arbitrary character offset would not
// be exact (BPE merges and the pre-tokenizer's look-ahead cross it), which is why the unit is the
// segment and not a text prefix. Keyed by segment text, the cache holds one copy of a turn however
// many conversations or lengths of one conversation repeat it, where a prefix cache would store
// every prefix.

// DefaultSegmentCacheBytes bounds a pool's segment cache unless configured: about 80 distinct
// 100k-token conversations (text plus ids ≈ 8 B per token).
const DefaultSegmentCacheBytes = 64 << 20

// minCachedSegment is the shortest segment kept: shorter ones encode in about the time a lookup
// takes (and BPE's word cache already holds their pieces).
const minCachedSegment = 128

// segmentOverhead approximates an entry's bookkeeping (map slot, list element, headers), bytes.
const segmentOverhead = 128

// SegmentCache remembers the ids of text segments between added tokens, for every tokenizer of a
// pool, bounded by bytes (text + ids + overhead), least recently used dropped first. Safe for
// concurrent use.
type SegmentCache struct {
	max      int64
	minBytes int // segments shorter than this are encoded, not kept (tests lower it)

	mu    sync.Mutex
	m     map[segmentKey]*list.Element
	lru   list.List // of *segmentEntry, most recent first
	bytes int64

	hits, misses, evictions atomic.Uint64
}

// segmentKey is the tokenizer's identity (its two files' digests: identical files give identical
// segment ids) and the segment text, compared in full by the map.
type segmentKey struct {
	tokenizer string
	text      string
}

type segmentEntry struct {
	key  segmentKey
	ids  []uint32 // never modified once stored
	size int64
}

// NewSegmentCache returns a cache of at most maxBytes; nil when maxBytes ≤ 0 (no cache).
func NewSegmentCache(maxBytes int64) *SegmentCache {
	if maxBytes <= 0 {
		return nil
	}
	return &SegmentCache{max: maxBytes, minBytes: minCachedSegment, m: map[segmentKey]*list.Element{}}
}

// SegmentCacheStats counts a cache's lookups and evictions since it was made.
type SegmentCacheStats struct {
	Hits, Misses, Evictions uint64
	Bytes, MaxBytes         int64
	Entries                 int
}

// Stats returns the counters (zero for a nil cache).
func (c *SegmentCache) Stats() SegmentCacheStats {
	if c == nil {
		return SegmentCacheStats{}
	}
	c.mu.Lock()
	b, n := c.bytes, c.lru.Len()
	c.mu.Unlock()
	return SegmentCacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Evictions: c.evictions.Load(), Bytes: b, MaxBytes: c.max, Entries: n}
}

func (c *SegmentCache) get(k segmentKey) ([]uint32, bool) {
	c.mu.Lock()
	el, ok := c.m[k]
	if ok {
		c.lru.MoveToFront(el)
	}
	c.mu.Unlock()
	if !ok {
		c.misses.Add(1)
		return nil, false
	}
	c.hits.Add(1)
	return el.Value.(*segmentEntry).ids, true
}

func (c *SegmentCache) put(k segmentKey, ids []uint32) {
	size := int64(len(k.text)) + 4*int64(len(ids)) + segmentOverhead
	if size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; ok { // another request encoded it meanwhile
		return
	}
	// Own copies: the segment is a substring of a request's text, which it must not keep alive.
	k.text = strings.Clone(k.text)
	e := &segmentEntry{key: k, ids: append([]uint32(nil), ids...), size: size}
	c.m[k] = c.lru.PushFront(e)
	c.bytes += size
	for c.bytes > c.max {
		old := c.lru.Remove(c.lru.Back()).(*segmentEntry)
		delete(c.m, old.key)
		c.bytes -= old.size
		c.evictions.Add(1)
	}
}

// WithSegmentCache returns a copy of t that memoizes its text segments in c (nil: none). The copy
// shares everything else with t; t itself is unchanged. When t's components are not all
// segment-local the copy does not use c (Encode stays exact).
func (t *Tokenizer) WithSegmentCache(c *SegmentCache) *Tokenizer {
	u := *t
	u.segs = nil
	if c != nil && t.segmentLocal {
		u.segs = c
	}
	return &u
}

// SegmentCached says whether t's Encode uses a segment cache.
func (t *Tokenizer) SegmentCached() bool { return t.segs != nil }

// segmentLocal reports whether a normalizer, pre-tokenizer step or model turns its input into output
// from that input alone — the condition for the segment cache to be exact. It lists the components
// this package implements; anything else (a future component, say Metaspace with prepend_scheme
// "first", which HF applies only to the text's first segment) is not known to be local.
func segmentLocal(c any) bool {
	switch c := c.(type) {
	case nil:
		return true
	case nfcNormalizer, replaceNormalizer:
		return true
	case prependNormalizer:
		return true // HF prepends to every non-empty segment, as here (Mistral's "▁" after a special token)
	case sequenceNormalizer:
		for _, n := range c {
			if !segmentLocal(n) {
				return false
			}
		}
		return true
	case *splitStep:
		return true // matches run inside the piece they are given
	case *byteLevelStep:
		return true // add_prefix_space looks at the piece's own first byte
	case *bpe:
		return true // merges and byte fallback stay inside a pre-tokenized piece
	}
	return false
}

// tokenizerSegmentLocal is segmentLocal for all of t's segment pipeline.
func tokenizerSegmentLocal(t *Tokenizer) bool {
	if t.normalizer != nil && !segmentLocal(t.normalizer) {
		return false
	}
	for _, p := range t.pre {
		if !segmentLocal(p) {
			return false
		}
	}
	return segmentLocal(t.model)
}
