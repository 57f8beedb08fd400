package kvbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// The pool the benchmark runs: vLLM simulators of one pinned release, engine hash binding with a
// pinned PYTHONHASHSEED, so a certificate can cover it exactly as ctk certify would.
const (
	family   = "vllm"
	release  = "v0.25.1"
	ruleName = "bench"
)

var seed0 = "0"

// PoolShape is the simulated hardware: small pools, fast simulated prefill, a KV cache small enough
// that eviction matters.
type PoolShape struct {
	Endpoints       int
	CapacityBlocks  int // per engine
	MaxConcurrency  int // per engine (max_num_seqs)
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	MaxModelLen     int // 0: the simulator's default
	// OffloadBlocks is each engine's CPU offloading tier in blocks (0: none); the offload
	// workload's cells run with OffloadBlocksFor's.
	OffloadBlocks int `json:"offloadBlocks,omitempty"`
	// Adapters are the LoRA adapters every engine serves and the rule declares (the lora-tenants
	// workload's, AdapterName 0..n−1).
	Adapters []string `json:"adapters,omitempty"`
}

// OffloadBlocksFor is the offload workload's host tier: twice the GPU KV per engine, so the
// workload's ~3,000 blocks exceed the pool's GPU KV (4 × 512) and fit its host memory (4 × 1,024)
// when every prompt stays where it was computed (~750 blocks an engine at 4 engines), while an
// engine that sees every prompt keeps about a third of them.
func (s PoolShape) OffloadBlocksFor() int { return 2 * s.CapacityBlocks }

// ShapeFor is the pool a workload's cells run on: the offload workload's has the host tier, the
// small-pool workload's is 3 engines of 96 blocks (the real-vLLM benchmark's, whatever --endpoints).
func (s PoolShape) ShapeFor(workload string) PoolShape {
	switch workload {
	case WorkloadOffload:
		s.OffloadBlocks = s.OffloadBlocksFor()
	case WorkloadSmallPool:
		s.Endpoints, s.CapacityBlocks = 3, 96
	case WorkloadLoRATenants:
		s.Adapters = nil
		for i := range DefaultShape().Adapters {
			s.Adapters = append(s.Adapters, AdapterName(i))
		}
	}
	return s
}

// DefaultPoolShape: 4 engines × 512 blocks of 16 tokens, 4 running requests each, 150 µs per
// uncached prompt token (a 1k-token prefill is 150 ms), 2 ms per output token. Simulated time is
// slow enough that the gateway, the simulators and the client together stay well inside 2 shared
// cores at the highest offered load: the sweep measures routing, not CPU starvation.
func DefaultPoolShape() PoolShape {
	return PoolShape{Endpoints: 4, CapacityBlocks: 512, MaxConcurrency: 4, PrefillPerToken: 150 * time.Microsecond, DecodePerToken: 2 * time.Millisecond}
}

// Scaled is the shape with n engines whose simulated time runs n/4 times slower: the offered
// request rate at a given load, and with it the CPU the gateway, simulators and client need, stays
// that of the 4-engine pool, so a 64-engine cell measures routing, not CPU starvation of 2 cores.
func (s PoolShape) Scaled(n int) PoolShape {
	f := float64(n) / float64(s.Endpoints)
	s.Endpoints = n
	s.PrefillPerToken = time.Duration(float64(s.PrefillPerToken) * f)
	s.DecodePerToken = time.Duration(float64(s.DecodePerToken) * f)
	return s
}

// ServiceTime is one uncached request's time in an engine slot.
func (s PoolShape) ServiceTime(promptTokens float64, maxTokens int) time.Duration {
	return time.Duration(promptTokens*float64(s.PrefillPerToken)) + time.Duration(max(maxTokens-1, 0))*s.DecodePerToken
}

// Capacity is the pool's request rate when nothing is cached (requests/s): the load unit of the
// sweep, so "1.0" is saturation for a cache-blind policy.
func (s PoolShape) Capacity(promptTokens float64, maxTokens int) float64 {
	return float64(s.Endpoints*s.MaxConcurrency) / s.ServiceTime(promptTokens, maxTokens).Seconds()
}

// Pool is a set of simulators with a gateway in front of them.
type Pool struct {
	Sims   []*sim.Engine
	G      *gateway.Gateway
	Reg    *prometheus.Registry
	URL    string   // where clients send
	URLs   []string // the oracle's listeners, one per engine in order
	Hasher *hashcore.Hasher
	// Law is the rule's bounded-load law as the router builds it (the oracle decides with it).
	Law     route.Law
	cleanup []func()
}

