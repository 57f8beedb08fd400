package ctk_test

import (
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
)

var _ = Describe("a correct simulator pool", func() {
	It("is certified for the engine and router bindings when it is vLLM", func() {
		e := startSim("vllm", "v0.25.1", func(c *sim.Config) { c.Seed = strp("0") })
		res := certify(poolFor(e, "P0", `seed: "0"`), nil)
		Expect(res.ExitCode).To(Equal(0), failed(res))
		Expect(res.Endpoints[0].Certified).To(ConsistOf(certificate.CoverAffinity, certificate.CoverEngine, certificate.CoverRouter))
		Expect(spec(res, "P0", "block keys").State).To(Equal(ctk.Pass))
		Expect(spec(res, "P0", "replay").State).To(Equal(ctk.Pass))
		Expect(spec(res, "P0", "cache clear").State).To(Equal(ctk.Pass))
	})

	It("is certified for the engine and router bindings when it is SGLang (page size 1)", func() {
		e := startSim("sglang", "v0.5.18", nil)
		res := certify(poolFor(e, "S0"), nil)
		Expect(res.ExitCode).To(Equal(0), failed(res))
		Expect(res.Endpoints[0].Certified).To(ConsistOf(certificate.CoverAffinity, certificate.CoverEngine, certificate.CoverRouter))
		Expect(spec(res, "S0", "cache clear").State).To(Equal(ctk.Pass))
	})

	It("is certified for the router binding only when it is TensorRT-LLM, tokens counted and read from its events", func() {
		e := startSim("trtllm", "1.2", nil)
		res := certify(poolFor(e, "T0"), nil)
		Expect(res.ExitCode).To(Equal(0), failed(res))
		Expect(res.Endpoints[0].Certified).To(ConsistOf(certificate.CoverAffinity, certificate.CoverRouter))
		Expect(spec(res, "T0", "add_special_tokens=true").Message).To(ContainSubstring("token ids equal (read from the engine's stored events)"))
		Expect(spec(res, "T0", "chat template").Message).To(ContainSubstring("token ids equal (read from the engine's stored events)"))
		Expect(spec(res, "T0", "block keys").State).To(Equal(ctk.Skip))
		Expect(spec(res, "T0", "replay").Message).To(ContainSubstring("no replay"))
	})

	It("is certified for content affinity only when it is llama.cpp, with the reason", func() {
		e := startSim("llamacpp", "b10573", nil)
		res := certify(poolFor(e, "L0"), nil)
		Expect(res.ExitCode).To(Equal(0), failed(res))
		Expect(res.Endpoints[0].Require).To(Equal(ctk.RequireAffinity))
		Expect(res.Endpoints[0].Certified).To(ConsistOf(certificate.CoverAffinity))
		ev := spec(res, "L0", "stored-block event")
		Expect(ev.State).To(Equal(ctk.Skip))
		Expect(ev.Message).To(ContainSubstring("content affinity only"))
		Expect(spec(res, "L0", "chat template").State).To(Equal(ctk.Pass))
	})
})

