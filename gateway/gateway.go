// Package gateway owns the rule runtimes and their control: one runtime per rule (its endpoints
// with health, its inventory fed by the endpoints' event streams, its keyer and router, and the
// certificate verdict that decides whether KV-exact may run), the health prober, the per-endpoint
// exactness checks, the status, and the client and admin listeners' servers (serve.go). Rules
// change live through the admin API; a change rebuilds that rule's runtime and tears the old one
// down (sockets and goroutines included), except a change of its endpoint list alone, which keeps
// the runtime (membership.go). The front ends that ask it where a request goes (gateway/proxy,
// gateway/epp) are wired to it by gateway/assemble, the one place a configuration becomes a
// running gateway.
package gateway

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
	"github.com/kvexact/kvexact/gateway/exactness"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/hub"
	"github.com/kvexact/kvexact/gateway/ingest"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/kvgroups"
	"github.com/kvexact/kvexact/gateway/resolver"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
	"github.com/kvexact/kvexact/internal/buildinfo"
)

// Options configure a Gateway.
type Options struct {
	Config *rules.Config
	// Certificates are the loaded certificates (ctk certify); a rule runs KV-exact only on endpoints
	// one of them covers for the rule's staged profile.
	Certificates []*certificate.Certificate
	// CertificatePaths are re-read by Reload (and listed in the status).
	CertificatePaths []string
	// CertificateKey verifies signed certificates when set.
	CertificateKey ed25519.PublicKey
	// RequireSigned refuses, on reload, certificates not verified with CertificateKey (the
	// gateway's --require-signed; the command checks the certificates it starts with).
	RequireSigned bool
	// ExpiryCheck is how often certificate expiry is checked while running (default 1s).
	ExpiryCheck time.Duration
	// ParityCheckFirst and ParitySampleEvery tune the live parity watch: every stored-block event
	// is checked for the first ParityCheckFirst after each (re)connect, restart or clear (default
	// 64), then one in ParitySampleEvery (default 16; 1 checks all).
	ParityCheckFirst  int
	ParitySampleEvery int
	// ResumeAfterBlocks is how many matching blocks the watch must see after a restart before
	// KV-exact resumes on the endpoint (default DefaultResumeAfterBlocks).
	ResumeAfterBlocks int
	// ShortfallHits is how many consecutive KV-exact hits predicting at least one block, with no
	// cached token reported by the engine, suspend the endpoint (default DefaultShortfallHits).
	ShortfallHits int
	// TokenCheckGrace and TokenDriftChecks tune the router binding's token-side check: how long
	// after a response the routed prompt's deepest block must be published, and how many
	// consecutive prompts not reproduced suspend the endpoint (defaults DefaultTokenCheckGrace,
	// DefaultTokenDriftChecks).
	TokenCheckGrace  time.Duration
	TokenDriftChecks int
	// Tokenizers is the tokenizer pool; nil builds one from Config.Tokenizers.
	Tokenizers *tokenize.Pool
	Registry   *prometheus.Registry
	Log        *slog.Logger
	Now        func() time.Time
	// ProbeInterval for active health probes (default 5s; negative disables).
	ProbeInterval time.Duration
	// HTTPTransport reaches the engines (default: http.DefaultTransport).
	HTTPTransport http.RoundTripper
	// ReprobeInterval re-checks every certified endpoint's identity and tokenizer (default 60s;
	// negative disables). A failure fences KV-exact for that endpoint.
	ReprobeInterval time.Duration
	// AdmissionBackoff is the wait before an admission probe that was refused is retried, doubled
	// on each refusal up to 5 minutes (default 1s).
	AdmissionBackoff time.Duration
	// AdmissionEventTimeout bounds an admission probe's wait for its subscription and its own
	// KV events, as ctk certify's --event-timeout does (default 15s).
	AdmissionEventTimeout time.Duration
	// CertificateWatch is how often the certificate files are checked for new content (a
	// Kubernetes Secret volume, a file a CI job rewrites); a change reloads them as SIGHUP does
	// (0: not watched).
	CertificateWatch time.Duration
	// TokenizerRetry is how often a rule whose tokenizer could not be loaded (ExactStatus code
	// "tokenizer") tries again, so it becomes exact by itself once the files appear (default
	// DefaultTokenizerRetry; it is also the pool's failure memory when the gateway builds the pool).
	TokenizerRetry time.Duration
	// EventReplayTimeout bounds one replay exchange with an engine's replay socket (0: ingest's
	// default, 15s); a failed first replay redials and asks again.
	EventReplayTimeout time.Duration
	// EngineLoadInterval scrapes each engine's own request gauges (engines.LoadGauges) this often
	// and adds what they count beyond this gateway's own in-flight share (other replicas') to the
	// endpoint's load (0: off; at least engineload.MinInterval).
	EngineLoadInterval time.Duration
	// PeerSnapshot, when set, seeds each endpoint's inventory at start from a peer replica's
	// snapshot where the engine's replay proves it current (nil: off, every endpoint rebuilds
	// from replay).
	PeerSnapshot *PeerSnapshot
}

