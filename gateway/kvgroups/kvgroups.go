// Package kvgroups is the residency of an endpoint's KV-cache groups other than full attention,
// and the engine's prefix-hit rule over them.
//
// A hybrid model (full attention beside sliding-window, Mamba or chunked-local groups) publishes
// its blocks once per KV-cache group. The rule's inventory holds the full-attention groups (the
// prefix every group needs); this package holds the other groups' blocks per (endpoint, rank,
// group) and answers, for a prompt, the longest prefix the engine would itself accept: vLLM's
// HybridKVCacheCoordinator.find_longest_cache_hit accepts L blocks only when every group agrees
// (docs/reference/vllm-releases.md §7 has the rule with its source lines). Full attention alone
// over-predicts: a sliding-window group may have evicted the blocks before L that the window
// needs, a Mamba group keeps state only at the blocks it checkpointed.
//
// Endpoints that never publish such a group are not hybrid: Hit answers ok=false and the router
// keeps its one-index path. Writers are the endpoint's ingest pipeline (one at a time); readers
// are routing decisions, concurrently, under the endpoint's read lock.
package kvgroups

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/kvexact/kvexact/gateway/inventory"
)

// Kind is what a KV-cache group's layers keep, as far as the hit rule cares.
type Kind uint8

const (
	// KindFull holds every block of the prefix (full, MLA and sink attention): the inventory's.
	KindFull Kind = iota + 1
	// KindSlidingWindow needs only the blocks covering the last Window−1 tokens before the hit.
	KindSlidingWindow
	// KindMamba keeps recurrent state at block boundaries: the hit ends at a checkpointed block.
	KindMamba
	// KindChunkedLocal attends within Window-token chunks: blocks before the hit's chunk count.
	KindChunkedLocal
	// KindNone takes no part in prefix hits (cross or encoder attention, unknown kinds).
	KindNone
)

func (k Kind) String() string {
	switch k {
	case KindFull:
		return "full_attention"
	case KindSlidingWindow:
		return "sliding_window"
	case KindMamba:
		return "mamba"
	case KindChunkedLocal:
		return "chunked_local_attention"
	}
	return "none"
}

// KindOf maps a published kv_cache_spec_kind (vLLM's KVCacheSpecKind values) to a Kind. An absent
// kind (engines or releases that send none) is full attention, as before groups were published.
func KindOf(spec string) Kind {
	switch spec {
	case "", "full_attention", "mla_attention", "sink_full_attention":
		return KindFull
	case "sliding_window", "sliding_window_mla":
		return KindSlidingWindow
	case "mamba":
		return KindMamba
	case "chunked_local_attention":
		return KindChunkedLocal
	}
	return KindNone
}

// Spec is one KV-cache group as its events describe it.
type Spec struct {
	Kind      Kind
	Window    int // tokens: the sliding window, or the chunk of chunked-local attention
	BlockSize int // tokens per block of the group (its BlockStored.block_size)
}

// Index is one rule's group residency: endpoints by id, each created by Endpoint.
type Index struct {
	blockSize int // tokens per key of the prompt's chain (the rule's block size)
	mu        sync.RWMutex
	eps       map[inventory.EndpointID]*Endpoint
	hybrid    atomic.Int32 // endpoints with a group of a kind other than full: 0 keeps Hit free
}

// New returns an empty index for prompts keyed every blockSize tokens.
func New(blockSize int) *Index {
	return &Index{blockSize: max(blockSize, 1), eps: map[inventory.EndpointID]*Endpoint{}}
}

// Endpoint returns the writer of endpoint id, creating it.
func (x *Index) Endpoint(id inventory.EndpointID) *Endpoint {
	x.mu.Lock()
	defer x.mu.Unlock()
	e := x.eps[id]
	if e == nil {
		e = &Endpoint{x: x, specs: map[int]Spec{}, sets: map[rankGroup]map[uint64]uint32{}}
		x.eps[id] = e
	}
	return e
}

// RemoveEndpoint forgets id (its source has stopped).
func (x *Index) RemoveEndpoint(id inventory.EndpointID) {
	x.mu.Lock()
	e := x.eps[id]
	delete(x.eps, id)
	x.mu.Unlock()
	if e != nil {
		e.mu.Lock()
		if e.hybrid {
			x.hybrid.Add(-1)
			e.hybrid = false
		}
		e.mu.Unlock()
	}
}

type rankGroup struct{ rank, group int }

