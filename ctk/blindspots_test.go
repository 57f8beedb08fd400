package ctk_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// poolOf writes one pool of several simulators of one family: each endpoint named by its
// simulator's Endpoint, with its own events unless events overrides them.
func poolOf(staged []string, events map[string]*sim.Engine, sims ...*sim.Engine) *ctk.Pool {
	c := sims[0].Config()
	var b strings.Builder
	fmt.Fprintf(&b, "model: llama3\nengine: {family: %s, release: %s}\n", c.Family, c.Release)
	for _, s := range staged {
		b.WriteString(s + "\n")
	}
	b.WriteString("endpoints:\n")
	for _, e := range sims {
		name := e.Config().Endpoint
		fmt.Fprintf(&b, "  - name: %s\n    address: %s\n", name, e.URL())
		src := e
		if o := events[name]; o != nil {
			src = o
		}
		if pubs := src.PublishAddrs(); len(pubs) > 0 {
			fmt.Fprintf(&b, "    events:\n      zmq: [%s]\n", strings.Join(pubs, ", "))
			if reps := src.ReplayAddrs(); len(reps) > 0 {
				fmt.Fprintf(&b, "      replay: [%s]\n", strings.Join(reps, ", "))
			}
		} else if c.Family == "trtllm" {
			fmt.Fprintf(&b, "    events: {drain: %s}\n", src.URL())
		}
	}
	p, err := ctk.ParsePool([]byte(b.String()))
	Expect(err).NotTo(HaveOccurred(), b.String())
	return p
}

// verdict finds an endpoint's verdict.
func verdict(res *ctk.Result, name string) ctk.EndpointResult {
	for _, e := range res.Endpoints {
		if e.Name == name {
			return e
		}
	}
	Fail("no verdict for " + name)
	return ctk.EndpointResult{}
}

// failsWithLeg asserts the run failed, that bad failed with leg named by a failing spec (and no
// spec failed with a leg in not), and that good still certified.
func failsWithLeg(res *ctk.Result, good, bad, leg string, not ...string) {
	GinkgoHelper()
	Expect(res.ExitCode).To(Equal(1), failed(res))
	Expect(verdict(res, good).OK).To(BeTrue(), failed(res))
	Expect(verdict(res, bad).OK).To(BeFalse(), failed(res))
	legs := map[string]bool{}
	for _, s := range res.Specs {
		if s.Endpoint == bad && s.State == ctk.Fail {
			legs[s.Leg] = true
		}
	}
	Expect(legs).To(HaveKey(leg), failed(res))
	for _, l := range not {
		Expect(legs).NotTo(HaveKey(l), failed(res))
	}
}

func named(name string, mod func(*sim.Config)) func(*sim.Config) {
	return func(c *sim.Config) {
		c.Endpoint = name
		if c.Family == "vllm" {
			c.Seed = strp("0")
		}
		if mod != nil {
			mod(c)
		}
	}
}

var familyOf = map[string]string{"vllm": "v0.25.1", "sglang": "v0.5.18", "trtllm": "1.2"}

var _ = Describe("drops at the start of a stream", func() {
	// SGLang's first message is its startup AllBlocksCleared, published before any subscriber
	// exists (PUB sends it to nobody; the connect-time replay delivers it): dropping it alone is not
	// a loss, so SGLang's cases drop it and what follows.
	for _, c := range []struct {
		family string
		drop   int
	}{{"vllm", 1}, {"vllm", 3}, {"sglang", 2}, {"sglang", 3}, {"trtllm", 1}, {"trtllm", 3}} {
		It(fmt.Sprintf("fail the sequence leg for %s --drop-events %d, the correct endpoint still certifying", c.family, c.drop), func() {
			good := startSim(c.family, familyOf[c.family], named("good", nil))
			bad := startSim(c.family, familyOf[c.family], named("bad", func(s *sim.Config) { s.Faults.DropEvents = c.drop }))
			res := certify(poolOf([]string{`seed: "0"`}, nil, good, bad), nil)
			failsWithLeg(res, "good", "bad", ctk.LegSequence, ctk.LegTokens, ctk.LegTokenizer)
		})
	}
})

var _ = Describe("a stream that keeps skipping sequence numbers", func() {
	for _, family := range []string{"vllm", "sglang", "trtllm"} {
		It("fails the sequence leg for "+family, func() {
			good := startSim(family, familyOf[family], named("good", nil))
			bad := startSim(family, familyOf[family], named("bad", func(s *sim.Config) { s.Faults.SkipSeqEvery = 2 }))
			res := certify(poolOf([]string{`seed: "0"`}, nil, good, bad), nil)
			failsWithLeg(res, "good", "bad", ctk.LegSequence, ctk.LegTokens)
		})
	}
})

