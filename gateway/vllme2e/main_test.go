// Package vllme2e_test runs the gateway end to end against real vLLM engines (the CPU build in
// .cache/py/vllm, a tiny llama3 with dummy weights, serving a dummy LoRA adapter): certified by ctk against the live engines,
// then KV-exact routing checked against the engines' own usage receipts, and the simulator held to
// the same engines (simulator_test.go). The engines start once for the package (TestMain), with
// one more beside them that offloads to a host tier (offload_test.go), and are stopped by PID when
// it ends.
package vllme2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
	"github.com/kvexact/kvexact/internal/replicatest"
)

// kvBlocks is each engine's KV cache in blocks: 96 blocks of 32 tokens, above the 64 one
// 2048-token request needs, small enough that a few long prompts evict.
const kvBlocks = 96

// startTimeout bounds one engine's start: about a minute alone on an idle machine, several when
// other engines start beside it on a loaded one (five minutes ran out here at load 20).
const startTimeout = 10 * time.Minute

var (
	env     *vllmpool.Env
	envErr  error
	model   string
	adapter = "tiny-lora" // the dummy LoRA adapter every engine serves (its folder's name)
	engines []*vllmpool.Engine
	seed0   = "0"
	prof    vllmpool.Profile
	certs   []*certificate.Certificate
)

