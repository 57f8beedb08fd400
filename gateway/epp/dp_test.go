package epp_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
)

// TestPickerPinsTheDataParallelRank: e0 runs two vLLM data-parallel ranks and only rank 1 holds the
// prompt. The picker sends Envoy to e0 with x-data-parallel-rank: 1, and lists as fallbacks only
// endpoints that have a rank 1 (the header reaches them too, and vLLM refuses a rank it lacks);
// the engine, given the header, serves the prompt from rank 1's cache.
func TestPickerPinsTheDataParallelRank(t *testing.T) {
	w := startWorld(t, worldSpec{n: 3, sim: func(i int, c *sim.Config) {
		if i != 1 {
			c.DPRanks = 2
		}
	}, picker: nil})
	doc := "Pinned document. " + strings.Repeat("Ranks keep their own caches, so a request must land on the one holding its blocks. ", 12)
	body, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": doc, "max_tokens": 1})
	req, _ := http.NewRequest("POST", w.sims[0].URL()+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-data-parallel-rank", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	follow := completionBody(doc + " And then?")
	var res *envoyResult
	eventually(t, 10*time.Second, "a KV-exact decision on e0", func() bool {
		res = w.request(envoyRequest{path: "/v1/completions", body: follow})
		return strings.Contains(res.decision, `"tier":"kv-exact"`) && w.byAddr[strings.Split(res.header, ",")[0]] == "e0"
	})
	rank := ""
	for _, h := range res.mutation.GetSetHeaders() {
		if h.Header.Key == "x-data-parallel-rank" {
			rank = string(h.Header.RawValue)
		}
	}
	if rank != "1" {
		t.Fatalf("picker headers %v: want x-data-parallel-rank 1 (decision %s)", res.mutation.GetSetHeaders(), res.decision)
	}
	for _, a := range strings.Split(res.header, ",")[1:] {
		if w.byAddr[a] == "e1" {
			t.Fatalf("fallback list %q names e1, which has no rank 1", res.header)
		}
	}
	// What Envoy does with the mutation: the engine serves from rank 1's cache.
	req, _ = http.NewRequest("POST", "http://"+strings.Split(res.header, ",")[0]+"/v1/completions", bytes.NewReader(res.body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-data-parallel-rank", rank)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var u struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &u); err != nil || u.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("served with the picker's rank: %s (%v), want cached tokens", raw, err)
	}
	res.cancel()
}

// TestPickerPrefillLegCountsWhatEveryRankHolds: in P/D, the prefill endpoint e0 runs two vLLM
// data-parallel ranks. The standalone proxy sends the prefill leg itself and pins it to the rank
// holding the prompt (x-data-parallel-rank on the leg); through the picker the decode endpoint's
// sidecar sends the prefill leg, which no rank header reaches, so only what every rank holds
// counts: with the document on rank 1 only, the picker scores e0 at 0 blocks and names no rank;
// once rank 0 holds it too, the picker's decision is KV-exact with e0 as the prefill endpoint,
// still without a rank header.
func TestPickerPrefillLegCountsWhatEveryRankHolds(t *testing.T) {
	w := startWorld(t, worldSpec{n: 2, roles: []string{"prefill", "decode"},
		mod: func(r *rules.Rule) { r.KVExactMode, r.Selector = 1, "" },
		sim: func(i int, c *sim.Config) {
			if i == 0 {
				c.DPRanks = 2
			}
		}})
	doc := "Disaggregated document. " + strings.Repeat("A prefill engine with two ranks keeps one cache per rank, and the leg lands on one. ", 12)
	prefillOn := func(rank string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": doc, "max_tokens": 1,
			"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false}})
		req, _ := http.NewRequest("POST", w.sims[0].URL()+"/v1/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-data-parallel-rank", rank)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("prefill leg straight to rank %s: %d %s", rank, resp.StatusCode, b)
		}
	}
	follow := completionBody(doc + " And then?")
	parsed := func() *route.Request {
		hr, _ := http.NewRequest("POST", "/v1/completions", nil)
		req, err := proxy.ParseRequest(hr, follow)
		if err != nil {
			t.Fatal(err)
		}
		return req
	}
	e0 := func(d *route.Decision) route.EndpointEvidence {
		for _, ev := range d.Endpoints {
			if ev.Name == "e0" {
				return ev
			}
		}
		return route.EndpointEvidence{}
	}
	// The standalone proxy's scoring pins the prefill leg: rank 1's blocks count, on rank 1.
	eventually(t, 15*time.Second, "rank 1's blocks scored by the standalone proxy", func() bool {
		prefillOn("1")
		rt, _ := w.g.Router("pool")
		d, err := rt.Explain(t.Context(), parsed())
		if err != nil {
			t.Fatal(err)
		}
		ev := e0(d)
		return ev.Overlap > 0 && ev.Rank != nil && *ev.Rank == 1
	})
	rankHeader := func(res *envoyResult) string {
		for _, h := range res.mutation.GetSetHeaders() {
			if strings.EqualFold(h.Header.Key, "x-data-parallel-rank") {
				return string(h.Header.RawValue)
			}
		}
		return ""
	}
	res := w.request(envoyRequest{path: "/v1/completions", body: follow})
	var d route.Decision
	if err := json.Unmarshal([]byte(res.decision), &d); err != nil {
		t.Fatalf("picker decision %q: %v", res.decision, err)
	}
	if ev := e0(&d); ev.Overlap != 0 || ev.Rank != nil || d.Rank != nil || d.Tier == route.TierKVExact || rankHeader(res) != "" {
		t.Fatalf("picker, document on rank 1 only: e0 %+v, decision %s, rank header %q; want 0 blocks counted, no rank, no KV-exact", ev, res.decision, rankHeader(res))
	}
	res.cancel()

	// Both ranks hold it: what every rank holds counts.
	eventually(t, 15*time.Second, "a KV-exact picker decision once every rank holds the document", func() bool {
		prefillOn("0")
		res = w.request(envoyRequest{path: "/v1/completions", body: follow})
		defer res.cancel()
		d = route.Decision{}
		json.Unmarshal([]byte(res.decision), &d)
		return d.Tier == route.TierKVExact
	})
	if ev := e0(&d); ev.Overlap == 0 || ev.Rank != nil || d.Rank != nil || w.byAddr[res.prefill] != "e0" || rankHeader(res) != "" {
		t.Fatalf("picker, document on both ranks: e0 %+v, prefill %q, decision %s, rank header %q; want e0's blocks counted with no rank pinned", ev, res.prefill, res.decision, rankHeader(res))
	}
}
