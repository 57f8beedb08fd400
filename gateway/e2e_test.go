package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/kvexact/kvexact/internal/promtest"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// pool is a set of simulators and a gateway in front of them, all in-process on 127.0.0.1.
type pool struct {
	t       *testing.T
	sims    []*sim.Engine
	g       *gateway.Gateway
	srv     *gateway.Servers
	base    string // client listener URL
	admin   string
	token   string
	reg     *prometheus.Registry
	model   string
	cleanup []func()
	// transport is the proxy's upstream transport (so tests can drop its idle connections).
	transport *http.Transport
	// certPath is the certificate file the gateway reloads from (poolSpec.certFile).
	certPath string
	// opts are the gateway's options (a replica started later reuses them).
	opts gateway.Options
}

type poolSpec struct {
	family, release string
	n               int
	seed            *string
	mode            int
	roles           []string // per endpoint; default normal
	certify         bool
	blockSize       int
	replay          bool
	simMod          func(i int, c *sim.Config)
	reprobe         time.Duration // 0: off
	cfgMod          func(c *rules.Config)
	certValid       time.Duration // the certificate's lifetime (default 1h)
	certFile        bool          // write the certificate to a file the gateway reloads from
	gwMod           func(o *gateway.Options)
	wrap            func(http.Handler) http.Handler // around the proxy handler
	ruleMod         func(r *rules.Rule)
	certMod         func(c *certificate.Certificate)
	// certAdapters, when set, gives endpoint i's certificate entry its proven adapters (nil: the
	// entry records none, as certificates written before adapters were recorded).
	certAdapters func(i int) *[]string
	accessLog    *slog.Logger // the proxy's access log
	tracer       trace.Tracer // the proxy's tracer
	// upstream, when set, wraps the proxy's upstream transport (tests see what reaches engines)
	upstream func(http.RoundTripper) http.RoundTripper
}

func strp(s string) *string { return &s }

