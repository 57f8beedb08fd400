package ctk

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
	"github.com/kvexact/kvexact/gateway/hub"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// Options tune a certification run. Zero values take the defaults noted.
type Options struct {
	// ValidFor is the certificate's lifetime (default 7 days).
	ValidFor time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// SignKey signs the certificate when set.
	SignKey ed25519.PrivateKey
	// Issuer is written into the certificate (default "ctk certify").
	Issuer string
	// SubscribeTimeout bounds subscribing to an endpoint's event stream (default 10s).
	SubscribeTimeout time.Duration
	// EventTimeout bounds the wait for the probe's own events, and for a clear's (default 15s, the
	// reference's challenge timeout).
	EventTimeout time.Duration
	// HTTPClient is used for every engine call (default: 30s timeout per request).
	HTTPClient *http.Client
	// Tokenizer replaces loading the pool's tokenizer folder (tests, the gateway's own pool).
	Tokenizer *tokenize.Tokenizer
	// Parallel is how many endpoints are certified at once (default 4).
	Parallel int
	// Logger receives progress (default: discard).
	Logger *slog.Logger
	// LenientAuto restores the old verdict of binding auto: an endpoint that proved one binding
	// passes even when a leg of the other failed (a seed the engine binding cannot reproduce, say).
	// By default such an endpoint is still covered for the binding it proved, but the run exits 1.
	LenientAuto bool
	// Only, when set, lists the spec ids to run; the others are skipped (an admission probe runs
	// the specs its certificate's policy lists: Admit).
	Only []string
	// Admission is the policy written into the certificates for endpoints that join later
	// (nil: admit none, as certificates written without it mean).
	Admission *certificate.Admission
	// AddedTokensPerText, above 1, joins the tokenizer specs' added-token probes (each token alone
	// and glued to words) into texts of up to that many tokens, one tokenize call each: a text
	// whose ids equal the gateway's pins each of its tokens (pins); a text that does not pin, or
	// whose ids differ, is probed token by token, so a failure names the tokens as without it.
	// 0: one call per probe (ctk certify); an admission uses AdmissionAddedTokensPerText.
	AddedTokensPerText int
}

