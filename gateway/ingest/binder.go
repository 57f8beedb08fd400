package ingest

import (
	"strings"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/hashcore"
)

// binder turns decoded events into inventory updates under one key binding. It holds the state the
// router binding needs (per rank: engine id → router key, with a stored-copy count, and the engine
// ids of partial TensorRT-LLM blocks whose removal is suppressed) and, for vLLM, which KV-cache
// groups are indexed. It is not safe for concurrent use: the source serializes calls.
type binder struct {
	family    string
	binding   Binding
	blockSize int
	maxMapped int

	groups  map[int]bool // vLLM group_idx → indexed (full attention), learned from BlockStored
	pres    *presence    // the contract's "presence" residency rule, nil for "copies"
	group   int          // group_idx of the event being applied (presence rule)
	presBuf []uint64
	ranks   map[int]*rankKeys
	mapped  int // entries over all ranks
	keys    []uint64
	tokens  []uint32
	extras  [][]any
	emit    func(Update)
	skipped func(rank int, reason string, n int)
	applied func(rank int, kind string, n int)
	cleared func(cause string)
}

// mapped is one engine block known to the router binding: its router key, how many stored copies
// the engine reported, and whether it counts as resident (GPU; TensorRT-LLM cache level 0).
type mappedKey struct {
	key  uint64
	refs uint32
	gpu  bool
}

type rankKeys struct {
	m       map[uint64]mappedKey
	partial map[uint64]struct{}
}

func newBinder(family string, binding Binding, blockSize, maxMapped int) *binder {
	return &binder{
		family: family, binding: binding, blockSize: blockSize, maxMapped: maxMapped,
		groups: map[int]bool{}, ranks: map[int]*rankKeys{},
	}
}

func (b *binder) rank(r int) *rankKeys {
	rk := b.ranks[r]
	if rk == nil {
		rk = &rankKeys{m: map[uint64]mappedKey{}, partial: map[uint64]struct{}{}}
		b.ranks[r] = rk
	}
	return rk
}

// clear forgets the endpoint: the inventory (all ranks, the reference's deliberate over-clear) and
// every rank's router-key map. Group kinds are configuration, not state, and survive.
func (b *binder) clear(rank int, cause string) {
	clear(b.ranks)
	b.mapped = 0
	b.emit(Update{Rank: rank, Op: OpClear, Cause: cause})
	b.cleared(cause)
}

// gpu: only the GPU medium (or none given) makes a block resident (DESIGN.md, Decisions).
func gpu(medium string) bool { return medium == "" || strings.EqualFold(medium, engines.MediumGPU) }