func tokenizerPool(t *testing.T) *tokenize.Pool {
	p := tokenize.NewPool("")
	if _, err := p.Get("llama3"); err != nil {
		t.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	return p
}

func startPool(t *testing.T, spec poolSpec) *pool {
	t.Helper()
	toks := tokenizerPool(t)
	tok, _ := toks.Get("llama3")
	ct, err := contracts.Lookup(spec.family, spec.release)
	if err != nil {
		t.Fatal(err)
	}
	p := &pool{t: t, model: "llama3", token: "test-token", transport: proxy.DefaultTransport()}
	t.Cleanup(func() {
		for i := len(p.cleanup) - 1; i >= 0; i-- {
			p.cleanup[i]()
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	p.cleanup = append(p.cleanup, cancel)
	rule := rules.Rule{Name: "pool", Models: []string{"llama3"}, Engine: rules.EngineRef{Family: spec.family, Release: spec.release}, KVExactMode: spec.mode, BlockSize: spec.blockSize}
	if ct.Hash.Seed == "pythonhashseed" {
		rule.Seed = spec.seed
	}
	for i := 0; i < spec.n; i++ {
		role := "normal"
		if i < len(spec.roles) {
			role = spec.roles[i]
		}
		cfg := sim.Config{Family: spec.family, Release: spec.release, Model: "llama3", Tokenizer: tok, ServedModelName: "llama3",
			Endpoint: fmt.Sprintf("e%d", i), Seed: spec.seed, BlockSize: spec.blockSize, Role: sim.Role(role),
			PrefillPerToken: 20 * time.Microsecond, DecodePerToken: 200 * time.Microsecond, DrainWait: 50 * time.Millisecond}
		if ct.Transport == "zmq-multipart-v1" {
			cfg.PublishAddr = "tcp://*:0"
			if spec.replay {
				cfg.ReplayAddr = "tcp://*:0"
			}
		}
		if spec.simMod != nil {
			spec.simMod(i, &cfg)
		}
		e, err := sim.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(ctx); err != nil {
			t.Fatal(err)
		}
		p.cleanup = append(p.cleanup, func() { e.Close() })
		p.sims = append(p.sims, e)
		ep := rules.Endpoint{Name: cfg.Endpoint, Address: e.URL(), Role: role}
		if b := e.BootstrapAddr(); b != "" {
			_, port, _ := strings.Cut(b, ":")
			fmt.Sscan(port, &ep.BootstrapPort)
		}
		switch ct.Transport {
		case "zmq-multipart-v1":
			ep.Events.ZMQ = e.PublishAddrs()
			ep.Events.Replay = e.ReplayAddrs()
		case "http-drain-v1":
			ep.Events.Drain = e.URL()
		}
		rule.Endpoints = append(rule.Endpoints, ep)
	}
	if spec.ruleMod != nil {
		spec.ruleMod(&rule)
	}
	cfg := &rules.Config{Listen: "127.0.0.1:0", Admin: rules.Admin{Listen: "127.0.0.1:0", Token: p.token}, DebugHeader: true, Rules: []rules.Rule{rule}}
	if spec.cfgMod != nil {
		spec.cfgMod(cfg)
	}
	if err := cfg.Normalize(); err != nil {
		t.Fatal(err)
	}
	var certs []*certificate.Certificate
	if spec.certify {
		r := cfg.Rules[0]
		js, cs := tok.Files()
		prof := certificate.NewProfile(ct.Family, ct.ID, "llama3", js, cs, tok.Config().ChatTemplate, r.BlockSize, r.Binding, r.HashAlgorithm, r.Seed)
		cov := []certificate.Coverage{certificate.CoverRouter}
		if ct.SupportsBinding("engine") {
			cov = append(cov, certificate.CoverEngine)
		}
		valid := spec.certValid
		if valid == 0 {
			valid = time.Hour
		}
		c := &certificate.Certificate{Format: certificate.FormatVersion, Profile: prof, ProfileDigest: prof.Digest(), IssuedAt: time.Now(), ExpiresAt: time.Now().Add(valid)}
		for i := range r.Endpoints {
			ce := certificate.NewEndpoint(gateway.IdentityOf(&r, i), cov)
			if spec.certAdapters != nil {
				ce.Adapters = spec.certAdapters(i)
			}
			c.Endpoints = append(c.Endpoints, ce)
		}
		if spec.certMod != nil {
			spec.certMod(c)
		}
		certs = append(certs, c)
	}
	p.reg = prometheus.NewRegistry()
	reprobe := spec.reprobe
	if reprobe == 0 {
		reprobe = -1
	}
	opts := gateway.Options{Config: cfg, Certificates: certs, Tokenizers: toks, Registry: p.reg, ProbeInterval: -1, ReprobeInterval: reprobe}
	if spec.certFile && len(certs) > 0 {
		p.certPath = t.TempDir() + "/certificate.json"
		if err := certs[0].Write(p.certPath); err != nil {
			t.Fatal(err)
		}
		opts.CertificatePaths = []string{p.certPath}
	}
	if spec.gwMod != nil {
		spec.gwMod(&opts)
	}
	p.opts = opts
	var upstream http.RoundTripper = p.transport
	if spec.upstream != nil {
		upstream = spec.upstream(upstream)
	}
	gw, err := assemble.New(assemble.Config{Options: opts, Transport: upstream, Wrap: spec.wrap, AccessLog: spec.accessLog, Tracer: spec.tracer})
	if err != nil {
		t.Fatal(err)
	}
	p.cleanup = append(p.cleanup, func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		gw.Shutdown(sctx)
	})
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	g, srv := gw.Runtime, gw.Servers
	p.g, p.srv = g, srv
	p.base = "http://" + srv.Client["127.0.0.1:0"]
	if cfg.Server.TLS.Enabled() {
		p.base = "https://" + srv.Client["127.0.0.1:0"]
	}
	p.admin = "http://" + srv.Admin
	if cfg.Admin.TLS.Enabled() {
		p.admin = "https://" + srv.Admin
	}
	if ct.HasEvents() {
		p.waitSubscribed()
	}
	return p
}

// waitSubscribed sends each engine small prompts directly (not through the gateway) until the
// gateway's inventory shows that endpoint's events: ZeroMQ drops what is published before a
// subscription reaches the publisher, so tests must not race the first subscription.
func (p *pool) waitSubscribed() {
	p.t.Helper()
	if p.sims[0].Config().Role == sim.RolePrefill {
		// P/D engines only prefill inside their dialect: warm them through the gateway, whose
		// min-load tier spreads the prompts over the prefill endpoints.
		deadline := time.Now().Add(15 * time.Second)
		for n := 0; ; n++ {
			ready := true
			for _, s := range p.sims {
				if s.Config().Role == sim.RolePrefill && p.resident(s.Config().Endpoint) == 0 {
					ready = false
				}
			}
			if ready {
				return
			}
			if time.Now().After(deadline) {
				p.t.Fatal("the gateway saw no event from some prefill endpoint within 15s")
			}
			p.complete(strings.Repeat(fmt.Sprintf("warm up round %d. ", n), 8), false)
			time.Sleep(20 * time.Millisecond)
		}
	}
	for i, s := range p.sims {
		ep := s.Config().Endpoint
		if s.Config().Role == sim.RoleDecode {
			continue
		}
		deadline := time.Now().Add(10 * time.Second)
		for n := 0; p.resident(ep) == 0; n++ {
			if time.Now().After(deadline) {
				p.t.Fatalf("endpoint %s: the gateway saw no event within 10s", ep)
			}
			prompt := strings.Repeat(fmt.Sprintf("warm up endpoint %d round %d. ", i, n), 8)
			body, _ := json.Marshal(map[string]any{"model": p.model, "prompt": prompt, "max_tokens": 1})
			if resp, err := http.Post(s.URL()+"/v1/completions", "application/json", bytes.NewReader(body)); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			for w := 0; w < 20 && p.resident(ep) == 0; w++ {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
}

// completion is one response as the client sees it.
type completion struct {
	status   int
	endpoint string // gateway receipt
	servedBy string // simulator receipt
	cached   int
	prompt   int
	decision string
	body     string
	// P/D receipts: the gateway's prefill header and the decode simulator's own account.
	prefill, prefilledBy string
}

func (p *pool) complete(prompt string, stream bool) completion {
	p.t.Helper()
	req := map[string]any{"model": p.model, "prompt": prompt, "max_tokens": 4, "stream": stream}
	if stream {
		req["stream_options"] = map[string]any{"include_usage": true}
	}
	body, _ := json.Marshal(req)
	resp, err := http.Post(p.base+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	c := completion{status: resp.StatusCode, endpoint: resp.Header.Get(proxy.HeaderEndpoint), servedBy: resp.Header.Get(sim.ReceiptHeader),
		prefill: resp.Header.Get(proxy.HeaderPrefill), prefilledBy: resp.Header.Get(sim.PrefilledByHeader),
		decision: resp.Header.Get(proxy.HeaderDecision), body: string(raw)}
	if stream {
		for _, line := range strings.Split(string(raw), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok && d != "[DONE]" {
				if prompt, cached, ok := usageOf([]byte(d)); ok {
					c.prompt, c.cached = prompt, cached
				}
			}
		}
	} else if prompt, cached, ok := usageOf(raw); ok {
		c.prompt, c.cached = prompt, cached
	}
	return c
}

// usageOf reads an OpenAI body's (or stream chunk's) usage: prompt tokens and cached tokens; ok is
// false when the body has no usage.
func usageOf(body []byte) (prompt, cached int, ok bool) {
	var u struct {
		Usage *struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &u) != nil || u.Usage == nil {
		return 0, 0, false
	}
	return u.Usage.PromptTokens, u.Usage.PromptTokensDetails.CachedTokens, true
}

// overlap asks the router (dry run) how many of prompt's blocks endpoint holds.
func (p *pool) overlap(prompt, endpoint string) int {
	body, _ := json.Marshal(map[string]any{"model": p.model, "prompt": prompt})
	hr, _ := http.NewRequest("POST", "/v1/completions", nil)
	req, err := proxy.ParseRequest(hr, body)
	if err != nil {
		p.t.Fatal(err)
	}
	rt, _ := p.g.Router("pool")
	d, err := rt.Explain(context.Background(), req)
	if err != nil {
		return 0
	}
	for _, e := range d.Endpoints {
		if e.Name == endpoint {
			return e.Overlap
		}
	}
	return 0
}

// resident returns an endpoint's resident block count in the gateway's inventory.
func (p *pool) resident(ep string) int {
	keys, _ := p.g.Inventory("pool", ep)
	return len(keys)
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s", d, what)
}

func hits(p *pool, ep string) float64 {
	return promtest.Value(p.t, p.reg, "kvexact_kv_exact_hits_total", map[string]string{"rule": "pool", "endpoint": ep})
}

// docs builds n distinct long prompts (≥ 10 blocks each with llama3).
func docs(n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		var b strings.Builder
		fmt.Fprintf(&b, "Document %d. ", i)
		for j := 0; j < 40; j++ {
			fmt.Fprintf(&b, "Section %d of document %d talks about topic %d in some detail. ", j, i, (i*7+j)%13)
		}
		out = append(out, b.String())
	}
	return out
}

// warmThenHit checks the central promise end to end: after a prompt has been served once, a request
// sharing its prefix goes to the endpoint that caches it — the hit counter moved for that endpoint,
// the gateway's receipt names it, the simulator's own receipt agrees, and cached_tokens is positive.
func warmThenHit(t *testing.T, p *pool, stream bool) {
	for i, doc := range docs(4) {
		first := p.complete(doc, stream)
		if first.status != 200 {
			t.Fatalf("doc %d: status %d: %s", i, first.status, first.body)
		}
		if first.endpoint == "" || first.endpoint != first.servedBy {
			t.Fatalf("doc %d: gateway receipt %q, simulator receipt %q", i, first.endpoint, first.servedBy)
		}
		follow := doc + " And a follow-up question?"
		eventually(t, 15*time.Second, "the inventory to learn doc "+fmt.Sprint(i), func() bool { return p.overlap(follow, first.endpoint) > 0 })
		// Wait until the gateway's inventory covers the prompt's blocks.
		before := hits(p, first.endpoint)
		var again completion
		deadline := time.Now().Add(15 * time.Second)
		for {
			again = p.complete(follow, stream)
			if hits(p, first.endpoint) > before {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("doc %d: no KV-exact hit on %s within 5s; last decision %s", i, first.endpoint, again.decision)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if again.endpoint != first.endpoint || again.servedBy != first.endpoint {
			t.Fatalf("doc %d: warm request went to %s (sim says %s), prefix cached on %s; decision %s", i, again.endpoint, again.servedBy, first.endpoint, again.decision)
		}
		if again.cached <= 0 || again.cached > again.prompt {
			t.Fatalf("doc %d: cached_tokens %d of %d on the warm request", i, again.cached, again.prompt)
		}
	}
}

func TestE2EModeThreeVLLM(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 3, seed: strp("0"), mode: 3, certify: true, replay: true})
	st := p.g.Status().Rules[0]
	if !st.Exact.Enabled || st.Exact.Binding != "engine" {
		t.Fatalf("exact not enabled with a matching certificate: %+v", st.Exact)
	}
	warmThenHit(t, p, false)
	warmThenHit(t, p, true)
}

func TestE2EModeThreeSGLang(t *testing.T) {
	p := startPool(t, poolSpec{family: "sglang", release: "v0.5.18", n: 2, mode: 3, certify: true, blockSize: 16})
	warmThenHit(t, p, false)
}

func TestE2EModeThreeTRTLLM(t *testing.T) {
	p := startPool(t, poolSpec{family: "trtllm", release: "1.2", n: 2, mode: 3, certify: true, blockSize: 16})
	if b := p.g.Status().Rules[0].Exact.Binding; b != "router" {
		t.Fatalf("trtllm binding %q, want router", b)
	}
	warmThenHit(t, p, false)
}

func TestE2EExactRefusedWithoutCertificate(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: false})
	st := p.g.Status().Rules[0]
	if st.Exact.Enabled || !strings.Contains(st.Exact.Reason, "no certificate") {
		t.Fatalf("exact enabled without a certificate: %+v", st.Exact)
	}
	doc := docs(1)[0]
	first := p.complete(doc, false)
	eventually(t, 5*time.Second, "the inventory to learn", func() bool { return p.resident(first.endpoint) > 0 })
	for i := 0; i < 4; i++ {
		c := p.complete(doc, false)
		if strings.Contains(c.decision, `"tier":"kv-exact"`) || !strings.Contains(c.decision, "no_certificate") {
			t.Fatalf("uncertified rule decided by KV-exact: %s", c.decision)
		}
	}
	// A certificate for a different profile (other seed) does not enable it either.
	tok, _ := tokenizerPool(t).Get("llama3")
	js, cs := tok.Files()
	prof := certificate.NewProfile("vllm", "vllm-kv-map-v2", "llama3", js, cs, tok.Config().ChatTemplate, 16, "auto", "sha256", strp("1"))
	c := &certificate.Certificate{Format: certificate.FormatVersion, Profile: prof, ProfileDigest: prof.Digest(), IssuedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour),
		Endpoints: []certificate.Endpoint{{Name: "e0", Certified: []certificate.Coverage{certificate.CoverEngine}}, {Name: "e1", Certified: []certificate.Coverage{certificate.CoverEngine}}}}
	if err := p.g.SetCertificates([]*certificate.Certificate{c}); err != nil {
		t.Fatal(err)
	}
	if st := p.g.Status().Rules[0].Exact; st.Enabled || !strings.Contains(st.Reason, "differs from the rule's staged profile") {
		t.Fatalf("mismatching certificate accepted: %+v", st)
	}
	// The reason names the one field that differs, with both values, and no other.
	want := fmt.Sprintf("in seed fingerprint: certificate %q, rule %q;", prof.SeedFingerprint, certificate.SeedFingerprint(strp("0")))
	if st := p.g.Status().Rules[0].Exact; !strings.Contains(st.Reason, want) || strings.Contains(st.Reason, "hash algorithm:") || strings.Contains(st.Reason, "binding:") {
		t.Fatalf("the reason does not name the seed alone (want %s): %s", want, st.Reason)
	}
}

func TestE2EConnectFailureGoesToSecondBest(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 3, seed: strp("0"), mode: 3, certify: true})
	doc := docs(1)[0]
	// Warm two endpoints with the same document (round robin spreads the first requests).
	holders := map[string]bool{}
	for len(holders) < 2 {
		c := p.complete(fmt.Sprintf("%d %s", len(holders), doc), false)
		_ = c
		for _, s := range p.sims {
			for _, ep := range []string{s.Config().Endpoint} {
				if p.resident(ep) > 0 {
					holders[ep] = true
				}
			}
		}
	}
	// Now send the doc to the best holder: it wins; then make it refuse connections.
	c := p.complete(doc, false)
	eventually(t, 5*time.Second, "learned", func() bool { return p.resident(c.endpoint) > 0 })
	var best completion
	eventually(t, 5*time.Second, "kv hit", func() bool {
		best = p.complete(doc, false)
		return strings.Contains(best.decision, `"tier":"kv-exact"`)
	})
	var bestSim *sim.Engine
	for _, s := range p.sims {
		if s.Config().Endpoint == best.endpoint {
			bestSim = s
		}
	}
	refuse := true
	if _, err := bestSim.SetFaults(sim.FaultPatch{Refuse: &refuse}); err != nil {
		t.Fatal(err)
	}
	got := p.complete(doc, false)
	if got.status != 200 || got.endpoint == best.endpoint || got.servedBy != got.endpoint {
		t.Fatalf("after refusing %s: status %d served by %s (sim %s)", best.endpoint, got.status, got.endpoint, got.servedBy)
	}
}

func TestE2EBreakerOpensAndHeals(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 0})
	bad := p.sims[0]
	n := 5
	if _, err := bad.SetFaults(sim.FaultPatch{Status5xx: &n}); err != nil {
		t.Fatal(err)
	}
	// Three consecutive origin 5xx open e0's breaker; the 5xx are relayed, not retried.
	statuses := map[int]int{}
	for i := 0; i < 8; i++ {
		statuses[p.complete("hello there", false).status]++
	}
	if statuses[500]+statuses[502]+statuses[503] == 0 {
		t.Fatalf("origin 5xx not relayed: %v", statuses)
	}
	var e0 gateway.EndpointStatus
	eventually(t, 2*time.Second, "the breaker to open", func() bool {
		e0 = p.g.Status().Rules[0].Endpoints[0]
		return e0.Breaker == "open"
	})
	for i := 0; i < 6; i++ {
		if c := p.complete("hello there", false); c.status != 200 || c.endpoint != "e1" {
			t.Fatalf("open breaker still routed: %+v", c)
		}
	}
}

