package sim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/hashcore"
)

// Engine is one simulated engine server.
type Engine struct {
	cfg      Config
	ct       *contracts.Contract
	tok      textModel
	hasher   *hashcore.Hasher // vLLM and SGLang; nil for trtllm and llamacpp
	seedDesc string           // how the root was chosen (logged, never the value when random)
	words    []uint32         // the output word cycle
	ranks    []*rank
	drain    *drain // trtllm
	faults   faultBox
	created  time.Time
	started  atomic.Bool
	closed   atomic.Bool
	reqID    atomic.Uint64
	ctxID    atomic.Uint64 // TensorRT-LLM ctx_request_id
	engineID string        // vLLM remote_engine_id
	loras    []loraModule  // Config.LoRAModules

	httpMu   sync.Mutex
	connMu   sync.Mutex
	idle     map[net.Conn]bool
	refusing bool
	httpAddr string
	ln       net.Listener
	srv      *http.Server
	adminSrv *http.Server
	adminLn  net.Listener
	boot     *bootstrap

	mux *http.ServeMux
	wg  sync.WaitGroup
}

// rank is one data-parallel engine core: its own block pool, scheduler and event stream.
type rank struct {
	idx     int
	e       *Engine
	mu      sync.Mutex
	cache   *cache // nil for llama.cpp
	slots   chan struct{}
	freed   chan struct{} // closed (and replaced) whenever blocks or slots are given back
	pub     *publisher    // ZeroMQ families
	llama   []*llamaSlot  // llama.cpp
	running atomic.Int64
	waiting atomic.Int64

	// counters for /metrics
	requests       atomic.Uint64
	promptTokens   atomic.Uint64
	genTokens      atomic.Uint64
	cachedTokens   atomic.Uint64
	queriedTokensL atomic.Uint64 // llama.cpp / aggregate when cache is nil
}

// New validates cfg, loads the tokenizer and builds the engine; Start makes it listen.
func New(cfg Config) (*Engine, error) {
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, ct: cfg.contract, created: time.Now()}
	e.faults.f = cfg.Faults
	tok, err := loadText(cfg.Model, cfg.Tokenizer)
	if err != nil {
		return nil, err
	}
	e.tok = tok
	if cfg.ServeChatTemplate != "" {
		if e.tok, err = withChatTemplate(tok, cfg.ServeChatTemplate); err != nil {
			return nil, err
		}
	}
	if e.cfg.ServedModelName == "" {
		e.cfg.ServedModelName = cfg.Model
		if cfg.Family == "trtllm" || cfg.Family == "llamacpp" {
			e.cfg.ServedModelName = filepath.Base(cfg.Model)
		}
		if e.cfg.ServedModelName == "" || e.cfg.ServedModelName == "." {
			e.cfg.ServedModelName = "model"
		}
	}
	if e.loras, err = parseLoRAModules(cfg.Family, e.cfg.ServedModelName, cfg.LoRAModules); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	if e.words, err = tok.Encode(outputText, false); err != nil || len(e.words) == 0 {
		return nil, fmt.Errorf("sim: tokenizer cannot encode the output word list: %v", err)
	}
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	e.engineID = hex.EncodeToString(idb[:])
	switch cfg.Family {
	case "vllm":
		seed, rootErr := cfg.contract.EngineSeed(cfg.Algorithm, cfg.Seed)
		e.seedDesc = "PYTHONHASHSEED set"
		if cfg.Seed == nil && rootErr == nil {
			e.seedDesc = "PYTHONHASHSEED unset: the release's default seed"
		}
		if seed == nil {
			// vLLM draws os.urandom(32) as its root when PYTHONHASHSEED is unset. The hash core
			// roots at H(seed string), so a random 32-byte seed string gives an equally
			// unreproducible root.
			var b [32]byte
			_, _ = rand.Read(b[:])
			s := hex.EncodeToString(b[:])
			seed = &s
			e.seedDesc = "PYTHONHASHSEED unset: random root"
		}
		e.hasher, err = hashcore.New(hashcore.Binding{Algorithm: hashcore.Algorithm(cfg.Algorithm), BlockSize: cfg.BlockSize, Seed: seed}, hashcore.Default())
	case "sglang":
		e.hasher, err = hashcore.New(hashcore.Binding{Algorithm: hashcore.SGLangSHA256, BlockSize: cfg.BlockSize}, hashcore.Default())
	}
	if err != nil {
		return nil, fmt.Errorf("sim: hash binding: %w", err)
	}
	if cfg.Family == "trtllm" {
		e.drain = newDrain(cfg.DrainBuffer, cfg.DPRanks, cfg.MaxModelLen, &e.faults)
		e.drain.blocks = cfg.CapacityBlocks
	}
	for i := 0; i < cfg.DPRanks; i++ {
		r := &rank{idx: i, e: e, slots: make(chan struct{}, cfg.MaxConcurrency), freed: make(chan struct{})}
		switch cfg.Family {
		case "llamacpp":
			for s := 0; s < cfg.MaxConcurrency; s++ {
				r.llama = append(r.llama, &llamaSlot{id: s})
			}
		default:
			pol := policyFor(cfg.Family)
			pol.reportReuse = cfg.ReportMode == ReportFull
			r.cache = newCache(cfg.CapacityBlocks, cfg.BlockSize, pol, r.storedEvent)
			if cfg.OffloadBlocks > 0 {
				r.cache.off = newOffloadTier(cfg.OffloadBlocks)
			}
			if cfg.SlidingWindow > 0 {
				r.cache.win = newWindowGroup(cfg.SlidingWindow, cfg.BlockSize, cfg.SlidingWindowBlocks, r.cache)
			}
		}
		e.ranks = append(e.ranks, r)
	}
	e.mux = e.routes()
	return e, nil
}

