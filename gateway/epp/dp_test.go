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
