package ctk_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
)

var _ = Describe("a pool serving LoRA adapters", func() {
	withLoRA := func(c *sim.Config) { c.Seed = strp("0"); c.LoRAModules = []string{"sql-lora=/adapters/sql"} }

	It("passes the adapter probe when the pool declares the adapter the engine serves", func() {
		e := startSim("vllm", "v0.25.1", withLoRA)
		res := certify(poolFor(e, "P0", `seed: "0"`, `adapters: [{name: sql-lora}]`), nil)
		Expect(res.ExitCode).To(Equal(0), failed(res))
		s := spec(res, "P0", "LoRA adapter")
		Expect(s.State).To(Equal(ctk.Pass), s.Message)
		Expect(s.Message).To(ContainSubstring(`block keys equal with LoRA name "sql-lora"`))
		// The certificate records the LoRA name proven: the gateway routes KV-exact only for it.
		Expect(res.Certificate.Endpoints[0].Adapters).NotTo(BeNil())
		Expect(*res.Certificate.Endpoints[0].Adapters).To(Equal([]string{"sql-lora"}))
	})

	It("probes the adapter the endpoint lists when the pool discovers adapters", func() {
		e := startSim("vllm", "v0.25.1", withLoRA)
		res := certify(poolFor(e, "P0", `seed: "0"`, `discoverAdapters: true`), nil)
		Expect(res.ExitCode).To(Equal(0), failed(res))
		Expect(spec(res, "P0", "LoRA adapter").Message).To(ContainSubstring(`adapter "sql-lora"`))
	})

	It("hashes the root the endpoint lists beside the name on a release with tagged extra keys", func() {
		e := startSim("vllm", "v0.31.0", withLoRA)
		res := certify(poolFor(e, "P0", `seed: "0"`, `discoverAdapters: true`), nil)
		Expect(res.ExitCode).To(Equal(0), failed(res))
		Expect(spec(res, "P0", "LoRA adapter").Message).To(ContainSubstring(`block keys equal with LoRA name "sql-lora"`))
	})

	It("fails the lora leg naming loraPath when a declared adapter's path is not the engine's", func() {
		e := startSim("vllm", "v0.31.0", withLoRA)
		res := certify(poolFor(e, "P0", `seed: "0"`, `adapters: [{name: sql-lora, loraPath: /elsewhere}]`), nil)
		s := spec(res, "P0", "LoRA adapter")
		Expect(s.State).To(Equal(ctk.Fail))
		Expect(s.Leg).To(Equal(ctk.LegLoRA))
		Expect(s.Hint).To(ContainSubstring(`loraPath (now "/elsewhere")`))
	})

	It("fails the lora leg when the engine hashes another LoRA name than the pool", func() {
		e := startSim("vllm", "v0.25.1", withLoRA)
		res := certify(poolFor(e, "P0", `seed: "0"`, `adapters: [{name: sql-lora, loraName: sql-v2}]`), nil)
		Expect(res.ExitCode).NotTo(Equal(0))
		s := spec(res, "P0", "LoRA adapter")
		Expect(s.State).To(Equal(ctk.Fail))
		Expect(s.Leg).To(Equal(ctk.LegLoRA))
		Expect(s.Message).To(ContainSubstring(`the engine hashes LoRA name "sql-lora", the pool "sql-v2"`))
		Expect(s.Hint).To(ContainSubstring(`loraName: "sql-lora"`))
		Expect(res.Endpoints[0].Reason).To(ContainSubstring("[lora]"))
	})

	It("fails the lora leg from the events' lora_name under the router binding", func() {
		e := startSim("vllm", "v0.25.1", withLoRA)
		res := certify(poolFor(e, "P0", `seed: "0"`, `binding: router`, `adapters: [{name: sql-lora, loraName: sql-v2}]`), nil)
		s := spec(res, "P0", "LoRA adapter")
		Expect(s.State).To(Equal(ctk.Fail), s.Message)
		Expect(s.Leg).To(Equal(ctk.LegLoRA))
		Expect(s.Message).To(ContainSubstring(`events carry lora_name "sql-lora"`))
	})

	It("fails the lora leg when the endpoint does not serve the declared adapter", func() {
		e := startSim("vllm", "v0.25.1", func(c *sim.Config) { c.Seed = strp("0") })
		res := certify(poolFor(e, "P0", `seed: "0"`, `adapters: [{name: sql-lora}]`), nil)
		s := spec(res, "P0", "LoRA adapter")
		Expect(s.State).To(Equal(ctk.Fail))
		Expect(s.Leg).To(Equal(ctk.LegLoRA))
		Expect(s.Message).To(ContainSubstring(`does not serve adapter "sql-lora"`))
	})

	It("skips the adapter probe, naming why, when the pool has no adapter", func() {
		e := startSim("vllm", "v0.25.1", func(c *sim.Config) { c.Seed = strp("0") })
		res := certify(poolFor(e, "P0", `seed: "0"`), nil)
		Expect(res.ExitCode).To(Equal(0), failed(res))
		s := spec(res, "P0", "LoRA adapter")
		Expect(s.State).To(Equal(ctk.Skip))
		Expect(s.Message).To(ContainSubstring("declares no adapter"))
		// An empty list: this certificate proves no adapter (nil would restrict none).
		Expect(res.Certificate.Endpoints[0].Adapters).NotTo(BeNil())
		Expect(*res.Certificate.Endpoints[0].Adapters).To(BeEmpty())
	})

	Describe("ProveAdapters, the gateway's probe of an adapter its certificate did not prove", func() {
		prove := func(e *sim.Engine, adapters string, digest func(c *certificate.Certificate)) ([]string, string) {
			base := certify(poolFor(e, "P0", `seed: "0"`), nil)
			Expect(base.ExitCode).To(Equal(0), failed(base))
			if digest != nil {
				digest(base.Certificate)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			proved, reason, err := ctk.ProveAdapters(ctx, poolFor(e, "P0", `seed: "0"`, adapters), base.Certificate,
				ctk.Options{Tokenizer: tokenizer("llama3"), EventTimeout: 2 * time.Second, SubscribeTimeout: 3 * time.Second})
			Expect(err).NotTo(HaveOccurred())
			return proved, reason
		}
		It("proves the LoRA name the engine hashes", func() {
			proved, reason := prove(startSim("vllm", "v0.25.1", withLoRA), `adapters: [{name: sql-lora}]`, nil)
			Expect(reason).To(BeEmpty())
			Expect(proved).To(Equal([]string{"sql-lora"}))
		})
		It("proves nothing, naming the lora leg, for another LoRA name", func() {
			proved, reason := prove(startSim("vllm", "v0.25.1", withLoRA), `adapters: [{name: sql-lora, loraName: sql-v2}]`, nil)
			Expect(proved).To(BeEmpty())
			Expect(reason).To(ContainSubstring("(lora leg)"))
			Expect(reason).To(ContainSubstring(`the engine hashes LoRA name "sql-lora", the pool "sql-v2"`))
		})
		It("proves nothing under a certificate for another profile", func() {
			proved, reason := prove(startSim("vllm", "v0.25.1", withLoRA), `adapters: [{name: sql-lora}]`, func(c *certificate.Certificate) {
				c.Profile.BlockSize = 32
				c.ProfileDigest = c.Profile.Digest()
			})
			Expect(proved).To(BeEmpty())
			Expect(reason).To(ContainSubstring("the staged profile differs from the certificate's"))
		})
	})
})
