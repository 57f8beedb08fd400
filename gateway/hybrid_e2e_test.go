package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
)

// TestE2EHybridSlidingWindow: a vLLM of the newest pinned release simulating a hybrid model (full
// attention + a 64-token sliding-window group whose pool holds 16 blocks) behind the gateway. A
// 40-block prompt leaves full attention holding all 40 blocks and the sliding group only the last
// 16 (it let go of the blocks behind its window while prefilling, and evicted them). The gateway
// must predict, per prompt, what the engine then reports as cached: a prompt sharing 30 blocks
// hits 30 (the window's 4 blocks before block 30 are held); one sharing 20 hits nothing, although
// full attention alone — the prediction before group residency, still shown as fullPrefix — says 20.
// Both bindings: the router binding rehashes the sliding group's events through its own key map.
func TestE2EHybridSlidingWindow(t *testing.T) {
	for _, binding := range []string{"engine", "router"} {
		t.Run(binding, func(t *testing.T) { hybridSlidingWindow(t, binding) })
	}
}

func hybridSlidingWindow(t *testing.T, binding string) {
	const bs = 16
	p := startPool(t, poolSpec{family: "vllm", release: newestVLLMPin(t), n: 1, seed: strp("0"), mode: 3, certify: true, blockSize: bs,
		simMod:  func(_ int, c *sim.Config) { c.SlidingWindow, c.SlidingWindowBlocks = 4*bs, 16 },
		ruleMod: func(r *rules.Rule) { r.Binding = binding }})
	base := make([]uint32, 40*bs+3)
	for i := range base {
		base[i] = uint32(1000 + i)
	}
	sharing := func(blocks int) []uint32 {
		out := append([]uint32(nil), base[:blocks*bs]...)
		for i := 0; i < 5*bs+3; i++ {
			out = append(out, uint32(60000+blocks*100+i))
		}
		return out
	}
	if c := p.completeTokens(base); c.status != 200 {
		t.Fatalf("first prompt: %d %s", c.status, c.body)
	}
	eventually(t, 5*time.Second, "the full-attention blocks of the first prompt in the inventory", func() bool {
		return p.explainTokens(base).FullPrefix == 40 || p.explainTokens(base).Prefix == 40
	})
	for _, c := range []struct {
		shared, want, full int
		limit              string
	}{
		{30, 30, 30, "full_attention"},
		{20, 0, 20, "group 1 (sliding_window, window 64)"},
	} {
		prompt := sharing(c.shared)
		ev := p.explainTokens(prompt)
		if ev.Prefix != c.want || ev.FullPrefix != c.full || ev.Limit != c.limit {
			t.Fatalf("sharing %d blocks: evidence %+v, want prefix %d, full attention %d, limited by %q", c.shared, ev, c.want, c.full, c.limit)
		}
		got := p.completeTokens(prompt)
		if got.status != 200 || got.cached != c.want*bs {
			t.Fatalf("sharing %d blocks: the engine cached %d tokens (status %d), the gateway predicted %d", c.shared, got.cached, got.status, c.want*bs)
		}
		if c.want < c.full && got.cached >= c.full*bs {
			t.Fatalf("sharing %d blocks: the engine cached %d tokens, as full attention alone predicted: the case shows nothing", c.shared, got.cached)
		}
	}
}

// completeTokens sends a completion whose prompt is token ids.
func (p *pool) completeTokens(ids []uint32) completion {
	p.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": p.model, "prompt": ids, "max_tokens": 1})
	resp, err := http.Post(p.base+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	c := completion{status: resp.StatusCode, body: string(raw)}
	if _, cached, ok := usageOf(raw); ok {
		c.cached = cached
	}
	return c
}

// explainTokens is the router's dry run for a token-id prompt: endpoint e0's evidence.
func (p *pool) explainTokens(ids []uint32) route.EndpointEvidence {
	p.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": p.model, "prompt": ids})
	hr, _ := http.NewRequest("POST", "/v1/completions", nil)
	req, err := proxy.ParseRequest(hr, body)
	if err != nil {
		p.t.Fatal(err)
	}
	rt, _ := p.g.Router("pool")
	d, err := rt.Explain(context.Background(), req)
	if err != nil || len(d.Endpoints) == 0 {
		return route.EndpointEvidence{}
	}
	return d.Endpoints[0]
}
