// Package watch is the live parity watch: for every BlockStored event that carries token ids, it
// recomputes the engine's block keys with the rule's engine binding (algorithm, seed, block size,
// and the extra keys the event carries) and compares them with the keys the engine published. One
// mismatching block is evidence that the gateway and the engine no longer agree, and the gateway
// suspends KV-exact on that endpoint at once; matching blocks are what lets an endpoint whose
// engine restarted resume.
//
// Events publish truncated 64-bit keys while the engine chains full digests, so a block can be
// recomputed only when its chain starts at the root (no parent) or at a block whose full digest the
// watch itself computed and verified earlier (a bounded map of those). Blocks chained on anything
// else are counted as unchecked: see docs/ingest.md for which blocks that leaves.
package watch

import (
	"fmt"
	"strings"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
	"github.com/kvexact/kvexact/gateway/hashcore"
)

// Defaults.
const (
	// DefaultCheckFirst events are checked in full after every reset ((re)connect, restart, clear).
	DefaultCheckFirst = 64
	// DefaultSampleEvery: after those, one event in this many is checked.
	DefaultSampleEvery = 16
	// DefaultMaxDigests bounds the verified digests kept to chain later events from.
	DefaultMaxDigests = 1 << 16
)

// Config describes one endpoint's watch.
type Config struct {
	// Hasher is the rule's engine binding.
	Hasher *hashcore.Hasher
	// Family names the engine family; its key rules (engines.KeyRules) must say its keys are
	// reproducible.
	Family string
	// TaggedExtraKeys: the release hashes tagged extra keys (vLLM v0.31.0+, contracts'
	// extraKeys scheme "tagged") while its events publish them untagged (vLLM's
	// to_event_extra_keys), so the watch tags an event's keys again before hashing them.
	TaggedExtraKeys bool
	// CheckFirst, SampleEvery, MaxDigests: zero takes the defaults above; SampleEvery 1 checks
	// every event.
	CheckFirst  int
	SampleEvery int
	MaxDigests  int
}

// Leg names the part of the binding a mismatch points at.
type Leg string

const (
	LegBlockSize Leg = "block_size" // the event's blocks have another token count
	LegAlgorithm Leg = "algorithm"  // the first block's digest matches another algorithm
	LegSeed      Leg = "seed"       // every block is wrong from the root: the seed (vLLM) differs
	LegChain     Leg = "chain"      // a block chained on a verified one differs: tokens or extra keys
)

// Mismatch is a block the engine published under another key than the binding computes.
type Mismatch struct {
	Leg    Leg
	Block  int // index in the event
	Detail string
}

func (m *Mismatch) Error() string { return fmt.Sprintf("%s: %s", m.Leg, m.Detail) }

// Outcome is what one event told the watch.
type Outcome struct {
	Checked   int // blocks recomputed (matching or not)
	Matched   int // blocks whose key matched
	Unchecked int // blocks the watch could not recompute (see the package doc)
	Sampled   int // blocks of an event the sampling passed over
	Mismatch  *Mismatch
}

// Watch is one endpoint's watch; it is not safe for concurrent use (ingest calls it in stream
// order, under the stream's lock).
type Watch struct {
	cfg   Config
	rules engines.KeyRules // the family's
	seen  int              // events since the last reset
	// digests are full digests of verified blocks by published key, retired FIFO beyond MaxDigests.
	digests map[uint64][]byte
	ring    []uint64
	next    int
	extras  [][]any
}

// New validates cfg.
func New(cfg Config) (*Watch, error) {
	if cfg.Hasher == nil {
		return nil, fmt.Errorf("watch: no hasher")
	}
	fam, err := registry.Lookup(cfg.Family)
	if err != nil || !fam.KeyRules().Reproducible {
		return nil, fmt.Errorf("watch: family %q: only %s publish reproducible engine keys", cfg.Family, reproducible())
	}
	if cfg.CheckFirst <= 0 {
		cfg.CheckFirst = DefaultCheckFirst
	}
	if cfg.SampleEvery <= 0 {
		cfg.SampleEvery = DefaultSampleEvery
	}
	if cfg.MaxDigests <= 0 {
		cfg.MaxDigests = DefaultMaxDigests
	}
	return &Watch{cfg: cfg, rules: fam.KeyRules(), digests: make(map[uint64][]byte)}, nil
}