func (o *Options) defaults() {
	if o.ValidFor <= 0 {
		o.ValidFor = 7 * 24 * time.Hour
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Issuer == "" {
		o.Issuer = "ctk certify"
	}
	if o.SubscribeTimeout <= 0 {
		o.SubscribeTimeout = 10 * time.Second
	}
	if o.EventTimeout <= 0 {
		o.EventTimeout = 15 * time.Second
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	if o.Parallel <= 0 {
		o.Parallel = 4
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// EndpointResult is one endpoint's verdict.
type EndpointResult struct {
	Name      string                 `json:"name"`
	Address   string                 `json:"address"`
	Family    string                 `json:"family"`
	Release   string                 `json:"release"` // as the engine reported it ("" when unknown)
	Contract  string                 `json:"contract"`
	Require   string                 `json:"require"`
	Certified []certificate.Coverage `json:"certified"`
	// OK says whether the endpoint is certified for what the pool requires of it; Reason says why not.
	OK     bool   `json:"ok"`
	Reason string `json:"reason,omitempty"`
	// Binding is the KV-exact binding the endpoint got ("engine", "router"; "" none): under
	// binding auto, the one the gateway will use.
	Binding string `json:"binding,omitempty"`
	// FailedLegs lists the legs of the specs that failed (with binding auto an endpoint may be
	// covered for one binding and still have failed legs: the run then exits 1).
	FailedLegs []string `json:"failed_legs,omitempty"`
}

// Result is a whole run: the certificate (one per engine family in the pool; Certificate is the
// first), every spec's outcome, each endpoint's verdict and the exit status.
type Result struct {
	Certificate  *certificate.Certificate   `json:"-"`
	Certificates []*certificate.Certificate `json:"-"`
	Specs        []SpecResult               `json:"specs"`
	Endpoints    []EndpointResult           `json:"endpoints"`
	// ExitCode is 0 when every endpoint is certified for what the pool asks of it, else 1.
	ExitCode int       `json:"exit_code"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
}

// HubFetchTimeout bounds the tokenizer's fetch from a hub (listing and every file), as the
// gateway bounds its own.
const HubFetchTimeout = 2 * time.Minute

// NewProber returns the family's HTTP prober for an engine at address.
func NewProber(family, address string, hc *http.Client) (engines.Prober, error) {
	return registry.NewProber(family, address, hc)
}

// LoadTokenizer loads the pool's staged tokenizer the way the gateway does: the tokenizer folder
// when the pool names one, else the model's snapshot fetched from the hub (tokenizers.hub, into
// its cacheDir), else the model slug under the default tokenizer roots.
func LoadTokenizer(p *Pool) (*tokenize.Tokenizer, error) {
	if h := p.Tokenizers.Hub; h != nil {
		ctx, cancel := context.WithTimeout(context.Background(), HubFetchTimeout)
		defer cancel()
		c := &hub.Client{CacheDir: h.CacheDir, HTTP: &http.Client{Timeout: HubFetchTimeout}}
		snap, err := c.Fetch(ctx, h.Source(h.Models[p.Model]))
		if err != nil {
			return nil, fmt.Errorf("pool: tokenizers.hub: %w", err)
		}
		t, err := tokenize.Load(snap.Dir)
		if err != nil {
			return nil, fmt.Errorf("pool: tokenizers.hub: %s at %s: %w", snap.Repo, snap.Commit, err)
		}
		return t, nil
	}
	if dir := p.tokenizerDir(); dir != "" {
		t, err := tokenize.Load(dir)
		if err != nil {
			return nil, fmt.Errorf("pool: tokenizer: %w", err)
		}
		return t, nil
	}
	t, err := tokenize.NewPool("").Get(p.Model)
	if err != nil {
		return nil, fmt.Errorf("pool: tokenizer: none given, and the model's slug folder was not found: %w", err)
	}
	return t, nil
}

// Profile is the certificate profile of one family of the pool, built with exactly the call the
// gateway makes for a rule with the same staged fields (gateway.certify).
func Profile(p *Pool, family string, tok *tokenize.Tokenizer) (certificate.Profile, error) {
	st, ok := p.Staged(family)
	if !ok {
		return certificate.Profile{}, fmt.Errorf("ctk: the pool has no %s endpoint", family)
	}
	jsonSHA, cfgSHA := tok.Files()
	return certificate.NewProfile(family, st.Contract.ID, p.Model, jsonSHA, cfgSHA, tok.Config().ChatTemplate, st.BlockSize, st.Binding, st.Algorithm, st.Seed), nil
}

// Certify runs every spec against every endpoint of the pool and assembles the certificate. An
// error means the input is unusable (the tokenizer cannot be loaded); engine failures are spec
// failures in the Result, never errors.
func Certify(ctx context.Context, p *Pool, opts Options) (*Result, error) {
	opts.defaults()
	if p == nil || p.staged == nil {
		return nil, errors.New("ctk: pool is not normalized (use LoadPool or ParsePool)")
	}
	tok := opts.Tokenizer
	if tok == nil {
		var err error
		if tok, err = LoadTokenizer(p); err != nil {
			return nil, err
		}
	}
	if opts.Admission != nil && opts.Admission.Admit == certificate.AdmitProbe {
		for _, ep := range p.Endpoints {
			if st, _ := p.Staged(ep.Family); st.Contract != nil && st.Contract.Drained() {
				return nil, fmt.Errorf("ctk: admit probe: endpoint %s: %s", ep.Name, drainedAdmission(ep.Family))
			}
		}
	}
	res := &Result{Started: opts.Now()}
	runs := make([]*endpointRun, len(p.Endpoints))
	sem := make(chan struct{}, opts.Parallel)
	var wg sync.WaitGroup
	for i := range p.Endpoints {
		ep := &p.Endpoints[i]
		st, _ := p.Staged(ep.Family)
		pr, err := NewProber(ep.Family, ep.Address, opts.HTTPClient)
		if err != nil {
			return nil, err
		}
		r := &endpointRun{pool: p, ep: ep, st: st, tok: tok, pr: pr, opts: &opts, results: map[string]State{}}
		runs[i] = r
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			r.run(ctx)
		})
	}
	wg.Wait()
	res.Finished = opts.Now()
	families := map[string]*certificate.Certificate{}
	var order []string
	for _, r := range runs {
		res.Specs = append(res.Specs, r.specs...)
		er := r.verdict()
		res.Endpoints = append(res.Endpoints, er)
		c := families[r.ep.Family]
		if c == nil {
			prof, err := Profile(p, r.ep.Family, tok)
			if err != nil {
				return nil, err
			}
			c = &certificate.Certificate{Format: certificate.FormatVersion, Profile: prof, ProfileDigest: prof.Digest(),
				IssuedAt: res.Finished.UTC().Truncate(time.Second), ExpiresAt: res.Finished.Add(opts.ValidFor).UTC().Truncate(time.Second), Issuer: opts.Issuer,
				Admission: opts.Admission}
			families[r.ep.Family] = c
			order = append(order, r.ep.Family)
		}
		// The entry binds the identity certified: the gateway covers only a rule endpoint with
		// the same address, event addresses, release and model.
		ev := r.ep.Events
		ce := certificate.NewEndpoint(certificate.Identity{Name: er.Name, Address: er.Address, Release: er.Release, Model: p.Model,
			Events: certificate.Events{ZMQ: ev.ZMQ, Replay: ev.Replay, Drain: ev.Drain}}, er.Certified)
		// The adapters proven: the gateway routes KV-exact for an adapter only where its LoRA
		// name is listed (an empty list proves none).
		ce.Adapters = &[]string{}
		if r.state(idLoRA) == Pass {
			*ce.Adapters = append(*ce.Adapters, r.provedLoRA...)
		}
		if ce.Certified == nil || !er.OK {
			// As the certificate format says: an endpoint that failed what the pool asked of it
			// is listed with no coverage, so the gateway reports its failures.
			ce.Certified = []certificate.Coverage{}
		}
		for _, s := range r.specs {
			if s.State == Fail {
				ce.Failures = append(ce.Failures, fmt.Sprintf("%s: %s (%s)", s.Group, s.Text, s.Leg))
			}
		}
		c.Endpoints = append(c.Endpoints, ce)
		if !er.OK || len(er.FailedLegs) > 0 && r.st.Binding == "auto" && r.ep.Require == RequireExact && !opts.LenientAuto {
			res.ExitCode = 1
		}
	}
	for _, f := range order {
		c := families[f]
		if opts.SignKey != nil {
			c.Sign(opts.SignKey)
		}
		res.Certificates = append(res.Certificates, c)
	}
	if len(res.Certificates) > 0 {
		res.Certificate = res.Certificates[0]
	}
	return res, nil
}

// Spec ids, used to find results when computing coverage.
const (
	idHealth    = "health"
	idRelease   = "release"
	idModel     = "model"
	idTokTrue   = "tok-true"
	idTokFalse  = "tok-false"
	idTemplate  = "template"
	idEvents    = "events"
	idBlockSize = "block-size"
	idTokens    = "tokens"
	idKeys      = "keys"
	idSequence  = "sequence"
	idReplay    = "replay"
	idClear     = "clear"
)

// endpointRun is one endpoint's certification: its spec tree, the shared probe state, the results.
type endpointRun struct {
	pool *Pool
	ep   *Endpoint
	st   Staged
	tok  *tokenize.Tokenizer
	pr   engines.Prober
	opts *Options

	release     string
	unreachable bool
	w           *watcher
	watchErr    error // why the event stream could not be subscribed
	streamOwn   *bool // TensorRT-LLM: the stream proved to carry this engine's events (nil: not tried)
	probe       *probeOutcome
	// provedLoRA are the LoRA names (as the engine hashes them) whose adapter probes passed.
	provedLoRA []string

	specs   []SpecResult
	results map[string]State
}

// tree is the endpoint's spec tree, in run order: one behaviour per spec, each text a requirement.
func (r *endpointRun) tree() []struct {
	id string
	spec
} {
	type node = struct {
		id string
		spec
	}
	return []node{
		{idHealth, spec{GroupIdentity, "answers its health endpoint", r.specHealth}},
		{idRelease, spec{GroupIdentity, "reports a release that maps to the staged engine contract", r.specRelease}},
		{idModel, spec{GroupIdentity, "serves the staged model", r.specModel}},
		{idTokTrue, spec{GroupTokenizer, "tokenizes the probe corpus like the gateway with add_special_tokens=true", func(t *T) { r.specTokenizer(t, true) }}},
		{idTokFalse, spec{GroupTokenizer, "tokenizes the probe corpus like the gateway with add_special_tokens=false", func(t *T) { r.specTokenizer(t, false) }}},
		{idTemplate, spec{GroupTemplate, "renders and tokenizes the probe conversations like the gateway's chat template", r.specTemplate}},
		{idEvents, spec{GroupHash, "publishes a stored-block event for a probe completion", r.specEvents}},
		{idBlockSize, spec{GroupHash, "stores blocks of the staged block size", r.specBlockSize}},
		{idTokens, spec{GroupHash, "stores exactly the token ids the gateway computes for the probe prompt (router binding)", r.specTokens}},
		{idKeys, spec{GroupHash, "publishes the block keys the gateway computes for the probe prompt (engine binding)", r.specKeys}},
		{idLoRA, spec{GroupHash, "keys a probe through a LoRA adapter with the adapter's LoRA name", r.specLoRA}},
		{idSequence, spec{GroupStream, "numbers its event messages consecutively", r.specSequence}},
		{idReplay, spec{GroupStream, "answers a replay request with the probe's batch", r.specReplay}},
		{idClear, spec{GroupStream, "announces a cache clear on its event stream", r.specClear}},
	}
}

func (r *endpointRun) run(ctx context.Context) {
	log := r.opts.Logger.With("endpoint", r.ep.Name)
	log.Info("ctk: certifying", "address", r.ep.Address, "family", r.ep.Family)
	defer func() {
		if r.w != nil {
			r.w.stop()
		}
	}()
	for _, n := range r.tree() {
		body := n.body
		switch {
		case r.unreachable && n.id != idHealth:
			body = func(t *T) { t.Skipf("not run: the endpoint is unreachable") }
		case r.opts.Only != nil && !slices.Contains(r.opts.Only, n.id):
			body = func(t *T) { t.Skipf("not run: the admission policy does not list this spec") }
		case r.dependsOnModel(n.id) && r.state(idModel) == Fail:
			// Every later leg sends probes naming the staged model; against another model they
			// would fail for that reason and blame their own leg.
			body = func(t *T) { t.Skipf("not run: model mismatch") }
		}
		res := runSpec(ctx, r.ep.Name, spec{n.group, n.text, body})
		r.specs = append(r.specs, res)
		r.results[n.id] = res.State
		log.Info("ctk: spec", "state", res.State, "spec", res.Group+": "+res.Text, "leg", res.Leg)
	}
}

// dependsOnModel says whether a spec probes the engine with the staged model's name: all but the
// identity legs before it.
func (r *endpointRun) dependsOnModel(id string) bool {
	return id != idHealth && id != idRelease && id != idModel
}

func (r *endpointRun) state(id string) State {
	if s, ok := r.results[id]; ok {
		return s
	}
	return Skip
}

// verdict turns the spec outcomes into coverage and the requirement check.
func (r *endpointRun) verdict() EndpointResult {
	ct := r.st.Contract
	er := EndpointResult{Name: r.ep.Name, Address: r.ep.Address, Family: r.ep.Family, Release: r.release, Contract: ct.ID, Require: r.ep.Require}
	pass := func(ids ...string) bool {
		for _, id := range ids {
			if r.state(id) != Pass {
				return false
			}
		}
		return true
	}
	notFailed := func(ids ...string) bool {
		for _, id := range ids {
			if r.state(id) == Fail {
				return false
			}
		}
		return true
	}
	common := pass(idHealth, idRelease, idModel, idTokTrue, idTokFalse) && notFailed(idTemplate)
	if common {
		er.Certified = append(er.Certified, certificate.CoverAffinity)
	}
	exact := common && ct.HasEvents() && pass(idEvents, idBlockSize, idTokens) && notFailed(idSequence, idReplay, idClear, idLoRA)
	if exact && ct.SupportsBinding("engine") && r.st.Binding != "router" && pass(idKeys) {
		er.Certified = append(er.Certified, certificate.CoverEngine)
	}
	if exact && ct.SupportsBinding("router") && r.st.Binding != "engine" {
		er.Certified = append(er.Certified, certificate.CoverRouter)
	}
	has := func(c certificate.Coverage) bool { return slices.Contains(er.Certified, c) }
	switch {
	case r.ep.Require == RequireAffinity:
		er.OK = has(certificate.CoverAffinity)
	case r.st.Binding == "engine":
		er.OK = has(certificate.CoverEngine)
	case r.st.Binding == "router":
		er.OK = has(certificate.CoverRouter)
	default:
		er.OK = has(certificate.CoverEngine) || has(certificate.CoverRouter)
	}
	if !er.OK {
		var failed []string
		for _, s := range r.specs {
			if s.State == Fail {
				failed = append(failed, s.Text+" ["+s.Leg+"]")
			}
		}
		want := r.ep.Require
		if want == RequireExact {
			want += " (" + r.st.Binding + " binding)"
		}
		if len(failed) == 0 {
			er.Reason = fmt.Sprintf("not certified for %s: required specs were skipped", want)
		} else {
			er.Reason = fmt.Sprintf("not certified for %s: %s", want, strings.Join(failed, "; "))
		}
	}
	switch {
	case has(certificate.CoverEngine) && r.st.Binding != "router":
		er.Binding = "engine"
	case has(certificate.CoverRouter):
		er.Binding = "router"
	}
	for _, s := range r.specs {
		if s.State == Fail && !slices.Contains(er.FailedLegs, s.Leg) {
			er.FailedLegs = append(er.FailedLegs, s.Leg)
		}
	}
	if er.OK && len(er.FailedLegs) > 0 && r.st.Binding == "auto" && r.ep.Require == RequireExact && !r.opts.LenientAuto {
		er.Reason = fmt.Sprintf("binding auto: covered for the %s binding only, with failing legs %s (the run exits 1; fix the legs, set binding: %s in the pool to ask for that binding alone, or pass --lenient-auto)",
			er.Binding, strings.Join(er.FailedLegs, ", "), er.Binding)
	}
	sort.Slice(er.Certified, func(i, j int) bool { return er.Certified[i] < er.Certified[j] })
	return er
}