// Endpoint is one endpoint's groups: their specs and, for the groups the rule needs, the keys
// each rank holds with a copy count. What the hit rule derives from the specs (the groups in
// order, the alignment, the names) is computed when a spec changes, not per request.
type Endpoint struct {
	x      *Index
	mu     sync.RWMutex
	specs  map[int]Spec
	sets   map[rankGroup]map[uint64]uint32
	ranks  []int // the ranks that stored anything, ascending
	n      int   // (rank, group, key) entries
	hybrid bool  // some group has a rule of its own

	groups  []group // the groups with a rule of their own, by group index
	align   int     // the scheduler block in keys: LCM of every group's block
	hasFull bool
	refuse  string // set when a group's blocks cannot be located in the prompt's chain
}

// Learn records group's spec (from its stores); a changed spec forgets the group's blocks.
func (e *Endpoint) Learn(group int, s Spec) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if old, ok := e.specs[group]; ok && old == s {
		return
	}
	e.specs[group] = s
	for rg, set := range e.sets {
		if rg.group == group {
			e.n -= len(set)
			delete(e.sets, rg)
		}
	}
	e.derive()
}

// derive recomputes the rule's view of the specs.
func (e *Endpoint) derive() {
	bs := e.x.blockSize
	e.groups, e.align, e.hasFull, e.refuse = e.groups[:0], 1, false, ""
	idx := make([]int, 0, len(e.specs))
	for gi := range e.specs {
		idx = append(idx, gi)
	}
	sort.Ints(idx)
	for _, gi := range idx {
		s := e.specs[gi]
		if s.Kind == KindNone {
			continue
		}
		k := 1
		if s.BlockSize > 0 {
			if s.BlockSize%bs != 0 {
				// A group whose block is no whole number of keys: its blocks cannot be located in
				// the prompt's chain, so no hit can be promised.
				e.refuse = fmt.Sprintf("group %d (%s): block size %d is not a multiple of %d", gi, s.Kind, s.BlockSize, bs)
				continue
			}
			k = s.BlockSize / bs
		}
		e.align = lcm(e.align, k)
		if s.Kind == KindFull {
			e.hasFull = true
			continue
		}
		g := group{idx: gi, spec: s, k: k, kt: bs}
		switch s.Kind {
		case KindSlidingWindow, KindChunkedLocal:
			g.name = fmt.Sprintf("group %d (%s, window %d)", gi, s.Kind, s.Window)
		default:
			g.name = fmt.Sprintf("group %d (%s)", gi, s.Kind)
		}
		e.groups = append(e.groups, g)
	}
	h := len(e.groups) > 0 || e.refuse != ""
	if h != e.hybrid {
		e.hybrid = h
		if h {
			e.x.hybrid.Add(1)
		} else {
			e.x.hybrid.Add(-1)
		}
	}
}

// Spec returns group's learned spec.
func (e *Endpoint) Spec(group int) (Spec, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	s, ok := e.specs[group]
	return s, ok
}

// Store adds one copy of each key to (rank, group). Under presence (the contract's residency
// rule: a re-emitted store is not a second copy) a key is held at most once per (rank, group).
func (e *Endpoint) Store(rank, group int, keys []uint64, presence bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	rg := rankGroup{rank, group}
	set := e.sets[rg]
	if set == nil {
		set = map[uint64]uint32{}
		e.sets[rg] = set
		if i := sort.SearchInts(e.ranks, rank); i == len(e.ranks) || e.ranks[i] != rank {
			e.ranks = append(e.ranks, 0)
			copy(e.ranks[i+1:], e.ranks[i:])
			e.ranks[i] = rank
		}
	}
	for _, k := range keys {
		c := set[k]
		if c == 0 {
			e.n++
		} else if presence {
			continue
		}
		set[k] = c + 1
	}
}

// Remove drops one copy of each key from (rank, group); unknown keys are ignored.
func (e *Endpoint) Remove(rank, group int, keys []uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	set := e.sets[rankGroup{rank, group}]
	for _, k := range keys {
		switch c := set[k]; c {
		case 0:
		case 1:
			delete(set, k)
			e.n--
		default:
			set[k] = c - 1
		}
	}
}

// Clear forgets every rank's blocks; specs are configuration and stay.
func (e *Endpoint) Clear() {
	e.mu.Lock()
	defer e.mu.Unlock()
	clear(e.sets)
	e.ranks = e.ranks[:0]
	e.n = 0
}

// Len is the number of (rank, group, key) entries held.
func (e *Endpoint) Len() int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.n
}

// Hybrid says whether any endpoint of the index has a group with a rule of its own.
func (x *Index) Hybrid() bool { return x.hybrid.Load() > 0 }

// Result is the engine's hit for one endpoint.
type Result struct {
	Blocks int // the prefix hit, in prompt keys
	// Limit names what held the hit below the prompt: the group that cut it ("group 1
	// (sliding_window, window 4096)"), "full_attention" (its prefix ended there), "alignment" (the
	// scheduler block), or why no hit can be promised; "" when the whole prompt hit.
	Limit string
}