func policyFor(family string) policy {
	switch family {
	case "vllm":
		return policy{nullBlock: true, groupTagged: true}
	case "sglang":
		return policy{dedup: true, leafFirst: true, mergeStored: true, mergeRemoved: true}
	}
	return policy{dedup: true, leafFirst: true, mergeStored: true, mergeRemoved: true}
}

// Start binds the API (and the event sockets) and returns once everything listens.
func (e *Engine) Start(ctx context.Context) error {
	if !e.started.CompareAndSwap(false, true) {
		return errors.New("sim: already started")
	}
	if err := e.startEvents(); err != nil {
		e.stopEvents()
		return err
	}
	if e.cfg.Role == RolePrefill && e.cfg.Family == "sglang" {
		b, err := startBootstrap(e.cfg.BootstrapAddr)
		if err != nil {
			e.stopEvents()
			return fmt.Errorf("sim: bootstrap %s: %w", e.cfg.BootstrapAddr, err)
		}
		b.wait = e.cfg.BootstrapTimeout
		e.boot = b
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", e.cfg.HTTPAddr)
	if err != nil {
		e.stopEvents()
		return fmt.Errorf("sim: http %s: %w", e.cfg.HTTPAddr, err)
	}
	e.httpAddr = ln.Addr().String()
	e.srv = &http.Server{Handler: e.mux, ReadHeaderTimeout: 10 * time.Second, ConnState: e.trackConn}
	e.serve(ln)
	if e.cfg.AdminAddr != "" {
		al, err := (&net.ListenConfig{}).Listen(ctx, "tcp", e.cfg.AdminAddr)
		if err != nil {
			e.Close()
			return fmt.Errorf("sim: admin %s: %w", e.cfg.AdminAddr, err)
		}
		e.adminLn = al
		e.adminSrv = &http.Server{Handler: e.adminRoutes(), ReadHeaderTimeout: 10 * time.Second}
		e.wg.Add(1)
		go func() { defer e.wg.Done(); _ = e.adminSrv.Serve(al) }()
	}
	e.faults.onRefuse = e.setRefuse
	if e.faults.get().Refuse {
		e.setRefuse(true)
	}
	e.cfg.Logger.Info("enginesim started", "family", e.cfg.Family, "release", e.cfg.Release, "endpoint", e.cfg.Endpoint,
		"http", e.httpAddr, "block_size", e.cfg.BlockSize, "algorithm", e.cfg.Algorithm, "seed", e.seedDesc, "dp", e.cfg.DPRanks)
	return nil
}

func (e *Engine) serve(ln net.Listener) {
	e.httpMu.Lock()
	e.ln = ln
	e.httpMu.Unlock()
	e.wg.Add(1)
	go func() { defer e.wg.Done(); _ = e.srv.Serve(ln) }()
}

// trackConn remembers idle keep-alive connections, so that refusing can drop them too.
func (e *Engine) trackConn(c net.Conn, st http.ConnState) {
	e.connMu.Lock()
	defer e.connMu.Unlock()
	if e.idle == nil {
		e.idle = map[net.Conn]bool{}
	}
	switch st {
	case http.StateIdle:
		if e.refusing {
			// A response finished after refusing began: a dead server keeps no connection.
			c.Close()
			return
		}
		e.idle[c] = true
	case http.StateActive, http.StateHijacked, http.StateClosed:
		delete(e.idle, c)
	}
}

// setRefuse closes the API listener (clients get connection refused) and drops idle keep-alive
// connections, as a dead server process would; requests in flight finish. refuse=false reopens the
// listener on the same address.
func (e *Engine) setRefuse(refuse bool) {
	if e.closed.Load() {
		return
	}
	e.httpMu.Lock()
	defer e.httpMu.Unlock()
	if refuse {
		if e.ln != nil {
			e.ln.Close()
			e.ln = nil
		}
		e.connMu.Lock()
		e.refusing = true
		for c := range e.idle {
			c.Close()
		}
		e.idle = nil
		e.connMu.Unlock()
		return
	}
	e.connMu.Lock()
	e.refusing = false
	e.connMu.Unlock()
	if e.ln != nil {
		return
	}
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ { // the port was ours a moment ago; retry briefly if the OS lags
		if ln, err = net.Listen("tcp", e.httpAddr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		e.cfg.Logger.Error("sim: cannot reopen the API listener", "addr", e.httpAddr, "err", err)
		return
	}
	e.ln = ln
	e.wg.Add(1)
	go func() { defer e.wg.Done(); _ = e.srv.Serve(ln) }()
}

// startEvents resolves each rank's addresses and opens its event stream.
func (e *Engine) startEvents() error {
	if e.cfg.NoEvents {
		return nil
	}
	if e.ct.Transport == "http-drain-v1" {
		e.drain.startup()
		return nil
	}
	if e.ct.Transport != "zmq-multipart-v1" {
		return nil
	}
	enc, err := encoderFor(e.cfg.Family, e.cfg.Release)
	if err != nil {
		return err
	}
	n := e.cfg.DPRanks
	pubHost, pubPort, err := splitTCP(e.cfg.PublishAddr)
	if err != nil {
		return fmt.Errorf("sim: publish address: %w", err)
	}
	bind := isBindable(e.cfg.Family, e.cfg.PublishAddr)
	avoid := map[int]bool{}
	if pubPort == 0 {
		if !bind {
			return fmt.Errorf("sim: publish address %q: port 0 needs a wildcard host (tcp://*:0) so the engine binds", e.cfg.PublishAddr)
		}
		if pubPort, err = freePorts(pubHost, n, nil); err != nil {
			return fmt.Errorf("sim: publish address: %w", err)
		}
	}
	for i := 0; i < n; i++ {
		avoid[pubPort+i] = true
	}
	var repHost string
	var repPort int
	if e.cfg.ReplayAddr != "" {
		if repHost, repPort, err = splitTCP(e.cfg.ReplayAddr); err != nil {
			return fmt.Errorf("sim: replay address: %w", err)
		}
		if repPort == 0 {
			if repPort, err = freePorts(repHost, n, avoid); err != nil {
				return fmt.Errorf("sim: replay address: %w", err)
			}
		}
		for i := 0; i < n; i++ {
			if avoid[repPort+i] && bind {
				return fmt.Errorf("sim: replay port %d collides with a rank's publish port (ranks use port + rank)", repPort+i)
			}
		}
	}
	for i, r := range e.ranks {
		rep := ""
		if e.cfg.ReplayAddr != "" {
			rep = joinTCP(repHost, repPort+i)
		}
		r.pub = newPublisher(i, e.cfg.Family, enc, e.cfg.Topic, joinTCP(pubHost, pubPort+i), rep, e.cfg.ReplayBuffer, &e.faults, e.cfg.Logger)
		r.pub.hwm = e.cfg.HWM
		if err := r.pub.start(); err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		if e.cfg.Family == "sglang" {
			// SGLang's radix cache resets at construction: its first batch is AllBlocksCleared.
			r.emit([]engines.Event{{Kind: engines.AllBlocksCleared}})
		}
	}
	return nil
}

func (e *Engine) stopEvents() {
	for _, r := range e.ranks {
		if r.pub != nil {
			r.pub.stop()
		}
	}
}

// Close stops listening and releases every socket. In-flight requests are cut off.
func (e *Engine) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	e.faults.stop()
	if e.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = e.srv.Shutdown(ctx)
		cancel()
		_ = e.srv.Close()
	}
	if e.adminSrv != nil {
		_ = e.adminSrv.Close()
	}
	if e.boot != nil {
		e.boot.close()
	}
	if e.drain != nil {
		e.drain.close()
	}
	e.stopEvents()
	e.wg.Wait()
	return nil
}

