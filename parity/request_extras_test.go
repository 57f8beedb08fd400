package parity

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/vectors"
)

// TestRequestExtrasVectors: the request path reproduces the engines' own extra-key vectors. Every
// engine-produced case with a LoRA name or a cache_salt (and nothing the request path refuses:
// multimodal items, prompt embeddings, decode-time or group hashing) is sent as the client would —
// a completions body with the case's token ids and cache_salt, parsed by the proxy — keyed with the
// LoRA name the router takes from the rule's adapter, and must give the engine's block keys.
func TestRequestExtrasVectors(t *testing.T) {
	checked := map[string]int{}
	for _, lf := range blockHashFiles(t) {
		rel, f := lf.rel, lf.f
		if f.Header.Generated() {
			continue
		}
		for i := range f.Cases {
			c := &f.Cases[i]
			r := c.Request
			if (r.LoRAName == "" && r.CacheSalt == "") || len(r.MM) > 0 || r.PromptEmbedsRows != nil || c.PromptLen > 0 ||
				c.GroupBlockSize > 0 || c.Bigram || vectors.SkipReason(c) != "" || len(c.Tokens) == 0 {
				continue
			}
			b := c.Binding()
			if b.Algorithm.IsVLLM() && b.Seed == nil {
				continue // random root: no engine binding to check
			}
			h, err := hashcore.New(b, hashcore.Default())
			if err != nil {
				t.Fatalf("%s %s: %v", rel, c.Name, err)
			}
			body := map[string]any{"model": "m", "prompt": c.Tokens}
			if r.CacheSalt != "" {
				body["cache_salt"] = r.CacheSalt
			}
			raw, _ := json.Marshal(body)
			req, err := proxy.ParseRequest(httptest.NewRequest("POST", "/v1/completions", nil), raw)
			if err != nil {
				t.Fatalf("%s %s: %v", rel, c.Name, err)
			}
			req.LoRAName = r.LoRAName
			k := &route.PromptKeyer{Hasher: h, BlockExtras: b.Algorithm.IsVLLM(), TaggedExtras: c.TaggedExtras}
			keys, _, miss, reason := k.Keys(context.Background(), req)
			if miss != route.MissNone {
				if (!b.Algorithm.IsVLLM() || c.TaggedExtras) && r.LoRAName != "" && miss == route.MissLoRA {
					checked[rel+" (lora refused)"]++
					continue // SGLang does not hash LoRA; tagged vLLM keys hash the adapter path: refused, as they must be
				}
				t.Errorf("%s %s: miss %s: %s", rel, c.Name, miss, reason)
				continue
			}
			if !slices.Equal(keys, c.Expected.Keys) {
				t.Errorf("%s %s: request keys %v, engine %v", rel, c.Name, keys, c.Expected.Keys)
			}
			checked[rel]++
		}
	}
	for _, want := range []string{"vllm/v0.25.1/sha256.json", "vllm/v0.25.1/sha256_cbor.json", "vllm/v0.25.1/xxhash.json", "vllm/v0.25.1/xxhash_cbor.json", "vllm/v0.31.0/sha256.json", "vllm/v0.31.0/sha256_cbor.json", "sglang/v0.5.18/page_hash.json"} {
		if checked[want] == 0 {
			t.Errorf("%s: no extra-key case checked through the request path", want)
		}
	}
	t.Logf("extra-key cases checked through the request path: %v", checked)
}
