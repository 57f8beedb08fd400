package ctk_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
)

// newestVLLMPin is the pin of the newest vLLM contract, from the data: a new release's contract
// becomes the newest end of these tests by itself.
func newestVLLMPin() string {
	var newest contracts.Version
	pin := ""
	for _, c := range contracts.All() {
		if c.Family != "vllm" {
			continue
		}
		if v, err := contracts.ParseVersion(c.Pin.Release); err == nil && (pin == "" || v.Compare(newest) > 0) {
			newest, pin = v, c.Pin.Release
		}
	}
	return pin
}

// Certification per pinned vLLM release: the oldest covered (v0.19.0), the oldest pin and the newest,
// seeded and with PYTHONHASHSEED
// unset, where the release's own seed rule decides whether the engine binding can follow.
var _ = Describe("pinned vLLM releases", func() {
	newest := newestVLLMPin()
	for _, rel := range []string{"v0.19.0", "v0.23.0", newest} {
		It("certifies "+rel+" for the engine and router bindings with PYTHONHASHSEED set", func() {
			e := startSim("vllm", rel, func(c *sim.Config) { c.Seed = strp("0") })
			res := certify(poolFor(e, "P0", `seed: "0"`), nil)
			Expect(res.ExitCode).To(Equal(0), failed(res))
			Expect(res.Endpoints[0].Certified).To(ConsistOf(certificate.CoverAffinity, certificate.CoverEngine, certificate.CoverRouter))
			Expect(spec(res, "P0", "block keys").State).To(Equal(ctk.Pass))
		})
	}

	It("certifies "+newest+" with PYTHONHASHSEED unset for the engine binding: sha256 roots in the default seed", func() {
		e := startSim("vllm", newest, nil)
		res := certify(poolFor(e, "P0", "binding: engine"), nil)
		Expect(res.ExitCode).To(Equal(0), failed(res))
		Expect(res.Endpoints[0].Certified).To(ContainElement(certificate.CoverEngine))
		Expect(spec(res, "P0", "block keys").State).To(Equal(ctk.Pass))
	})

	It("refuses the engine binding of "+newest+" with PYTHONHASHSEED unset under xxhash, naming the random root", func() {
		e := startSim("vllm", newest, func(c *sim.Config) { c.Algorithm = "xxhash" })
		res := certify(poolFor(e, "P0", "hashAlgorithm: xxhash"), nil)
		Expect(res.Endpoints[0].Certified).NotTo(ContainElement(certificate.CoverEngine))
		s := spec(res, "P0", "block keys")
		Expect(s.State).To(Equal(ctk.Skip))
		Expect(s.Message).To(ContainSubstring("random root for xxhash"))
		_, err := ctk.ParsePool([]byte("model: llama3\nengine: {family: vllm, release: " + newest + "}\nhashAlgorithm: xxhash\nbinding: engine\nendpoints:\n  - {name: P0, address: http://127.0.0.1:1}\n"))
		Expect(err).To(MatchError(ContainSubstring("random root for xxhash")))
	})

	It("refuses the engine binding of the newest release without the default seed (v0.27.1) with PYTHONHASHSEED unset", func() {
		e := startSim("vllm", "v0.27.1", nil)
		res := certify(poolFor(e, "P0"), nil)
		Expect(res.Endpoints[0].Certified).To(ConsistOf(certificate.CoverAffinity, certificate.CoverRouter))
		Expect(spec(res, "P0", "block keys").Message).To(ContainSubstring("has no default seed"))
		_, err := ctk.ParsePool([]byte("model: llama3\nengine: {family: vllm, release: v0.27.1}\nbinding: engine\nendpoints:\n  - {name: P0, address: http://127.0.0.1:1}\n"))
		Expect(err).To(MatchError(ContainSubstring("has no default seed")))
	})

	It("fails the seed leg when the engine sets a PYTHONHASHSEED the pool does not stage, naming the default seed it assumed", func() {
		e := startSim("vllm", "v0.29.0", func(c *sim.Config) { c.Seed = strp("7") })
		res := certify(poolFor(e, "P0", "binding: engine"), nil)
		Expect(res.ExitCode).To(Equal(1))
		s := spec(res, "P0", "block keys")
		Expect(s.Leg).To(Equal(ctk.LegSeed))
		Expect(s.Hint).To(ContainSubstring(`default seed "vllm-none-hash"`))
	})

	It("names the nearest pinned contract and what to verify for an unknown newer release", func() {
		// The newest pinned vLLM contract and a release above it, from the data: adding a release's
		// contract leaves this test as it is.
		var n *contracts.Contract
		for _, c := range contracts.All() {
			if c.Family == "vllm" {
				n = c
			}
		}
		v, err := contracts.ParseVersion(n.Pin.Release)
		Expect(err).NotTo(HaveOccurred())
		newer := fmt.Sprintf("%d.%d.0", v.Nums[0], v.Nums[1]+1)
		e := startSim("vllm", n.Pin.Release, func(c *sim.Config) { c.Seed = strp("0") })
		// The engine in front reports a release no contract covers; everything else is the sim's.
		p := poolBehind(e, `seed: "0"`, func(path string, body []byte) []byte {
			if path == "/version" {
				return []byte(`{"version":"` + newer + `"}`)
			}
			return body
		})
		res := certify(p, nil)
		Expect(res.ExitCode).To(Equal(1))
		s := spec(res, "P0", "release")
		Expect(s.Leg).To(Equal(ctk.LegRelease))
		Expect(s.Message).To(ContainSubstring(fmt.Sprintf("nearest pinned: vllm %s (contract %s, pin %s)", n.Versions.String(), n.ID, n.Pin.Release)))
		Expect(s.Hint).To(ContainSubstring("kv_cache_utils.py"))
	})
})