var _ = Describe("a pool with one wrong leg", func() {
	It("fails and names the seed when the engine's PYTHONHASHSEED differs", func() {
		e := startSim("vllm", "v0.25.1", func(c *sim.Config) { c.Seed = strp("1") })
		res := certify(poolFor(e, "P0", `seed: "0"`, "binding: engine"), nil)
		Expect(res.ExitCode).To(Equal(1))
		s := spec(res, "P0", "block keys")
		Expect(s.State).To(Equal(ctk.Fail))
		Expect(s.Leg).To(Equal(ctk.LegSeed))
		Expect(s.Hint).To(ContainSubstring("PYTHONHASHSEED"))
		Expect(spec(res, "P0", "token ids").State).To(Equal(ctk.Pass))
	})

	It("covers the router binding under auto when only the seed differs, reports it, and exits 1 (0 with LenientAuto)", func() {
		e := startSim("vllm", "v0.25.1", func(c *sim.Config) { c.Seed = strp("1") })
		res := certify(poolFor(e, "P0", `seed: "0"`), nil)
		Expect(res.ExitCode).To(Equal(1), "a CI gate on the exit code must not pass a failing leg")
		Expect(res.Endpoints[0].Certified).To(ConsistOf(certificate.CoverAffinity, certificate.CoverRouter))
		Expect(res.Endpoints[0].Binding).To(Equal("router"))
		Expect(res.Endpoints[0].FailedLegs).To(ConsistOf(ctk.LegSeed))
		Expect(res.Endpoints[0].Reason).To(ContainSubstring("covered for the router binding only, with failing legs seed"))
		Expect(res.Certificate.Endpoints[0].Certified).To(ConsistOf(certificate.CoverAffinity, certificate.CoverRouter))
		Expect(spec(res, "P0", "block keys").Leg).To(Equal(ctk.LegSeed))

		res = certifyWith(poolFor(e, "P0", `seed: "0"`), ctk.Options{LenientAuto: true})
		Expect(res.ExitCode).To(Equal(0), failed(res))
		Expect(res.Endpoints[0].Binding).To(Equal("router"))
	})

	It("fails and names the algorithm when the engine hashes with another algorithm", func() {
		e := startSim("vllm", "v0.25.1", func(c *sim.Config) { c.Seed, c.Algorithm = strp("0"), "xxhash_cbor" })
		res := certify(poolFor(e, "P0", `seed: "0"`, "binding: engine", "hashAlgorithm: sha256"), nil)
		Expect(res.ExitCode).To(Equal(1))
		s := spec(res, "P0", "block keys")
		Expect(s.Leg).To(Equal(ctk.LegAlgorithm))
		Expect(s.Message).To(ContainSubstring("xxhash_cbor"))
	})

	It("fails and names the block size when the engine's blocks differ", func() {
		e := startSim("vllm", "v0.25.1", func(c *sim.Config) { c.Seed, c.BlockSize = strp("0"), 32 })
		res := certify(poolFor(e, "P0", `seed: "0"`, "blockSize: 16"), nil)
		Expect(res.ExitCode).To(Equal(1))
		s := spec(res, "P0", "block size")
		Expect(s.State).To(Equal(ctk.Fail))
		Expect(s.Leg).To(Equal(ctk.LegBlockSize))
		Expect(s.Message).To(ContainSubstring("block size 32"))
	})

	It("fails and names the tokenizer when the engine serves another tokenizer", func() {
		qwen := tokenizer("qwen3")
		e := startSim("sglang", "v0.5.18", func(c *sim.Config) { c.Tokenizer, c.Model = qwen, "qwen3" })
		res := certify(poolFor(e, "S0"), nil)
		Expect(res.ExitCode).To(Equal(1))
		Expect(spec(res, "S0", "add_special_tokens=true").Leg).To(Equal(ctk.LegTokenizer))
		Expect(spec(res, "S0", "add_special_tokens=false").Leg).To(Equal(ctk.LegTokenizer))
		Expect(spec(res, "S0", "token ids").Leg).To(Equal(ctk.LegTokens))
	})

	It("fails and names the chat template when the engine renders another template", func() {
		other := withTemplate("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")
		e := startSim("vllm", "v0.25.1", func(c *sim.Config) { c.Seed, c.Tokenizer = strp("0"), other })
		res := certify(poolFor(e, "P0", `seed: "0"`), nil)
		Expect(res.ExitCode).To(Equal(1))
		s := spec(res, "P0", "chat template")
		Expect(s.State).To(Equal(ctk.Fail))
		Expect(s.Leg).To(Equal(ctk.LegTemplate))
		Expect(spec(res, "P0", "add_special_tokens=true").State).To(Equal(ctk.Pass))
		Expect(res.Endpoints[0].Certified).To(BeEmpty())
	})

	It("names the served model when the engine serves another, and runs no leg that depends on it", func() {
		e := startSim("vllm", "v0.25.1", func(c *sim.Config) { c.Seed, c.ServedModelName = strp("0"), "llama3-other" })
		res := certify(poolFor(e, "P0", `seed: "0"`), nil)
		Expect(res.ExitCode).To(Equal(1))
		s := spec(res, "P0", "serves the staged model")
		Expect(s.State).To(Equal(ctk.Fail))
		Expect(s.Leg).To(Equal(ctk.LegModel))
		Expect(s.Message).To(Equal(`the engine serves "llama3-other", not "llama3"`))
		for _, frag := range []string{"add_special_tokens=true", "chat template", "stored-block event", "block keys", "consecutively"} {
			d := spec(res, "P0", frag)
			Expect(d.State).To(Equal(ctk.Skip), frag)
			Expect(d.Message).To(Equal("not run: model mismatch"), frag)
		}
		Expect(failed(res)).To(Equal("serves the staged model [model] " + s.Message + "\n"))
	})

	It("fails and names the events when the engine publishes none", func() {
		e := startSim("vllm", "v0.25.1", func(c *sim.Config) {
			c.Seed, c.ReplayAddr = strp("0"), ""
			c.Faults.DropEvents = 1 << 30
		})
		res := certify(poolFor(e, "P0", `seed: "0"`), nil)
		Expect(res.ExitCode).To(Equal(1))
		s := spec(res, "P0", "stored-block event")
		Expect(s.Leg).To(Equal(ctk.LegEvents))
		Expect(s.Hint).To(ContainSubstring("kv-events-config"))
		Expect(spec(res, "P0", "block keys").State).To(Equal(ctk.Skip))
	})

	It("fails and names the events when nothing listens at the event address", func() {
		e := startSim("sglang", "v0.5.18", nil)
		p := poolFor(e, "S0")
		p.Endpoints[0].Events.ZMQ, p.Endpoints[0].Events.Replay = []string{"tcp://127.0.0.1:1"}, nil
		res := certify(p, nil)
		Expect(res.ExitCode).To(Equal(1))
		Expect(spec(res, "S0", "stored-block event").Leg).To(Equal(ctk.LegEvents))
	})

	It("fails and names the release when the engine runs another contract's release", func() {
		e := startSim("vllm", "v0.23.0", func(c *sim.Config) { c.Seed = strp("0") })
		p := poolFor(e, "P0", `seed: "0"`)
		Expect(p.Normalize()).To(Succeed())
		p2, err := ctk.ParsePool([]byte("model: llama3\nengine: {family: vllm, release: v0.25.1}\nseed: \"0\"\nendpoints:\n  - name: P0\n    address: " + e.URL() + "\n    events: {zmq: [" + e.PublishAddrs()[0] + "]}\n"))
		Expect(err).NotTo(HaveOccurred())
		res := certify(p2, nil)
		s := spec(res, "P0", "release")
		Expect(s.Leg).To(Equal(ctk.LegRelease))
		Expect(s.Message).To(ContainSubstring("vllm-kv-array-v1"))
	})
})

