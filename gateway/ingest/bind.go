package ingest

import (
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/kvgroups"
)

// binder is the bind stage: it turns decoded events into inventory updates under one key binding.
// The engine binding passes the engine's ids as published; the router binding hands each event to
// the family's RouterBinder, which rehashes its tokens through the endpoint's KeyMap. The binder
// also decides which KV-cache groups are indexed and applies the release's residency rule. It is
// not safe for concurrent use: the pipeline serializes calls.
type binder struct {
	p         *pipeline
	apply     func(Update) // the inventory stage
	router    engines.RouterBinder
	km        *engines.KeyMap
	maxMapped int

	groups map[int]bool // group_idx → indexed (full attention), learned from BlockStored
	// side holds the groups of other kinds the engine's hit rule reads (sliding window, Mamba,
	// chunked local), nil when the endpoint has no group residency (their events are skipped).
	side  *kvgroups.Endpoint
	specs map[int]kvgroups.Spec // what side was last told per group (Learn only on change)
	// sideKMs are the router binding's engine-id → router-key maps of the side groups, one per
	// group: a group's removal must not drop a mapping the inventory's groups or another still use.
	sideKMs map[int]*engines.KeyMap
	pres    *presence // the contract's "presence" residency rule, nil for "copies"
	// tiers says whether lower-tier events (CPU, disk, shared store) are indexed; tierKMs are the
	// router binding's key maps of each lower tier (a tier's copy of a block has its own lifetime).
	tiers   bool
	tierKMs map[engines.Tier]*engines.KeyMap
	// tierExtras: the router binding rehashes with the engine's per-block extra keys (vLLM), so a
	// lower-tier store that carries none (vLLM's offload events publish extra_keys None) cannot be
	// rehashed: a salted or adapter block would get the plain prompt's key, a false hit.
	tierExtras bool
	group      int // group_idx of the event being applied (presence rule)
	presBuf    []uint64
}

// clear forgets the endpoint: the inventory (all ranks, the reference's deliberate over-clear) and
// every rank's router-key map. Group kinds are configuration, not state, and survive.
func (b *binder) clear(rank int, cause string) {
	b.km.Clear()
	if b.side != nil {
		b.side.Clear()
	}
	clear(b.sideKMs)
	clear(b.tierKMs)
	b.emit(Update{Rank: rank, Op: OpClear, Cause: cause})
	b.p.cleared(cause)
}

// fullAttention says whether a KV-cache group kind holds the whole prefix. Sliding-window groups
// mask blocks outside the window, Mamba groups keep state rather than per-block KV, and
// encoder/cross attention are not the prompt's prefix: a hit on them is not a reusable prefix. An
// absent kind (engines or releases that send none) is indexed.
func fullAttention(kind string) bool { return kvgroups.KindOf(kind) == kvgroups.KindFull }

// groupIndexed decides for an event whether its group is indexed. Stores teach the group's kind; a
// removal in a group never seen stored is not applied (its copy was never counted, and the same
// hash may be held by an indexed group).
func (b *binder) groupIndexed(ev *engines.Event) bool {
	if !ev.HasGroupIdx {
		return true
	}
	if ev.Kind == engines.BlockStored {
		ok := fullAttention(ev.SpecKind)
		b.groups[ev.GroupIdx] = ok
		b.learn(ev)
		return ok
	}
	return b.groups[ev.GroupIdx]
}

// learn tells the group residency a group's spec when it first appears or changes.
func (b *binder) learn(ev *engines.Event) {
	if b.side == nil {
		return
	}
	s := kvgroups.Spec{Kind: kvgroups.KindOf(ev.SpecKind), Window: ev.SlidingWin, BlockSize: ev.BlockSize}
	if s.Kind == kvgroups.KindMamba && b.router != nil {
		// A Mamba store lists only its checkpoint blocks while its token ids span the null blocks
		// before them: the router binding cannot tell which block a hash is, so the group stays
		// out of the rule (full attention alone decides, as before group residency).
		s.Kind = kvgroups.KindNone
	}
	if old, ok := b.specs[ev.GroupIdx]; ok && old == s {
		return
	}
	b.specs[ev.GroupIdx] = s
	b.side.Learn(ev.GroupIdx, s)
}

