package vllme2e_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
)

// TestPublishedKeysEqualGatewayKeys: for each request shape of the corpus, sent straight to one
// engine (no routing involved), the block keys that engine publishes over ZeroMQ are the keys the
// gateway computes for the same request: the gateway's mirror of the engine (built only from the
// published events) covers every full block of the prompt, counted from the engine's own
// usage.prompt_tokens. A control request whose keys must differ (another salt, no BOS) covers none,
// so a gateway that ignored the field would fail.
func TestPublishedKeysEqualGatewayKeys(t *testing.T) {
	publishedKeysEqualGatewayKeys(t, startGateway(t), engines[0])
}

// publishedKeysEqualGatewayKeys runs the corpus against the engine ep behind g, whose rule must
// use the engine binding (the gateway computes the engine's keys itself; under the router binding
// it would rehash the events' own tokens, and parity would hold by construction).
func publishedKeysEqualGatewayKeys(t *testing.T, g *gw, ep *vllmpool.Engine) {
	t.Helper()
	if b := g.a.Runtime.Status().Rules[0].Exact.Binding; b != "engine" {
		t.Fatalf("the rule runs the %q binding; key parity needs the engine binding", b)
	}
	tag := time.Now().Format(time.RFC3339Nano)
	completion := func(text string, extra map[string]any) map[string]any {
		r := map[string]any{"model": g.model, "prompt": text}
		for k, v := range extra {
			r[k] = v
		}
		return r
	}
	chat := func(text string, extra map[string]any) map[string]any {
		r := map[string]any{"model": g.model, "messages": []map[string]any{
			{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": text}}}
		for k, v := range extra {
			r[k] = v
		}
		return r
	}
	ids := tokenizeOnEngine(t, ep, doc("token ids "+tag, 10))
	for _, c := range []struct {
		name, path string
		req        map[string]any
		control    map[string]any // the same prompt under a field that must change its keys
	}{
		{"completions", "/v1/completions", completion(doc("plain "+tag, 10), nil), nil},
		{"chat", "/v1/chat/completions", chat(doc("chat "+tag, 10), nil), nil},
		{"completions-cache-salt", "/v1/completions", completion(doc("salted "+tag, 10), map[string]any{"cache_salt": "tenant-a"}),
			completion(doc("salted "+tag, 10), map[string]any{"cache_salt": "tenant-b"})},
		{"chat-cache-salt", "/v1/chat/completions", chat(doc("salted chat "+tag, 10), map[string]any{"cache_salt": "tenant-a"}),
			chat(doc("salted chat "+tag, 10), nil)},
		{"completions-no-special-tokens", "/v1/completions", completion(doc("no bos "+tag, 10), map[string]any{"add_special_tokens": false}),
			completion(doc("no bos "+tag, 10), nil)},
		{"chat-add-special-tokens", "/v1/chat/completions", chat(doc("chat bos "+tag, 10), map[string]any{"add_special_tokens": true}),
			chat(doc("chat bos "+tag, 10), nil)},
		{"token-id-prompt", "/v1/completions", map[string]any{"model": g.model, "prompt": ids}, nil},
		{"completions-lora", "/v1/completions", map[string]any{"model": adapter, "prompt": doc("lora "+tag, 10)},
			completion(doc("lora "+tag, 10), nil)},
		{"chat-lora", "/v1/chat/completions", chat(doc("lora chat "+tag, 10), map[string]any{"model": adapter}),
			chat(doc("lora chat "+tag, 10), nil)},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := send(t, ep.URL, c.path, clone(c.req), false)
			full := r.prompt / vllmpool.BlockSize
			if full < 2 {
				t.Fatalf("the engine counted %d prompt tokens: the corpus wants at least two full blocks", r.prompt)
			}
			got := 0
			deadline := time.Now().Add(10 * time.Second)
			for got < full && time.Now().Before(deadline) {
				got = g.overlap(c.path, c.req, ep.Name)
				time.Sleep(20 * time.Millisecond)
			}
			if got != full {
				t.Fatalf("the gateway's keys cover %d of the %d full blocks %s published (%d prompt tokens)", got, full, ep.Name, r.prompt)
			}
			if c.control != nil {
				if n := g.overlap(c.path, c.control, ep.Name); n != 0 {
					t.Fatalf("control request: %d blocks overlap, want 0 (the field must change the keys)", n)
				}
				// The engine agrees: the control is no hit there either.
				if cr := send(t, ep.URL, c.path, clone(c.control), false); cr.cached != 0 {
					t.Fatalf("control request: the engine cached %d tokens", cr.cached)
				}
			}
		})
	}
}

// tokenizeOnEngine is the engine's own /tokenize of a completion prompt (special tokens added).
func tokenizeOnEngine(t *testing.T, ep *vllmpool.Engine, text string) []int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": text})
	resp, err := http.Post(ep.URL+"/tokenize", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Tokens []int `json:"tokens"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || len(out.Tokens) == 0 {
		t.Fatalf("/tokenize: status %d, %v, %d tokens", resp.StatusCode, err, len(out.Tokens))
	}
	return out.Tokens
}

// clone copies a request map one level deep (send adds max_tokens and stream to what it sends).
func clone(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
