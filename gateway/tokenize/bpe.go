package tokenize

import (
	"bytes"
	"container/heap"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"unicode/utf8"
)

// bpe is the BPE model: byte-level (GPT-2 style, the ByteLevel pre-tokenizer's byte-to-char mapping
// folded into the vocabulary, so it works on raw bytes) or SentencePiece style (chars, byte_fallback
// <0xNN> tokens, unk with fuse_unk).
type bpe struct {
	byteLevel    bool
	ignoreMerges bool
	byteFallback bool
	fuseUnk      bool
	unkID        int64 // -1: none

	tokens []string          // id -> token as written in tokenizer.json
	vocab  map[string]uint32 // token as written -> id
	lookup map[string]uint32 // raw-byte key (byte-level) or token (otherwise) -> id

	byteIDs     [256]int32 // byte-level: id of each single byte, -1 when absent
	fallbackIDs [256]int32 // byte_fallback: id of <0xNN>, -1 when absent
	merges      map[uint64]uint64

	cache wordCache
}

const noRank = math.MaxUint32

type bpeJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  json.RawMessage   `json:"merges"`
}

func parseBPE(path string, m json.RawMessage, byteLevel bool) (*bpe, error) {
	typ, err := typeOf(path, m)
	if err != nil {
		return nil, err
	}
	if typ != "BPE" {
		return nil, unsupported(path, typ)
	}
	var j bpeJSON
	if err := json.Unmarshal(m, &j); err != nil {
		return nil, loadError(path, "%v", err)
	}
	if j.Dropout != nil && *j.Dropout != 0 {
		return nil, loadError(path+".dropout", "%v is not supported (must be null)", *j.Dropout)
	}
	if j.ContinuingSubwordPrefix != nil && *j.ContinuingSubwordPrefix != "" {
		return nil, loadError(path+".continuing_subword_prefix", "%q is not supported", *j.ContinuingSubwordPrefix)
	}
	if j.EndOfWordSuffix != nil && *j.EndOfWordSuffix != "" {
		return nil, loadError(path+".end_of_word_suffix", "%q is not supported", *j.EndOfWordSuffix)
	}
	b := &bpe{byteLevel: byteLevel, ignoreMerges: j.IgnoreMerges, byteFallback: j.ByteFallback, fuseUnk: j.FuseUnk, unkID: -1, vocab: j.Vocab}
	maxID := -1
	for tok, id := range j.Vocab {
		if id >= 1<<24 {
			return nil, loadError(path+".vocab", "id %d of %q is out of range", id, tok)
		}
		maxID = max(maxID, int(id))
	}
	b.tokens = make([]string, maxID+1)
	for tok, id := range j.Vocab {
		b.tokens[id] = tok
	}
	if j.UnkToken != nil {
		id, ok := j.Vocab[*j.UnkToken]
		if !ok {
			return nil, loadError(path+".unk_token", "%q is not in the vocabulary", *j.UnkToken)
		}
		b.unkID = int64(id)
	}
	for i := range b.byteIDs {
		b.byteIDs[i], b.fallbackIDs[i] = -1, -1
	}
	if byteLevel {
		b.lookup = make(map[string]uint32, len(j.Vocab))
		var buf []byte
		for tok, id := range j.Vocab {
			var ok bool
			if buf, ok = byteLevelDecode(buf[:0], tok); ok {
				b.lookup[string(buf)] = id
				if len(buf) == 1 {
					b.byteIDs[buf[0]] = int32(id)
				}
			}
		}
	} else {
		b.lookup = j.Vocab
		for i := 0; i < 256; i++ {
			if id, ok := j.Vocab[fmt.Sprintf("<0x%02X>", i)]; ok {
				b.fallbackIDs[i] = int32(id)
			}
		}
	}
	if err := b.parseMerges(path+".merges", j.Merges); err != nil {
		return nil, err
	}
	b.cache.init(8192)
	return b, nil
}