func TestMain(m *testing.M) {
	replicatest.RunIfReplica() // TestReplicasBehindNginx runs this binary as its gateway processes
	code := func() int {
		env, envErr = vllmpool.Find()
		if envErr != nil {
			if envErr == vllmpool.ErrNoEnv && os.Getenv("CI") == "" {
				fmt.Println("vllme2e: skipping:", vllmpool.MissingEnvHint)
				return m.Run() // each test skips with the same message
			}
			fmt.Println("vllme2e:", envErr)
			return 1
		}
		if raceEnabled {
			// The race pass (make test's second go test) would start the engines again for the
			// same tests; they run once, in the plain pass. The gateway's code under race is the
			// simulator suites' job.
			env = nil
			fmt.Println("vllme2e: real engines run in the plain (non-race) pass only")
			return m.Run()
		}
		unlock, err := env.Lock()
		if err != nil {
			fmt.Println(err)
			return 1
		}
		defer unlock()
		dir, err := os.MkdirTemp("", "vllme2e-")
		if err != nil {
			fmt.Println(err)
			return 1
		}
		defer os.RemoveAll(dir)
		model = filepath.Join(dir, "llama3")
		lora := filepath.Join(dir, adapter)
		if err := env.TinyModel(model, "llama3", lora); err != nil {
			fmt.Println(err)
			return 1
		}
		prof = vllmpool.Profile{Model: "llama3", Tokenizer: model, Seed: &seed0}
		if longRun {
			// The long tests start their own engines; the shared pool serves make test's pass.
			return m.Run()
		}
		start := time.Now()
		engines = make([]*vllmpool.Engine, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i := range engines {
			wg.Go(func() {
				engines[i], errs[i] = env.Start(context.Background(), vllmpool.Spec{Name: fmt.Sprintf("e%d", i), Model: model, Seed: &seed0, KVBlocks: kvBlocks, LoRA: lora}, startTimeout)
			})
		}
		// The engine with the offloading connector starts beside the pool (offload_test.go): its
		// own start, in parallel, costs the package less than a restart of e0 or e1 would.
		wg.Go(func() {
			offEngine, offErr = env.Start(context.Background(), vllmpool.Spec{Name: "off", Model: model, Seed: &seed0, KVBlocks: kvBlocks, OffloadBlocks: offloadBlocks}, startTimeout)
		})
		wg.Wait()
		defer func() {
			for _, e := range append(engines, offEngine) {
				if e != nil {
					e.Stop()
				}
			}
		}()
		for _, err := range errs {
			if err != nil {
				fmt.Println(err)
				return 1
			}
		}
		fmt.Printf("vllme2e: engines up in %v\n", time.Since(start).Round(time.Second))
		for _, e := range engines {
			certified = append(certified, e.Spec)
		}
		if certs, err = certify(); err != nil {
			fmt.Println(err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// certify runs ctk against the live shared engines: the gateway gets the certificate they earned.
func certify() ([]*certificate.Certificate, error) { return certifyPool(prof, engines) }

// certifyPool runs ctk against the engines es under the staged profile; an engine that is not
// certified is an error with ctk's report.
func certifyPool(prof vllmpool.Profile, es []*vllmpool.Engine) ([]*certificate.Certificate, error) {
	p, err := vllmpool.Pool(prof, es)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := ctk.Certify(ctx, p, ctk.Options{})
	if err != nil {
		return nil, err
	}
	if res.ExitCode != 0 {
		var b strings.Builder
		res.WriteText(&b)
		return nil, fmt.Errorf("vllme2e: the real pool is not certified:\n%s", b.String())
	}
	return res.Certificates, nil
}

// longRun is KVEXACT_VLLM=long (make vllm-long): only the tests that start engines of their own
// beyond the shared pool's budget in make test run, and the shared pool is not started.
var longRun = os.Getenv("KVEXACT_VLLM") == "long"

// needEnv skips a test when the environment is absent or this is the race pass.
func needEnv(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("real engines run in the plain (non-race) pass of make test")
	}
	if env == nil {
		t.Skip(vllmpool.MissingEnvHint)
	}
}

func needEngines(t *testing.T) {
	t.Helper()
	needEnv(t)
	if longRun {
		t.Skip("the shared engines run in make test's pass; KVEXACT_VLLM=long runs only the tests that start engines of their own")
	}
	for i := range engines {
		if drifted[i] {
			restartWith(t, i, func(s *vllmpool.Spec) { *s = certified[i] })
			delete(drifted, i)
		}
	}
}

// drifted marks the engines a test left running another configuration than the certified one
// (certified[i]): the next test that needs the engines restarts them first, so the package's last
// test pays no restart it does not need.
var (
	drifted   = map[int]bool{}
	certified []vllmpool.Spec
)

// gw is one gateway in front of the shared engines.
type gw struct {
	t     *testing.T
	a     *assemble.Gateway
	reg   *prometheus.Registry
	base  string
	stop  func()
	model string
}

// startGateway is a gateway in front of the shared engines, with their certificates.
func startGateway(t *testing.T) *gw {
	t.Helper()
	needEngines(t)
	return startGatewayOn(t, prof, engines, certs)
}

// startGatewayOn is a gateway routing es under the staged profile (one KV-exact rule "pool") with
// the certificates cs; when an engine serves the LoRA adapter, it returns once the gateway has
// discovered it.
func startGatewayOn(t *testing.T, prof vllmpool.Profile, es []*vllmpool.Engine, cs []*certificate.Certificate) *gw {
	t.Helper()
	cfg := &rules.Config{Listen: "127.0.0.1:0", Admin: rules.Admin{Listen: "127.0.0.1:0", Token: "test-token"}, DebugHeader: true,
		Rules: []rules.Rule{vllmpool.Rule("pool", prof, es)}}
	off := rules.OffDuration(0)
	cfg.Rules[0].PredictOnRoute = &off // predictions rest on engine-confirmed blocks only
	if err := cfg.Normalize(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	opts := gateway.Options{Config: cfg, Certificates: cs, Tokenizers: tokenize.NewPool(""), Registry: reg, ProbeInterval: -1, ReprobeInterval: -1,
		Log: slog.New(slog.DiscardHandler)}
	a, err := assemble.New(assemble.Config{Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	g := &gw{t: t, a: a, reg: reg, base: "http://" + a.Servers.Client["127.0.0.1:0"], model: "llama3"}
	var once sync.Once
	g.stop = func() {
		once.Do(func() {
			sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
			defer c()
			a.Shutdown(sctx)
			cancel()
		})
	}
	t.Cleanup(g.stop)
	if !g.a.Runtime.Status().Rules[0].Exact.Enabled {
		t.Fatalf("KV-exact is not enabled on the certified rule: %+v", g.a.Runtime.Status().Rules[0].Exact)
	}
	if slices.ContainsFunc(es, func(e *vllmpool.Engine) bool { return e.LoRA != "" }) {
		rt, _ := g.a.Runtime.Router("pool")
		eventually(t, 10*time.Second, "the gateway to discover the engines' LoRA adapter", func() bool { return rt.ServesAdapter(adapter) })
	}
	return g
}

// reply is one response as the client sees it.
type reply struct {
	status   int
	endpoint string
	decision decision
	prompt   int
	cached   int
	body     string
}

// decision is the part of the X-Kvexact-Decision header these tests read.
type decision struct {
	Target    string `json:"target"`
	Tier      string `json:"tier"`
	Miss      string `json:"miss"`
	Blocks    int    `json:"blocks"`
	MaxHit    int    `json:"maxHit"`
	Score     int    `json:"score"`
	Predicted bool   `json:"predicted"`
	Rank      *int   `json:"rank"` // the data-parallel rank the request was pinned to
}

// send posts a completion (prompt) or a chat (messages) through the gateway, or straight to an
// engine when base is an engine URL.
func send(t *testing.T, base, path string, req map[string]any, stream bool) reply {
	t.Helper()
	return sendWith(t, base, path, req, stream, nil)
}

// sendWith is send with extra request headers (X-data-parallel-rank straight to an engine).
func sendWith(t *testing.T, base, path string, req map[string]any, stream bool, hdr map[string]string) reply {
	t.Helper()
	req["max_tokens"] = 2
	req["stream"] = stream
	if stream {
		req["stream_options"] = map[string]any{"include_usage": true}
	}
	body, _ := json.Marshal(req)
	hr, err := http.NewRequest("POST", base+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	hr.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		hr.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, endpoint: resp.Header.Get(proxy.HeaderEndpoint), body: string(raw)}
	if d := resp.Header.Get(proxy.HeaderDecision); d != "" {
		if err := json.Unmarshal([]byte(d), &r.decision); err != nil {
			t.Fatalf("decision header %q: %v", d, err)
		}
	}
	var u usageBody
	take := func(b []byte) {
		if json.Unmarshal(b, &u) == nil && u.Usage != nil {
			r.prompt = u.Usage.PromptTokens
			if u.Usage.PromptTokensDetails != nil {
				r.cached = u.Usage.PromptTokensDetails.CachedTokens
			}
		}
	}
	if stream {
		for _, line := range strings.Split(string(raw), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok && d != "[DONE]" {
				take([]byte(d))
			}
		}
	} else {
		take(raw)
	}
	if r.status != 200 {
		t.Fatalf("%s: status %d: %s", path, r.status, raw)
	}
	return r
}

// usageBody is the usage an engine reports in a response (or a stream's last chunk).
type usageBody struct {
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// explain is the router's dry run: the endpoints' evidence for a request.
func (g *gw) explain(path string, req map[string]any) *route.Decision {
	g.t.Helper()
	body, _ := json.Marshal(req)
	hr, _ := http.NewRequest("POST", path, nil)
	pr, err := proxy.ParseRequest(hr, body)
	if err != nil {
		g.t.Fatal(err)
	}
	rt, _ := g.a.Runtime.Router("pool")
	d, err := rt.Explain(context.Background(), pr)
	if err != nil {
		g.t.Fatal(err)
	}
	return d
}

func (g *gw) overlap(path string, req map[string]any, ep string) int {
	for _, e := range g.explain(path, req).Endpoints {
		if e.Name == ep {
			return e.Overlap
		}
	}
	return 0
}

func (g *gw) resident(ep string) int {
	keys, _ := g.a.Runtime.Inventory("pool", ep)
	return len(keys)
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// doc is a distinct prompt of about n sentences (≈ 12 tokens each with llama3).
func doc(tag string, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Document %s. ", tag)
	for j := 0; j < n; j++ {
		fmt.Fprintf(&b, "Section %d of document %s talks about topic %d in some detail. ", j, tag, j%13)
	}
	return b.String()
}