// DefaultTokenizerRetry is Options.TokenizerRetry's default.
const DefaultTokenizerRetry = 30 * time.Second

// hubFetchTimeout bounds one tokenizer fetch from a hub (listing and every file).
const hubFetchTimeout = 2 * time.Minute

// Gateway is the rule runtimes of a running gateway and their control (assemble.Gateway adds the
// front ends and listeners).
type Gateway struct {
	opts    Options
	cfg     *rules.Config
	store   *rules.Store
	pool    *tokenize.Pool
	keys    *route.KeyCache // shared by every rule's keyer (entries are per key space); nil: off
	reg     *prometheus.Registry
	log     *slog.Logger
	now     func() time.Time
	ingestM *ingest.Metrics
	routeM  *route.Metrics
	statusM *statusMetrics

	adm       *admissions
	lproofs   *adapterProofs // adapters the gateway proved itself (adapterproofs.go)
	applyMu   sync.Mutex
	mu        sync.RWMutex
	runtimes  map[string]*ruleRuntime // by rule name
	routes    resolver.Table          // the runtimes' routers by listener and model, for the front ends
	certs     []*certificate.Certificate
	certPaths []string
	removed   []func(rule string) // OnRuleRemoved hooks

	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	started atomic.Bool // Start built the rules (readiness)
}

// ruleRuntime is everything one rule runs.
type ruleRuntime struct {
	rule     *rules.Rule
	contract *contracts.Contract
	router   *route.Router
	index    *inventory.Index
	// lower are the lower tiers' residencies (host memory, storage, a shared store), one per
	// tier, with the same endpoint ids as index.
	lower   []route.LowerIndex
	groups  *kvgroups.Index // KV-cache groups beside full attention (hybrid models)
	eps     []*route.Endpoint
	keyer   *route.PromptKeyer
	exact   ExactStatus
	binding string             // the ingest binding its sources run with
	sources map[string]*source // by endpoint: each event source runs and stops on its own
	errs    sync.Map           // endpoint → last ingest error
	// epExact is each endpoint's runtime exactness (parallel to eps); expires is when the earliest
	// certificate granting coverage here stops being valid (zero: none granted).
	epExact []*endpointExact
	watches map[string]*endpointWatch // by endpoint, where events are watched
	expires time.Time
	lora    adapterLists // what each endpoint lists (rules.Rule.DiscoverAdapters; adapters.go)
	// adapters are, per endpoint whose certificate entry (or admission) records them, the LoRA
	// names it proved, with those the gateway proved itself since (adapterproofs.go).
	adapters map[inventory.EndpointID][]string
	// ranks is the per-rank residency of the data-parallel endpoints (route.Ranks).
	ranks *route.Ranks
}

// addRanks registers a data-parallel endpoint's ranks (one ZeroMQ publisher each) with the
// runtime's per-rank index, and gives the router's endpoint the family's rank header.
func (rt *ruleRuntime) addRanks(e rules.Endpoint, ep *route.Endpoint) error {
	n := len(e.Events.ZMQ)
	if n < 2 {
		return nil
	}
	ep.DPRanks = n
	if fam, err := registry.Lookup(rt.contract.Family); err == nil {
		ep.RankHeader = fam.DPRankHeader()
	}
	return rt.ranks.Add(ep.ID, e.Name, n)
}

// ExactStatus says whether KV-exact runs for a rule, with which binding, and why (not).
type ExactStatus struct {
	Mode          int    `json:"mode"`
	Enabled       bool   `json:"enabled"`
	Binding       string `json:"binding,omitempty"`
	ProfileDigest string `json:"profile_digest,omitempty"`
	Reason        string `json:"reason,omitempty"`
	// Code is Reason's stable code (the reason label of kvexact_rule_exact_enabled, a closed set:
	// exactOffCodes), "" when enabled.
	Code      string            `json:"code,omitempty"`
	Endpoints map[string]string `json:"endpoints,omitempty"` // endpoint → "certified (engine)" or why not
	// Tokenizer is where the rule's tokenizer was loaded from (nil while it is missing).
	Tokenizer *TokenizerSource `json:"tokenizer,omitempty"`
}

// TokenizerSource records the tokenizer files a rule's profile was computed from: their folder,
// each file's sha256 (tokenizer.json and tokenizer_config.json are the profile's own digests), and
// for files fetched from a hub the repository and the commit the revision resolved to.
type TokenizerSource struct {
	Dir    string            `json:"dir"`
	Repo   string            `json:"repo,omitempty"`
	Commit string            `json:"commit,omitempty"`
	Files  map[string]string `json:"files"`
}

