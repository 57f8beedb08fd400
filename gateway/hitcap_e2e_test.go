package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/internal/promtest"
)

// TestE2EHitCapBlockBoundary: every engine computes a prompt's last token, so a prompt of exactly
// k blocks that the engine holds whole hits k−1 blocks, not k (engines.Hits). The gateway must
// score and predict k−1: the evidence's prefix, the decision's maxHit and the predicted cached
// tokens equal the simulator's cached_tokens receipt, for each family with events, and for a
// hybrid vLLM (the KV-cache group rule runs below the same cap).
func TestE2EHitCapBlockBoundary(t *testing.T) {
	const bs, k = 16, 8
	for _, c := range []struct {
		name   string
		spec   poolSpec
		blocks int
	}{
		{"vllm", poolSpec{family: "vllm", release: "v0.25.1", seed: strp("0")}, k},
		{"sglang", poolSpec{family: "sglang", release: "v0.5.18"}, k},
		{"trtllm", poolSpec{family: "trtllm", release: "1.2"}, k},
		{"vllm-hybrid", poolSpec{family: "vllm", release: "v0.30.0", seed: strp("0"),
			simMod: func(_ int, c *sim.Config) { c.SlidingWindow, c.SlidingWindowBlocks = 4*bs, 16 }}, 3 * k},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := c.spec
			spec.n, spec.mode, spec.certify, spec.blockSize = 1, 3, true, bs
			p := startPool(t, spec)
			prompt := make([]uint32, c.blocks*bs)
			for i := range prompt {
				prompt[i] = uint32(2000 + i)
			}
			if first := p.completeTokens(prompt); first.status != 200 || first.cached != 0 {
				t.Fatalf("first request: status %d, cached %d: %s", first.status, first.cached, first.body)
			}
			want := c.blocks - 1
			var d *route.Decision
			eventually(t, 10*time.Second, "the prompt's blocks in the inventory", func() bool {
				d = p.explainDecision(prompt)
				return len(d.Endpoints) == 1 && d.Endpoints[0].Prefix >= want
			})
			if ev := d.Endpoints[0]; ev.Prefix != want || ev.Overlap != want || d.MaxHit != want || d.Blocks != c.blocks {
				t.Fatalf("evidence %+v, blocks %d, maxHit %d: want prefix, overlap and maxHit %d of %d blocks", ev, d.Blocks, d.MaxHit, want, c.blocks)
			}
			again := p.completeTokens(prompt)
			if again.status != 200 || again.cached != want*bs {
				t.Fatalf("second request: status %d, the engine cached %d tokens, the gateway predicted %d", again.status, again.cached, want*bs)
			}
			labels := map[string]string{"rule": "pool", "endpoint": "e0"}
			var pred, real float64
			eventually(t, 5*time.Second, "the usage account of the second request", func() bool {
				pred = promtest.Value(t, p.reg, "kvexact_predicted_cached_tokens_total", labels)
				real = promtest.Value(t, p.reg, "kvexact_realized_cached_tokens_total", labels)
				return real > 0
			})
			if pred != real || real != float64(want*bs) {
				t.Fatalf("predicted %v cached tokens, realized %v (want both %d)", pred, real, want*bs)
			}
		})
	}
}

// explainDecision is the router's dry run for a token-id prompt.
func (p *pool) explainDecision(ids []uint32) *route.Decision {
	p.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": p.model, "prompt": ids})
	hr, _ := http.NewRequest("POST", "/v1/completions", nil)
	req, err := proxy.ParseRequest(hr, body)
	if err != nil {
		p.t.Fatal(err)
	}
	rt, _ := p.g.Router("pool")
	d, err := rt.Explain(context.Background(), req)
	if err != nil {
		p.t.Fatal(fmt.Errorf("explain: %w", err))
	}
	return d
}