func TestE2EConcurrentStreamsNoLeak(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true, simMod: func(i int, c *sim.Config) {
		c.MaxConcurrency = 1000
		c.DecodePerToken = 0
		c.PrefillPerToken = 0
	}})
	p.complete("warm up", true)
	base := runtime.NumGoroutine()
	const n = 1000
	var wg sync.WaitGroup
	errs := make(chan string, n)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 200}}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"model":"llama3","prompt":"stream %d please","max_tokens":3,"stream":true}`, i)
			resp, err := client.Post(p.base+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				errs <- err.Error()
				return
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(raw), "[DONE]") {
				errs <- fmt.Sprintf("status %d body %q", resp.StatusCode, raw)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatalf("stream failed: %s", e)
	}
	client.CloseIdleConnections()
	p.transport.CloseIdleConnections()
	eventually(t, 10*time.Second, "goroutines to settle", func() bool { return runtime.NumGoroutine() <= base+20 })
}

// TestE2EPrefillDecode runs the P/D ladder (mode 1) against simulators of each family in their own
// dialect: the prefill that caches a prompt's prefix serves its next prefill (KV-exact tier, hit
// counter moved), the decode engine's receipt names that same prefill endpoint, and decode endpoints
// are never KV candidates.
func TestE2EPrefillDecode(t *testing.T) {
	for _, tc := range []struct{ family, release string }{{"vllm", "v0.25.1"}, {"sglang", "v0.5.18"}, {"trtllm", "1.2"}} {
		t.Run(tc.family, func(t *testing.T) {
			p := startPool(t, poolSpec{family: tc.family, release: tc.release, n: 3, seed: strp("0"), mode: 1, certify: true, blockSize: 16,
				roles: []string{"prefill", "prefill", "decode"}})
			for i, doc := range docs(3) {
				first := p.complete(doc, false)
				if first.status != 200 {
					t.Fatalf("doc %d: status %d: %s", i, first.status, first.body)
				}
				if first.endpoint != "e2" || first.servedBy != "e2" {
					t.Fatalf("doc %d: decode receipts %q / %q, want e2", i, first.endpoint, first.servedBy)
				}
				if first.prefill == "" || first.prefill != first.prefilledBy {
					t.Fatalf("doc %d: gateway says prefill %q, decode engine says %q", i, first.prefill, first.prefilledBy)
				}
				follow := doc + " One more question?"
				eventually(t, 15*time.Second, "the prefill inventory", func() bool { return p.overlap(follow, first.prefill) > 0 })
				before := hits(p, first.prefill)
				var again completion
				eventually(t, 15*time.Second, "a KV-exact prefill hit", func() bool {
					again = p.complete(follow, false)
					return hits(p, first.prefill) > before
				})
				if again.status != 200 || again.prefill != first.prefill || again.prefilledBy != first.prefill || again.endpoint != "e2" {
					t.Fatalf("doc %d: warm request prefilled on %q (engine says %q), decoded on %q; prefix cached on %s; decision %s",
						i, again.prefill, again.prefilledBy, again.endpoint, first.prefill, again.decision)
				}
				if !strings.Contains(again.decision, `"tier":"kv-exact"`) || strings.Contains(again.decision, `"name":"e2"`) {
					t.Fatalf("doc %d: decision %s", i, again.decision)
				}
			}
			// Predicted vs realized is accounted on the prefill endpoints (their leg's own usage),
			// never on the decode endpoint, whose cached_tokens count the KV it pulled.
			var pred, real float64
			for _, ep := range []string{"e0", "e1"} {
				pred += promtest.Value(t, p.reg, "kvexact_predicted_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": ep})
				real += promtest.Value(t, p.reg, "kvexact_realized_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": ep})
			}
			if pred < 16 || real < pred {
				t.Fatalf("prefill endpoints: predicted %v, realized %v cached tokens", pred, real)
			}
			if d := promtest.Value(t, p.reg, "kvexact_realized_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": "e2"}); d != 0 {
				t.Fatalf("the decode endpoint was accounted %v realized tokens", d)
			}
		})
	}
}

// TestE2EGracefulShutdownFinishesStreams: a stream in flight when shutdown starts completes.
func TestE2EGracefulShutdownFinishesStreams(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 0, simMod: func(i int, c *sim.Config) {
		c.DecodePerToken = 20 * time.Millisecond
	}})
	resp, err := http.Post(p.base+"/v1/completions", "application/json", strings.NewReader(`{"model":"llama3","prompt":"tell me a long story","max_tokens":40,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 1)
	if _, err := resp.Body.Read(buf); err != nil { // the stream has started
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- p.srv.Shutdown(ctx)
	}()
	rest, err := io.ReadAll(resp.Body)
	if err != nil || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("stream cut by shutdown: %v, %q", err, rest)
	}
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if _, err := http.Post(p.base+"/v1/completions", "application/json", strings.NewReader(`{}`)); err == nil {
		t.Fatal("listener still accepting after shutdown")
	}
}