// New builds a gateway from validated options (it starts nothing; see Start).
func New(opts Options) (*Gateway, error) {
	if opts.Config == nil {
		return nil, errors.New("gateway: no configuration")
	}
	for _, c := range opts.Certificates {
		if err := CheckAdmission(c); err != nil {
			return nil, err
		}
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.TokenizerRetry <= 0 {
		opts.TokenizerRetry = DefaultTokenizerRetry
	}
	if ps := opts.PeerSnapshot; ps != nil {
		c := *ps
		if err := c.check(); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		opts.PeerSnapshot = &c
	}
	if opts.Tokenizers == nil {
		po := []tokenize.PoolOption{tokenize.WithRetryAfter(opts.TokenizerRetry)}
		if h := opts.Config.Tokenizers.Hub; h != nil {
			srcs := map[string]hub.Source{}
			for m, hm := range h.Models {
				srcs[m] = h.Source(hm)
			}
			po = append(po, tokenize.WithHub(&hub.Client{CacheDir: h.CacheDir, HTTP: &http.Client{Timeout: hubFetchTimeout}}, srcs, hubFetchTimeout))
		}
		for m, dir := range opts.Config.Tokenizers.Folders {
			po = append(po, tokenize.WithFolder(m, dir))
		}
		segBytes := int64(tokenize.DefaultSegmentCacheBytes)
		if n := opts.Config.Tokenizers.SegmentCacheBytes; n != nil {
			segBytes = *n
		}
		po = append(po, tokenize.WithSegmentCacheBytes(segBytes))
		opts.Tokenizers = tokenize.NewPool(opts.Config.Tokenizers.Root, po...)
	}
	// The build, the Go runtime and the process, beside the gateway's own series.
	for _, c := range []prometheus.Collector{buildinfo.Collector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := opts.Registry.Register(c); err != nil {
			return nil, err
		}
	}
	if err := registerSegmentCacheMetrics(opts.Registry, opts.Tokenizers); err != nil {
		return nil, err
	}
	keyBytes := int64(route.DefaultKeyCacheBytes)
	if n := opts.Config.Tokenizers.KeyCacheBytes; n != nil {
		keyBytes = *n
	}
	keys := route.NewKeyCache(keyBytes)
	if err := registerKeyCacheMetrics(opts.Registry, keys); err != nil {
		return nil, err
	}
	im, err := ingest.NewMetrics(opts.Registry)
	if err != nil {
		return nil, err
	}
	g := &Gateway{
		opts: opts, cfg: opts.Config, store: rules.NewStore(opts.Config), pool: opts.Tokenizers, keys: keys, reg: opts.Registry,
		log: opts.Log, now: opts.Now, ingestM: im, routeM: route.NewMetrics(opts.Registry), statusM: newStatusMetrics(opts.Registry),
		adm: newAdmissions(opts.Registry), lproofs: newAdapterProofs(opts.Registry), runtimes: map[string]*ruleRuntime{}, certs: opts.Certificates, certPaths: opts.CertificatePaths,
	}
	if err := opts.Registry.Register(newHealthCollector(g)); err != nil {
		return nil, err
	}
	return g, nil
}

// Store is the live rule set (the admin API edits it).
func (g *Gateway) Store() *rules.Store { return g.store }

// Registry holds every metric of the gateway.
func (g *Gateway) Registry() *prometheus.Registry { return g.reg }

// Start builds every rule's runtime (subscribers dial with retry, so engines may come up later) and
// starts the health prober. Listeners are the caller's (see Serve).
func (g *Gateway) Start(ctx context.Context) error {
	g.ctx, g.cancel = context.WithCancel(ctx)
	for _, r := range g.store.List() {
		if err := g.apply(r); err != nil {
			return fmt.Errorf("rule %q: %w", r.Name, err)
		}
	}
	g.store.Watch(func(ch rules.Change) {
		if ch.New != nil {
			if err := g.apply(ch.New.Clone()); err != nil {
				g.log.Error("gateway: rule change could not be applied", "rule", ch.New.Name, "err", err)
			}
			return
		}
		g.remove(ch.Old.Name)
	})
	if g.opts.ReprobeInterval >= 0 {
		iv := g.opts.ReprobeInterval
		if iv == 0 {
			iv = time.Minute
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.runReprobe(g.ctx, iv)
		}()
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.runAdapterDiscovery(g.ctx, iv)
		}()
	} else {
		// Re-probing off: the adapters are read once, at start.
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.runAdapterDiscovery(g.ctx, 0)
		}()
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.runAdmissions(g.ctx)
	}()
	if iv := g.opts.CertificateWatch; iv > 0 && len(g.certPaths) > 0 {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.runCertificateWatch(g.ctx, iv)
		}()
	}
	expiry := g.opts.ExpiryCheck
	if expiry <= 0 {
		expiry = time.Second
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.runExpiry(g.ctx, expiry)
	}()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.runTokenizerRetry(g.ctx, g.opts.TokenizerRetry)
	}()
	if iv := g.engineLoadInterval(); iv > 0 {
		m, err := newEngineLoadMetrics(g.reg, g, iv)
		if err != nil {
			return fmt.Errorf("engine load metrics: %w", err)
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.runEngineLoad(g.ctx, iv, m)
		}()
	}
	if g.opts.ProbeInterval >= 0 {
		p := &health.Prober{Interval: g.opts.ProbeInterval, Client: &http.Client{Transport: g.transport()}}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			p.Run(g.ctx, g.healthTargets)
		}()
	}
	g.started.Store(true)
	return nil
}

