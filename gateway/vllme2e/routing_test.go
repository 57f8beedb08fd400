package vllme2e_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
	"github.com/kvexact/kvexact/gateway/route"
)

// TestPredictedEqualsCachedTokens: for completions and chat, streamed and not, on the base model
// and through the LoRA adapter (whose keys hash the path the engine lists for it in /v1/models), a
// prompt extending one the pool served before goes to the engine that holds its prefix, and the
// cached tokens the gateway predicted (the winner's score in blocks, resting on engine-confirmed
// blocks) equal the engine's own usage.prompt_tokens_details.cached_tokens.
func TestPredictedEqualsCachedTokens(t *testing.T) {
	g := startGateway(t)
	for _, c := range []struct {
		name, path, model string
		stream            bool
	}{
		{"completions", "/v1/completions", g.model, false},
		{"completions-stream", "/v1/completions", g.model, true},
		{"chat", "/v1/chat/completions", g.model, false},
		{"chat-stream", "/v1/chat/completions", g.model, true},
		{"completions-lora", "/v1/completions", adapter, false},
		{"completions-lora-stream", "/v1/completions", adapter, true},
		{"chat-lora", "/v1/chat/completions", adapter, false},
		{"chat-lora-stream", "/v1/chat/completions", adapter, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := func(text string) map[string]any {
				if c.path == "/v1/completions" {
					return map[string]any{"model": c.model, "prompt": text}
				}
				return map[string]any{"model": c.model, "messages": []map[string]any{{"role": "user", "content": text}}}
			}
			base := doc(c.name+time.Now().Format(time.RFC3339Nano), 12)
			first := send(t, g.base, c.path, req(base), c.stream)
			if first.cached != 0 {
				t.Fatalf("first request: the engine reports %d cached tokens of a new prompt", first.cached)
			}
			follow := base + " And a follow-up question about it?"
			eventually(t, 10*time.Second, "the inventory to hold the first prompt", func() bool {
				return g.overlap(c.path, req(follow), first.endpoint) > 0
			})
			again := send(t, g.base, c.path, req(follow), c.stream)
			d := again.decision
			if again.endpoint != first.endpoint || d.Tier != route.TierKVExact || d.Predicted {
				t.Fatalf("follow-up went to %s (tier %q, predicted-on-route %v), prefix on %s: %+v", again.endpoint, d.Tier, d.Predicted, first.endpoint, d)
			}
			predicted := d.Score * vllmpool.BlockSize
			if predicted == 0 || predicted != again.cached {
				t.Fatalf("predicted %d cached tokens (score %d blocks of %d), the engine cached %d of %d", predicted, d.Score, vllmpool.BlockSize, again.cached, again.prompt)
			}
		})
	}
}

// TestEvictionRemovesKeys: the engines' small KV cache (kvBlocks) evicts under a stream of
// distinct long prompts; the engine's BlockRemoved events take the keys out of the gateway's
// inventory, so it never holds more than the engine can and forgets the first prompt.
func TestEvictionRemovesKeys(t *testing.T) {
	g := startGateway(t)
	ep := engines[0]
	firstReq := map[string]any{"model": g.model, "prompt": doc("evicted first", 40)}
	send(t, ep.URL, "/v1/completions", map[string]any{"model": g.model, "prompt": firstReq["prompt"]}, false)
	eventually(t, 10*time.Second, "the first prompt in the inventory", func() bool { return g.overlap("/v1/completions", firstReq, ep.Name) > 0 })
	for i := 0; i < 8; i++ {
		send(t, ep.URL, "/v1/completions", map[string]any{"model": g.model, "prompt": doc(fmt.Sprintf("filler %d", i), 40)}, false)
	}
	eventually(t, 10*time.Second, "the first prompt's keys to be removed", func() bool { return g.overlap("/v1/completions", firstReq, ep.Name) == 0 })
	if n := g.resident(ep.Name); n > kvBlocks {
		t.Fatalf("the inventory holds %d blocks of %s, whose cache has %d", n, ep.Name, kvBlocks)
	}
	// The engine agrees: the first prompt is no longer cached there.
	if r := send(t, ep.URL, "/v1/completions", map[string]any{"model": g.model, "prompt": firstReq["prompt"]}, false); r.cached != 0 {
		t.Fatalf("the engine still caches %d tokens of the evicted prompt", r.cached)
	}
}

// TestGatewayRestartReplayRestores: a gateway started after the engines cached a prompt learns it
// from the engines' replay sockets (it starts from an empty mirror), and routes to it.
func TestGatewayRestartReplayRestores(t *testing.T) {
	needEngines(t)
	ep := engines[1]
	prompt := doc("held before the gateway restart", 12)
	req := map[string]any{"model": "llama3", "prompt": prompt}
	g1 := startGateway(t)
	send(t, ep.URL, "/v1/completions", map[string]any{"model": "llama3", "prompt": prompt}, false)
	eventually(t, 10*time.Second, "the first gateway to learn the prompt", func() bool { return g1.overlap("/v1/completions", req, ep.Name) > 0 })
	want := g1.overlap("/v1/completions", req, ep.Name)
	g1.stop()

	g2 := startGateway(t)
	eventually(t, 15*time.Second, "replay to restore the prompt's blocks", func() bool { return g2.overlap("/v1/completions", req, ep.Name) == want })
	r := send(t, g2.base, "/v1/completions", map[string]any{"model": "llama3", "prompt": prompt + " More."}, false)
	if r.endpoint != ep.Name || r.decision.Score*vllmpool.BlockSize != r.cached || r.cached == 0 {
		t.Fatalf("after the restart: served by %s, predicted %d blocks, engine cached %d tokens", r.endpoint, r.decision.Score, r.cached)
	}
}
