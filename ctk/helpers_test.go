package ctk_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

var (
	tokMu    sync.Mutex
	tokCache = map[string]*tokenize.Tokenizer{}
)

// tokenizer loads a reference tokenizer once, or skips naming what is missing.
func tokenizer(model string) *tokenize.Tokenizer {
	tokMu.Lock()
	defer tokMu.Unlock()
	if t := tokCache[model]; t != nil {
		return t
	}
	dir, err := tokenize.FindModelDir(tokenize.DefaultRoots(), model)
	if err != nil {
		Skip(fmt.Sprintf("the %s tokenizer is not available (run make tokenizers or set KVEXACT_TOKENIZERS): %v", model, err))
	}
	t, err := tokenize.Load(dir)
	Expect(err).NotTo(HaveOccurred())
	tokCache[model] = t
	return t
}

// withTemplate is the llama3 tokenizer with another chat template: same tokens, other prompts.
func withTemplate(tmpl string) *tokenize.Tokenizer {
	dir, err := tokenize.FindModelDir(tokenize.DefaultRoots(), "llama3")
	if err != nil {
		Skip("the llama3 tokenizer is not available: " + err.Error())
	}
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	Expect(err).NotTo(HaveOccurred())
	cj, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	Expect(err).NotTo(HaveOccurred())
	var cfg map[string]any
	Expect(json.Unmarshal(cj, &cfg)).To(Succeed())
	cfg["chat_template"] = tmpl
	cj, err = json.Marshal(cfg)
	Expect(err).NotTo(HaveOccurred())
	t, err := tokenize.FromBytes(tj, cj)
	Expect(err).NotTo(HaveOccurred())
	return t
}

// startSim runs a fast in-process simulator on 127.0.0.1 random ports until the spec ends.
func startSim(family, release string, mod func(*sim.Config)) *sim.Engine {
	c := sim.Config{Family: family, Release: release, Model: "llama3", Tokenizer: tokenizer("llama3"), ServedModelName: "llama3",
		Endpoint: "ep-" + family, PrefillPerToken: time.Microsecond, DecodePerToken: time.Microsecond,
		DrainWait: 50 * time.Millisecond, DevMode: true}
	if family == "vllm" || family == "sglang" {
		c.PublishAddr, c.ReplayAddr = "tcp://*:0", "tcp://*:0"
	}
	if mod != nil {
		mod(&c)
	}
	e, err := sim.New(c)
	Expect(err).NotTo(HaveOccurred())
	Expect(e.Start(context.Background())).To(Succeed())
	DeferCleanup(e.Close)
	return e
}

// poolFor writes the pool document of one simulator: its events, its release, and the staged
// fields given as extra YAML lines.
func poolFor(e *sim.Engine, name string, staged ...string) *ctk.Pool {
	c := e.Config()
	var b strings.Builder
	fmt.Fprintf(&b, "model: llama3\nengine: {family: %s, release: %s}\n", c.Family, c.Release)
	for _, s := range staged {
		b.WriteString(s + "\n")
	}
	fmt.Fprintf(&b, "endpoints:\n  - name: %s\n    address: %s\n", name, e.URL())
	if pubs := e.PublishAddrs(); len(pubs) > 0 {
		fmt.Fprintf(&b, "    events:\n      zmq: [%s]\n", strings.Join(pubs, ", "))
		if reps := e.ReplayAddrs(); len(reps) > 0 {
			fmt.Fprintf(&b, "      replay: [%s]\n", strings.Join(reps, ", "))
		}
	}
	p, err := ctk.ParsePool([]byte(b.String()))
	Expect(err).NotTo(HaveOccurred(), b.String())
	return p
}

// certify runs the kit with the llama3 tokenizer staged and short timeouts.
func certify(p *ctk.Pool, tok *tokenize.Tokenizer) *ctk.Result {
	return certifyWith(p, ctk.Options{Tokenizer: tok})
}

// certifyWith certifies with opts, the tests' tokenizer and timeouts filled in where unset.
func certifyWith(p *ctk.Pool, opts ctk.Options) *ctk.Result {
	if opts.Tokenizer == nil {
		opts.Tokenizer = tokenizer("llama3")
	}
	opts.EventTimeout, opts.SubscribeTimeout = 2*time.Second, 3*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := ctk.Certify(ctx, p, opts)
	Expect(err).NotTo(HaveOccurred())
	return res
}

// spec finds one spec's result by a fragment of its text.
func spec(res *ctk.Result, endpoint, fragment string) ctk.SpecResult {
	for _, s := range res.Specs {
		if s.Endpoint == endpoint && strings.Contains(s.Text, fragment) {
			return s
		}
	}
	Fail(fmt.Sprintf("no spec %q for %s", fragment, endpoint))
	return ctk.SpecResult{}
}

// failed lists the failing specs with their legs, for assertion messages.
func failed(res *ctk.Result) string {
	var b strings.Builder
	for _, s := range res.Specs {
		if s.State == ctk.Fail {
			fmt.Fprintf(&b, "%s [%s] %s\n", s.Text, s.Leg, s.Message)
		}
	}
	return b.String()
}

func strp(s string) *string { return &s }