func (g *Gateway) transport() http.RoundTripper {
	if g.opts.HTTPTransport != nil {
		return g.opts.HTTPTransport
	}
	return http.DefaultTransport
}

func (g *Gateway) healthTargets() []*health.Endpoint {
	g.mu.RLock()
	defer g.mu.RUnlock()
	var out []*health.Endpoint
	for _, rt := range g.runtimes {
		for _, e := range rt.eps {
			out = append(out, e.Health)
		}
	}
	return out
}

// Close stops every rule runtime and the prober, waiting for their goroutines.
func (g *Gateway) Close() {
	if g.cancel != nil {
		g.cancel()
	}
	g.mu.Lock()
	rts := g.runtimes
	g.runtimes = map[string]*ruleRuntime{}
	g.routes.Clear()
	g.mu.Unlock()
	for _, rt := range rts {
		rt.stop()
	}
	g.wg.Wait()
}

// apply builds a rule's runtime and swaps it in; the old one (if any) is stopped after the swap so
// that requests always find a router.
func (g *Gateway) apply(r *rules.Rule) error {
	// Rule changes, certificate reloads, expiries and admissions all apply from their own
	// goroutines: one at a time, so none builds on a runtime another is replacing.
	g.applyMu.Lock()
	defer g.applyMu.Unlock()
	return g.applyLocked(r)
}

// reevaluate re-applies the rule as it runs now (a certificate expired, an admission's verdict
// came in): read under the apply lock, so a rule change applied meanwhile is never reverted.
func (g *Gateway) reevaluate(name string) error {
	g.applyMu.Lock()
	defer g.applyMu.Unlock()
	rt, ok := g.runtime(name)
	if !ok {
		return nil
	}
	return g.applyLocked(rt.rule.Clone())
}

func (g *Gateway) applyLocked(r *rules.Rule) error {
	if old, ok := g.runtime(r.Name); ok {
		if done, err := g.applyMembership(old, r); done {
			return err
		}
	}
	rt, err := g.build(r)
	if err != nil {
		return err
	}
	g.mu.RLock()
	g.carryAdapters(g.runtimes[r.Name], rt)
	g.mu.RUnlock()
	g.mu.Lock()
	old := g.runtimes[r.Name]
	g.runtimes[r.Name] = rt
	g.routes.Set(g.listenerOf(r), rt.router)
	g.mu.Unlock()
	if old != nil {
		old.stop()
	}
	g.statusM.set(rt)
	g.noteTokenizer(old, rt)
	return nil
}

func (g *Gateway) remove(name string) {
	g.adm.forget(name, nil)
	g.lproofs.forget(name)
	g.mu.Lock()
	old := g.runtimes[name]
	delete(g.runtimes, name)
	g.routes.Remove(name)
	g.mu.Unlock()
	if old != nil {
		old.stop()
		g.routeM.Forget(name)
		for _, e := range old.eps {
			g.ingestM.Forget(name, e.Name)
		}
		g.statusM.forget(name)
		g.statusM.forgetUsage(name)
		g.mu.RLock()
		hooks := g.removed
		g.mu.RUnlock()
		for _, f := range hooks {
			f(name)
		}
	}
}

// OnRuleRemoved registers f to run after a rule was deleted and its runtime stopped: what the
// gateway's callers keep per rule (the proxy's series and transports) goes with it.
func (g *Gateway) OnRuleRemoved(f func(rule string)) {
	g.mu.Lock()
	g.removed = append(g.removed, f)
	g.mu.Unlock()
}

func (rt *ruleRuntime) stop() {
	for _, s := range rt.sources {
		s.cancel()
	}
	for _, s := range rt.sources {
		<-s.done
	}
}