// TestE2EReprobeFencesChangedEngine: an endpoint that no longer tokenizes like the gateway (here its
// engine was restarted with another model's tokenizer after certification) is fenced from KV-exact
// by the periodic re-probe, and the status and metric say why; the healthy endpoint stays certified.
func TestE2EReprobeFencesChangedEngine(t *testing.T) {
	qwen, err := tokenize.NewPool("").Get("qwen3")
	if err != nil {
		t.Skipf("qwen3 tokenizer not found: %v", err)
	}
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true, reprobe: 100 * time.Millisecond,
		simMod: func(i int, c *sim.Config) {
			if i == 1 {
				c.Tokenizer = qwen
			}
		}})
	var st gateway.RuleStatus
	eventually(t, 5*time.Second, "the re-probe to fence e1", func() bool {
		st = p.g.Status().Rules[0]
		return st.Endpoints[1].Fenced != ""
	})
	if !strings.Contains(st.Endpoints[1].Fenced, "tokenizer changed") || st.Endpoints[0].Fenced != "" {
		t.Fatalf("fences: e0 %q, e1 %q", st.Endpoints[0].Fenced, st.Endpoints[1].Fenced)
	}
	if v := promtest.Value(t, p.reg, "kvexact_endpoint_exact_fenced", map[string]string{"endpoint": "e1"}); v != 1 {
		t.Fatalf("fence metric = %v", v)
	}
	// KV-exact never picks e1 now, even for a prompt it holds.
	doc := docs(1)[0]
	body, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": doc, "max_tokens": 1})
	http.Post(p.sims[1].URL()+"/v1/completions", "application/json", bytes.NewReader(body))
	time.Sleep(200 * time.Millisecond)
	for i := 0; i < 3; i++ {
		c := p.complete(doc, false)
		if strings.Contains(c.decision, `"tier":"kv-exact"`) && c.endpoint == "e1" {
			t.Fatalf("fenced endpoint chosen by KV-exact: %s", c.decision)
		}
	}
}
