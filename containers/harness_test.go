package containers_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvexact/kvexact/containers"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// The suite shares one harness, one static build of the binaries and their images per test binary.
var (
	setupOnce sync.Once
	setupErr  error
	skipWhy   string
	hv        *containers.Harness
	binDir    string
	bins      map[string]string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if hv != nil {
		hv.Close()
	}
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// harness connects to Docker, reaps dangling containers of dead runs, builds enginesim and
// gateway statically and their FROM scratch images — once. Without a daemon the test skips.
func harness(t *testing.T) *containers.Harness {
	t.Helper()
	setupOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		h, err := containers.Connect(ctx, containers.Options{})
		if errors.Is(err, containers.ErrNoDocker) {
			skipWhy = err.Error()
			return
		}
		if err != nil {
			setupErr = err
			return
		}
		hv = h
		if n, err := h.Reap(ctx); err != nil {
			setupErr = err
			return
		} else if n > 0 {
			fmt.Fprintf(os.Stderr, "containers: removed %d dangling container(s) of dead runs\n", n)
		}
		root, err := containers.ModuleRoot()
		if err != nil {
			setupErr = err
			return
		}
		if binDir, err = os.MkdirTemp("", "kvexact-bin-"); err != nil {
			setupErr = err
			return
		}
		start := time.Now()
		if bins, err = h.BuildImages(ctx, root, binDir, "enginesim", "gateway"); err != nil {
			setupErr = err
			return
		}
		fmt.Fprintf(os.Stderr, "containers: binaries and images built in %s\n", time.Since(start).Round(time.Millisecond))
	})
	if skipWhy != "" {
		missingPeer(t, skipWhy) // under CI a missing daemon fails
	}
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	return hv
}

// model is the tokenizer the containers load: the smallest staged folder that works (mistral7b
// starts in about a second; llama3's 9 MB tokenizer.json takes several). KVEXACT_CONTAINERS_MODEL
// overrides it.
func model() string {
	if m := os.Getenv("KVEXACT_CONTAINERS_MODEL"); m != "" {
		return m
	}
	return "mistral7b"
}

const (
	ruleName   = "pool"
	adminToken = "containers-test-token"
	seed       = "0"
)

// pool is a gateway in front of simulated vLLM engines, all on the host's network.
type pool struct {
	t       *testing.T
	h       *containers.Harness
	model   string
	root    string
	engines map[string]*containers.Engine
	names   []string
	gw      *containers.Gateway
	http    *http.Client
}

type poolOpts struct {
	engines    int
	certify    bool     // write a certificate so KV-exact runs (routing outcomes through receipts)
	engineArgs []string // extra enginesim flags for every engine
	network    bool     // every engine on one bridge network (ports published on 127.0.0.1), so links can be cut
}

