package inventory

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
)

// Errors returned by the index; callers match them with errors.Is.
var (
	ErrUnknownEndpoint = errors.New("unknown endpoint")
	ErrDuplicateName   = errors.New("endpoint name already in use")
	ErrFull            = errors.New("too many endpoints")
)

// Compaction of an endpoint's FIFO: when its dead entries exceed half its resident keys plus
// compactSlack, or some key's pending count reaches compactPending.
const (
	compactSlack   = 1024
	compactPending = 1 << 15
)

// Config configures one index (one rule).
type Config struct {
	// CapacityPerEndpoint caps the resident keys of each endpoint; above it the oldest resident
	// key is retired (a missed remove is the usual cause). 0 or less means unlimited.
	CapacityPerEndpoint int
}

// Score is one candidate's result: how many of the prompt's keys it holds (Overlap, the reference
// behaviour) and how many leading keys it holds without a gap (Prefix, what the engine reuses).
type Score struct {
	Endpoint        EndpointID
	Overlap, Prefix int
}

// KeyCount is a resident key and its copy count.
type KeyCount struct {
	Key   uint64
	Count int
}

// Stats are the index's totals. Counters are cumulative over the index's life, including
// endpoints since removed.
type Stats struct {
	Endpoints      int   // registered endpoints
	Keys           int64 // distinct keys in the table (a key removed everywhere may linger until its FIFO entries drain)
	Resident       int64 // resident (endpoint, key) pairs
	OverflowNodes  int64 // 64-byte nodes holding keys with several endpoint entries
	Stored         uint64
	Removed        uint64
	UnknownRemoves uint64 // removes of a key the endpoint did not hold
	Retirements    uint64 // keys retired by the capacity cap
	Clears         uint64
	Refused        uint64 // updates refused because a shard ran out of overflow node indexes (2^23)
}

// EndpointStats are one endpoint's figures.
type EndpointStats struct {
	ID             EndpointID
	Name           string
	Resident       int64
	Stored         uint64 // copies reported stored
	Removed        uint64 // copies reported removed (known ones)
	UnknownRemoves uint64
	Retirements    uint64
	Clears         uint64
}

type counters struct {
	stored, removed, unknown, retired, clears atomic.Uint64
}

type endpoint struct {
	id       EndpointID
	name     string
	resident atomic.Int64
	counters

	mu          sync.Mutex // serializes this endpoint's writers; guards the fields below
	gone        bool
	fifo        fifo
	dead        int // FIFO entries that are no longer live
	compactFlag bool
}

// Index is one rule's block inventory. All methods are safe for concurrent use.
type Index struct {
	capacity int64
	shards   [nShards]shard
	eps      [MaxEndpoints]atomic.Pointer[endpoint]
	total    counters

	regMu sync.Mutex // endpoint registry
	names map[string]EndpointID
}

// New returns an empty index.
func New(cfg Config) *Index {
	ix := &Index{names: make(map[string]EndpointID)}
	if cfg.CapacityPerEndpoint > 0 {
		ix.capacity = int64(cfg.CapacityPerEndpoint)
	}
	for i := range ix.shards {
		ix.shards[i].init(i)
	}
	return ix
}

// AddEndpoint registers an endpoint under a name unique within the index and returns the lowest
// free id.
func (ix *Index) AddEndpoint(name string) (EndpointID, error) {
	if name == "" {
		return 0, errors.New("inventory: endpoint name is empty")
	}
	ix.regMu.Lock()
	defer ix.regMu.Unlock()
	if _, ok := ix.names[name]; ok {
		return 0, fmt.Errorf("inventory: endpoint %q: %w", name, ErrDuplicateName)
	}
	for i := range ix.eps {
		if ix.eps[i].Load() == nil {
			id := EndpointID(i)
			ix.eps[i].Store(&endpoint{id: id, name: name})
			ix.names[name] = id
			return id, nil
		}
	}
	return 0, fmt.Errorf("inventory: endpoint %q: %w (max %d)", name, ErrFull, MaxEndpoints)
}

// RemoveEndpoint forgets the endpoint and its keys; its id may be handed out again, so the
// endpoint's event stream must be stopped first.
func (ix *Index) RemoveEndpoint(id EndpointID) error {
	ix.regMu.Lock()
	e := ix.endpoint(id)
	if e == nil {
		ix.regMu.Unlock()
		return unknown(id)
	}
	e.mu.Lock()
	ix.clear(e, false)
	e.gone = true
	e.mu.Unlock()
	ix.eps[id].Store(nil)
	delete(ix.names, e.name)
	ix.regMu.Unlock()
	return nil
}

// Lookup returns the id registered under name.
func (ix *Index) Lookup(name string) (EndpointID, bool) {
	ix.regMu.Lock()
	defer ix.regMu.Unlock()
	id, ok := ix.names[name]
	return id, ok
}

func unknown(id EndpointID) error {
	return fmt.Errorf("inventory: endpoint %d: %w", id, ErrUnknownEndpoint)
}

func (ix *Index) endpoint(id EndpointID) *endpoint {
	if id >= MaxEndpoints {
		return nil
	}
	return ix.eps[id].Load()
}