// Close stops everything the pool started, in reverse order.
func (p *Pool) Close() {
	for i := len(p.cleanup) - 1; i >= 0; i-- {
		p.cleanup[i]()
	}
	p.cleanup = nil
}

// StartPool starts the simulators and a gateway whose rule runs the policy (for the oracle, one
// rule per engine); for KV-exact it issues the certificate ctk certify would, and waits until the
// gateway's inventory has seen every endpoint's events.
func StartPool(ctx context.Context, toks *tokenize.Pool, model string, shape PoolShape, pol Policy) (_ *Pool, err error) {
	tok, err := toks.Get(model)
	if err != nil {
		return nil, err
	}
	ct, err := contracts.Lookup(family, release)
	if err != nil {
		return nil, err
	}
	p := &Pool{}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	p.cleanup = append(p.cleanup, cancel)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rule := rules.Rule{Name: ruleName, Models: []string{model}, Engine: rules.EngineRef{Family: family, Release: release},
		Selector: pol.Selector, Seed: &seed0}
	for _, a := range shape.Adapters {
		rule.Adapters = append(rule.Adapters, rules.Adapter{Name: a, LoRAPath: "/adapters/" + a})
	}
	if pol.Exact {
		rule.KVExactMode = rules.KVExactPool
		rule.Binding = "engine"
		if !pol.Defaults {
			ttl := rules.OffDuration(pol.Predict)
			rule.PredictOnRoute = &ttl
		}
		if pol.Binding != "" {
			rule.Binding = pol.Binding
		}
		if pol.GPUOnly {
			off := false
			rule.LowerTiers = &off
		}
		rule.Scoring = pol.Scoring
		rule.LoadLaw.Kind = pol.Law
		if pol.CapFloor > 0 {
			rule.LoadLaw.CapFloor = &pol.CapFloor
		}
		if pol.Epsilon > 0 {
			rule.LoadLaw.Epsilon = &pol.Epsilon
		}
		rule.LoadLaw.MissPlacement = pol.MissPlacement
	}
	sims, eps, err := startSims(ctx, tok, model, shape, pol.Exact, &p.cleanup)
	if err != nil {
		return nil, err
	}
	p.Sims, rule.Endpoints = sims, eps
	bs := p.Sims[0].Config().BlockSize
	if p.Hasher, err = hashcore.New(hashcore.Binding{Algorithm: hashcore.Algorithm(p.Sims[0].Config().Algorithm), BlockSize: bs, Seed: &seed0}, hashcore.Default()); err != nil {
		return nil, err
	}
	// A client-side policy's listener ports are chosen before the gateway binds them; a port taken
	// meanwhile (an outgoing connection's ephemeral port, another process) fails the bind, and the
	// pool retries with fresh ports.
	var cfg *rules.Config
	var gw *assemble.Gateway
	for attempt := 1; ; attempt++ {
		var stop func()
		cfg, gw, p.Reg, stop, err = startPoolGateway(ctx, rule, pol, ct, tok, toks, model, quiet)
		if err == nil {
			p.cleanup = append(p.cleanup, stop)
			break
		}
		if stop != nil {
			stop()
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == listenAttempts {
			return nil, err
		}
	}
	p.Law = lawOf(&cfg.Rules[0])
	p.G = gw.Runtime
	if pol.clientSide() {
		for _, r := range cfg.Rules {
			p.URLs = append(p.URLs, "http://"+gw.Servers.Client[r.Listener])
		}
	} else {
		p.URL = "http://" + gw.Servers.Client["127.0.0.1:0"]
	}
	if pol.Exact {
		if st := p.G.Status().Rules[0].Exact; !st.Enabled || st.Binding != rule.Binding {
			return nil, fmt.Errorf("KV-exact not enabled by the certificate: %+v", st)
		}
		if err := p.waitSubscribed(ctx, model); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// startSims starts shape.Endpoints simulators e0.. (with replay listeners when exact) and returns
// them with the rule endpoints naming them; their Close is appended to cleanup.
func startSims(ctx context.Context, tok *tokenize.Tokenizer, model string, shape PoolShape, exact bool, cleanup *[]func()) ([]*sim.Engine, []rules.Endpoint, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var sims []*sim.Engine
	var eps []rules.Endpoint
	var loras []string
	for _, a := range shape.Adapters {
		loras = append(loras, a+"=/adapters/"+a)
	}
	for i := 0; i < shape.Endpoints; i++ {
		cfg := sim.Config{Family: family, Release: release, Model: model, Tokenizer: tok, ServedModelName: model,
			Endpoint: fmt.Sprintf("e%d", i), Seed: &seed0, CapacityBlocks: shape.CapacityBlocks, MaxConcurrency: shape.MaxConcurrency,
			PrefillPerToken: shape.PrefillPerToken, DecodePerToken: shape.DecodePerToken, MaxModelLen: shape.MaxModelLen, OffloadBlocks: shape.OffloadBlocks, LoRAModules: loras, Logger: quiet}
		// Port 0 binds free ports (the simulator binds when the host is *, as vLLM does).
		cfg.PublishAddr = "tcp://*:0"
		if exact {
			cfg.ReplayAddr = "tcp://*:0"
		}
		e, err := sim.New(cfg)
		if err != nil {
			return nil, nil, err
		}
		if err := e.Start(ctx); err != nil {
			return nil, nil, err
		}
		*cleanup = append(*cleanup, func() { e.Close() })
		sims = append(sims, e)
		// The engine's running-request limit is declared as an operator declares vLLM's
		// --max-num-seqs (the ttft law's slot wait); kvbench scrapes no load reports to learn it.
		ep := rules.Endpoint{Name: cfg.Endpoint, Address: e.URL(), CapacityBlocks: shape.CapacityBlocks, MaxRunning: shape.MaxConcurrency}
		if exact {
			ep.Events.ZMQ, ep.Events.Replay = e.PublishAddrs(), e.ReplayAddrs()
		}
		eps = append(eps, ep)
	}
	return sims, eps, nil
}

// pickPorts chooses a client-side pool's listener ports (a variable so a test can hand out a taken one).
var pickPorts = freePorts

// listenAttempts bounds StartPool's retries of a client-side pool whose chosen port was taken.
const listenAttempts = 5

// startPoolGateway assembles and starts the pool's gateway: one rule, or for a client-side policy one
// single-endpoint rule per engine, each on its own listener. stop, when not nil, shuts it down (also
// after a failed start, which may have started the rule runtimes).
func startPoolGateway(ctx context.Context, rule rules.Rule, pol Policy, ct *contracts.Contract, tok *tokenize.Tokenizer, toks *tokenize.Pool, model string, quiet *slog.Logger) (_ *rules.Config, _ *assemble.Gateway, _ *prometheus.Registry, stop func(), _ error) {
	cfg := &rules.Config{Listen: "127.0.0.1:0", Admin: rules.Admin{Listen: "127.0.0.1:0", Token: "bench"}, DebugHeader: true, Rules: []rules.Rule{rule}}
	if pol.clientSide() {
		// The oracle decides in the client, then sends through the same proxy as every other policy:
		// one single-endpoint rule per engine, each on its own listener, so the data path (and its
		// cost) is the same and only the decision differs.
		cfg.Rules = nil
		ports, err := pickPorts(len(rule.Endpoints))
		if err != nil {
			return nil, nil, nil, nil, err
		}
		for i, ep := range rule.Endpoints {
			r := rule
			r.Name, r.Listener, r.Endpoints = fmt.Sprintf("oracle-%s", ep.Name), fmt.Sprintf("127.0.0.1:%d", ports[i]), []rules.Endpoint{ep}
			cfg.Rules = append(cfg.Rules, r)
		}
	}
	if err := cfg.Normalize(); err != nil {
		return nil, nil, nil, nil, err
	}
	var certs []*certificate.Certificate
	if pol.Exact {
		certs = append(certs, Certificate(cfg.Rules[0], ct, tok, model))
	}
	reg := prometheus.NewRegistry()
	transport := proxy.DefaultTransport()
	transport.MaxIdleConnsPerHost = 512
	gw, err := assemble.New(assemble.Config{Options: gateway.Options{Config: cfg, Certificates: certs, Tokenizers: toks, Registry: reg, ProbeInterval: -1, Log: quiet},
		Transport: transport})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	stop = func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		gw.Shutdown(sctx)
		transport.CloseIdleConnections()
	}
	if err := gw.Start(ctx); err != nil {
		return nil, nil, nil, stop, err
	}
	return cfg, gw, reg, stop, nil
}

// lawOf is the load law a mode-3 (single-pool KV-exact) router applies for the rule. The oracle's
// rules are selector-only, whose normalized law carries mode 1's default (no spill relief): without
// it, an endpoint at its cap keeps every request sharing a short prefix (RAG's instruction) while
// the others, never sent anything, score 0 — the first oracle piled a whole RAG run on one engine.
func lawOf(r *rules.Rule) route.Law {
	l := route.LawOf(r.LoadLaw)
	if l.Kind == "" {
		l.Kind = route.LawHard
	}
	l.SpillRelief = true // mode 3's default
	if r.LoadLaw.SpillRelief != nil && r.KVExactMode == rules.KVExactPool {
		l.SpillRelief = *r.LoadLaw.SpillRelief
	}
	return l
}

func freePort() (int, error) {
	ps, err := freePorts(1)
	if err != nil {
		return 0, err
	}
	return ps[0], nil
}

// freePorts finds n distinct free ports on 127.0.0.1. Every probe listener stays open until all n
// are bound: a port closed at once can come back from the kernel on the next bind, and at 64
// engines two per-engine listeners then got the same port ("already served by rule oracle-e25").
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Certificate is what ctk certify writes for this pool: the rule's profile, every endpoint covered
// for the engine and router bindings.
func Certificate(r rules.Rule, ct *contracts.Contract, tok *tokenize.Tokenizer, model string) *certificate.Certificate {
	js, cs := tok.Files()
	prof := certificate.NewProfile(ct.Family, ct.ID, model, js, cs, tok.Config().ChatTemplate, r.BlockSize, r.Binding, r.HashAlgorithm, r.Seed)
	c := &certificate.Certificate{Format: certificate.FormatVersion, Profile: prof, ProfileDigest: prof.Digest(), IssuedAt: time.Now(), ExpiresAt: time.Now().Add(24 * time.Hour)}
	for i := range r.Endpoints {
		c.Endpoints = append(c.Endpoints, certificate.NewEndpoint(gateway.IdentityOf(&r, i), []certificate.Coverage{certificate.CoverRouter, certificate.CoverEngine}))
	}
	return c
}

// waitSubscribed sends each engine one small prompt directly until the gateway's inventory shows
// its events: ZeroMQ drops what is published before a subscription reaches the publisher.
func (p *Pool) waitSubscribed(ctx context.Context, model string) error {
	for i, s := range p.Sims {
		ep := s.Config().Endpoint
		deadline := time.Now().Add(10 * time.Second)
		for n := 0; p.resident(ep) == 0; n++ {
			if time.Now().After(deadline) {
				return fmt.Errorf("endpoint %s: the gateway saw no KV event within 10s", ep)
			}
			body, _ := json.Marshal(map[string]any{"model": model, "prompt": fmt.Sprintf("Warm up endpoint %d, round %d: one short line of text, a little longer than a block.", i, n), "max_tokens": 1})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			for w := 0; w < 50 && p.resident(ep) == 0; w++ {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	return nil
}

func (p *Pool) resident(ep string) int {
	keys, _ := p.G.Inventory(ruleName, ep)
	return len(keys)
}

// HitCounters reads kvexact_kv_exact_hits_total per endpoint, summed over the gateway's rules.
// TTFTErrors sums the gateway's kvexact_ttft_prediction_error_ratio over its endpoints: the
// receipts it observed and how many fell within ±10 % and ±25 % ((−0.1, 0.1] and (−0.25, 0.25],
// from the cumulative buckets). Its realized TTFT runs from the upstream send, so it leaves out
// what the client's clock adds before the decision.
func (p *Pool) TTFTErrors() (n, within10, within25 uint64) {
	if p.Reg == nil {
		return 0, 0, 0
	}
	mfs, _ := p.Reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "kvexact_ttft_prediction_error_ratio" {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			n += h.GetSampleCount()
			cum := map[float64]uint64{}
			for _, b := range h.GetBucket() {
				cum[b.GetUpperBound()] = b.GetCumulativeCount()
			}
			within10 += cum[0.1] - cum[-0.1]
			within25 += cum[0.25] - cum[-0.25]
		}
	}
	return n, within10, within25
}

func (p *Pool) HitCounters() map[string]float64 {
	out := map[string]float64{}
	if p.Reg == nil {
		return out
	}
	mfs, _ := p.Reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "kvexact_kv_exact_hits_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ep string
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" {
					ep = l.GetValue()
				}
			}
			out[ep] += m.GetCounter().GetValue()
		}
	}
	return out
}
