package engines

import "github.com/kvexact/kvexact/gateway/hashcore"

// A RouterBinder turns a family's decoded events into inventory updates under the router binding:
// keys are hashcore.RouterKeys (kvexact-xxh3-v1) over the tokens the events carry, chained from the
// parent's router key found in the endpoint's KeyMap. The pipeline hands it every event that passed
// its medium and KV-cache-group checks except clears (AllBlocksCleared, CacheCreated), which it
// handles itself. It is not safe for concurrent use.
type RouterBinder interface {
	Bind(rank int, ev *Event, m *KeyMap, out BindOutput)
}

// BindOutput receives a RouterBinder's results.
type BindOutput interface {
	// Store and Remove change one stored copy of each key of rank; keys are only valid during the call.
	Store(rank int, keys []uint64)
	Remove(rank int, keys []uint64)
	// Skip counts n events or blocks deliberately not indexed, by reason (a metric label).
	Skip(rank int, reason string, n int)
	// Applied counts one applied event of kind (its Kind.String()).
	Applied(rank int, kind string)
	// Grew says the KeyMap grew: past its bound the endpoint is cleared.
	Grew(rank int)
}

// KeyMap is the router binding's per-endpoint state: per rank, engine block id → router key (with
// the engine's stored-copy count and whether the block is resident), and the engine ids of blocks
// deliberately not indexed whose later removal is suppressed rather than counted unknown.
type KeyMap struct {
	ranks  map[int]*RankKeys
	mapped int      // entries over all ranks
	keys   []uint64 // Remove's output buffer
}

// MappedKey is one engine block known to the router binding.
type MappedKey struct {
	Key  uint64
	Refs uint32
	GPU  bool // resident: GPU medium (TensorRT-LLM cache level 0)
}

// RankKeys is one rank's part of a KeyMap.
type RankKeys struct {
	km      *KeyMap
	m       map[uint64]MappedKey
	partial map[uint64]struct{}
}

// NewKeyMap returns an empty map.
func NewKeyMap() *KeyMap { return &KeyMap{ranks: map[int]*RankKeys{}} }

// Rank returns rank r's entries, creating them.
func (km *KeyMap) Rank(r int) *RankKeys {
	rk := km.ranks[r]
	if rk == nil {
		rk = &RankKeys{km: km, m: map[uint64]MappedKey{}, partial: map[uint64]struct{}{}}
		km.ranks[r] = rk
	}
	return rk
}

// Clear forgets every rank.
func (km *KeyMap) Clear() {
	clear(km.ranks)
	km.mapped = 0
}

// Len is the number of entries the map holds, suppressed ids included (what its bound counts).
func (km *KeyMap) Len() int {
	n := km.mapped
	for _, rk := range km.ranks {
		n += len(rk.partial)
	}
	return n
}

// Parent resolves an event's parent to its router key (0 at the root); false when the parent is
// not mapped.
func (km *KeyMap) Parent(rank int, ev *Event) (uint64, bool) {
	if !ev.HasParent {
		return 0, true
	}
	e, ok := km.Rank(rank).m[ev.Parent]
	return e.Key, ok
}

// Get returns the entry of engineID.
func (rk *RankKeys) Get(engineID uint64) (MappedKey, bool) {
	e, ok := rk.m[engineID]
	return e, ok
}

// Set replaces the entry of engineID, which must exist.
func (rk *RankKeys) Set(engineID uint64, e MappedKey) { rk.m[engineID] = e }

// Put records one stored copy of engineID under key.
func (rk *RankKeys) Put(engineID, key uint64, gpu bool) {
	e, ok := rk.m[engineID]
	if !ok {
		rk.km.mapped++
		rk.m[engineID] = MappedKey{Key: key, Refs: 1, GPU: gpu}
		return
	}
	e.Key = key
	e.Refs++
	e.GPU = e.GPU || gpu
	rk.m[engineID] = e
}

// Each calls fn for every entry of the rank, and suppressed for every id suppressed (an
// inventory snapshot's export).
func (rk *RankKeys) Each(fn func(engineID uint64, e MappedKey), suppressed func(engineID uint64)) {
	for id, e := range rk.m {
		fn(id, e)
	}
	for id := range rk.partial {
		suppressed(id)
	}
}