func newPool(t *testing.T, o poolOpts) *pool {
	t.Helper()
	h := harness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m := model()
	root, err := containers.TokenizerRoot(m)
	if err != nil {
		t.Skip(err.Error())
	}
	p := &pool{t: t, h: h, model: m, root: root, engines: map[string]*containers.Engine{}, http: &http.Client{Timeout: 60 * time.Second}}
	var nw *containers.Network
	if o.network {
		var err error
		if nw, err = h.CreateNetwork(ctx, "engines"); err != nil {
			t.Fatal(err)
		}
		// Registered before terminate, so it runs after the containers are gone.
		t.Cleanup(func() {
			if err := nw.Remove(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(p.terminate)
	s := seed
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []error
	for i := range o.engines {
		name := fmt.Sprintf("E%d", i)
		p.names = append(p.names, name)
		wg.Go(func() {
			e, err := h.StartEngineSim(ctx, containers.EngineSimSpec{Endpoint: name, Model: m, TokenizerRoot: root, Seed: &s, Replay: true, Args: o.engineArgs, Network: nw})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			p.engines[name] = e
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	cfg, err := p.config()
	if err != nil {
		t.Fatal(err)
	}
	spec := containers.GatewaySpec{Config: cfg, AdminToken: adminToken, TokenizerRoot: root, Models: []string{m}}
	if o.certify {
		cert, err := p.certificate(cfg)
		if err != nil {
			t.Fatal(err)
		}
		spec.Certificates = map[string][]byte{"cert.json": cert}
	}
	if p.gw, err = h.StartGateway(ctx, spec); err != nil {
		t.Fatal(err)
	}
	for _, n := range p.names {
		p.waitConnected(n, 0)
	}
	return p
}

// config is the gateway.yaml of the pool: one mode-3 rule, engine binding with the engines' seed,
// no cold-start seeding (every KV-exact hit goes to the best endpoint, so receipts are exact).
func (p *pool) config() ([]byte, error) {
	ports, err := containers.FreePorts(2)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:%d\nadmin:\n  listen: 127.0.0.1:%d\n  token: %s\n", ports[0], ports[1], adminToken)
	fmt.Fprintf(&b, "tokenizers:\n  root: %s\nrules:\n- name: %s\n  models: [%s]\n", containers.TokenizersMount, ruleName, p.model)
	fmt.Fprintf(&b, "  engine: {family: vllm, release: v0.25.1}\n  selector: rr\n  kvExactMode: 3\n  seed: %q\n", seed)
	b.WriteString("  loadLaw: {coldStartSeedN: 0}\n  endpoints:\n")
	for _, n := range p.names {
		e := p.engines[n]
		fmt.Fprintf(&b, "  - name: %s\n    address: %s\n    events:\n      zmq: [%q]\n      replay: [%q]\n", n, e.URL(), e.PublishAddr(), e.ReplayAddr())
	}
	return []byte(b.String()), nil
}

// certificate stands in for `ctk certify`: the simulator shares the gateway's hash core and
// tokenizer, so the engine binding is proven by construction. The profile is computed exactly as
// the gateway computes it (gateway.certify): normalized rule, staged tokenizer digests, template.
func (p *pool) certificate(cfg []byte) ([]byte, error) {
	c, err := rules.Parse(cfg)
	if err != nil {
		return nil, err
	}
	r := c.Rules[0]
	ct := r.Contract()
	tok, err := tokenize.NewPool(p.root).Get(p.model)
	if err != nil {
		return nil, err
	}
	js, cs := tok.Files()
	prof := certificate.NewProfile(ct.Family, ct.ID, p.model, js, cs, tok.Config().ChatTemplate, r.BlockSize, r.Binding, r.HashAlgorithm, r.Seed)
	now := time.Now().UTC()
	cert := &certificate.Certificate{Format: certificate.FormatVersion, Profile: prof, ProfileDigest: prof.Digest(),
		IssuedAt: now, ExpiresAt: now.Add(2 * time.Hour), Issuer: "containers_test (simulated engines)"}
	for i := range r.Endpoints {
		cert.Endpoints = append(cert.Endpoints, certificate.NewEndpoint(gateway.IdentityOf(&r, i), []certificate.Coverage{certificate.CoverEngine}))
	}
	dir := p.t.TempDir()
	if err := cert.Write(dir + "/cert.json"); err != nil {
		return nil, err
	}
	return os.ReadFile(dir + "/cert.json")
}

// terminate dumps the logs when the test failed, then removes every container of the pool.
func (p *pool) terminate() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var all []*containers.Container
	if p.gw != nil {
		all = append(all, p.gw.Container)
	}
	for _, n := range p.names {
		if e := p.engines[n]; e != nil {
			all = append(all, e.Container)
		}
	}
	for _, c := range all {
		if p.t.Failed() {
			if logs, err := c.Logs(ctx); err == nil {
				lines := strings.Split(strings.TrimRight(logs, "\n"), "\n")
				if len(lines) > 60 {
					lines = lines[len(lines)-60:]
				}
				p.t.Logf("--- %s (last %d lines) ---\n%s", c.Name, len(lines), strings.Join(lines, "\n"))
			}
		}
		if err := c.Terminate(ctx); err != nil {
			p.t.Errorf("terminate %s: %v", c.Name, err)
		}
	}
}

func (p *pool) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	p.t.Cleanup(cancel)
	return ctx
}

// prompt is a deterministic text of about n words, distinct per tag from its first word on (so two
// tags share no KV block).
func prompt(tag string, n int) string {
	words := []string{"amber", "basil", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
		"kelp", "lumen", "meadow", "nectar", "onyx", "pepper", "quartz", "raven", "saffron", "tundra", "umber",
		"velvet", "willow", "xenon", "yarrow", "zephyr"}
	h := fnv.New64a()
	h.Write([]byte(tag))
	x := h.Sum64() | 1
	var b strings.Builder
	b.WriteString("Record " + tag + ":")
	for range n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b.WriteString(" " + words[x%uint64(len(words))])
	}
	return b.String()
}

// send posts a completion through the gateway and requires a 200 with consistent receipts.
func (p *pool) send(text string, maxTokens int) *containers.Completion {
	p.t.Helper()
	c, err := containers.Complete(p.ctx(), p.http, p.gw.URL(), containers.CompletionRequest{Model: p.model, Prompt: text, MaxTokens: maxTokens})
	if err != nil {
		p.t.Fatalf("gateway completion: %v", err)
	}
	if c.Status != http.StatusOK {
		p.t.Fatalf("gateway completion: status %d: %s", c.Status, c.Body)
	}
	if c.Endpoint == "" || c.Endpoint != c.ServedBy {
		p.t.Fatalf("receipts disagree: gateway says %q, backend says %q", c.Endpoint, c.ServedBy)
	}
	return c
}

// direct posts a completion straight to one engine (the gateway only sees its events) and returns
// the keys it added to the engine's cache.
func (p *pool) direct(ep, text string) map[uint64]bool {
	p.t.Helper()
	e := p.engines[ep]
	before := p.cache(ep)
	c, err := containers.Complete(p.ctx(), p.http, e.URL(), containers.CompletionRequest{Model: p.model, Prompt: text, MaxTokens: 1})
	if err != nil || c.Status != http.StatusOK {
		p.t.Fatalf("direct completion to %s: %v %+v", ep, err, c)
	}
	after := p.cache(ep)
	added := map[uint64]bool{}
	for k := range after {
		if _, ok := before[k]; !ok {
			added[k] = true
		}
	}
	return added
}

func (p *pool) cache(ep string) map[uint64]int {
	p.t.Helper()
	m, err := p.engines[ep].Cache(p.ctx())
	if err != nil {
		p.t.Fatalf("engine %s cache: %v", ep, err)
	}
	return m
}

func (p *pool) inventory(ep string) map[uint64]int {
	p.t.Helper()
	m, err := p.gw.Inventory(p.ctx(), ruleName, ep)
	if err != nil {
		p.t.Fatalf("inventory %s: %v", ep, err)
	}
	return m
}

func (p *pool) metric(name string, labels map[string]string) float64 {
	p.t.Helper()
	m, err := p.gw.Metrics(p.ctx())
	if err != nil {
		p.t.Fatalf("metrics: %v", err)
	}
	return m.Sum(name, labels)
}

func (p *pool) explain(text string) *containers.Decision {
	p.t.Helper()
	d, err := p.gw.Explain(p.ctx(), containers.CompletionRequest{Model: p.model, Prompt: text, MaxTokens: 1})
	if err != nil {
		p.t.Fatalf("explain: %v", err)
	}
	return d
}

// eventually polls cond every 50ms until it holds or the deadline passes; then it fails with the
// last description cond gave.
func (p *pool) eventually(within time.Duration, what string, cond func() (bool, string)) {
	p.t.Helper()
	p.eventuallyDiag(within, what, cond, nil)
}

// eventuallyDiag is eventually that, on a failure, also logs what diag reports (nil: nothing).
func (p *pool) eventuallyDiag(within time.Duration, what string, cond func() (bool, string), diag func() string) {
	p.t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		ok, desc := cond()
		if ok {
			return
		}
		last = desc
		if time.Now().After(deadline) {
			if diag != nil {
				p.t.Log(diag())
			}
			p.t.Fatalf("%s: not within %s: %s", what, within, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitSynced waits until the gateway's inventory of ep equals the engine's cache, key for key
// and copy for copy.
func (p *pool) waitSynced(ep string) map[uint64]int {
	p.t.Helper()
	var inv map[uint64]int
	p.eventually(15*time.Second, "inventory of "+ep+" equals the engine's cache", func() (bool, string) {
		inv = p.inventory(ep)
		c := p.cache(ep)
		return maps.Equal(inv, c), diff(inv, c)
	})
	return inv
}

// waitConnected waits until the gateway's subscription to ep is up and has connected more than
// `reconnects` times after the first.
func (p *pool) waitConnected(ep string, reconnects float64) {
	p.t.Helper()
	lab := map[string]string{"rule": ruleName, "endpoint": ep}
	p.eventually(30*time.Second, "gateway subscribed to "+ep, func() (bool, string) {
		c, r := p.metric("kvexact_ingest_connected", lab), p.metric("kvexact_ingest_reconnects_total", lab)
		return c == 1 && r >= reconnects, fmt.Sprintf("connected=%v reconnects=%v (want >= %v)", c, r, reconnects)
	})
}

func diff(inv, cache map[uint64]int) string {
	var onlyInv, onlyCache, count int
	for k, n := range inv {
		if m, ok := cache[k]; !ok {
			onlyInv++
		} else if m != n {
			count++
		}
	}
	for k := range cache {
		if _, ok := inv[k]; !ok {
			onlyCache++
		}
	}
	return fmt.Sprintf("inventory %d keys, cache %d keys: %d only in inventory, %d only in cache, %d with other counts", len(inv), len(cache), onlyInv, onlyCache, count)
}

func keysOf[M ~map[uint64]V, V any](m M) []uint64 {
	return slices.Sorted(maps.Keys(m))
}

// enginesimHasFlag reports whether the built enginesim knows a flag (features other helpers may
// not have landed yet).
func enginesimHasFlag(name string) bool {
	out, _ := exec.Command(bins["enginesim"], "-h").CombinedOutput()
	return strings.Contains(string(out), "-"+name+" ")
}