// Addr is the API's host:port.
func (e *Engine) Addr() string { return e.httpAddr }

// URL is the API's base URL.
func (e *Engine) URL() string { return "http://" + e.httpAddr }

// AdminAddr is the separate admin listener's host:port ("" when none).
func (e *Engine) AdminAddr() string {
	if e.adminLn == nil {
		return ""
	}
	return e.adminLn.Addr().String()
}

// BootstrapAddr is the SGLang prefill bootstrap rendezvous host:port ("" when none).
func (e *Engine) BootstrapAddr() string {
	if e.boot == nil {
		return ""
	}
	return e.boot.addr()
}

// PublishAddrs are the dialable ZeroMQ publish endpoints, one per rank (nil without ZeroMQ).
func (e *Engine) PublishAddrs() []string {
	var out []string
	for _, r := range e.ranks {
		if r.pub != nil {
			p, _ := r.pub.addrs()
			out = append(out, p)
		}
	}
	return out
}

// ReplayAddrs are the dialable replay endpoints, one per rank (nil without replay).
func (e *Engine) ReplayAddrs() []string {
	var out []string
	for _, r := range e.ranks {
		if r.pub != nil {
			if _, rp := r.pub.addrs(); rp != "" {
				out = append(out, rp)
			}
		}
	}
	return out
}

