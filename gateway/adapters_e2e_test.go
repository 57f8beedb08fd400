package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
)

// explainReq parses a completions body as the data path does.
func explainReq(t *testing.T, body map[string]any) *route.Request {
	t.Helper()
	raw, _ := json.Marshal(body)
	hr, _ := http.NewRequest("POST", "/v1/completions", nil)
	req, err := proxy.ParseRequest(hr, raw)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// unloadable stands in front of a simulator and, while hidden is set, answers /v1/models without
// the LoRA adapters, as vLLM does after /v1/unload_lora_adapter (everything else is the simulator's).
func unloadable(t *testing.T, target string, hidden *atomic.Bool) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.URL.Path != "/v1/models" || !hidden.Load() {
			return nil
		}
		var v struct {
			Object string           `json:"object"`
			Data   []map[string]any `json:"data"`
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		var keep []map[string]any
		for _, m := range v.Data {
			if m["parent"] == nil {
				keep = append(keep, m)
			}
		}
		v.Data = keep
		b, _ = json.Marshal(v)
		resp.Body = io.NopCloser(bytes.NewReader(b))
		resp.ContentLength = int64(len(b))
		resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
		return nil
	}
	s := httptest.NewServer(rp)
	t.Cleanup(s.Close)
	return s.URL
}

func (p *pool) listsAdapter(name string) bool {
	p.t.Helper()
	resp, err := http.Get(p.base + "/v1/models")
	if err != nil {
		p.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return strings.Contains(string(b), `"id":"`+name+`"`) && strings.Contains(string(b), `"parent":"llama3"`)
}

// The rule declares no adapter: sql-lora is discovered from the engines' /v1/models, requests for it
// land where its blocks live (not where the base model's same-text blocks live), go only to the
// endpoints that list it, and answer 404 once no endpoint lists it, until one lists it again.
func TestE2ELoRADiscovered(t *testing.T) {
	hidden := make([]atomic.Bool, 2)
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true, reprobe: 200 * time.Millisecond,
		simMod: func(i int, c *sim.Config) { c.LoRAModules = []string{"sql-lora=/adapters/sql"} },
		ruleMod: func(r *rules.Rule) {
			r.DiscoverAdapters = true
			for i := range r.Endpoints {
				r.Endpoints[i].Address = unloadable(t, r.Endpoints[i].Address, &hidden[i])
			}
		}})
	eventually(t, 15*time.Second, "the gateway to list the discovered adapter", func() bool { return p.listsAdapter("sql-lora") })

	doc := docs(1)[0]
	follow := doc + " And a follow-up question?"
	p.direct(0, map[string]any{"model": "llama3", "prompt": doc, "max_tokens": 1})
	p.direct(1, map[string]any{"model": "sql-lora", "prompt": doc, "max_tokens": 1})
	lora := map[string]any{"model": "sql-lora", "prompt": follow, "max_tokens": 2}
	base := map[string]any{"model": "llama3", "prompt": follow, "max_tokens": 2}
	eventually(t, 15*time.Second, "both endpoints' blocks in the inventory", func() bool {
		return p.explainOverlap("/v1/completions", lora)["e1"] > 0 && p.explainOverlap("/v1/completions", base)["e0"] > 0
	})
	if ov := p.explainOverlap("/v1/completions", lora); ov["e0"] != 0 {
		t.Fatalf("the discovered adapter's request matches the base model's blocks: %v", ov)
	}
	for _, tc := range []struct {
		body map[string]any
		want string
	}{{lora, "e1"}, {base, "e0"}} {
		c := p.send("/v1/completions", tc.body)
		if c.status != 200 || c.endpoint != tc.want || c.servedBy != tc.want || c.cached <= 0 {
			t.Fatalf("model %v: %d on %s (sim %s), cached %d, want %s; decision %s; %s", tc.body["model"], c.status, c.endpoint, c.servedBy, c.cached, tc.want, c.decision, c.body)
		}
	}

	// Unloaded on e1, which holds its blocks: it goes to e0, the one endpoint still listing it.
	hidden[1].Store(true)
	eventually(t, 15*time.Second, "the adapter request to avoid e1", func() bool {
		d, _ := p.g.Router("pool")
		dec, err := d.Explain(t.Context(), explainReq(t, lora))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range dec.Endpoints {
			if e.Name == "e1" {
				return e.Excluded == route.ExcludedAdapterNotListed
			}
		}
		return false
	})
	for range 3 {
		if c := p.send("/v1/completions", lora); c.status != 200 || c.endpoint != "e0" {
			t.Fatalf("adapter unloaded on e1: %d on %s; decision %s", c.status, c.endpoint, c.decision)
		}
	}
	// Unloaded everywhere: the adapter is an unknown model again.
	hidden[0].Store(true)
	eventually(t, 15*time.Second, "the unloaded adapter to answer 404", func() bool { return p.send("/v1/completions", lora).status == http.StatusNotFound })
	if p.listsAdapter("sql-lora") {
		t.Fatal("/v1/models still lists the unloaded adapter")
	}
	if c := p.send("/v1/completions", base); c.status != 200 {
		t.Fatalf("the base model after the unload: %d %s", c.status, c.body)
	}
	// Loaded again: served again, with its blocks.
	hidden[0].Store(false)
	hidden[1].Store(false)
	eventually(t, 15*time.Second, "the reloaded adapter to be served", func() bool { return p.send("/v1/completions", lora).status == http.StatusOK })
	// Both endpoints hold its blocks by now (e0 served it while e1 did not list it).
	if c := p.send("/v1/completions", lora); c.cached <= 0 || !strings.Contains(c.decision, `"tier":"kv-exact"`) {
		t.Fatalf("reloaded adapter on %s, cached %d; decision %s", c.endpoint, c.cached, c.decision)
	}
}

