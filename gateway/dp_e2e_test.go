package gateway_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/internal/promtest"
)

// directRank sends a completion straight to a simulator's data-parallel rank: vLLM's
// X-data-parallel-rank header, SGLang's routed_dp_rank body field.
func directRank(t *testing.T, s *sim.Engine, family, prompt string, rank int) {
	t.Helper()
	body := map[string]any{"model": "llama3", "prompt": prompt, "max_tokens": 1}
	if family == "sglang" {
		body["routed_dp_rank"] = rank
	}
	raw, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", s.URL()+"/v1/completions", bytes.NewReader(raw))
	req.Header.Set("Content-Type", "application/json")
	if family == "vllm" {
		req.Header.Set("X-data-parallel-rank", strconv.Itoa(rank))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("direct to rank %d: %d %s", rank, resp.StatusCode, b)
	}
}

// explainEvidence is the dry-run evidence of body on endpoint.
func (p *pool) explainEvidence(body map[string]any, endpoint string) (*route.Decision, route.EndpointEvidence) {
	p.t.Helper()
	rt, _ := p.g.Router("pool")
	d, err := rt.Explain(p.t.Context(), explainReq(p.t, body))
	if err != nil {
		p.t.Fatal(err)
	}
	for _, ev := range d.Endpoints {
		if ev.Name == endpoint {
			return d, ev
		}
	}
	p.t.Fatalf("no evidence for %s", endpoint)
	return nil, route.EndpointEvidence{}
}

// TestE2EDataParallelRequestGoesToTheRankHoldingItsBlocks: e0 runs two vLLM data-parallel ranks and
// only rank 1 holds the prompt. KV-exact scores e0 by rank 1 and sends the request there with
// X-data-parallel-rank: 1, so the engine reports the cached tokens the gateway predicted. (Scored
// over the union of the ranks and sent without the header, the engine's least-loaded choice, rank
// 0, would serve it with no cached token: a false hit.)
func TestE2EDataParallelRequestGoesToTheRankHoldingItsBlocks(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true, blockSize: 16,
		simMod: func(i int, c *sim.Config) {
			if i == 0 {
				c.DPRanks = 2
			}
		}})
	doc := docs(1)[0]
	directRank(t, p.sims[0], "vllm", doc, 1)
	req := map[string]any{"model": "llama3", "prompt": doc + " And a follow-up question?", "max_tokens": 2}
	eventually(t, 10*time.Second, "e0's rank 1 blocks in the inventory", func() bool {
		_, ev := p.explainEvidence(req, "e0")
		return ev.Overlap > 0
	})
	if _, ev := p.explainEvidence(req, "e0"); ev.Rank == nil || *ev.Rank != 1 {
		t.Fatalf("e0's evidence: %+v, want rank 1 scored", ev)
	}
	for i := 0; i < 3; i++ {
		c := p.send("/v1/completions", req)
		var d route.Decision
		if err := json.Unmarshal([]byte(c.decision), &d); err != nil {
			t.Fatal(err)
		}
		if c.status != 200 || d.Tier != "kv-exact" || c.endpoint != "e0" || d.Rank == nil || *d.Rank != 1 || c.cached == 0 || c.cached != d.Score*16 {
			t.Fatalf("request %d: %d on %s, decision %s, cached %d; want KV-exact on e0's rank 1 with the predicted %d cached tokens", i, c.status, c.endpoint, c.decision, c.cached, d.Score*16)
		}
	}
}

// TestE2EDataParallelUnpinnedCountsWhatEveryRankHolds: SGLang's ranks cannot be pinned by the
// gateway (it does not rewrite bodies), so the engine picks the rank: KV-exact scores e0 by what
// every rank holds. A prompt on rank 1 only is no hit on e0 (the engine may serve it on rank 0);
// once rank 0 holds it too, it is.
func TestE2EDataParallelUnpinnedCountsWhatEveryRankHolds(t *testing.T) {
	p := startPool(t, poolSpec{family: "sglang", release: "v0.5.18", n: 1, mode: 3, certify: true, blockSize: 16,
		simMod: func(i int, c *sim.Config) { c.DPRanks = 2 }})
	doc := docs(1)[0]
	req := map[string]any{"model": "llama3", "prompt": doc + " And a follow-up question?", "max_tokens": 2}
	directRank(t, p.sims[0], "sglang", doc, 1)
	eventually(t, 10*time.Second, "rank 1's blocks in the inventory", func() bool { return p.resident("e0") > 0 })
	if _, ev := p.explainEvidence(req, "e0"); ev.Overlap != 0 || ev.Rank != nil {
		t.Fatalf("a prompt on one of two unpinnable ranks scores %+v on e0, want 0", ev)
	}
	directRank(t, p.sims[0], "sglang", doc, 0)
	eventually(t, 10*time.Second, "both ranks' blocks scored", func() bool {
		_, ev := p.explainEvidence(req, "e0")
		return ev.Overlap > 0
	})
}

// TestE2EDataParallelPrefillGoesToTheRankHoldingItsBlocks: in P/D the prefill endpoint e0 runs two
// vLLM data-parallel ranks and only rank 1 holds the prompt (a prefill leg sent there directly).
// The prefill leg of the follow-up goes to rank 1 with X-data-parallel-rank: 1 and realizes the
// cached tokens KV-exact predicted there.
func TestE2EDataParallelPrefillGoesToTheRankHoldingItsBlocks(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 1, certify: true, blockSize: 16,
		roles: []string{"prefill", "decode"},
		simMod: func(i int, c *sim.Config) {
			if i == 0 {
				c.DPRanks = 2
			}
		}})
	doc := docs(1)[0]
	raw, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": doc, "max_tokens": 1,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false}})
	req, _ := http.NewRequest("POST", p.sims[0].URL()+"/v1/completions", bytes.NewReader(raw))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-data-parallel-rank", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("prefill leg straight to rank 1: %d %s", resp.StatusCode, b)
	}
	follow := doc + " One more question?"
	eventually(t, 10*time.Second, "rank 1's blocks in the prefill inventory", func() bool { return p.overlap(follow, "e0") > 0 })
	pred0 := promtest.Value(t, p.reg, "kvexact_predicted_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": "e0"})
	real0 := promtest.Value(t, p.reg, "kvexact_realized_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": "e0"})
	c := p.complete(follow, false)
	var d route.Decision
	if err := json.Unmarshal([]byte(c.decision), &d); err != nil || c.status != 200 || d.Tier != "kv-exact" || d.Rank == nil || *d.Rank != 1 {
		t.Fatalf("follow-up: %d, decision %s; want KV-exact prefill on e0's rank 1", c.status, c.decision)
	}
	pred := promtest.Value(t, p.reg, "kvexact_predicted_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": "e0"}) - pred0
	real := promtest.Value(t, p.reg, "kvexact_realized_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": "e0"}) - real0
	if pred <= 0 || real != pred {
		t.Fatalf("prefill leg on e0: predicted %v, realized %v cached tokens; want equal", pred, real)
	}
}