// Config returns the resolved configuration.
func (e *Engine) Config() Config { return e.cfg }

// Faults returns the current fault switches.
func (e *Engine) Faults() Faults { return e.faults.get() }

// SetFaults applies a patch to the fault switches.
func (e *Engine) SetFaults(p FaultPatch) (Faults, error) { return e.faults.apply(p) }

// CacheKeys returns, for data-parallel rank r, each cached block key with its number of cached
// copies (vLLM keeps duplicates; SGLang and TensorRT-LLM one). nil for llama.cpp.
func (e *Engine) CacheKeys(r int) map[uint64]int {
	if r < 0 || r >= len(e.ranks) || e.ranks[r].cache == nil {
		return nil
	}
	rk := e.ranks[r]
	rk.mu.Lock()
	defer rk.mu.Unlock()
	return rk.cache.snapshot()
}

// OffloadKeys returns the block keys data-parallel rank r's offload tier holds (one copy each),
// nil without a tier.
func (e *Engine) OffloadKeys(r int) map[uint64]int {
	if r < 0 || r >= len(e.ranks) || e.ranks[r].cache == nil || e.ranks[r].cache.off == nil {
		return nil
	}
	rk := e.ranks[r]
	rk.mu.Lock()
	defer rk.mu.Unlock()
	return rk.cache.off.snapshot()
}

// NextSeq is the sequence number rank r's next ZeroMQ batch will carry (TensorRT-LLM: the next
// event_id of rank r).
func (e *Engine) NextSeq(r int) uint64 {
	if e.drain != nil {
		return e.drain.nextID(r)
	}
	if r < 0 || r >= len(e.ranks) || e.ranks[r].pub == nil {
		return 0
	}
	return e.ranks[r].pub.nextSeq()
}

