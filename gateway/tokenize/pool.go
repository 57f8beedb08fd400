package tokenize

import (
	"container/list"
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/kvexact/kvexact/gateway/hub"
)

// Pool hands out tokenizers by model slug: loaded lazily, once per model however many callers ask
// at the same time, at most MaxLoaded kept (least recently used dropped first). A load failure is
// remembered with its reason and retried only after RetryAfter, so a broken model costs one load
// attempt per interval, not one per request. Its tokenizers share one segment cache
// (segment_cache.go; WithSegmentCacheBytes).
type Pool struct {
	roots      []string
	segBytes   int64
	segs       *SegmentCache
	folders    map[string]string
	maxLoaded  int
	retryAfter time.Duration
	now        func() time.Time
	load       func(dir string) (*Tokenizer, error)
	hub        *hub.Client
	hubModels  map[string]hub.Source
	hubTimeout time.Duration
	hubWait    time.Duration
	fetchMu    sync.Mutex
	fetches    map[string]*fetch // by model: the hub fetch running or finished and not yet used

	mu      sync.Mutex
	entries map[string]*poolEntry
	lru     *list.List // of *poolEntry, most recent first
}

type poolEntry struct {
	model    string
	dir      string
	ready    chan struct{}
	tok      *Tokenizer
	err      error
	snap     *hub.Snapshot // where a hub-fetched tokenizer came from
	failedAt time.Time
	elem     *list.Element
}

// PoolOption configures a Pool.
type PoolOption func(*Pool)

// WithFolder maps a model to its tokenizer folder: an absolute path, or a folder name under the
// pool's roots. Without it the folder is the model slug with "/" replaced by "__".
func WithFolder(model, dir string) PoolOption { return func(p *Pool) { p.folders[model] = dir } }

// WithHub fetches the listed models' tokenizers from a hub through c (their folders and roots are
// not searched); each fetch, listing included, is bounded by timeout. A load waits for the fetch at
// most hubWait (a cached snapshot or a near hub answers within it): past that the fetch goes on in
// the background and the load fails with "still fetching", so a slow hub never holds up the
// gateway's start. A failed fetch is a load failure like any other: remembered and retried after
// RetryAfter, when a finished background fetch is picked up.
func WithHub(c *hub.Client, models map[string]hub.Source, timeout time.Duration) PoolOption {
	return func(p *Pool) {
		p.hub, p.hubModels, p.hubTimeout, p.hubWait = c, models, timeout, DefaultHubWait
		p.fetches = map[string]*fetch{}
	}
}

// DefaultHubWait is how long a load waits for a hub fetch before leaving it to the background.
const DefaultHubWait = 5 * time.Second

// fetch is one hub fetch of a model's snapshot.
type fetch struct {
	started time.Time
	done    chan struct{}
	snap    *hub.Snapshot
	err     error
}

// fetchHub returns model's snapshot: the result of a fetch already finished, else that of a fetch
// started now (or running) if it finishes within hubWait, else a "still fetching" error.
func (p *Pool) fetchHub(model string, src hub.Source) (*hub.Snapshot, error) {
	p.fetchMu.Lock()
	f := p.fetches[model]
	if f == nil {
		f = &fetch{started: p.now(), done: make(chan struct{})}
		p.fetches[model] = f
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), p.hubTimeout)
			defer cancel()
			f.snap, f.err = p.hub.Fetch(ctx, src)
			close(f.done)
		}()
	}
	p.fetchMu.Unlock()
	select {
	case <-f.done:
	case <-time.After(p.hubWait):
		return nil, fmt.Errorf("still fetching %s from %s (started %s)", src.Repo, src.Endpoint, f.started.Format(time.RFC3339))
	}
	p.fetchMu.Lock()
	if p.fetches[model] == f {
		delete(p.fetches, model) // used: the next load (a retry, a new revision) fetches afresh
	}
	p.fetchMu.Unlock()
	return f.snap, f.err
}

// WithMaxLoaded bounds how many tokenizers (and remembered failures) the pool keeps (default 8).
func WithMaxLoaded(n int) PoolOption {
	return func(p *Pool) {
		if n > 0 {
			p.maxLoaded = n
		}
	}
}

// WithSegmentCacheBytes gives the pool's tokenizers a shared segment cache of n bytes (the gateway
// uses DefaultSegmentCacheBytes unless configured). Without it, or with n ≤ 0, there is none: a
// library caller, a benchmark or ctk gets cold encodes unless it asks.
func WithSegmentCacheBytes(n int64) PoolOption { return func(p *Pool) { p.segBytes = n } }

// WithRetryAfter sets how long a load failure is remembered before the next attempt (default 1m).
func WithRetryAfter(d time.Duration) PoolOption { return func(p *Pool) { p.retryAfter = d } }

// WithRoots adds folders searched after the pool's root, in order.
func WithRoots(roots ...string) PoolOption {
	return func(p *Pool) { p.roots = append(p.roots, roots...) }
}