// build makes a rule's runtime: endpoints, inventory, certificate verdict, keyer, router, sources.
func (g *Gateway) build(r *rules.Rule) (*ruleRuntime, error) {
	ct := r.Contract()
	if ct == nil {
		return nil, fmt.Errorf("no contract for %s %s", r.Engine.Family, r.Engine.Release)
	}
	rt := &ruleRuntime{rule: r, contract: ct, index: inventory.New(inventory.Config{CapacityPerEndpoint: r.InventoryCapacity}), groups: kvgroups.New(r.BlockSize),
		ranks: route.NewRanks(inventory.Config{CapacityPerEndpoint: r.InventoryCapacity})}
	for _, t := range engines.LowerTiers {
		if !r.IndexesLowerTiers() {
			break
		}
		rt.lower = append(rt.lower, route.LowerIndex{Tier: t, Index: inventory.New(inventory.Config{CapacityPerEndpoint: r.InventoryCapacity})})
	}
	for i, e := range r.Endpoints {
		id, err := rt.index.AddEndpoint(e.Name)
		if err != nil {
			return nil, err
		}
		for _, l := range rt.lower {
			if lid, err := l.Index.AddEndpoint(e.Name); err != nil || lid != id {
				return nil, fmt.Errorf("endpoints[%d]: %s tier inventory: id %d (%v), want %d", i, l.Tier, lid, err, id)
			}
		}
		h := g.newHealth(r, e)
		h.SetAdminDown(e.AdminDown)
		ep := &route.Endpoint{ID: id, Index: i, Name: e.Name, Address: e.Address, Role: route.Role(e.Role), Weight: e.Weight, Capacity: max(e.CapacityBlocks, 1), MaxRunning: e.MaxRunning, Health: h}
		if err := rt.addRanks(e, ep); err != nil {
			return nil, err
		}
		rt.eps = append(rt.eps, ep)
	}
	certified, binding := g.certify(rt)
	rt.binding = binding
	if rt.exact.Enabled {
		fam, _ := registry.Lookup(ct.Family) // a contract's family is registered (engines/registry's tests)
		kr := fam.KeyRules()
		k := &route.PromptKeyer{Pool: g.pool, BlockExtras: kr.BlockExtras, SaltedRoot: kr.SaltedRoot, TaggedExtras: ct.TaggedExtraKeys(), TruncationSide: kr.TruncationSide, Cache: g.keys}
		if binding == "engine" {
			algo := hashcore.Algorithm(r.HashAlgorithm)
			h, err := hashcore.New(hashcore.Binding{Algorithm: algo, BlockSize: r.BlockSize, Seed: seedFor(ct, r)}, hashcore.Default())
			if err != nil {
				rt.exact.Enabled, rt.exact.Reason, rt.exact.Code = false, "hash binding: "+err.Error(), "hash_binding"
			}
			k.Hasher = h
		} else {
			k.RouterBlockSize = r.BlockSize
		}
		rt.keyer = k
	}
	if err := g.newRouter(rt, certified); err != nil {
		return nil, err
	}
	for i, e := range rt.eps {
		ok := rt.exact.Enabled && certified.Has(e.ID)
		rt.epExact = append(rt.epExact, newEndpointExact(r.Name, e, g.verifyConfig(rt, i), ok, rt.exact.certWhy(e.Name), g.now, g.statusM, g.log))
	}
	if err := g.startSources(rt, binding); err != nil {
		rt.stop()
		return nil, err
	}
	return rt, nil
}

// newHealth is an endpoint's health view, with the rule's breaker and its state changes logged.
func (g *Gateway) newHealth(r *rules.Rule, e rules.Endpoint) *health.Endpoint {
	bcfg := health.BreakerConfig{FailureThreshold: r.Breaker.FailureThreshold, OpenFor: time.Duration(r.Breaker.OpenFor), HalfOpenRequests: r.Breaker.HalfOpenRequests, OriginErrorThreshold: *r.Breaker.OriginErrorThreshold}
	h := health.NewEndpoint(e.Name, e.Address, bcfg)
	h.SetLog(g.log.With("rule", r.Name, "endpoint", e.Name))
	return h
}

// newRouter builds the runtime's router over its endpoints, inventory and certificate verdict.
func (g *Gateway) newRouter(rt *ruleRuntime, certified inventory.Mask) error {
	r := rt.rule
	cfg := route.Config{Rule: r, Endpoints: rt.eps, Index: rt.index, Lower: rt.lower, Groups: rt.groups, Certified: certified, CertifiedAdapters: rt.adapters, Ranks: rt.ranks, Metrics: g.routeM, Now: g.now, Log: g.log}
	if fam, err := registry.Lookup(rt.contract.Family); err == nil {
		cfg.HitLimit = fam.HitLimit // the engine computes the last prompt token: scores stop there
	}
	if rt.exact.Enabled {
		cfg.Keyer = rt.keyer
	} else {
		cfg.CertReason = rt.exact.Reason
		if cfg.CertReason == "" {
			cfg.CertReason = "KV-exact is not enabled for this rule"
		}
	}
	router, err := route.New(cfg)
	if err != nil {
		return err
	}
	rt.router = router
	return nil
}