// A rule change keeps what was discovered: the rebuilt router serves the adapter at once, without
// waiting for the next re-probe (an hour here).
func TestE2ELoRADiscoveredSurvivesRuleChange(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true, reprobe: time.Hour,
		simMod:  func(i int, c *sim.Config) { c.LoRAModules = []string{"sql-lora=/adapters/sql"} },
		ruleMod: func(r *rules.Rule) { r.DiscoverAdapters = true }})
	eventually(t, 15*time.Second, "the gateway to list the discovered adapter", func() bool { return p.listsAdapter("sql-lora") })
	before, _ := p.g.Router("pool")
	r, _ := p.g.Store().Get("pool")
	r.Selector = "rr"
	if _, err := p.g.Store().Put(r); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the changed rule to apply", func() bool { rt, _ := p.g.Router("pool"); return rt != before })
	if c := p.send("/v1/completions", map[string]any{"model": "sql-lora", "prompt": "hello", "max_tokens": 1}); c.status != 200 {
		t.Fatalf("the adapter after the rule change: %d %s", c.status, c.body)
	}
	if !p.listsAdapter("sql-lora") {
		t.Fatal("/v1/models lost the adapter with the rule change")
	}
}

// TestE2EAdapterNotProvenIsNotExact: the certificate records the LoRA names each endpoint proved.
// e0 proved "sql-lora", e1 proved none: an adapter request scores e1 as excluded with the
// adapter_uncertified reason naming the LoRA name, and KV-exact may still pick e0. A rule whose
// loraName is not the one proven ("sql-v2", while ctk proved "sql-lora", what the engine hashes)
// is no KV-exact request anywhere: miss adapter_uncertified naming it, never an eligible endpoint
// that sees none of the adapter's blocks.
func TestE2EAdapterNotProvenIsNotExact(t *testing.T) {
	proved := func(i int) *[]string {
		if i == 0 {
			return &[]string{"sql-lora"}
		}
		return &[]string{}
	}
	mods := func(c *sim.Config) { c.LoRAModules = []string{"sql-lora=/adapters/sql"} }
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true, certAdapters: proved,
		simMod:  func(i int, c *sim.Config) { mods(c) },
		ruleMod: func(r *rules.Rule) { r.Adapters = []rules.Adapter{{Name: "sql-lora"}} }})
	doc := docs(1)[0]
	p.direct(0, map[string]any{"model": "sql-lora", "prompt": doc, "max_tokens": 1})
	p.direct(1, map[string]any{"model": "sql-lora", "prompt": doc, "max_tokens": 1})
	req := map[string]any{"model": "sql-lora", "prompt": doc + " more", "max_tokens": 2}
	eventually(t, 15*time.Second, "both endpoints' adapter blocks in the inventory", func() bool {
		ov := p.explainOverlap("/v1/completions", req)
		return ov["e0"] > 0 && ov["e1"] > 0
	})
	rt, _ := p.g.Router("pool")
	d, err := rt.Explain(t.Context(), explainReq(t, req))
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range d.Endpoints {
		switch ev.Name {
		case "e0":
			if !ev.Eligible {
				t.Errorf("e0 proved the adapter but is not eligible: %+v", ev)
			}
		case "e1":
			if ev.Eligible || !strings.HasPrefix(ev.Excluded, route.ExcludedAdapterUncertified+":") || !strings.Contains(ev.Excluded, `"sql-lora"`) {
				t.Errorf("e1 proved no adapter: want excluded %s naming the LoRA name, got %+v", route.ExcludedAdapterUncertified, ev)
			}
		}
	}
	if c := p.send("/v1/completions", req); c.status != 200 || c.endpoint != "e0" || !strings.Contains(c.decision, `"tier":"kv-exact"`) {
		t.Fatalf("adapter request: %d on %s, decision %s; want KV-exact on e0", c.status, c.endpoint, c.decision)
	}

	q := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 3, certify: true,
		certAdapters: func(int) *[]string { return &[]string{"sql-lora"} },
		simMod:       func(i int, c *sim.Config) { mods(c) },
		ruleMod:      func(r *rules.Rule) { r.Adapters = []rules.Adapter{{Name: "sql-lora", LoRAName: "sql-v2"}} }})
	c := q.send("/v1/completions", req)
	var dec struct{ Miss, Reason string }
	if err := json.Unmarshal([]byte(c.decision), &dec); err != nil || dec.Miss != string(route.MissAdapterUncertified) || !strings.Contains(dec.Reason, `"sql-v2"`) {
		t.Fatalf("rule loraName the certificate did not prove: decision %s, want miss %s naming \"sql-v2\"", c.decision, route.MissAdapterUncertified)
	}
}

