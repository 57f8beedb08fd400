package vllme2e_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/internal/envoytest"
	"github.com/kvexact/kvexact/internal/promtest"
)

// TestPickerThroughEnvoyPredictsCachedTokens: the same certified gateway as the standalone tests,
// now as the Endpoint Picker behind the Envoy the project ships, in front of the real engines. For
// completions and chat, streamed and not, a prompt extending one served before goes back to the
// engine holding its prefix (the receipt Envoy's served-endpoint report yields), and the cached
// tokens the picker predicted for it equal the engine's own usage.prompt_tokens_details.cached_tokens
// as the client read them through Envoy — the gateway's predicted and realized counters move by
// exactly that figure.
func TestPickerThroughEnvoyPredictsCachedTokens(t *testing.T) {
	g := startGateway(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.a.StartPicker(context.Background(), assemble.Picker{Listener: l}); err != nil {
		t.Fatal(err)
	}
	base := envoytest.Start(t, l.Addr().String())
	counter := func(name, ep string) float64 {
		return promtest.Value(t, g.reg, name, map[string]string{"rule": "pool", "endpoint": ep})
	}
	for _, c := range []struct {
		name, path string
		stream     bool
	}{
		{"completions", "/v1/completions", false},
		{"completions-stream", "/v1/completions", true},
		{"chat", "/v1/chat/completions", false},
		{"chat-stream", "/v1/chat/completions", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := func(text string) map[string]any {
				if c.path == "/v1/completions" {
					return map[string]any{"model": g.model, "prompt": text}
				}
				return map[string]any{"model": g.model, "messages": []map[string]any{{"role": "user", "content": text}}}
			}
			text := doc("envoy "+c.name+time.Now().Format(time.RFC3339Nano), 12)
			first := send(t, base, c.path, req(text), c.stream)
			if first.cached != 0 || first.endpoint == "" {
				t.Fatalf("first request through Envoy: receipt %q, %d cached tokens of a new prompt", first.endpoint, first.cached)
			}
			follow := text + " And a follow-up question about it?"
			eventually(t, 10*time.Second, "the inventory to hold the first prompt", func() bool {
				return g.overlap(c.path, req(follow), first.endpoint) > 0
			})
			want := g.overlap(c.path, req(follow), first.endpoint) * vllmpool.BlockSize
			p0, r0 := counter("kvexact_predicted_cached_tokens_total", first.endpoint), counter("kvexact_realized_cached_tokens_total", first.endpoint)
			again := send(t, base, c.path, req(follow), c.stream)
			if again.endpoint != first.endpoint {
				t.Fatalf("the follow-up went to %s through Envoy, its prefix is on %s", again.endpoint, first.endpoint)
			}
			if again.cached == 0 || again.cached != want {
				t.Fatalf("the engine cached %d of %d prompt tokens; the inventory's contiguous prefix on %s is %d tokens", again.cached, again.prompt, first.endpoint, want)
			}
			// The account lands when the picker's stream ends, just after the client's last byte.
			eventually(t, 5*time.Second, "the picker's account of the follow-up", func() bool {
				return counter("kvexact_realized_cached_tokens_total", first.endpoint)-r0 == float64(again.cached)
			})
			if d := counter("kvexact_predicted_cached_tokens_total", first.endpoint) - p0; d != float64(again.cached) {
				t.Fatalf("the picker predicted %v cached tokens, the engine reported %d through Envoy", d, again.cached)
			}
		})
	}
	// Envoy ends each ext_proc stream after the response it followed: the last may still be closing.
	eventually(t, 5*time.Second, "every picker stream to end", func() bool {
		return promtest.Value(t, g.reg, "kvexact_epp_streams_active", nil) == 0
	})
}