// Quiesce waits until no request runs or waits and every event queued so far has been handed to
// its socket (or drain buffer).
func (e *Engine) Quiesce(ctx context.Context) error {
	for {
		busy := false
		for _, r := range e.ranks {
			if r.running.Load() > 0 || r.waiting.Load() > 0 {
				busy = true
			}
		}
		if !busy {
			break
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		waitBriefly(ctx)
	}
	for _, r := range e.ranks {
		if r.pub != nil {
			if err := r.pub.flushed(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// RestartPublisher restarts every rank's event stream: new sockets on the same addresses with
// sequence numbers from 0 and an empty replay buffer (TensorRT-LLM: event_id from 0 with fresh
// created events). With engine true it is a whole engine restart: the cache is emptied without
// events (the new process knows nothing of the old one's blocks) and SGLang opens with
// AllBlocksCleared again.
func (e *Engine) RestartPublisher(engine bool) error {
	if e.cfg.Family == "llamacpp" {
		if engine {
			e.clearLlama()
		}
		return nil
	}
	if e.drain != nil {
		for _, r := range e.ranks {
			r.mu.Lock()
			r.cache.clear()
			r.cache.take()
			r.mu.Unlock()
		}
		e.drain.startup()
		return nil
	}
	for _, r := range e.ranks {
		r.mu.Lock()
		if engine {
			r.cache.clear()
		}
		r.cache.take()
		if err := r.pub.restart(); err != nil {
			r.mu.Unlock()
			return err
		}
		if engine && e.cfg.Family == "sglang" {
			r.emitLocked([]engines.Event{{Kind: engines.AllBlocksCleared}})
		}
		r.mu.Unlock()
	}
	return nil
}

// ErrBusy is returned by ClearCache when the family's engine would refuse the reset (busyLocked).
var ErrBusy = errors.New("cache not cleared: requests are running")

// ClearCache drops every cached block: vLLM and SGLang announce AllBlocksCleared, TensorRT-LLM
// (which has no clear event) one removal per block, llama.cpp erases its slots. It refuses when
// the engine refuses its reset (busyLocked): vLLM while a request holds blocks, SGLang while a
// request runs or waits. As vLLM's plain reset, an offload tier (Config.OffloadBlocks) keeps its
// copies: ClearCacheExternal empties it too.
func (e *Engine) ClearCache() error { return e.clearCache(false) }

// ClearCacheExternal is ClearCache that empties the offload tier too, as vLLM's
// /reset_prefix_cache?reset_external=true does (still the one AllBlocksCleared, nothing announced
// for the host). Without an offload tier it is ClearCache.
func (e *Engine) ClearCacheExternal() error { return e.clearCache(true) }

// busyLocked reports whether rank r's engine would refuse a cache reset now; r.mu is held.
//
//   - vLLM v0.31.0 refuses only while blocks are in use: v1/core/sched/scheduler.py
//     Scheduler.reset_prefix_cache returns KVCacheManager.reset_prefix_cache, which is
//     BlockPool.reset_prefix_cache (v1/core/block_pool.py), False while any block but the null
//     block is not free. A waiting request holds none (a preempted one has freed its blocks), so
//     a request that only waits does not stop the reset. The simulator's pool counts blocks held
//     (used) and those promised to an admitted request (reserved: vLLM allocates them when it
//     schedules the request, the simulator as the request grows).
//   - SGLang v0.5.23 refuses unless the scheduler is fully idle: managers/scheduler.py
//     Scheduler.flush_cache asks is_fully_idle, which wants an empty running batch and an empty
//     waiting_queue (a waiting request is enough to refuse; only a paused engine ignores the
//     queue, and the simulator has no pause).
//   - TensorRT-LLM and llama.cpp have no whole-cache reset to follow; the simulator's own clear
//     (POST /sim/clear) refuses while requests run or wait.
func (e *Engine) busyLocked(r *rank) bool {
	held := r.cache != nil && (r.cache.used > 0 || r.cache.reserved > 0)
	if e.cfg.Family == "vllm" {
		return held
	}
	return held || r.running.Load() > 0 || r.waiting.Load() > 0
}

func (e *Engine) clearCache(external bool) error {
	// Every rank's lock is held from the check to the clear, so no request is admitted in
	// between and a refusal leaves every rank as it was.
	for _, r := range e.ranks {
		r.mu.Lock()
	}
	defer func() {
		for _, r := range e.ranks {
			r.mu.Unlock()
		}
	}()
	for _, r := range e.ranks {
		if e.busyLocked(r) {
			return ErrBusy
		}
	}
	if e.cfg.Family == "llamacpp" {
		e.clearLlamaLocked()
		return nil
	}
	for _, r := range e.ranks {
		if e.drain != nil {
			r.cache.removeAll()
			r.emitLocked(r.cache.take())
		} else {
			if external {
				r.cache.clear()
			} else {
				r.cache.clearGPU()
			}
			r.cache.take()
			r.emitLocked([]engines.Event{{Kind: engines.AllBlocksCleared}})
		}
		r.broadcastLocked()
	}
	return nil
}

// ---- events ----

// emit publishes one step's events as one batch (no batch for an empty step).
func (r *rank) emit(evs []engines.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.emitLocked(evs)
}

func (r *rank) emitLocked(evs []engines.Event) {
	if len(evs) == 0 {
		return
	}
	e := r.e
	switch {
	case r.pub != nil:
		r.pub.publish(engines.Batch{Timestamp: float64(time.Now().UnixNano()) / 1e9, Events: evs, DPRank: r.idx, HasDPRank: true})
	case e.drain != nil && !e.cfg.NoEvents:
		e.drain.add(r.idx, evs)
	}
}

func (r *rank) broadcastLocked() {
	close(r.freed)
	r.freed = make(chan struct{})
}

// storedEvent builds the family's BlockStored for blocks [first, last) of s.
func (r *rank) storedEvent(s *seq, first, last int) engines.Event {
	e := r.e
	bs := e.cfg.BlockSize
	ev := engines.Event{Kind: engines.BlockStored, BlockHashes: append([]uint64(nil), s.keys[first:last]...),
		BlockSize: bs, Medium: engines.MediumGPU}
	if first > 0 {
		ev.Parent, ev.HasParent = s.keys[first-1], true
	}
	toks := s.tokens[first*bs : last*bs]
	switch e.cfg.Family {
	case "vllm":
		ev.TokenIDs = append([]uint32(nil), toks...)
		ev.HasExtraKeys = true
		ev.ExtraKeys = make([][]any, last-first)
		if s.ex != nil {
			if ks, err := hashcore.ExtraKeys(s.ex, last*bs, bs); err == nil && len(ks) >= last {
				copy(ev.ExtraKeys, ks[first:last])
			}
			if m := e.lora(s.ex.LoRAName); m != nil {
				ev.LoRAName, ev.LoRAID, ev.HasLoRAID = m.name, m.id, true
			}
		}
		ev.GroupIdx, ev.HasGroupIdx = 0, true
		ev.SpecKind = "full_attention"
	case "sglang":
		ev.TokenIDs = append([]uint32(nil), toks...)
		if s.ex != nil {
			ev.CacheSalt = s.ex.CacheSalt
		}
		ev.SessionID = s.session // the array layout (v0.5.18) drops it
	case "trtllm":
		ev.TokenIDs = append([]uint32(nil), toks...)
		ev.BlockTokens = make([][]uint32, last-first)
		ev.CacheLevels = make([]int, last-first)
		ev.Priorities = make([]int, last-first)
		for i := range ev.BlockTokens {
			ev.BlockTokens[i] = ev.TokenIDs[i*bs : (i+1)*bs]
			ev.Priorities[i] = trtDefaultPriority
		}
	}
	return ev
}

const trtDefaultPriority = 35

// ---- requests ----

// genReq is one generation as the scheduler sees it.
type genReq struct {
	rank      int // -1: the least loaded rank
	prompt    []uint32
	maxTokens int
	ex        *hashcore.Extras
	session   string // SGLang session_id, on the request's stores where the release's wire has it
	// remote is the number of leading prompt tokens whose KV a prefill engine computed (P/D
	// decode side): they cost no prefill time and count as cached.
	remote int
	// first are output tokens already sampled elsewhere (TensorRT-LLM generation_only).
	first []uint32
	// prefillOnly stops after the prefill step's one token (P/D prefill side).
	prefillOnly bool
	// skipRead: the request does not read the prefix cache (vLLM's skip_reading_prefix_cache,
	// which prompt_logprobs turns on: cached positions would have no prompt logprobs). Its blocks
	// are still stored.
	skipRead bool
	// onPrefilled runs once the prompt is computed (the first token is about to stream); onToken
	// for every output token.
	onPrefilled func(cached int)
	onToken     func(i int, tok uint32)
	// hold, when set, runs after prefill while the request still holds its blocks (SGLang's
	// prefill engine waits for the decode engine to fetch the KV).
	hold func(ctx context.Context) error
}

type genRes struct {
	output []uint32
	cached int
	rank   int
	blocks []int // block ids (vLLM remote_block_ids)
	finish string
}

// errTooLong is a prompt + max_tokens beyond the context length.
type errTooLong struct{ prompt, max, limit int }

func (e errTooLong) Error() string {
	return fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
		e.limit, e.prompt+e.max, e.prompt, e.max)
}

func (e *Engine) pickRank(want int) (*rank, error) {
	if want >= 0 {
		if want >= len(e.ranks) {
			return nil, fmt.Errorf("data parallel rank %d out of range [0, %d)", want, len(e.ranks))
		}
		return e.ranks[want], nil
	}
	best := e.ranks[0]
	for _, r := range e.ranks[1:] {
		if r.running.Load()+r.waiting.Load() < best.running.Load()+best.waiting.Load() {
			best = r
		}
	}
	return best, nil
}

// generate runs one request: queue, prefix-cache admission, chunked prefill, decode, release.
func (e *Engine) generate(ctx context.Context, q *genReq) (*genRes, error) {
	total := len(q.prompt) + q.maxTokens
	if total > e.cfg.MaxModelLen {
		return nil, errTooLong{len(q.prompt), q.maxTokens, e.cfg.MaxModelLen}
	}
	r, err := e.pickRank(q.rank)
	if err != nil {
		return nil, err
	}
	if d := e.faults.get().DelayMS; d > 0 {
		if err := sleepCtx(ctx, time.Duration(d)*time.Millisecond); err != nil {
			return nil, err
		}
	}
	if r.cache == nil {
		return r.generateLlama(ctx, q)
	}
	if !r.cache.fits(total) {
		return nil, fmt.Errorf("request needs %d blocks, the KV cache has %d", ceilDiv(total, e.cfg.BlockSize), r.cache.capacity())
	}
	s := &seq{ex: q.ex, session: q.session, skipRead: q.skipRead}
	keyer, err := e.newKeyer(q.ex)
	if err != nil {
		return nil, err
	}
	s.tokens = append(s.tokens, q.prompt...)
	if s.keys, err = keyer.append(q.prompt); err != nil {
		return nil, err
	}

	// Queue for a slot (FIFO), then for blocks.
	r.waiting.Add(1)
	select {
	case r.slots <- struct{}{}:
	case <-ctx.Done():
		r.waiting.Add(-1)
		return nil, ctx.Err()
	}
	defer func() {
		<-r.slots
		r.mu.Lock()
		r.broadcastLocked()
		r.mu.Unlock()
	}()
	for {
		r.mu.Lock()
		ok := r.cache.admit(s, len(q.prompt), total)
		freed := r.freed
		r.mu.Unlock()
		if ok {
			break
		}
		select {
		case <-freed:
		case <-ctx.Done():
			r.waiting.Add(-1)
			return nil, ctx.Err()
		}
	}
	r.waiting.Add(-1)
	r.running.Add(1)
	defer r.running.Add(-1)
	r.requests.Add(1)
	r.promptTokens.Add(uint64(len(q.prompt)))

	res := &genRes{rank: r.idx, finish: "length"}
	bs := e.cfg.BlockSize
	storeEarly := e.cfg.Family == "vllm" // vLLM announces blocks when it schedules them
	computed := s.hitN * bs
	remote := min(q.remote, len(q.prompt)-1) / bs * bs
	res.cached = computed
	if remote > computed {
		res.cached = remote
	}

	finish := func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !storeEarly {
			// SGLang and TensorRT-LLM insert a request's blocks into their trees once computed;
			// decode blocks when the request finishes.
			r.cache.store(s, computed/bs)
			if e.cfg.Family == "trtllm" && !e.cfg.NoTRTPartialBlocks {
				r.storeTRTPartial(s, computed)
			}
		}
		r.cache.release(s)
		r.emitLocked(r.cache.take())
		r.broadcastLocked()
	}
	defer finish()

	if s.offN > 0 {
		// Blocks loaded from the offload tier: a transfer, not a prefill, cached on the GPU as
		// computed ones are (vLLM announces them when it schedules them).
		end := computed + s.offN*bs
		r.mu.Lock()
		if !r.cache.grow(s, end) {
			r.mu.Unlock()
			return nil, errors.New("KV cache exhausted")
		}
		r.cache.store(s, end/bs)
		r.emitLocked(r.cache.take())
		r.mu.Unlock()
		if err := sleepCtx(ctx, time.Duration(end-computed)*e.cfg.OffloadPerToken); err != nil {
			return res, err
		}
		computed = end
		res.cached = max(res.cached, computed)
	}

	// Prefill, chunk by chunk. Remote KV (P/D) arrives without compute time.
	for computed < len(q.prompt) {
		end := min(computed+e.cfg.PrefillChunk, len(q.prompt))
		if computed < remote {
			end = remote
		}
		r.mu.Lock()
		if !r.cache.grow(s, end) {
			r.mu.Unlock()
			return nil, errors.New("KV cache exhausted")
		}
		if storeEarly {
			r.cache.store(s, end/bs)
		}
		r.emitLocked(r.cache.take())
		r.mu.Unlock()
		var work int
		if end > remote {
			work = end - max(computed, remote)
		}
		if err := sleepCtx(ctx, time.Duration(work)*e.cfg.PrefillPerToken); err != nil {
			return res, err
		}
		computed = end
		if !storeEarly {
			r.mu.Lock()
			r.cache.store(s, computed/bs)
			r.emitLocked(r.cache.take())
			r.mu.Unlock()
		}
	}
	r.cachedTokens.Add(uint64(res.cached))
	res.blocks = make([]int, 0, len(s.blocks))
	for _, b := range s.blocks {
		res.blocks = append(res.blocks, int(b))
	}
	if q.hold != nil {
		if err := q.hold(ctx); err != nil {
			return res, err
		}
	}
	if q.onPrefilled != nil {
		q.onPrefilled(res.cached)
	}

	// Decode: the prefill step samples token 1; each later token costs one decode step, which
	// computes the previous token's KV (completing blocks as it goes).
	maxTokens := q.maxTokens
	if q.prefillOnly {
		maxTokens = min(maxTokens, 1)
	}
	h := promptHash(q.prompt)
	for i := 0; i < maxTokens; i++ {
		if i > 0 {
			if err := sleepCtx(ctx, e.cfg.DecodePerToken); err != nil {
				return res, err
			}
			computed = len(s.tokens)
			r.mu.Lock()
			if !r.cache.grow(s, computed) {
				r.mu.Unlock()
				return res, errors.New("KV cache exhausted")
			}
			if storeEarly {
				r.cache.store(s, computed/bs)
				r.emitLocked(r.cache.take())
			}
			r.mu.Unlock()
		}
		var tok uint32
		if i < len(q.first) {
			tok = q.first[i]
		} else {
			tok = e.words[(h+uint64(i))%uint64(len(e.words))]
		}
		res.output = append(res.output, tok)
		s.tokens = append(s.tokens, tok)
		nk, err := keyer.append([]uint32{tok})
		if err != nil {
			return res, err
		}
		s.keys = append(s.keys, nk...)
		r.genTokens.Add(1)
		if q.onToken != nil {
			q.onToken(i, tok)
		}
	}
	return res, nil
}

// storeTRTPartial caches the trailing partial block (TensorRT-LLM partial reuse) of the first n
// tokens of s.
func (r *rank) storeTRTPartial(s *seq, n int) {
	bs := r.e.cfg.BlockSize
	full := n / bs
	if n%bs == 0 || full != s.storedN || full >= len(s.blocks) {
		return
	}
	var parent uint64
	if full > 0 {
		parent = s.keys[full-1]
	}
	toks := append([]uint32(nil), s.tokens[full*bs:n]...)
	key := trtBlockKey(parent, toks)
	ev := engines.Event{Kind: engines.BlockStored, BlockHashes: []uint64{key}, BlockSize: bs, Medium: engines.MediumGPU,
		TokenIDs: toks, BlockTokens: [][]uint32{toks}, CacheLevels: []int{0}, Priorities: []int{trtDefaultPriority}}
	if full > 0 {
		ev.Parent, ev.HasParent = parent, true
	}
	r.cache.storePartial(s, key, ev)
}

// ---- keys ----

// keyer extends a request's block keys as tokens are appended.
type keyer interface {
	append(toks []uint32) ([]uint64, error)
}

type coreKeyer struct{ s *hashcore.Sequence }

func (k coreKeyer) append(toks []uint32) ([]uint64, error) {
	ks, err := k.s.Append(toks...)
	return append([]uint64(nil), ks...), err
}

// trtKeyer chains TensorRT-LLM V1 keys over full blocks.
type trtKeyer struct {
	bs      int
	parent  uint64
	pending []uint32
}

func (k *trtKeyer) append(toks []uint32) ([]uint64, error) {
	k.pending = append(k.pending, toks...)
	var out []uint64
	for len(k.pending) >= k.bs {
		k.parent = trtBlockKey(k.parent, k.pending[:k.bs])
		out = append(out, k.parent)
		k.pending = k.pending[k.bs:]
	}
	return out, nil
}

func (e *Engine) newKeyer(ex *hashcore.Extras) (keyer, error) {
	if e.hasher != nil {
		return coreKeyer{e.hasher.NewSequence(e.hashExtras(ex))}, nil
	}
	return &trtKeyer{bs: e.cfg.BlockSize}, nil
}

// hashExtras is what the release hashes for a request's extras: the flat ones its events publish,
// or from vLLM v0.31.0 (a contract with tagged extra keys) the tagged form with the adapter's path.
func (e *Engine) hashExtras(ex *hashcore.Extras) *hashcore.Extras {
	if ex == nil || !e.ct.TaggedExtraKeys() {
		return ex
	}
	t := *ex
	t.Tagged = true
	if m := e.lora(ex.LoRAName); m != nil {
		t.LoRAPath = m.path
	}
	return &t
}

// ---- helpers ----

func promptHash(p []uint32) uint64 {
	h := fnv.New64a()
	var b [4]byte
	for _, t := range p {
		b[0], b[1], b[2], b[3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
		h.Write(b[:])
	}
	return h.Sum64()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitBriefly is one poll interval of a poll-with-deadline loop.
func waitBriefly(ctx context.Context) { _ = sleepCtx(ctx, 2*time.Millisecond) }

// outputText is the word cycle generated text is drawn from: plain words, so any tokenizer
// decodes them cleanly and outputs are deterministic per prompt.
const outputText = " The quick brown fox jumps over the lazy dog while the simulator keeps its cache warm and its answers short and plain."
