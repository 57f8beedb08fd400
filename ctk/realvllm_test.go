package ctk_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
)

// Certification against real vLLM engines (the CPU build, tiny models with dummy weights): three
// engines started once for these specs — llama3 "seeded" with PYTHONHASHSEED=0, llama3 "unseeded"
// without it, qwen3 "qwen3" seeded — and every single-leg mismatch staged against them; then two
// of them restarted as "xxhash" (no PYTHONHASHSEED, xxhash) and "silent" (the publisher off).
var _ = Describe("real vLLM", Ordered, Label("vllm"), func() {
	var (
		seeded, unseeded, qwen *vllmpool.Engine
		model, qwenModel       string
	)
	BeforeAll(func() {
		env := realEnv()
		unlock, err := env.Lock()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(unlock)
		model = filepath.Join(GinkgoT().TempDir(), "llama3")
		Expect(env.TinyModel(model, "llama3", "")).To(Succeed())
		qwenModel = filepath.Join(GinkgoT().TempDir(), "qwen3")
		Expect(env.TinyModel(qwenModel, "qwen3", "")).To(Succeed())
		specs := []vllmpool.Spec{{Name: "seeded", Model: model, Seed: strp("0")}, {Name: "unseeded", Model: model},
			{Name: "qwen3", Model: qwenModel, Seed: strp("0")}}
		es := make([]*vllmpool.Engine, len(specs))
		errs := make([]error, len(specs))
		var wg sync.WaitGroup
		for i := range specs {
			wg.Go(func() { es[i], errs[i] = env.Start(context.Background(), specs[i], startTimeout) })
		}
		wg.Wait()
		for i := range es {
			if es[i] != nil {
				DeferCleanup(es[i].Stop)
				GinkgoWriter.Printf("vllm %s up in %v (pid %d)\n", es[i].Name, es[i].Started.Round(time.Second), es[i].PID())
			}
			Expect(errs[i]).NotTo(HaveOccurred())
		}
		seeded, unseeded, qwen = es[0], es[1], es[2]
	})

	pool := func(prof vllmpool.Profile, es ...*vllmpool.Engine) *ctk.Pool {
		if prof.Model == "" {
			prof.Model = "llama3"
		}
		if prof.Tokenizer == "" {
			prof.Tokenizer = model
		}
		p, err := vllmpool.Pool(prof, es)
		Expect(err).NotTo(HaveOccurred())
		for i := range p.Endpoints {
			p.Endpoints[i].Clear = "/reset_prefix_cache"
		}
		return p
	}
	run := func(p *ctk.Pool, opts ctk.Options) *ctk.Result {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		opts.EventTimeout, opts.SubscribeTimeout = 5*time.Second, 5*time.Second
		res, err := ctk.Certify(ctx, p, opts)
		Expect(err).NotTo(HaveOccurred())
		return res
	}
	failsOn := func(res *ctk.Result, ep, leg string) {
		GinkgoHelper()
		Expect(res.ExitCode).To(Equal(1), failed(res))
		Expect(verdict(res, ep).OK).To(BeFalse(), failed(res))
		legs := map[string]bool{}
		for _, s := range res.Specs {
			if s.Endpoint == ep && s.State == ctk.Fail {
				legs[s.Leg] = true
			}
		}
		Expect(legs).To(HaveKey(leg), failed(res))
	}

	It("certifies an engine whose PYTHONHASHSEED is staged", func() {
		res := run(pool(vllmpool.Profile{Seed: strp("0")}, seeded), ctk.Options{})
		Expect(res.ExitCode).To(Equal(0), failed(res))
		Expect(spec(res, "seeded", "publishes the block keys the gateway computes").State).To(Equal(ctk.Pass))
		Expect(spec(res, "seeded", "answers a replay request").State).To(Equal(ctk.Pass))
		Expect(spec(res, "seeded", "announces a cache clear").State).To(Equal(ctk.Pass))
	})
	It("certifies a qwen3 engine with its own tokenizer and chat template", func() {
		res := run(pool(vllmpool.Profile{Model: "qwen3", Tokenizer: qwenModel, Seed: strp("0")}, qwen), ctk.Options{})
		Expect(res.ExitCode).To(Equal(0), failed(res))
		Expect(spec(res, "qwen3", "chat template").State).To(Equal(ctk.Pass))
		Expect(spec(res, "qwen3", "publishes the block keys the gateway computes").State).To(Equal(ctk.Pass))
	})
	It("certifies an engine without PYTHONHASHSEED under the release's default-seed rule for sha256", func() {
		res := run(pool(vllmpool.Profile{}, unseeded), ctk.Options{})
		Expect(res.ExitCode).To(Equal(0), failed(res))
		Expect(spec(res, "unseeded", "publishes the block keys the gateway computes").State).To(Equal(ctk.Pass))
	})
	// The seed and the algorithm are legs of the engine binding only (the router binding keys
	// blocks by their token ids): with binding auto a wrong seed still certifies the router
	// binding, so these stage the engine binding.
	It("names the seed when another one is staged", func() {
		failsOn(run(pool(vllmpool.Profile{Seed: strp("1"), Binding: "engine"}, seeded), ctk.Options{}), "seeded", ctk.LegSeed)
	})
	It("names the seed when a seed is staged for an engine started without one", func() {
		failsOn(run(pool(vllmpool.Profile{Seed: strp("0"), Binding: "engine"}, unseeded), ctk.Options{}), "unseeded", ctk.LegSeed)
	})
	It("names the block size", func() {
		failsOn(run(pool(vllmpool.Profile{Seed: strp("0"), BlockSize: 64}, seeded), ctk.Options{}), "seeded", ctk.LegBlockSize)
	})
	It("names the algorithm", func() {
		failsOn(run(pool(vllmpool.Profile{Seed: strp("0"), HashAlgo: "sha256_cbor", Binding: "engine"}, seeded), ctk.Options{}), "seeded", ctk.LegAlgorithm)
	})
	It("names the model", func() {
		failsOn(run(pool(vllmpool.Profile{Seed: strp("0"), Model: "qwen3"}, seeded), ctk.Options{}), "seeded", ctk.LegModel)
	})
	It("names the chat template", func() {
		res := run(pool(vllmpool.Profile{Seed: strp("0")}, seeded),
			ctk.Options{Tokenizer: withTemplate("{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}")})
		failsOn(res, "seeded", ctk.LegTemplate)
	})
	It("names the events when the staged event address has no publisher", func() {
		p := pool(vllmpool.Profile{Seed: strp("0")}, seeded)
		p.Endpoints[0].Events.ZMQ = []string{"tcp://127.0.0.1:1"}
		failsOn(run(p, ctk.Options{}), "seeded", ctk.LegEvents)
	})
	// The release's default seed is a value, not a mode: staged by hand it certifies the engine that
	// runs without PYTHONHASHSEED under sha256 (and, below, fails the one running xxhash).
	It("certifies an engine without PYTHONHASHSEED for the engine binding when the pool stages the default seed itself", func() {
		res := run(pool(vllmpool.Profile{Seed: strp(defaultSeed()), Binding: "engine"}, unseeded), ctk.Options{})
		Expect(res.ExitCode).To(Equal(0), failed(res))
		Expect(spec(res, "unseeded", "publishes the block keys the gateway computes").State).To(Equal(ctk.Pass))
	})

	// Two more configurations, started in place of two engines the specs above are done with (the
	// package never runs more than three): "xxhash" without PYTHONHASHSEED under
	// --prefix-caching-hash-algo xxhash, and "silent", seeded, with the KV event publisher off.
	Context("restarted under xxhash without PYTHONHASHSEED, and with the publisher off", Ordered, func() {
		var xx, silent *vllmpool.Engine
		BeforeAll(func() {
			env := realEnv()
			unseeded.Stop()
			seeded.Stop()
			specs := []vllmpool.Spec{{Name: "xxhash", Model: model, HashAlgo: "xxhash"}, {Name: "silent", Model: model, Seed: strp("0"), NoEvents: true}}
			es := make([]*vllmpool.Engine, len(specs))
			errs := make([]error, len(specs))
			var wg sync.WaitGroup
			for i := range specs {
				wg.Go(func() { es[i], errs[i] = env.Start(context.Background(), specs[i], startTimeout) })
			}
			wg.Wait()
			for i := range es {
				if es[i] != nil {
					DeferCleanup(es[i].Stop)
					GinkgoWriter.Printf("vllm %s up in %v (pid %d)\n", es[i].Name, es[i].Started.Round(time.Second), es[i].PID())
				}
				Expect(errs[i]).NotTo(HaveOccurred())
			}
			xx, silent = es[0], es[1]
		})

		It("refuses the engine binding of an engine without PYTHONHASHSEED under xxhash, naming the random root", func() {
			res := run(pool(vllmpool.Profile{HashAlgo: "xxhash"}, xx), ctk.Options{})
			v := verdict(res, "xxhash")
			Expect(v.Certified).NotTo(ContainElement(certificate.CoverEngine), failed(res))
			Expect(v.Certified).To(ContainElement(certificate.CoverRouter), failed(res)) // the events' tokens still route
			s := spec(res, "xxhash", "publishes the block keys the gateway computes")
			Expect(s.State).To(Equal(ctk.Skip))
			Expect(s.Message).To(ContainSubstring("random root for xxhash"))
			_, err := vllmpool.Pool(vllmpool.Profile{Model: "llama3", Tokenizer: model, HashAlgo: "xxhash", Binding: "engine"}, []*vllmpool.Engine{xx})
			Expect(err).To(MatchError(ContainSubstring("random root for xxhash")))
		})
		It("names the seed when the default seed is staged for xxhash: the engine roots it in random bytes, not in the default seed", func() {
			failsOn(run(pool(vllmpool.Profile{Seed: strp(defaultSeed()), HashAlgo: "xxhash", Binding: "engine"}, xx), ctk.Options{}), "xxhash", ctk.LegSeed)
		})
		It("names the events when the engine runs with its publisher off", func() {
			// The pool stages the addresses the engine would publish on had it been started with
			// --kv-events-config.
			on := silent.Spec
			on.NoEvents = false
			failsOn(run(pool(vllmpool.Profile{Seed: strp("0")}, vllmpool.Describe(on)), ctk.Options{}), "silent", ctk.LegEvents)
		})
	})
})

// defaultSeed is the seed the pinned release roots sha256 chains in when PYTHONHASHSEED is unset,
// as its contract says (vLLM's DEFAULT_NONE_HASH_SEED): staged by hand, the engine itself confirms it.
func defaultSeed() string {
	ct, err := contracts.Lookup("vllm", vllmpool.Release)
	Expect(err).NotTo(HaveOccurred())
	Expect(ct.Hash.DefaultSeed).NotTo(BeNil())
	return ct.Hash.DefaultSeed.Value
}

// startTimeout bounds one engine's start: about a minute alone on an idle machine, several when
// other engines start beside it on a loaded one (five minutes ran out here at load 20).
const startTimeout = 10 * time.Minute

// realEnv finds the pinned vLLM environment, or skips naming the command that makes it (CI makes
// it and never skips: there a missing environment fails).
func realEnv() *vllmpool.Env {
	env, err := vllmpool.Find()
	if err == vllmpool.ErrNoEnv && os.Getenv("CI") == "" {
		Skip(vllmpool.MissingEnvHint)
	}
	Expect(err).NotTo(HaveOccurred())
	return env
}