// reproducible lists the families whose engine keys the watch can recompute ("a and b").
func reproducible() string {
	var names []string
	for _, f := range registry.All() {
		if f.KeyRules().Reproducible {
			names = append(names, f.Name())
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// Reset forgets the verified digests and checks every event again for CheckFirst events: after a
// (re)connect, a restart or a clear the engine's chains start anew.
func (w *Watch) Reset() {
	w.seen = 0
	clear(w.digests)
	w.ring = w.ring[:0]
	w.next = 0
}

// Event checks one decoded event (only BlockStored is checked; AllBlocksCleared resets).
func (w *Watch) Event(ev *engines.Event) Outcome {
	switch ev.Kind {
	case engines.AllBlocksCleared:
		w.Reset()
		return Outcome{}
	case engines.BlockStored:
	default:
		return Outcome{}
	}
	n := len(ev.BlockHashes)
	if n == 0 {
		return Outcome{}
	}
	w.seen++
	if w.seen > w.cfg.CheckFirst && w.seen%w.cfg.SampleEvery != 0 {
		return Outcome{Sampled: n}
	}
	h := w.cfg.Hasher
	bs := h.Binding().BlockSize
	// What the watch cannot reproduce from the event alone.
	if ev.Bigram || len(ev.TokenIDs) == 0 || (ev.HasGroupIdx && ev.GroupIdx != 0) {
		return Outcome{Unchecked: n}
	}
	if ev.BlockSize > 0 && ev.BlockSize != bs {
		return Outcome{Checked: n, Mismatch: &Mismatch{Leg: LegBlockSize, Detail: fmt.Sprintf("the engine stores blocks of %d tokens, the rule hashes blocks of %d", ev.BlockSize, bs)}}
	}
	if len(ev.TokenIDs) < n*bs {
		return Outcome{Checked: n, Mismatch: &Mismatch{Leg: LegBlockSize, Detail: fmt.Sprintf("%d blocks carry %d tokens, fewer than %d per block: the engine's blocks are smaller than the rule's %d", n, len(ev.TokenIDs), bs, bs)}}
	}
	if len(ev.TokenIDs) != n*bs {
		return Outcome{Unchecked: n} // skipped null blocks: the split is not known
	}
	extras, ok := w.eventExtras(ev, n)
	if !ok {
		return Outcome{Unchecked: n}
	}
	var parent []byte
	root := !ev.HasParent
	if root {
		var ex *hashcore.Extras
		if ev.CacheSalt != "" && w.rules.SaltedRoot {
			ex = &hashcore.Extras{CacheSalt: ev.CacheSalt}
		}
		p, err := h.RootFor(ex)
		if err != nil {
			return Outcome{Unchecked: n}
		}
		parent = p
	} else if parent = w.digests[ev.Parent]; parent == nil {
		return Outcome{Unchecked: n}
	}
	digests, keys, err := h.ChainFrom(parent, ev.TokenIDs, extras)
	if err != nil {
		return Outcome{Unchecked: n}
	}
	out := Outcome{Checked: n}
	for i, k := range keys {
		if k != ev.BlockHashes[i] {
			out.Mismatch = w.diagnose(ev, i, root, keys, extras)
			return out
		}
		out.Matched++
		w.keep(k, digests[i])
	}
	return out
}

// eventExtras returns the per-block extra keys to hash with: vLLM's event list (absent means the
// release does not publish them, so a LoRA, salt or multimodal block cannot be reproduced); none for
// SGLang, which hashes no extra keys (its salt is the root).
func (w *Watch) eventExtras(ev *engines.Event, n int) ([][]any, bool) {
	if !w.rules.BlockExtras {
		return nil, true
	}
	if !ev.HasExtraKeys {
		return nil, false
	}
	w.extras = w.extras[:0]
	for i := range n {
		var e []any
		if i < len(ev.ExtraKeys) {
			e = ev.ExtraKeys[i]
		}
		if w.cfg.TaggedExtraKeys && e != nil {
			var ok bool
			if e, ok = retag(ev, e); !ok {
				return nil, false
			}
		}
		w.extras = append(w.extras, e)
	}
	return w.extras, true
}

// retag rebuilds the tagged extra keys a tagged release hashed from the untagged ones its events
// publish: a LoRA name (first, and named by the event's lora_name) is ("lora", name, path), whose
// path no event carries, so such a block cannot be reproduced; an (identifier, offset) pair is
// ("mm", identifier, offset); a string is ("cache_salt", salt); bytes are ("prompt_embeds",
// digest) — the order and shapes of vLLM's generate_block_hash_extra_keys.
func retag(ev *engines.Event, keys []any) ([]any, bool) {
	out := make([]any, 0, len(keys))
	for i, k := range keys {
		switch v := k.(type) {
		case []any:
			out = append(out, append([]any{"mm"}, v...))
		case string:
			if i == 0 && ev.LoRAName != "" && v == ev.LoRAName {
				return nil, false
			}
			out = append(out, []any{"cache_salt", v})
		case []byte:
			out = append(out, []any{"prompt_embeds", v})
		default:
			return nil, false
		}
	}
	return out, true
}

// diagnose names the leg of a mismatch at block i (only on the mismatch path, so it may be slow).
func (w *Watch) diagnose(ev *engines.Event, i int, root bool, keys []uint64, extras [][]any) *Mismatch {
	h := w.cfg.Hasher
	b := h.Binding()
	if !root || i > 0 {
		return &Mismatch{Leg: LegChain, Block: i, Detail: fmt.Sprintf("block %d (chained on a block that matched) has key %d, the rule computes %d: the engine hashed other tokens or extra keys", i, ev.BlockHashes[i], keys[i])}
	}
	// Block 0 from the root: another algorithm with the same seed, or else the seed.
	bs := b.BlockSize
	if suspects := w.rules.AlgorithmSuspects; len(suspects) > 0 { // a family of several algorithms, seeded roots
		for _, name := range suspects {
			a := hashcore.Algorithm(name)
			if a == b.Algorithm {
				continue
			}
			alt, err := hashcore.New(hashcore.Binding{Algorithm: a, BlockSize: bs, Seed: b.Seed}, h.Impl())
			if err != nil {
				continue
			}
			_, k, err := alt.ChainFrom(alt.Root(), ev.TokenIDs[:bs], extras[:min(1, len(extras))])
			if err == nil && len(k) == 1 && k[0] == ev.BlockHashes[0] {
				return &Mismatch{Leg: LegAlgorithm, Detail: fmt.Sprintf("the engine hashes with %s, the rule with %s (block 0 matches %s)", a, b.Algorithm, a)}
			}
		}
		allWrong := true
		for j := range keys {
			if keys[j] == ev.BlockHashes[j] {
				allWrong = false
			}
		}
		if allWrong {
			return &Mismatch{Leg: LegSeed, Detail: fmt.Sprintf("every block differs from the root (block 0: engine %d, rule %d): the engine's PYTHONHASHSEED is not the rule's seed", ev.BlockHashes[0], keys[0])}
		}
	}
	return &Mismatch{Leg: LegAlgorithm, Detail: fmt.Sprintf("block 0 from the root has key %d, the rule's %s computes %d", ev.BlockHashes[0], b.Algorithm, keys[0])}
}

// keep remembers a verified block's digest, retiring the oldest beyond MaxDigests.
func (w *Watch) keep(key uint64, digest []byte) {
	if _, ok := w.digests[key]; ok {
		return
	}
	if len(w.ring) < w.cfg.MaxDigests {
		w.ring = append(w.ring, key)
	} else {
		delete(w.digests, w.ring[w.next])
		w.ring[w.next] = key
		w.next = (w.next + 1) % len(w.ring)
	}
	w.digests[key] = digest
}

// Held is the number of verified digests kept (tests, status).
func (w *Watch) Held() int { return len(w.digests) }