// From vLLM v0.31.0 a LoRA block's key hashes the adapter's path beside its name: the path the
// endpoint lists as the adapter's root in /v1/models is what the gateway hashes, so a repeated
// adapter prompt is a KV-exact hit whose predicted cached tokens equal the engine's.
func TestE2ELoRAPathFromModels(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.31.0", n: 2, seed: strp("0"), mode: 3, certify: true, reprobe: time.Hour,
		simMod:  func(i int, c *sim.Config) { c.LoRAModules = []string{"sql-lora=/adapters/sql"} },
		ruleMod: func(r *rules.Rule) { r.DiscoverAdapters = true }})
	eventually(t, 15*time.Second, "the gateway to list the discovered adapter", func() bool { return p.listsAdapter("sql-lora") })
	doc := docs(1)[0]
	p.direct(1, map[string]any{"model": "sql-lora", "prompt": doc, "max_tokens": 1})
	lora := map[string]any{"model": "sql-lora", "prompt": doc + " And a follow-up question?", "max_tokens": 2}
	eventually(t, 15*time.Second, "the adapter's blocks in the inventory", func() bool { return p.explainOverlap("/v1/completions", lora)["e1"] > 0 })
	c := p.send("/v1/completions", lora)
	var d struct {
		Tier  string
		Score int
	}
	if err := json.Unmarshal([]byte(c.decision), &d); err != nil || d.Tier != "kv-exact" || c.endpoint != "e1" || c.cached == 0 || c.cached != d.Score*16 {
		t.Fatalf("adapter request: on %s, cached %d, decision %s; want KV-exact on e1 predicting the cached tokens", c.endpoint, c.cached, c.decision)
	}
}

// Two endpoints list one adapter name at different paths: the gateway hashes the first listing's
// path, so the other endpoint's blocks of it (keyed with its own path) are no hit, never a false one.
func TestE2ELoRAPathsDiffer(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.31.0", n: 2, seed: strp("0"), mode: 3, certify: true, reprobe: time.Hour,
		simMod:  func(i int, c *sim.Config) { c.LoRAModules = []string{fmt.Sprintf("sql-lora=/adapters/sql%d", i)} },
		ruleMod: func(r *rules.Rule) { r.DiscoverAdapters = true }})
	eventually(t, 15*time.Second, "the gateway to list the discovered adapter", func() bool { return p.listsAdapter("sql-lora") })
	doc := docs(1)[0]
	lora := map[string]any{"model": "sql-lora", "prompt": doc, "max_tokens": 1}
	p.direct(0, lora)
	p.direct(1, lora)
	eventually(t, 15*time.Second, "both endpoints' adapter blocks in the inventory", func() bool {
		return p.explainOverlap("/v1/completions", lora)["e0"] > 0 && p.resident("e1") >= p.resident("e0")
	})
	if ov := p.explainOverlap("/v1/completions", lora); ov["e1"] != 0 {
		t.Fatalf("e1 holds the adapter's blocks under another path, yet they match the gateway's keys: %v", ov)
	}
}