// lock returns the endpoint with its writer lock held.
func (ix *Index) lock(id EndpointID) (*endpoint, error) {
	e := ix.endpoint(id)
	if e == nil {
		return nil, unknown(id)
	}
	e.mu.Lock()
	if e.gone {
		e.mu.Unlock()
		return nil, unknown(id)
	}
	return e, nil
}

func (ix *Index) shard(h uint64) *shard { return &ix.shards[h>>(64-shardBits)] }

// Store records one stored copy per key (duplicates and each KV-cache group count). Keys that
// become resident join the endpoint's FIFO; above the capacity the oldest resident key retires.
func (ix *Index) Store(id EndpointID, keys []uint64) error {
	e, err := ix.lock(id)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	for _, k := range keys {
		h := mix(k)
		c0, _, c1, p1 := ix.shard(h).apply(h, id, opStore)
		if c0 == 0 && c1 > 0 {
			e.fifo.push(k)
			if e.resident.Add(1) > ix.capacity && ix.capacity > 0 {
				ix.retireOldest(e)
			}
		}
		if p1 >= compactPending {
			e.compactFlag = true
		}
	}
	e.stored.Add(uint64(len(keys)))
	ix.total.stored.Add(uint64(len(keys)))
	ix.maybeCompact(e)
	return nil
}

// Remove records one removed copy per key. A key the endpoint does not hold is counted as an
// unknown remove (missed store, replay overlap), not an error.
func (ix *Index) Remove(id EndpointID, keys []uint64) error {
	e, err := ix.lock(id)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	var unk uint64
	for _, k := range keys {
		h := mix(k)
		op := opRemove
		if head, ok := e.fifo.peek(); ok && head == k {
			op = opRemoveHead // engines evict oldest first: usually the case
		}
		c0, p0, c1, _ := ix.shard(h).apply(h, id, op)
		switch {
		case c0 == 0:
			unk++
		case c1 > 0:
		case op == opRemoveHead && p0 == 1:
			e.fifo.pop()
			e.resident.Add(-1)
		default:
			e.resident.Add(-1)
			e.dead++
		}
	}
	known := uint64(len(keys)) - unk
	e.removed.Add(known)
	e.unknown.Add(unk)
	ix.total.removed.Add(known)
	ix.total.unknown.Add(unk)
	ix.trimHead(e)
	ix.maybeCompact(e)
	return nil
}

// trimHead drops dead entries from the head of the endpoint's FIFO. Engines evict roughly oldest
// first, so most dead entries are found here, each for one lookup, long before a compaction.
func (ix *Index) trimHead(e *endpoint) {
	for e.dead > 0 {
		k, ok := e.fifo.peek()
		if !ok {
			return
		}
		h := mix(k)
		c0, p0, _, _ := ix.shard(h).apply(h, e.id, opTrim)
		if p0 == 1 && c0 > 0 {
			return
		}
		e.fifo.pop()
		if p0 > 0 {
			e.dead--
		}
	}
}

// Clear forgets every key of the endpoint, in time proportional to that endpoint's keys.
func (ix *Index) Clear(id EndpointID) error {
	e, err := ix.lock(id)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	ix.clear(e, true)
	return nil
}

func (ix *Index) clear(e *endpoint, count bool) {
	e.fifo.each(func(k uint64) {
		h := mix(k)
		ix.shard(h).apply(h, e.id, opDrop)
	})
	e.fifo = fifo{}
	e.dead = 0
	e.compactFlag = false
	e.resident.Store(0)
	if count {
		e.clears.Add(1)
		ix.total.clears.Add(1)
	}
}

// retireOldest pops FIFO entries until one retires a resident key.
func (ix *Index) retireOldest(e *endpoint) {
	for {
		k, ok := e.fifo.pop()
		if !ok {
			return
		}
		h := mix(k)
		c0, p0, _, _ := ix.shard(h).apply(h, e.id, opPop)
		switch {
		case p0 == 0: // cannot happen while the FIFO and the table agree
		case p0 > 1 || c0 == 0:
			e.dead--
		default:
			e.resident.Add(-1)
			e.retired.Add(1)
			ix.total.retired.Add(1)
			return
		}
	}
}

// maybeCompact drops the endpoint's dead FIFO entries (and the lingering table entries they keep)
// once they outnumber half its resident keys (removes far from the FIFO's head); the cost is
// amortized over the removes that made them.
func (ix *Index) maybeCompact(e *endpoint) {
	if !e.compactFlag && int64(e.dead) <= e.resident.Load()/2+compactSlack {
		return
	}
	old := e.fifo
	e.fifo = fifo{}
	old.each(func(k uint64) {
		h := mix(k)
		c0, p0, _, _ := ix.shard(h).apply(h, e.id, opCompact)
		if p0 == 1 && c0 > 0 {
			e.fifo.push(k)
		}
	})
	e.dead = 0
	e.compactFlag = false
}