var _ = Describe("a hybrid vLLM geometry", func() {
	newest := newestVLLMPin()
	It("certifies a hybrid model (full attention + a sliding-window group) of the newest release for the engine and router bindings", func() {
		// The sliding-window group stores the same keys under group_idx 1 with its kind and window;
		// certification compares the full-attention keys, and the second group must not confuse it.
		e := startSim("vllm", newest, func(c *sim.Config) { c.Seed, c.SlidingWindow, c.SlidingWindowBlocks = strp("0"), 64, 32 })
		res := certify(poolFor(e, "P0", `seed: "0"`), nil)
		Expect(res.ExitCode).To(Equal(0), failed(res))
		Expect(res.Endpoints[0].Certified).To(ConsistOf(certificate.CoverAffinity, certificate.CoverEngine, certificate.CoverRouter))
		Expect(spec(res, "P0", "block keys").State).To(Equal(ctk.Pass))
	})

	It("refuses the engine binding with the block-size leg when hashes are chained finer than the events' blocks, and still certifies the router binding", func() {
		e := startSim("vllm", newest, func(c *sim.Config) { c.Seed = strp("0") })
		// The engine in front states hash_block_size 8 for its 16-token group (two KV-cache groups of
		// block sizes 8 and 16, say); everything else is the sim's.
		p := poolBehind(e, `seed: "0"`, func(path string, body []byte) []byte {
			if path == "/metrics" {
				return bytes.Replace(body, []byte(`hash_block_size="16"`), []byte(`hash_block_size="8"`), 1)
			}
			return body
		})
		res := certify(p, nil)
		// binding auto: covered for the router binding, but a failing leg fails the run.
		Expect(res.ExitCode).To(Equal(1), failed(res))
		Expect(res.Endpoints[0].Certified).To(ConsistOf(certificate.CoverAffinity, certificate.CoverRouter))
		Expect(res.Endpoints[0].Binding).To(Equal("router"))
		s := spec(res, "P0", "block keys")
		Expect(s.State).To(Equal(ctk.Fail))
		Expect(s.Leg).To(Equal(ctk.LegBlockSize))
		Expect(s.Message).To(ContainSubstring("hash_block_size 8"))
		Expect(spec(res, "P0", "block size").State).To(Equal(ctk.Pass))
	})
})

// poolBehind puts a real HTTP server on 127.0.0.1 in front of a simulator, rewriting the bodies of
// its answers with edit (path, body), and returns the one-endpoint pool that points at it.
func poolBehind(e *sim.Engine, staged string, edit func(path string, body []byte) []byte) *ctk.Pool {
	target, err := url.Parse(e.URL())
	Expect(err).NotTo(HaveOccurred())
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(r *http.Response) error {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		_ = r.Body.Close()
		body = edit(r.Request.URL.Path, body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	front := httptest.NewServer(proxy)
	DeferCleanup(front.Close)
	doc := "model: llama3\nengine: {family: vllm, release: " + e.Config().Release + "}\n" + staged + "\nendpoints:\n  - name: P0\n    address: " + front.URL +
		"\n    events:\n      zmq: [" + strings.Join(e.PublishAddrs(), ", ") + "]\n"
	p, err := ctk.ParsePool([]byte(doc))
	Expect(err).NotTo(HaveOccurred(), doc)
	return p
}