// withClock and withLoader are test hooks.
func withClock(now func() time.Time) PoolOption { return func(p *Pool) { p.now = now } }
func withLoader(load func(string) (*Tokenizer, error)) PoolOption {
	return func(p *Pool) { p.load = load }
}

// NewPool returns a pool reading tokenizer folders under root ("" means DefaultRoots()).
func NewPool(root string, opts ...PoolOption) *Pool {
	p := &Pool{
		folders: map[string]string{}, maxLoaded: 8, retryAfter: time.Minute, now: time.Now, load: Load,
		entries: map[string]*poolEntry{}, lru: list.New(),
	}
	if root == "" {
		p.roots = DefaultRoots()
	} else {
		p.roots = []string{root}
	}
	for _, o := range opts {
		o(p)
	}
	p.segs = NewSegmentCache(p.segBytes)
	return p
}

// SegmentCacheStats returns the counters of the pool's segment cache (zero when it has none).
func (p *Pool) SegmentCacheStats() SegmentCacheStats { return p.segs.Stats() }

// PoolLoadError is a remembered load failure.
type PoolLoadError struct {
	Model, Dir string
	At         time.Time
	RetryAt    time.Time
	Err        error
}

func (e *PoolLoadError) Error() string {
	return fmt.Sprintf("tokenizer for model %q: %v (next attempt after %s)", e.Model, e.Err, e.RetryAt.Format(time.RFC3339))
}

func (e *PoolLoadError) Unwrap() error { return e.Err }

// Get returns the tokenizer of model, loading it on first use.
func (p *Pool) Get(model string) (*Tokenizer, error) {
	p.mu.Lock()
	e := p.entries[model]
	if e != nil {
		select {
		case <-e.ready:
			if e.err != nil && !p.now().Before(e.failedAt.Add(p.retryAfter)) {
				p.drop(e)
				e = nil
			}
		default:
		}
	}
	if e != nil {
		p.lru.MoveToFront(e.elem)
		p.mu.Unlock()
		<-e.ready
		return e.tok, e.err
	}
	e = &poolEntry{model: model, ready: make(chan struct{})}
	e.elem = p.lru.PushFront(e)
	p.entries[model] = e
	p.mu.Unlock()

	tok, dir, snap, err := p.loadModel(model)
	if tok != nil && p.segs != nil {
		tok = tok.WithSegmentCache(p.segs)
	}
	p.mu.Lock()
	e.tok, e.dir, e.snap = tok, dir, snap
	if err != nil {
		e.failedAt = p.now()
		e.err = &PoolLoadError{Model: model, Dir: dir, At: e.failedAt, RetryAt: e.failedAt.Add(p.retryAfter), Err: err}
	}
	close(e.ready)
	p.evict()
	p.mu.Unlock()
	return e.tok, e.err
}

func (p *Pool) loadModel(model string) (*Tokenizer, string, *hub.Snapshot, error) {
	if src, ok := p.hubModels[model]; ok {
		snap, err := p.fetchHub(model, src)
		if err != nil {
			return nil, "", nil, err
		}
		t, err := p.load(snap.Dir)
		return t, snap.Dir, snap, err
	}
	folder, mapped := p.folders[model]
	if !mapped {
		folder = FolderFor(model)
	}
	if filepath.IsAbs(folder) {
		t, err := p.load(folder)
		return t, folder, nil, err
	}
	dir, err := FindModelDir(p.roots, folder)
	if err != nil {
		return nil, "", nil, err
	}
	t, err := p.load(dir)
	return t, dir, nil, err
}

// Snapshot returns the hub snapshot model's loaded tokenizer came from (nil: a local folder, or
// not loaded).
func (p *Pool) Snapshot(model string) *hub.Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.entries[model]; e != nil {
		select {
		case <-e.ready:
			return e.snap
		default:
		}
	}
	return nil
}

// drop removes an entry; the caller holds p.mu.
func (p *Pool) drop(e *poolEntry) {
	p.lru.Remove(e.elem)
	if p.entries[e.model] == e {
		delete(p.entries, e.model)
	}
}

// evict drops the least recently used finished entries beyond maxLoaded; the caller holds p.mu.
func (p *Pool) evict() {
	for el := p.lru.Back(); el != nil && p.lru.Len() > p.maxLoaded; {
		prev := el.Prev()
		e := el.Value.(*poolEntry)
		select {
		case <-e.ready:
			p.drop(e)
		default: // still loading: keep
		}
		el = prev
	}
}

// PoolEntry describes one model the pool knows about.
type PoolEntry struct {
	Model   string
	Dir     string
	Loaded  bool
	Loading bool
	Err     error
}

// Status lists the pool's entries, sorted by model.
func (p *Pool) Status() []PoolEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []PoolEntry
	for _, e := range p.entries {
		s := PoolEntry{Model: e.model}
		select {
		case <-e.ready:
			s.Dir, s.Loaded, s.Err = e.dir, e.err == nil, e.err
		default:
			s.Loading = true
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}