// Load adds the entry of engineID as exported by Each (an inventory snapshot's import).
func (rk *RankKeys) Load(engineID uint64, e MappedKey) {
	if _, ok := rk.m[engineID]; !ok {
		rk.km.mapped++
	}
	rk.m[engineID] = e
}

// Suppress remembers engineID as a block not indexed: its removal is not an unknown block.
func (rk *RankKeys) Suppress(engineID uint64) { rk.partial[engineID] = struct{}{} }

// Suppressed reports whether engineID was suppressed.
func (rk *RankKeys) Suppressed(engineID uint64) bool {
	_, ok := rk.partial[engineID]
	return ok
}

// Remove drops one copy of each engine block of rank; resident ones leave the inventory through
// out. A suppressed block is forgotten and counted partial_block, an unmapped one unknown_block.
func (km *KeyMap) Remove(rank int, hashes []uint64, out BindOutput) {
	rk := km.Rank(rank)
	keys := km.keys[:0]
	unknown := 0
	for _, h := range hashes {
		e, ok := rk.m[h]
		if !ok {
			if _, p := rk.partial[h]; p {
				delete(rk.partial, h)
				out.Skip(rank, "partial_block", 1)
				continue
			}
			unknown++
			continue
		}
		if e.GPU {
			keys = append(keys, e.Key)
		}
		if e.Refs <= 1 {
			delete(rk.m, h)
			km.mapped--
		} else {
			e.Refs--
			rk.m[h] = e
		}
	}
	km.keys = keys
	out.Skip(rank, "unknown_block", unknown)
	if len(keys) > 0 {
		out.Remove(rank, keys)
	}
}

// TokenBinder is the router binding of events whose stores carry BlockSize-token blocks (vLLM,
// SGLang): the event's token ids are rehashed whole, chained from the parent's router key.
type TokenBinder struct {
	blockSize int
	keys      []uint64
	extras    [][]any
}

// NewTokenBinder returns a TokenBinder for rules of blockSize tokens per block.
func NewTokenBinder(blockSize int) *TokenBinder { return &TokenBinder{blockSize: blockSize} }

// Bind implements RouterBinder.
func (b *TokenBinder) Bind(rank int, ev *Event, m *KeyMap, out BindOutput) {
	switch ev.Kind {
	case BlockStored:
		b.stored(rank, ev, m, out)
	case BlockRemoved:
		m.Remove(rank, ev.BlockHashes, out)
		out.Applied(rank, "BlockRemoved")
	default:
		out.Skip(rank, "kind", 1)
	}
}

func (b *TokenBinder) stored(rank int, ev *Event, m *KeyMap, out BindOutput) {
	if ev.Bigram {
		// EAGLE bigram pages hash pairs, not the prompt's tokens: no router key can match a prompt.
		out.Skip(rank, "bigram", 1)
		return
	}
	if ev.BlockSize != b.blockSize {
		out.Skip(rank, "block_size", 1)
		return
	}
	n := len(ev.TokenIDs) / b.blockSize
	if n != len(ev.BlockHashes) || len(ev.TokenIDs)%b.blockSize != 0 {
		out.Skip(rank, "block_count", 1)
		return
	}
	parent, ok := m.Parent(rank, ev)
	if !ok {
		out.Skip(rank, "unknown_parent", 1)
		return
	}
	extras := ev.ExtraKeys
	if len(extras) > n {
		out.Skip(rank, "block_count", 1)
		return
	}
	if ev.CacheSalt != "" && !ev.HasParent && n > 0 {
		// SGLang salts the chain at its root; the router binding carries the salt in block 0's
		// extras, as vLLM does with cache_salt.
		b.extras = append(b.extras[:0], []any{ev.CacheSalt})
		extras = b.extras
	}
	keys, err := hashcore.RouterKeys(parent, ev.TokenIDs, b.blockSize, extras, b.keys[:0])
	if err != nil {
		out.Skip(rank, "hash_error", 1)
		return
	}
	b.keys = keys
	rk := m.Rank(rank)
	for i, h := range ev.BlockHashes {
		rk.Put(h, keys[i], true)
	}
	out.Store(rank, keys)
	out.Applied(rank, "BlockStored")
	out.Grew(rank)
}