// Hit is the prefix, in the prompt's keys, that endpoint id's engine would hit: the largest L no
// group refuses, given the full-attention prefix full (the inventory's). ok is false for an
// endpoint that is not hybrid (its score stays the inventory's). keys[i] is the key of the
// prompt's block i at the index's block size.
func (x *Index) Hit(id inventory.EndpointID, keys []uint64, full int) (r Result, ok bool) {
	if x.hybrid.Load() == 0 {
		return Result{}, false
	}
	x.mu.RLock()
	e := x.eps[id]
	x.mu.RUnlock()
	if e == nil {
		return Result{}, false
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if !e.hybrid {
		return Result{}, false
	}
	return e.hit(keys, full), true
}

// group is one group's part of a hit computation.
type group struct {
	idx  int
	spec Spec
	k    int // the group's block in prompt keys (its block size / kt)
	kt   int // tokens per prompt key
	name string
}

// hit runs the rule for every rank and keeps the best: a request lands on one rank, and the
// inventory's full-attention prefix is already the best over ranks.
func (e *Endpoint) hit(keys []uint64, full int) Result {
	if e.refuse != "" {
		return Result{Blocks: 0, Limit: e.refuse}
	}
	start, limit := len(keys), ""
	if e.hasFull && full < start {
		start, limit = max(full, 0), "full_attention"
	}
	// Hits land on the scheduler block (the LCM of the groups' blocks): full attention trims to it.
	if a := start / e.align * e.align; a != start {
		start, limit = a, "alignment"
	}
	best := Result{Blocks: -1}
	for i := 0; i == 0 || i < len(e.ranks); i++ {
		rank := 0 // nothing stored yet: rank 0's empty groups
		if len(e.ranks) > 0 {
			rank = e.ranks[i]
		}
		if r := e.rankHit(rank, keys, start); r.Blocks > best.Blocks {
			best = r
		}
	}
	if best.Limit == "" {
		best.Limit = limit
	}
	return best
}

// rankHit is HybridKVCacheCoordinator.find_longest_cache_hit for one rank: each group either
// accepts the candidate length or lowers it; any lowering restarts the pass, until a pass changes
// nothing (with full attention first and one other group, one pass suffices).
func (e *Endpoint) rankHit(rank int, keys []uint64, start int) Result {
	hit, limit := start, ""
	for {
		curr := hit
		for _, g := range e.groups {
			n := g.longest(e.sets[rankGroup{rank, g.idx}], keys, curr, e.align)
			if n < curr {
				curr, limit = n, g.name
			}
		}
		if curr >= hit {
			break
		}
		hit = curr
		if e.hasFull && len(e.groups) == 1 {
			break
		}
	}
	return Result{Blocks: hit, Limit: limit}
}

// longest is the group manager's find_longest_cache_hit with max_length = max keys, in keys. The
// group's block j is held when its published key, the chain's key at the block's last key
// ((j+1)·k−1: vLLM's BlockHashListWithBlockSize), is in set.
func (g group) longest(set map[uint64]uint32, keys []uint64, max, align int) int {
	k := g.k
	nb := max / k // the group's whole blocks within max
	has := func(j int) bool { return set[keys[(j+1)*k-1]] > 0 }
	switch g.spec.Kind {
	case KindSlidingWindow:
		// SlidingWindowManager: scan right to left for ceil((window−1)/block) contiguous blocks;
		// the hit ends after the run. Without such a run, the run from block 0 is the hit.
		need := ceilDiv(g.spec.Window-1, k*g.kt)
		run := 0
		for j := nb - 1; j >= 0; j-- {
			if !has(j) {
				run = 0
				continue
			}
			if run == 0 && k != align && (j+1)*k%align != 0 {
				continue // a run must end on an aligned boundary
			}
			run++
			if run >= need {
				return (j + run) * k
			}
		}
		return run * k / align * align
	case KindMamba:
		// MambaManager: the last checkpointed, aligned block within max.
		for j := nb - 1; j >= 0; j-- {
			if has(j) && (k == align || (j+1)*k%align == 0) {
				return (j + 1) * k
			}
		}
		return 0
	case KindChunkedLocal:
		// ChunkedLocalAttentionManager: the blocks before max's chunk are outside every window and
		// count as hit; from the chunk's first block, contiguous held blocks.
		startBlock := 0
		if g.spec.Window > 0 && max > 0 {
			startBlock = max * g.kt / g.spec.Window * g.spec.Window / (k * g.kt)
		}
		j := startBlock
		for j < nb && has(j) {
			j++
		}
		return min(j*k, max)
	}
	return max
}

func ceilDiv(a, b int) int {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int) int { return a / gcd(a, b) * b }