var _ = Describe("the certificate", func() {
	It("is accepted by the gateway's loader and carries the profile digest the gateway computes", func() {
		e := startSim("vllm", "v0.25.1", func(c *sim.Config) { c.Seed = strp("7") })
		res := certify(poolFor(e, "P0", `seed: "7"`), nil)
		Expect(res.ExitCode).To(Equal(0), failed(res))
		dir := GinkgoT().TempDir()
		key := filepath.Join(dir, "k")
		Expect(certificate.GenerateKeyFiles(key+".key", key+".pub")).To(Succeed())
		priv, err := certificate.LoadPrivateKey(key + ".key")
		Expect(err).NotTo(HaveOccurred())
		res.Certificate.Sign(priv)
		Expect(res.WriteFiles(dir)).To(Succeed())
		pub, err := certificate.LoadPublicKey(key + ".pub")
		Expect(err).NotTo(HaveOccurred())
		c, err := certificate.Load(filepath.Join(dir, ctk.CertificateFile), pub)
		Expect(err).NotTo(HaveOccurred())

		// The gateway's own construction for a rule with the same staged fields (gateway.certify).
		tok := tokenizer("llama3")
		jsonSHA, cfgSHA := tok.Files()
		want := certificate.NewProfile("vllm", "vllm-kv-map-v2", "llama3", jsonSHA, cfgSHA, tok.Config().ChatTemplate, 16, "auto", "sha256", strp("7"))
		Expect(c.ProfileDigest).To(Equal(want.Digest()))
		// The identity the gateway builds for a rule endpoint with the same addresses (gateway.IdentityOf).
		id := certificate.Identity{Name: "P0", Address: e.URL(), Release: "v0.25.1", Model: "llama3",
			Events: certificate.Events{ZMQ: e.PublishAddrs(), Replay: e.ReplayAddrs()}}
		cov, why := c.Covers(want.Digest(), id, time.Now())
		Expect(why).To(BeEmpty())
		Expect(cov).To(ContainElements(certificate.CoverEngine, certificate.CoverRouter))
		Expect(c.Verification()).To(Equal(certificate.Verified))
		// The same certificate does not follow the name to another address.
		moved := id
		moved.Address = "http://127.0.0.1:1"
		_, why = c.Covers(want.Digest(), moved, time.Now())
		Expect(why).To(ContainSubstring("certified for " + e.URL() + ", rule has http://127.0.0.1:1"))
		Expect(c.ExpiresAt.Sub(c.IssuedAt)).To(BeNumerically("~", 7*24*time.Hour, time.Second))
		for _, f := range []string{ctk.ReportFile, ctk.JUnitFile, ctk.JSONFile} {
			Expect(filepath.Join(dir, f)).To(BeAnExistingFile())
		}
	})

	It("lists a failing endpoint with no coverage and the failing specs", func() {
		good := startSim("vllm", "v0.25.1", func(c *sim.Config) { c.Seed = strp("0"); c.Endpoint = "good" })
		bad := startSim("vllm", "v0.25.1", func(c *sim.Config) { c.Seed = strp("9"); c.Endpoint = "bad" })
		p, err := ctk.ParsePool([]byte("model: llama3\nengine: {family: vllm, release: v0.25.1}\nseed: \"0\"\nbinding: engine\nendpoints:\n" +
			"  - {name: good, address: " + good.URL() + ", events: {zmq: [" + good.PublishAddrs()[0] + "]}}\n" +
			"  - {name: bad, address: " + bad.URL() + ", events: {zmq: [" + bad.PublishAddrs()[0] + "]}}\n"))
		Expect(err).NotTo(HaveOccurred())
		res := certify(p, nil)
		Expect(res.ExitCode).To(Equal(1))
		Expect(res.Certificate.Endpoints).To(HaveLen(2))
		Expect(res.Certificate.Endpoints[0].Certified).To(ContainElement(certificate.CoverEngine))
		Expect(res.Certificate.Endpoints[1].Certified).To(BeEmpty())
		Expect(res.Certificate.Endpoints[1].Failures).To(ContainElement(ContainSubstring("(seed)")))
	})
})