func (b *bpe) parseMerges(path string, m json.RawMessage) error {
	m = bytes.TrimSpace(m)
	var pairs [][2]string
	if len(m) == 0 || bytes.Equal(m, []byte("null")) {
		return nil
	}
	// Two layouts: ["a b", ...] (older) or [["a", "b"], ...].
	inner := bytes.TrimSpace(bytes.TrimPrefix(m, []byte("[")))
	if len(inner) > 0 && inner[0] == '"' {
		var lines []string
		if err := json.Unmarshal(m, &lines); err != nil {
			return loadError(path, "%v", err)
		}
		pairs = make([][2]string, len(lines))
		for i, l := range lines {
			a, c, ok := strings.Cut(l, " ")
			if !ok || strings.Contains(c, " ") {
				return loadError(fmt.Sprintf("%s[%d]", path, i), "%q is not two tokens separated by one space", l)
			}
			pairs[i] = [2]string{a, c}
		}
	} else if err := json.Unmarshal(m, &pairs); err != nil {
		return loadError(path, "%v", err)
	}
	b.merges = make(map[uint64]uint64, len(pairs))
	for rank, p := range pairs {
		a, ok1 := b.vocab[p[0]]
		c, ok2 := b.vocab[p[1]]
		if !ok1 || !ok2 {
			return loadError(fmt.Sprintf("%s[%d]", path, rank), "token of %q is not in the vocabulary", p)
		}
		n, ok := b.vocab[p[0]+p[1]]
		if !ok {
			return loadError(fmt.Sprintf("%s[%d]", path, rank), "merged token %q is not in the vocabulary", p[0]+p[1])
		}
		k := uint64(a)<<32 | uint64(c)
		if _, dup := b.merges[k]; !dup { // the first (lowest) rank wins, as in HF
			b.merges[k] = uint64(rank)<<32 | uint64(n)
		}
	}
	return nil
}

// rank returns the merge rank and result of the pair (a, c), or noRank.
func (b *bpe) rank(a, c uint32) (uint32, uint32) {
	v, ok := b.merges[uint64(a)<<32|uint64(c)]
	if !ok {
		return noRank, 0
	}
	return uint32(v >> 32), uint32(v)
}

// maxCachedPiece bounds the pieces kept in the word cache.
const maxCachedPiece = 64

// encode appends the ids of one pre-tokenized piece.
func (b *bpe) encode(dst []uint32, piece string, sc *scratch) []uint32 {
	if b.ignoreMerges {
		if id, ok := b.lookup[piece]; ok {
			return append(dst, id)
		}
	}
	cacheable := len(piece) <= maxCachedPiece
	if cacheable {
		if ids, ok := b.cache.get(piece); ok {
			return append(dst, ids...)
		}
	}
	syms := b.initialSymbols(sc.syms[:0], piece)
	if len(syms) > 1 {
		if len(syms) <= 128 {
			syms = b.mergeSmall(syms, sc)
		} else {
			syms = b.mergeLarge(syms)
		}
	}
	sc.syms = syms
	if cacheable {
		b.cache.put(piece, syms)
	}
	return append(dst, syms...)
}

// initialSymbols splits a piece into its first symbols (HF BPE merge_word, before merging).
func (b *bpe) initialSymbols(syms []uint32, piece string) []uint32 {
	if b.byteLevel {
		for i := 0; i < len(piece); i++ {
			if id := b.byteIDs[piece[i]]; id >= 0 {
				syms = append(syms, uint32(id))
			} else if b.unkID >= 0 {
				syms = append(syms, uint32(b.unkID)) // byte-level vocabularies hold all 256 bytes
			}
		}
		return syms
	}
	pendingUnk := false
	for i := 0; i < len(piece); {
		n := 1
		if piece[i] >= utf8.RuneSelf {
			_, n = utf8.DecodeRuneInString(piece[i:])
		}
		ch := piece[i : i+n]
		i += n
		if id, ok := b.lookup[ch]; ok {
			if pendingUnk {
				syms = append(syms, uint32(b.unkID))
				pendingUnk = false
			}
			syms = append(syms, id)
			continue
		}
		if b.byteFallback {
			all := true
			for k := 0; k < len(ch); k++ {
				if b.fallbackIDs[ch[k]] < 0 {
					all = false
					break
				}
			}
			if all {
				for k := 0; k < len(ch); k++ {
					syms = append(syms, uint32(b.fallbackIDs[ch[k]]))
				}
				continue
			}
		}
		if b.unkID >= 0 {
			if pendingUnk && !b.fuseUnk {
				syms = append(syms, uint32(b.unkID))
			}
			pendingUnk = true
		}
	}
	if pendingUnk {
		syms = append(syms, uint32(b.unkID))
	}
	return syms
}

// mergeSmall merges the lowest-ranked adjacent pair (leftmost on ties) until none is left, keeping
// one rank per pair so each step is a scan of small integers.
func (b *bpe) mergeSmall(syms []uint32, sc *scratch) []uint32 {
	ranks, news := sc.ranks[:0], sc.news[:0]
	for i := 0; i+1 < len(syms); i++ {
		r, n := b.rank(syms[i], syms[i+1])
		ranks = append(ranks, r)
		news = append(news, n)
	}
	for len(ranks) > 0 {
		best, bi := uint32(noRank), -1
		for i, r := range ranks {
			if r < best {
				best, bi = r, i
			}
		}
		if bi < 0 {
			break
		}
		syms[bi] = news[bi]
		syms = append(syms[:bi+1], syms[bi+2:]...)
		ranks = append(ranks[:bi], ranks[bi+1:]...)
		news = append(news[:bi], news[bi+1:]...)
		if bi > 0 {
			ranks[bi-1], news[bi-1] = b.rank(syms[bi-1], syms[bi])
		}
		if bi < len(ranks) {
			ranks[bi], news[bi] = b.rank(syms[bi], syms[bi+1])
		}
	}
	sc.ranks, sc.news = ranks, news
	return syms
}