var _ = Describe("events from another engine", func() {
	for _, family := range []string{"vllm", "sglang", "trtllm"} {
		It("name the events leg when "+family+"'s event address is another engine's", func() {
			good := startSim(family, familyOf[family], named("good", nil))
			other := startSim(family, familyOf[family], named("other", nil))
			bad := startSim(family, familyOf[family], named("bad", nil))
			// The other engine serves traffic all along, so its stream carries stored events.
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					body := fmt.Sprintf(`{"model":"llama3","prompt":"background traffic %d of another engine, long enough to fill blocks of sixteen tokens each","max_tokens":1}`, i)
					if resp, err := http.Post(other.URL()+"/v1/completions", "application/json", strings.NewReader(body)); err == nil {
						resp.Body.Close()
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
			DeferCleanup(func() { cancel(); wg.Wait() })
			res := certify(poolOf([]string{`seed: "0"`}, map[string]*sim.Engine{"bad": other}, good, bad), nil)
			failsWithLeg(res, "good", "bad", ctk.LegEvents, ctk.LegTokens, ctk.LegClear, ctk.LegTokenizer, ctk.LegTemplate)
			s := spec(res, "bad", "stored-block event")
			Expect(s.Message).To(ContainSubstring("belongs to another endpoint/model"))
			addr := other.URL()
			if family != "trtllm" {
				addr = other.PublishAddrs()[0]
			}
			Expect(s.Message).To(ContainSubstring(addr))
		})
	}
})

// llama3With is the llama3 tokenizer with its tokenizer.json and chat template edited.
func llama3With(editJSON func(map[string]any), editTemplate func(string) string) *tokenize.Tokenizer {
	dir, err := tokenize.FindModelDir(tokenize.DefaultRoots(), "llama3")
	if err != nil {
		Skip("the llama3 tokenizer is not available: " + err.Error())
	}
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	Expect(err).NotTo(HaveOccurred())
	cj, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	Expect(err).NotTo(HaveOccurred())
	if editJSON != nil {
		var m map[string]any
		Expect(json.Unmarshal(tj, &m)).To(Succeed())
		editJSON(m)
		tj, err = json.Marshal(m)
		Expect(err).NotTo(HaveOccurred())
	}
	if editTemplate != nil {
		var cfg map[string]any
		Expect(json.Unmarshal(cj, &cfg)).To(Succeed())
		before := cfg["chat_template"].(string)
		cfg["chat_template"] = editTemplate(before)
		Expect(cfg["chat_template"]).NotTo(Equal(before), "the template edit changed nothing")
		cj, err = json.Marshal(cfg)
		Expect(err).NotTo(HaveOccurred())
	}
	t, err := tokenize.FromBytes(tj, cj)
	Expect(err).NotTo(HaveOccurred())
	return t
}

var _ = Describe("a TensorRT-LLM engine with another chat template", func() {
	const gen = "<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
	for _, c := range []struct{ name, replace string }{
		{`"assistant"→"model"`, "<|start_header_id|>model<|end_header_id|>\n\n' }}{% endif %}"},
		{`\n\n→\n`, "<|start_header_id|>assistant<|end_header_id|>\n' }}{% endif %}"},
	} {
		It("fails the chat-template leg by token ids when the generation prompt is "+c.name, func() {
			other := llama3With(nil, func(t string) string { return strings.Replace(t, gen, c.replace, 1) })
			good := startSim("trtllm", "1.2", named("good", nil))
			bad := startSim("trtllm", "1.2", named("bad", func(s *sim.Config) { s.Tokenizer = other }))
			res := certify(poolOf(nil, nil, good, bad), nil)
			failsWithLeg(res, "good", "bad", ctk.LegTemplate, ctk.LegTokenizer)
			Expect(spec(res, "bad", "chat template").Message).To(ContainSubstring("first difference at token"))
		})
	}
})

var _ = Describe("an engine tokenizer with one reserved special token renamed", func() {
	renamed := func() *tokenize.Tokenizer {
		return llama3With(func(m map[string]any) {
			for _, a := range m["added_tokens"].([]any) {
				if t := a.(map[string]any); t["content"] == "<|reserved_special_token_200|>" {
					t["content"] = "<|reserved_special_token_200_renamed|>"
				}
			}
		}, nil)
	}
	for _, family := range []string{"vllm", "sglang", "trtllm"} {
		It("fails the tokenizer leg for "+family, func() {
			good := startSim(family, familyOf[family], named("good", nil))
			bad := startSim(family, familyOf[family], named("bad", func(s *sim.Config) { s.Tokenizer = renamed() }))
			res := certify(poolOf([]string{`seed: "0"`}, nil, good, bad), nil)
			failsWithLeg(res, "good", "bad", ctk.LegTokenizer)
			Expect(spec(res, "bad", "add_special_tokens=true").Message).To(ContainSubstring("reserved_special_token_200"))
		})
	}
})

var _ = Describe("a drop in the middle of the probe's own blocks", func() {
	It("fails the sequence leg only, not the tokens", func() {
		good := startSim("vllm", "v0.25.1", named("good", nil))
		// The probe's prompt is prefilled 16 tokens at a time, one batch per chunk, 5 ms per token.
		bad := startSim("vllm", "v0.25.1", named("bad", func(s *sim.Config) { s.PrefillChunk, s.PrefillPerToken = 16, 5*time.Millisecond }))
		// Watch bad's stream; when the probe's first chunk is out, drop the next message.
		ctx, cancel := context.WithCancel(context.Background())
		sub := zmq4.NewSub(ctx)
		DeferCleanup(func() { cancel(); sub.Close() })
		Expect(sub.Dial(bad.PublishAddrs()[0])).To(Succeed())
		Expect(sub.SetOption(zmq4.OptionSubscribe, "")).To(Succeed())
		tok := tokenizer("llama3")
		armed := make(chan struct{})
		go func() {
			for {
				msg, err := sub.Recv()
				if err != nil {
					return
				}
				_, _, payload, err := engines.ParseFrames(msg.Frames)
				if err != nil {
					continue
				}
				b, err := vllm.DecodeBatch(payload)
				if err != nil {
					continue
				}
				for _, ev := range b.Events {
					if text, _ := tok.Decode(ev.TokenIDs, true); strings.HasPrefix(text, "kvexact certification probe") {
						one := 1
						_, _ = bad.SetFaults(sim.FaultPatch{DropEvents: &one})
						close(armed)
						return
					}
				}
			}
		}()
		res := certify(poolOf([]string{`seed: "0"`}, nil, good, bad), nil)
		Eventually(armed).Should(BeClosed(), "the probe's first chunk was never seen")
		failsWithLeg(res, "good", "bad", ctk.LegSequence, ctk.LegTokens, ctk.LegEvents)
		Expect(spec(res, "bad", "token ids").State).To(Equal(ctk.Skip))
	})
})

var _ = Describe("simulator legs", func() {
	It("fail the release leg when the engine reports a release no contract covers", func() {
		good := startSim("vllm", "v0.25.1", named("good", nil))
		bad := startSim("vllm", "v0.25.1", named("bad", func(s *sim.Config) { s.ReportVersion = "0.99.0" }))
		res := certify(poolOf([]string{`seed: "0"`}, nil, good, bad), nil)
		failsWithLeg(res, "good", "bad", ctk.LegRelease)
		Expect(spec(res, "bad", "reports a release").Message).To(ContainSubstring("0.99.0"))
	})

	for _, family := range []string{"vllm", "trtllm"} {
		It("fail the events leg when "+family+" runs with KV events off", func() {
			good := startSim(family, familyOf[family], named("good", nil))
			bad := startSim(family, familyOf[family], named("bad", func(s *sim.Config) { s.NoEvents = true }))
			p := poolOf([]string{`seed: "0"`}, map[string]*sim.Engine{"bad": good}, good, bad)
			if family == "vllm" {
				// Nothing publishes there: events off means no publisher at all, not the default port.
				Expect(bad.PublishAddrs()).To(BeEmpty())
				p.Endpoints[1].Events.ZMQ, p.Endpoints[1].Events.Replay = []string{"tcp://127.0.0.1:1"}, nil
			} else {
				p.Endpoints[1].Events.Drain = bad.URL()
			}
			res := certify(p, nil)
			failsWithLeg(res, "good", "bad", ctk.LegEvents, ctk.LegTokens)
		})
	}

	It("skip the clear spec, naming dev mode, when vLLM does not mount /reset_prefix_cache", func() {
		e := startSim("vllm", "v0.25.1", named("P0", func(s *sim.Config) { s.DevMode = false }))
		res := certify(poolFor(e, "P0", `seed: "0"`), nil)
		Expect(res.ExitCode).To(Equal(0), failed(res))
		s := spec(res, "P0", "cache clear")
		Expect(s.State).To(Equal(ctk.Skip))
		Expect(s.Message).To(ContainSubstring("VLLM_SERVER_DEV_MODE=1"))
	})
})