// Score counts, for every endpoint in mask, how many of keys (a prompt's block keys in chain
// order) it holds and how many leading keys it holds without a gap. It returns one Score per id in
// mask, ascending (an id with no endpoint scores zero), appended to out[:0]. Each key is read
// consistently; the prompt as a whole is not a point-in-time snapshot.
func (ix *Index) Score(keys []uint64, mask Mask, out []Score) []Score {
	var overlap, prefix [MaxEndpoints]int
	var held Mask
	// Only the mask's non-empty words can score: most rules have fewer than 64 endpoints.
	words := 0
	for w := range mask {
		if mask[w] != 0 {
			words = w + 1
		}
	}
	for i, k := range keys {
		h := mix(k)
		ix.shard(h).holders(h, &held)
		for w := 0; w < words; w++ {
			b := held[w] & mask[w]
			for b != 0 {
				ep := w*64 + bits.TrailingZeros64(b)
				b &= b - 1
				overlap[ep]++
				if prefix[ep] == i {
					prefix[ep]++
				}
			}
		}
	}
	out = out[:0]
	for w, b := range mask {
		for b != 0 {
			ep := w*64 + bits.TrailingZeros64(b)
			b &= b - 1
			out = append(out, Score{Endpoint: EndpointID(ep), Overlap: overlap[ep], Prefix: prefix[ep]})
		}
	}
	return out
}

// Holders sets in out the endpoints holding key (out is overwritten), read consistently as
// Score reads each key.
func (ix *Index) Holders(key uint64, out *Mask) {
	h := mix(key)
	ix.shard(h).holders(h, out)
}

// Resident is the number of keys resident on the endpoint (0 for an unknown id).
func (ix *Index) Resident(id EndpointID) int {
	if e := ix.endpoint(id); e != nil {
		return int(e.resident.Load())
	}
	return 0
}

// Snapshot returns the endpoint's resident keys with their copy counts, sorted by key (nil for an
// unknown id). It holds the endpoint's writer lock while it walks the endpoint's keys.
func (ix *Index) Snapshot(id EndpointID) []KeyCount {
	e, err := ix.lock(id)
	if err != nil {
		return nil
	}
	defer e.mu.Unlock()
	out := make([]KeyCount, 0, e.resident.Load())
	e.fifo.each(func(k uint64) {
		h := mix(k)
		if c, _ := ix.shard(h).read(h, id); c > 0 {
			out = append(out, KeyCount{Key: k, Count: int(c)})
		}
	})
	slices.SortFunc(out, func(a, b KeyCount) int {
		switch {
		case a.Key < b.Key:
			return -1
		case a.Key > b.Key:
			return 1
		}
		return 0
	})
	return slices.CompactFunc(out, func(a, b KeyCount) bool { return a.Key == b.Key })
}

// Aged returns the endpoint's resident keys with their copy counts, oldest first: the order the
// capacity cap retires them in (nil for an unknown id). A key re-stored after a removal has an
// older, dead FIFO entry too; its age is its newest entry, the one whose pop retires it.
func (ix *Index) Aged(id EndpointID) []KeyCount {
	e, err := ix.lock(id)
	if err != nil {
		return nil
	}
	defer e.mu.Unlock()
	out := make([]KeyCount, 0, e.resident.Load())
	var later map[uint64]uint32 // keys with several FIFO entries: entries still to come
	e.fifo.each(func(k uint64) {
		h := mix(k)
		c, p := ix.shard(h).read(h, id)
		if c == 0 {
			return
		}
		if p > 1 {
			if later == nil {
				later = map[uint64]uint32{}
			}
			left, seen := later[k]
			if !seen {
				left = p
			}
			if left--; left > 0 {
				later[k] = left
				return
			}
			delete(later, k)
		}
		out = append(out, KeyCount{Key: k, Count: int(c)})
	})
	return out
}

// Endpoints returns every registered endpoint's figures, by id (the metrics hook).
func (ix *Index) Endpoints() []EndpointStats {
	var out []EndpointStats
	for i := range ix.eps {
		if e := ix.eps[i].Load(); e != nil {
			out = append(out, EndpointStats{
				ID: e.id, Name: e.name, Resident: e.resident.Load(),
				Stored: e.stored.Load(), Removed: e.removed.Load(), UnknownRemoves: e.unknown.Load(),
				Retirements: e.retired.Load(), Clears: e.clears.Load(),
			})
		}
	}
	return out
}

// Stats returns the index's totals.
func (ix *Index) Stats() Stats {
	var st Stats
	for i := range ix.eps {
		if e := ix.eps[i].Load(); e != nil {
			st.Endpoints++
			st.Resident += e.resident.Load()
		}
	}
	for i := range ix.shards {
		st.Keys += ix.shards[i].keys.Load()
		st.OverflowNodes += ix.shards[i].nodes.Load()
		st.Refused += ix.shards[i].exhausted.Load()
	}
	st.Stored = ix.total.stored.Load()
	st.Removed = ix.total.removed.Load()
	st.UnknownRemoves = ix.total.unknown.Load()
	st.Retirements = ix.total.retired.Load()
	st.Clears = ix.total.clears.Load()
	return st
}