// seedFor returns the seed hashcore wants: the one the engine roots in (the rule's PYTHONHASHSEED,
// else the release's default seed for the algorithm), none for the others; nil where the engine's
// roots are random, which hashcore then refuses with the reason.
func seedFor(ct *contracts.Contract, r *rules.Rule) *string {
	seed, _ := ct.EngineSeed(r.HashAlgorithm, r.Seed)
	return seed
}

// certify decides, from the certificates, which endpoints may run KV-exact and with which binding.
func (g *Gateway) certify(rt *ruleRuntime) (inventory.Mask, string) {
	r, ct := rt.rule, rt.contract
	st := ExactStatus{Mode: r.KVExactMode, Endpoints: map[string]string{}}
	defer func() { rt.exact = st }()
	g.adm.forget(r.Name, func(name string) bool { return containsEndpoint(r.Endpoints, name) })
	// The ingest binding when nothing is proven: what the engine publishes where it can be used.
	fallback := ct.Hash.DefaultBinding
	if r.Binding == "engine" || r.Binding == "router" {
		fallback = r.Binding
	}
	switch {
	case r.KVExactMode == rules.KVExactOff:
		st.Reason, st.Code = "kvExactMode is 0", "mode_off"
		return inventory.Mask{}, fallback
	case !ct.HasEvents():
		st.Reason, st.Code = ct.Hash.NoneReason, "no_events"
		return inventory.Mask{}, "none"
	case len(r.Models) != 1:
		st.Reason, st.Code = "KV-exact binds one certified profile per rule: list exactly one model in models", "models"
		return inventory.Mask{}, fallback
	}
	tok, err := g.pool.Get(r.Models[0])
	if err != nil {
		st.Reason, st.Code = "tokenizer: "+err.Error(), "tokenizer"
		return inventory.Mask{}, fallback
	}
	jsonSHA, cfgSHA := tok.Files()
	st.Tokenizer = &TokenizerSource{Dir: tok.Dir(), Files: map[string]string{"tokenizer.json": jsonSHA, "tokenizer_config.json": cfgSHA}}
	if snap := g.pool.Snapshot(r.Models[0]); snap != nil {
		st.Tokenizer.Dir, st.Tokenizer.Repo, st.Tokenizer.Commit = snap.Dir, snap.Repo, snap.Commit
		for n, d := range snap.Files {
			st.Tokenizer.Files[n] = d
		}
	}
	prof := certificate.NewProfile(ct.Family, ct.ID, r.Models[0], jsonSHA, cfgSHA, tok.Config().ChatTemplate, r.BlockSize, r.Binding, r.HashAlgorithm, r.Seed)
	st.ProfileDigest = prof.Digest()
	g.mu.RLock()
	certs := g.certs
	g.mu.RUnlock()
	if len(certs) == 0 {
		st.Reason, st.Code = "no certificate loaded (run ctk certify and start the gateway with --certificate)", "no_certificate"
		return inventory.Mask{}, fallback
	}
	now := g.now()
	cov := map[string][]certificate.Coverage{}
	admitted := map[string]string{}
	for i, e := range rt.eps {
		id := IdentityOf(r, i)
		c, got, why := certificate.CoversProfile(certs, prof, id, now)
		if got != nil {
			cov[e.Name] = got
			rt.noteExpiry(c.ExpiresAt)
			if ce := c.Entry(e.Name); ce != nil {
				rt.setProvenAdapters(e.ID, ce.Adapters, g.lproofs.provedOn(r.Name, id, st.ProfileDigest))
			}
			continue
		}
		// Not listed by a certificate that admits endpoints by probe: the admission's verdict.
		if acov, adapters, until, awhy, ok := g.adm.covers(r.Name, certs, st.ProfileDigest, id, now); ok {
			if acov != nil {
				cov[e.Name], admitted[e.Name] = acov, awhy
				rt.setProvenAdapters(e.ID, adapters, g.lproofs.provedOn(r.Name, id, st.ProfileDigest))
				rt.noteExpiry(until)
				continue
			}
			why = awhy
		}
		st.Endpoints[e.Name] = why
	}
	binding := resolveBinding(r.Binding, ct, cov)
	var mask inventory.Mask
	for _, e := range rt.eps {
		if c := cov[e.Name]; c != nil {
			if hasCoverage(c, binding) {
				mask.Set(e.ID)
				st.Endpoints[e.Name] = "certified (" + binding + ")"
				if a := admitted[e.Name]; a != "" {
					st.Endpoints[e.Name] = "certified (" + binding + "; " + a + ")"
				}
			} else {
				st.Endpoints[e.Name] = fmt.Sprintf("certified for %v, not for the %s binding this rule uses", c, binding)
			}
		}
	}
	if mask.Len() == 0 {
		names := make([]string, 0, len(st.Endpoints))
		for n := range st.Endpoints {
			names = append(names, n)
		}
		sort.Strings(names)
		var why []string
		for _, n := range names {
			why = append(why, n+": "+st.Endpoints[n])
		}
		st.Reason, st.Code = "no endpoint is certified for this rule's profile: "+strings.Join(why, "; "), "no_endpoint_certified"
		return mask, fallback
	}
	st.Enabled, st.Binding = true, binding
	return mask, binding
}