// sideEvent applies an event of a group the inventory does not index to the group residency, when
// the endpoint has one and the group's kind takes part in the hit rule. It reports whether it did.
// Under the router binding the event is rehashed as the inventory's are, through the group's own
// key map.
func (b *binder) sideEvent(rank int, ev *engines.Event) bool {
	if b.side == nil {
		return false
	}
	s, ok := b.specs[ev.GroupIdx]
	if !ok || s.Kind == kvgroups.KindNone || s.Kind == kvgroups.KindFull {
		return false
	}
	out := sideOutput{b: b, group: ev.GroupIdx}
	if b.router != nil {
		km := b.sideKMs[ev.GroupIdx]
		if km == nil {
			km = engines.NewKeyMap()
			b.sideKMs[ev.GroupIdx] = km
		}
		b.router.Bind(rank, ev, km, out)
		return true
	}
	switch ev.Kind {
	case engines.BlockStored:
		out.Store(rank, ev.BlockHashes)
		b.Applied(rank, "BlockStored")
		out.Grew(rank)
	case engines.BlockRemoved:
		out.Remove(rank, ev.BlockHashes)
		b.Applied(rank, "BlockRemoved")
	default:
		return false
	}
	return true
}

// sideOutput is the binder as a side group's engines.BindOutput: keys go to the group residency.
type sideOutput struct {
	b     *binder
	group int
}

func (o sideOutput) Store(rank int, keys []uint64) {
	o.b.side.Store(rank, o.group, keys, o.b.pres != nil)
}
func (o sideOutput) Remove(rank int, keys []uint64)      { o.b.side.Remove(rank, o.group, keys) }
func (o sideOutput) Skip(rank int, reason string, n int) { o.b.Skip(rank, reason, n) }
func (o sideOutput) Applied(rank int, kind string)       { o.b.Applied(rank, kind) }

// Grew bounds the side state as the inventory's: past MaxMapped entries the endpoint is cleared.
func (o sideOutput) Grew(rank int) {
	n := o.b.side.Len()
	for _, km := range o.b.sideKMs {
		n += km.Len()
	}
	if n > o.b.maxMapped {
		o.b.clear(rank, "map_overflow")
	}
}

// event applies one decoded event from rank.
func (b *binder) event(rank int, ev *engines.Event) {
	switch ev.Kind {
	case engines.AllBlocksCleared:
		b.clear(rank, "engine")
		b.Applied(rank, "AllBlocksCleared")
		return
	case engines.CacheCreated:
		// A fresh block pool: treated as AllBlocksCleared (reference §10.4).
		b.clear(rank, "created")
		b.Applied(rank, "CacheCreated")
		return
	}
	tier, known := engines.TierOf(ev.Medium)
	if !known || tier != engines.TierGPU && !b.tiers {
		b.Skip(rank, "medium", 1)
		return
	}
	if tier != engines.TierGPU {
		b.tierEvent(rank, tier, ev)
		return
	}
	if !b.groupIndexed(ev) {
		if !b.sideEvent(rank, ev) {
			b.Skip(rank, "group_kind", 1)
		}
		return
	}
	b.group = ev.GroupIdx
	if b.router != nil {
		b.router.Bind(rank, ev, b.km, b)
		return
	}
	switch ev.Kind {
	case engines.BlockStored:
		b.Store(rank, ev.BlockHashes)
		b.Applied(rank, "BlockStored")
	case engines.BlockRemoved:
		b.Remove(rank, ev.BlockHashes)
		b.Applied(rank, "BlockRemoved")
	default:
		b.Skip(rank, "kind", 1)
	}
}