// mergeLarge is the same merge order with a heap, for long pieces (O(n log n)).
func (b *bpe) mergeLarge(syms []uint32) []uint32 {
	n := len(syms)
	prev := make([]int32, n)
	next := make([]int32, n)
	alive := make([]bool, n)
	for i := range syms {
		prev[i], next[i], alive[i] = int32(i-1), int32(i+1), true
	}
	next[n-1] = -1
	h := &mergeHeap{}
	for i := 0; i+1 < n; i++ {
		if r, _ := b.rank(syms[i], syms[i+1]); r != noRank {
			h.items = append(h.items, mergeItem{r, int32(i)})
		}
	}
	heap.Init(h)
	for h.Len() > 0 {
		it := heap.Pop(h).(mergeItem)
		i := it.pos
		if !alive[i] || next[i] < 0 {
			continue
		}
		j := next[i]
		r, nid := b.rank(syms[i], syms[j])
		if r != it.rank {
			continue // stale: the pair changed since it was queued
		}
		syms[i] = nid
		alive[j] = false
		next[i] = next[j]
		if next[j] >= 0 {
			prev[next[j]] = i
		}
		if p := prev[i]; p >= 0 {
			if r, _ := b.rank(syms[p], syms[i]); r != noRank {
				heap.Push(h, mergeItem{r, p})
			}
		}
		if q := next[i]; q >= 0 {
			if r, _ := b.rank(syms[i], syms[q]); r != noRank {
				heap.Push(h, mergeItem{r, i})
			}
		}
	}
	out := syms[:0]
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, syms[i])
	}
	return out
}

type mergeItem struct {
	rank uint32
	pos  int32
}

type mergeHeap struct{ items []mergeItem }

func (h *mergeHeap) Len() int { return len(h.items) }
func (h *mergeHeap) Less(i, j int) bool {
	a, c := h.items[i], h.items[j]
	return a.rank < c.rank || (a.rank == c.rank && a.pos < c.pos)
}
func (h *mergeHeap) Swap(i, j int) { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *mergeHeap) Push(x any)    { h.items = append(h.items, x.(mergeItem)) }
func (h *mergeHeap) Pop() any {
	x := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return x
}

// wordCache remembers the ids of recent pieces (HF keeps such a cache too). Sharded, each shard
// cleared when full: bounded memory without per-entry bookkeeping.
type wordCache struct {
	perShard int
	shards   [32]cacheShard
}

type cacheShard struct {
	mu sync.RWMutex
	m  map[string][]uint32
}

func (c *wordCache) init(capacity int) {
	c.perShard = max(capacity/len(c.shards), 16)
	for i := range c.shards {
		c.shards[i].m = make(map[string][]uint32, c.perShard)
	}
}

func (c *wordCache) shard(k string) *cacheShard {
	h := uint32(2166136261)
	for i := 0; i < len(k); i++ {
		h = (h ^ uint32(k[i])) * 16777619
	}
	return &c.shards[h%uint32(len(c.shards))]
}

func (c *wordCache) get(k string) ([]uint32, bool) {
	s := c.shard(k)
	s.mu.RLock()
	v, ok := s.m[k]
	s.mu.RUnlock()
	return v, ok
}

func (c *wordCache) put(k string, ids []uint32) {
	s := c.shard(k)
	v := make([]uint32, len(ids))
	copy(v, ids)
	k = strings.Clone(k)
	s.mu.Lock()
	if len(s.m) >= c.perShard {
		clear(s.m)
	}
	s.m[k] = v
	s.mu.Unlock()
}

// scratch holds per-call buffers, pooled to keep allocation per Encode low.
type scratch struct {
	syms, ranks, news []uint32
	tok               *Tokenizer
	dst               []uint32
	emits             []func(string) // emits[k] feeds pre-tokenizer step k+1
}

var scratchPool = sync.Pool{New: func() any { return &scratch{} }}

func getScratch() *scratch  { return scratchPool.Get().(*scratch) }
func putScratch(s *scratch) { scratchPool.Put(s) }