// resolveBinding turns auto into the strongest binding the certificate proves for the most
// endpoints: engine where hash parity is proven, else router where the events carry tokens.
func resolveBinding(want string, ct *contracts.Contract, cov map[string][]certificate.Coverage) string {
	if want == "engine" || want == "router" {
		return want
	}
	count := map[string]int{}
	for _, c := range cov {
		for _, x := range c {
			count[string(x)]++
		}
	}
	if ct.SupportsBinding("engine") && count["engine"] > 0 && count["engine"] >= count["router"] {
		return "engine"
	}
	if ct.SupportsBinding("router") && count["router"] > 0 {
		return "router"
	}
	return ct.Hash.DefaultBinding
}

func hasCoverage(c []certificate.Coverage, binding string) bool {
	for _, x := range c {
		if string(x) == binding {
			return true
		}
	}
	return false
}

// source is one endpoint's running event source (and its identity probe).
type source struct {
	src    ingest.Source
	cancel context.CancelFunc
	done   chan struct{}
}

// startSources starts one event source per endpoint that publishes events and has none running
// yet (a membership change keeps the others' running). In mode 1 only prefill endpoints are
// scored, so only they are subscribed.
func (g *Gateway) startSources(rt *ruleRuntime, binding string) error {
	r := rt.rule
	if !rt.contract.HasEvents() || binding == "none" {
		return nil
	}
	if rt.sources == nil {
		rt.sources = map[string]*source{}
	}
	for i, e := range r.Endpoints {
		ep := rt.eps[i]
		if r.KVExactMode == rules.KVExactPD && ep.Role != route.RolePrefill {
			continue
		}
		if len(e.Events.ZMQ) == 0 && e.Events.Drain == "" {
			continue
		}
		if rt.sources[e.Name] != nil {
			continue
		}
		ranks := len(e.Events.ZMQ)
		if ranks == 0 {
			ranks = 1 // the drain poller
		}
		h, x := ep.Health, rt.epExact[i]
		h.SetEventRanks(ranks)
		ctx, cancel := context.WithCancel(g.ctx)
		var hasher *hashcore.Hasher
		tagged := false
		if binding == "engine" && rt.keyer != nil {
			hasher, tagged = rt.keyer.Hasher, rt.keyer.TaggedExtras
		}
		ew, err := g.newEndpointWatch(rt.epExact[i], r.Engine.Family, r.BlockSize, hasher, tagged)
		if err != nil {
			cancel()
			return fmt.Errorf("endpoints[%d]: live parity watch: %w", i, err)
		}
		if rt.watches == nil {
			rt.watches = map[string]*endpointWatch{}
		}
		rt.watches[e.Name] = ew
		index, lower, id, rule, name := rt.index, rt.lower, ep.ID, r.Name, e.Name
		ew.drop = func() {
			for _, l := range lower {
				_ = l.Index.Clear(id)
			}
			if index.Clear(id) == nil {
				g.log.Warn("inventory dropped: the engine runs a new process", "rule", rule, "endpoint", name)
			}
		}
		if rt.exact.Enabled {
			go g.probeProcess(ctx, ew) // the process identity the certificate's engine runs as
		}
		src, err := ingest.New(ingest.Config{
			Rule: r.Name, Endpoint: e.Name, Family: r.Engine.Family, Release: r.Engine.Release,
			Binding: ingest.Binding(binding), BlockSize: r.BlockSize, Publish: e.Events.ZMQ, Replay: e.Events.Replay, ReplayGaps: true, ReplayFirst: true, ClearUnreplayed: true,
			ReplayTimeout: g.opts.EventReplayTimeout,
			DrainURL:      e.Events.Drain, QueueLimit: e.Events.QueueLimit, Metrics: g.ingestM, Logger: g.log, Trace: func(t ingest.Trace) { eventConnection(h, x, e.Events.Replay, t); ew.trace(t) },
			Groups: rt.groups.Endpoint(ep.ID), Snapshot: g.seedFrom(r.Name, e), Tiers: r.IndexesLowerTiers(),
		})
		if err != nil {
			cancel()
			return fmt.Errorf("endpoints[%d].events: %w", i, err)
		}
		apply := ingest.Into(rt.index, ep.ID, g.ingestM, r.Name, e.Name, g.log)
		if len(rt.ranks.Of(ep.ID)) > 0 {
			apply = intoRanks(apply, rt.ranks, ep.ID)
		}
		for _, l := range rt.lower {
			apply = ingest.IntoTier(apply, l.Tier, l.Index, ep.ID, g.log)
		}
		s := &source{src: src, cancel: cancel, done: make(chan struct{})}
		rt.sources[e.Name] = s
		go func() {
			defer close(s.done)
			if err := src.Run(ctx, apply); err != nil {
				rt.errs.Store(e.Name, err.Error())
				g.log.Error("gateway: event source stopped", "rule", r.Name, "endpoint", e.Name, "err", err)
			}
		}()
	}
	return nil
}