// tierEvent applies an event of a lower tier to that tier's residency. Only full-attention blocks
// are indexed (a lower-tier hit continues the GPU prefix); the presence rule is not applied: the
// offloading connectors announce each copy and ask consumers to reference-count them (vLLM's
// self-describing offload events re-announce a shared hash once per chunk, and remove it as often).
func (b *binder) tierEvent(rank int, tier engines.Tier, ev *engines.Event) {
	if !b.groupIndexed(ev) {
		b.Skip(rank, "group_kind", 1)
		return
	}
	out := tierOutput{b: b, tier: tier}
	if b.router != nil && b.tierExtras && ev.Kind == engines.BlockStored && !ev.HasExtraKeys {
		b.Skip(rank, "extra_keys", 1)
		return
	}
	if b.router != nil {
		km := b.tierKMs[tier]
		if km == nil {
			km = engines.NewKeyMap()
			b.tierKMs[tier] = km
		}
		b.router.Bind(rank, ev, km, out)
		return
	}
	switch ev.Kind {
	case engines.BlockStored:
		out.Store(rank, ev.BlockHashes)
		b.Applied(rank, "BlockStored")
	case engines.BlockRemoved:
		out.Remove(rank, ev.BlockHashes)
		b.Applied(rank, "BlockRemoved")
	default:
		b.Skip(rank, "kind", 1)
	}
}

// tierOutput is the binder as a lower tier's engines.BindOutput: keys go to the tier's residency.
type tierOutput struct {
	b    *binder
	tier engines.Tier
}

func (o tierOutput) Store(rank int, keys []uint64) {
	o.b.apply(Update{Rank: rank, Op: OpStore, Keys: keys, Tier: o.tier})
}
func (o tierOutput) Remove(rank int, keys []uint64) {
	o.b.apply(Update{Rank: rank, Op: OpRemove, Keys: keys, Tier: o.tier})
}
func (o tierOutput) Skip(rank int, reason string, n int) { o.b.Skip(rank, reason, n) }
func (o tierOutput) Applied(rank int, kind string)       { o.b.Applied(rank, kind) }

// Grew bounds the tier's key map as the GPU's: past MaxMapped entries the endpoint is cleared.
func (o tierOutput) Grew(rank int) {
	if km := o.b.tierKMs[o.tier]; km != nil && km.Len() > o.b.maxMapped {
		o.b.clear(rank, "map_overflow")
	}
}

// Store, Remove, Skip, Applied and Grew are the binder as the RouterBinder's engines.BindOutput.

func (b *binder) Store(rank int, keys []uint64) { b.emit(Update{Rank: rank, Op: OpStore, Keys: keys}) }
func (b *binder) Remove(rank int, keys []uint64) {
	b.emit(Update{Rank: rank, Op: OpRemove, Keys: keys})
}
func (b *binder) Skip(rank int, reason string, n int) { b.p.skip(rank, reason, n) }
func (b *binder) Applied(rank int, kind string)       { b.p.lab.applied(rank, kind, 1) }

// Grew bounds the router-key map: past MaxMapped entries the endpoint is cleared (its removals
// could no longer be resolved exactly otherwise).
func (b *binder) Grew(rank int) {
	if b.km.Len() > b.maxMapped {
		b.clear(rank, "map_overflow")
	}
}

// emit hands an update to the inventory stage, through the presence rule when the release has it.
func (b *binder) emit(u Update) {
	if b.pres == nil {
		b.apply(u)
		return
	}
	if u.Op == OpClear {
		b.pres.filter(u, 0, nil)
		b.apply(u)
		return
	}
	u.Keys = b.pres.filter(u, b.group, b.presBuf[:0])
	b.presBuf = u.Keys
	if len(u.Keys) > 0 {
		b.apply(u)
	}
	if b.pres.n > b.maxMapped {
		b.clear(u.Rank, "map_overflow")
	}
}