// fullAttention says whether a vLLM KV-cache group kind holds the whole prefix. Sliding-window
// groups mask blocks outside the window, Mamba groups keep state rather than per-block KV, and
// encoder/cross attention are not the prompt's prefix: a hit on them is not a reusable prefix. An
// absent kind (vLLM < v0.22, SGLang, TRT-LLM) is indexed.
func fullAttention(kind string) bool {
	switch kind {
	case "", "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// groupIndexed decides for a vLLM event whether its group is indexed. Stores teach the group's
// kind; a removal in a group never seen stored is not applied (its copy was never counted, and the
// same hash may be held by an indexed group).
func (b *binder) groupIndexed(ev *engines.Event) bool {
	if !ev.HasGroupIdx {
		return true
	}
	if ev.Kind == engines.BlockStored {
		ok := fullAttention(ev.SpecKind)
		b.groups[ev.GroupIdx] = ok
		return ok
	}
	return b.groups[ev.GroupIdx]
}

// event applies one decoded event from rank.
func (b *binder) event(rank int, ev *engines.Event) {
	switch ev.Kind {
	case engines.AllBlocksCleared:
		b.clear(rank, "engine")
		b.applied(rank, "AllBlocksCleared", 1)
		return
	case engines.CacheCreated:
		// A fresh TensorRT-LLM block pool: treated as AllBlocksCleared (reference §10.4).
		b.clear(rank, "created")
		b.applied(rank, "CacheCreated", 1)
		return
	}
	if b.family == "trtllm" {
		b.trtllm(rank, ev)
		return
	}
	if !gpu(ev.Medium) {
		b.skipped(rank, "medium", 1)
		return
	}
	if !b.groupIndexed(ev) {
		b.skipped(rank, "group_kind", 1)
		return
	}
	b.group = ev.GroupIdx
	switch ev.Kind {
	case engines.BlockStored:
		if b.binding != BindingRouter {
			b.emit(Update{Rank: rank, Op: OpStore, Keys: ev.BlockHashes})
			b.applied(rank, "BlockStored", 1)
			return
		}
		b.routerStored(rank, ev)
	case engines.BlockRemoved:
		if b.binding != BindingRouter {
			b.emit(Update{Rank: rank, Op: OpRemove, Keys: ev.BlockHashes})
			b.applied(rank, "BlockRemoved", 1)
			return
		}
		b.routerRemoved(rank, ev.BlockHashes)
		b.applied(rank, "BlockRemoved", 1)
	default:
		b.skipped(rank, "kind", 1)
	}
}

// parentKey resolves an event's parent to its router key (0 at the root).
func (b *binder) parentKey(rank int, ev *engines.Event) (uint64, bool) {
	if !ev.HasParent {
		return 0, true
	}
	e, ok := b.rank(rank).m[ev.Parent]
	return e.key, ok
}

// routerStored rehashes a vLLM or SGLang BlockStored's tokens into router keys.
func (b *binder) routerStored(rank int, ev *engines.Event) {
	if ev.Bigram {
		// EAGLE bigram pages hash pairs, not the prompt's tokens: no router key can match a prompt.
		b.skipped(rank, "bigram", 1)
		return
	}
	if ev.BlockSize != b.blockSize {
		b.skipped(rank, "block_size", 1)
		return
	}
	n := len(ev.TokenIDs) / b.blockSize
	if n != len(ev.BlockHashes) || len(ev.TokenIDs)%b.blockSize != 0 {
		b.skipped(rank, "block_count", 1)
		return
	}
	parent, ok := b.parentKey(rank, ev)
	if !ok {
		b.skipped(rank, "unknown_parent", 1)
		return
	}
	extras := ev.ExtraKeys
	if len(extras) > n {
		b.skipped(rank, "block_count", 1)
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
		b.skipped(rank, "hash_error", 1)
		return
	}
	b.keys = keys
	rk := b.rank(rank)
	for i, h := range ev.BlockHashes {
		b.put(rk, h, keys[i], true)
	}
	b.emit(Update{Rank: rank, Op: OpStore, Keys: keys})
	b.applied(rank, "BlockStored", 1)
	b.checkOverflow(rank)
}

func (b *binder) put(rk *rankKeys, engineID, key uint64, gpu bool) {
	e, ok := rk.m[engineID]
	if !ok {
		b.mapped++
		rk.m[engineID] = mappedKey{key: key, refs: 1, gpu: gpu}
		return
	}
	e.key = key
	e.refs++
	e.gpu = e.gpu || gpu
	rk.m[engineID] = e
}

// routerRemoved drops one copy of each engine block; resident ones leave the inventory.
func (b *binder) routerRemoved(rank int, hashes []uint64) {
	rk := b.rank(rank)
	out := b.keys[:0]
	unknown := 0
	for _, h := range hashes {
		e, ok := rk.m[h]
		if !ok {
			if _, p := rk.partial[h]; p {
				delete(rk.partial, h)
				b.skipped(rank, "partial_block", 1)
				continue
			}
			unknown++
			continue
		}
		if e.gpu {
			out = append(out, e.key)
		}
		if e.refs <= 1 {
			delete(rk.m, h)
			b.mapped--
		} else {
			e.refs--
			rk.m[h] = e
		}
	}
	b.keys = out
	b.skipped(rank, "unknown_block", unknown)
	if len(out) > 0 {
		b.emit(Update{Rank: rank, Op: OpRemove, Keys: out})
	}
}

// trtllm applies a TensorRT-LLM event (always the router binding): stored blocks are rehashed from
// their token lists, a partial block (fewer than tokens_per_block tokens) and everything after it
// in the event are not indexed and their later removal is suppressed, cache level 0 is GPU.
func (b *binder) trtllm(rank int, ev *engines.Event) {
	rk := b.rank(rank)
	switch ev.Kind {
	case engines.BlockStored:
		if ev.CacheSalt != "" || ev.HasLoRAID || ev.LoRAName != "" {
			// Tokens alone cannot tell a salted or LoRA namespace apart; the prompt side would hash
			// them as plain text. Not indexed, and its blocks' removals are suppressed.
			for _, h := range ev.BlockHashes {
				rk.partial[h] = struct{}{}
			}
			b.skipped(rank, "namespaced", 1)
			return
		}
		parent, ok := b.parentKey(rank, ev)
		if !ok {
			if _, p := rk.partial[ev.Parent]; p {
				// Below an unindexed block: the whole subtree stays unindexed, removals suppressed.
				for _, h := range ev.BlockHashes {
					rk.partial[h] = struct{}{}
				}
				b.skipped(rank, "partial_block", len(ev.BlockHashes))
			} else {
				b.skipped(rank, "unknown_parent", 1)
			}
			return
		}
		full := len(ev.BlockHashes)
		if len(ev.BlockTokens) < full {
			full = len(ev.BlockTokens)
		}
		namespaced := false
		for i := 0; i < full; i++ {
			if len(ev.BlockTokens[i]) != b.blockSize {
				full = i
				break
			}
			if (i < len(ev.BlockExtraIDs) && ev.BlockExtraIDs[i] != nil) || (i < len(ev.BlockMMKeys) && len(ev.BlockMMKeys[i]) > 0) {
				// token_extra_id or multimodal keys: the tokens alone are not the block's identity.
				full, namespaced = i, true
				break
			}
		}
		for _, h := range ev.BlockHashes[full:] {
			rk.partial[h] = struct{}{}
		}
		if namespaced {
			b.skipped(rank, "namespaced", len(ev.BlockHashes)-full)
		} else {
			b.skipped(rank, "partial_block", len(ev.BlockHashes)-full)
		}
		if full == 0 {
			b.applied(rank, "BlockStored", 1)
			return
		}
		b.tokens = b.tokens[:0]
		for _, t := range ev.BlockTokens[:full] {
			b.tokens = append(b.tokens, t...)
		}
		keys, err := hashcore.RouterKeys(parent, b.tokens, b.blockSize, nil, b.keys[:0])
		if err != nil {
			b.skipped(rank, "hash_error", 1)
			return
		}
		b.keys = keys
		n := 0
		for i, h := range ev.BlockHashes[:full] {
			onGPU := i >= len(ev.CacheLevels) || ev.CacheLevels[i] == 0
			b.put(rk, h, keys[i], onGPU)
			if onGPU {
				keys[n] = keys[i]
				n++
			}
		}
		if n > 0 {
			b.emit(Update{Rank: rank, Op: OpStore, Keys: keys[:n]})
		}
		b.applied(rank, "BlockStored", 1)
		b.checkOverflow(rank)
	case engines.BlockRemoved:
		b.routerRemoved(rank, ev.BlockHashes)
		b.applied(rank, "BlockRemoved", 1)
	case engines.BlockUpdated:
		// Only a cache-level change matters: 0 (GPU) is resident, anything else (host) is not.
		if len(ev.CacheLevels) == 0 || len(ev.BlockHashes) == 0 {
			b.applied(rank, "BlockUpdated", 1)
			return
		}
		h := ev.BlockHashes[0]
		e, ok := rk.m[h]
		if !ok {
			if _, p := rk.partial[h]; p {
				b.skipped(rank, "partial_block", 1)
			} else {
				b.skipped(rank, "unknown_block", 1)
			}
			return
		}
		onGPU := ev.CacheLevels[0] == 0
		if onGPU != e.gpu {
			e.gpu = onGPU
			rk.m[h] = e
			b.keys = append(b.keys[:0], e.key)
			op := OpRemove
			if onGPU {
				op = OpStore
			}
			b.emit(Update{Rank: rank, Op: op, Keys: b.keys})
		}
		b.applied(rank, "BlockUpdated", 1)
	default:
		b.skipped(rank, "kind", 1)
	}
}

// checkOverflow bounds the router-key maps: past MaxMapped entries the endpoint is cleared (its
// removals could no longer be resolved exactly otherwise).
func (b *binder) checkOverflow(rank int) {
	n := b.mapped
	for _, rk := range b.ranks {
		n += len(rk.partial)
	}
	if n > b.maxMapped {
		b.clear(rank, "map_overflow")
	}
}