// eventConnection keeps the endpoint's health and exactness in step with its event streams: a
// rank is synchronized once connected and, where it has a replay address, once the replay that
// rebuilds its inventory has completed (ingest applies no live message before it: ReplayFirst).
// While any rank is not, KV-exact holds the endpoint (exactness.Unsynced).
func eventConnection(h *health.Endpoint, x *endpointExact, replay []string, t ingest.Trace) {
	switch {
	case t.Type == "connect":
		if t.Rank < len(replay) && replay[t.Rank] != "" {
			h.SetEventState(t.Rank, health.EventsReplaying)
		} else {
			h.SetEventState(t.Rank, health.EventsSynced)
		}
	case t.Type == "replay" && t.Reason == "completed":
		h.SetEventState(t.Rank, health.EventsSynced)
	case t.Type == "disconnect", t.Type == "error" && (t.Reason == "dial" || t.Reason == "http"):
		h.SetEventState(t.Rank, health.EventsDown)
	default:
		return
	}
	if h.EventsSynchronized() {
		x.apply(exactness.Evidence{Type: exactness.StreamSynced})
		return
	}
	why := fmt.Sprintf("rank %d %s", t.Rank, t.Type)
	if t.Type == "connect" {
		why = fmt.Sprintf("rank %d replaying", t.Rank)
	}
	x.apply(exactness.Evidence{Type: exactness.StreamUnsynced, Detail: why})
}

// Routes is the table the front ends resolve a request's rule with (the proxy, the Endpoint
// Picker): the gateway keeps it in step with the rules it runs.
func (g *Gateway) Routes() *resolver.Table { return &g.routes }

func (g *Gateway) listenerOf(r *rules.Rule) string {
	if r.Listener != "" {
		return r.Listener
	}
	return g.cfg.Listen
}

// Listeners returns every listener address the rules use.
func (g *Gateway) Listeners() []string {
	set := map[string]bool{g.cfg.Listen: true}
	for _, r := range g.store.List() {
		set[g.listenerOf(r)] = true
	}
	out := make([]string, 0, len(set))
	for l := range set {
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

// SetCertificates replaces the loaded certificates and re-evaluates every rule.
// A certificate whose admission policy the gateway cannot run (CheckAdmission) changes nothing.
func (g *Gateway) SetCertificates(cs []*certificate.Certificate) error {
	for _, c := range cs {
		if err := CheckAdmission(c); err != nil {
			return err
		}
	}
	g.mu.Lock()
	g.certs = cs
	g.mu.Unlock()
	for _, r := range g.store.List() {
		if err := g.apply(r); err != nil {
			return err
		}
	}
	g.recertified()
	return nil
}

// runtime returns a rule's runtime.
func (g *Gateway) runtime(name string) (*ruleRuntime, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	rt, ok := g.runtimes[name]
	return rt, ok
}

// listen opens a TCP listener (split out so tests can use port 0).
func listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

// intoRanks feeds a data-parallel endpoint's updates to the per-rank index as well as to apply.
func intoRanks(apply func(ingest.Update), ranks *route.Ranks, ep inventory.EndpointID) func(ingest.Update) {
	return func(u ingest.Update) {
		apply(u)
		switch u.Op {
		case ingest.OpStore:
			_ = ranks.Store(ep, u.Rank, u.Keys)
		case ingest.OpRemove:
			_ = ranks.RemoveKeys(ep, u.Rank, u.Keys)
		case ingest.OpClear:
			ranks.Clear(ep)
		}
	}
}

// holder says which tier of endpoint ep holds key: "gpu", a lower tier's name, or "" for none. A
// block the engine offloaded is a block it published under the same key, so the checks that
// look for a probe's or a routed prompt's key accept it on any tier.
func (rt *ruleRuntime) holder(ep inventory.EndpointID, key uint64) string {
	var m inventory.Mask
	rt.index.Holders(key, &m)
	if m.Has(ep) {
		return engines.TierGPU.String()
	}
	for _, l := range rt.lower {
		l.Index.Holders(key, &m)
		if m.Has(ep) {
			return l.Tier.String()
		}
	}
	return ""
}
