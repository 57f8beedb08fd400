package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
	"github.com/kvexact/kvexact/internal/promtest"
)

// Request fields that shape the engine's block keys, end to end against the simulator (which hashes
// cache_salt and LoRA names as vLLM and SGLang do and reports them in its events).

// send posts body (a JSON object) to the gateway's path and returns what the client saw.
func (p *pool) send(path string, body map[string]any) completion {
	p.t.Helper()
	raw, _ := json.Marshal(body)
	return p.sendRaw(p.base+path, raw)
}

func (p *pool) sendRaw(url string, raw []byte) completion {
	p.t.Helper()
	resp, err := http.Post(url, "application/json", bytes.NewReader(raw))
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	c := completion{status: resp.StatusCode, endpoint: resp.Header.Get(proxy.HeaderEndpoint), servedBy: resp.Header.Get(sim.ReceiptHeader),
		decision: resp.Header.Get(proxy.HeaderDecision), body: string(b)}
	if prompt, cached, ok := usageOf(b); ok {
		c.prompt, c.cached = prompt, cached
	}
	return c
}

// explainOverlap is the dry-run overlap of body on every endpoint (name → overlap).
func (p *pool) explainOverlap(path string, body map[string]any) map[string]int {
	p.t.Helper()
	raw, _ := json.Marshal(body)
	hr, _ := http.NewRequest("POST", path, nil)
	req, err := proxy.ParseRequest(hr, raw)
	if err != nil {
		p.t.Fatal(err)
	}
	rt, _ := p.g.Router("pool")
	d, err := rt.Explain(context.Background(), req)
	if err != nil {
		p.t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range d.Endpoints {
		out[e.Name] = e.Overlap
	}
	return out
}

func sum(m map[string]int) (n int) {
	for _, v := range m {
		n += v
	}
	return n
}

// direct sends a completions body straight to simulator i (placement under the test's control).
func (p *pool) direct(i int, body map[string]any) completion {
	p.t.Helper()
	raw, _ := json.Marshal(body)
	c := p.sendRaw(p.sims[i].URL()+"/v1/completions", raw)
	if c.status != 200 {
		p.t.Fatalf("direct to %d: %d %s", i, c.status, c.body)
	}
	return c
}

// warmHit sends warm through the gateway, waits until the inventory holds it, then sends follow and
// checks it was a KV-exact hit on the same endpoint, confirmed by the simulator's cached_tokens.
func warmHit(t *testing.T, p *pool, path string, warm, follow map[string]any) string {
	t.Helper()
	first := p.send(path, warm)
	if first.status != 200 || first.endpoint == "" {
		t.Fatalf("warm: %d %q %s", first.status, first.endpoint, first.body)
	}
	eventually(t, 15*time.Second, "the inventory to learn the warm request", func() bool {
		return p.explainOverlap(path, follow)[first.endpoint] > 0
	})
	before := hits(p, first.endpoint)
	again := p.send(path, follow)
	if again.status != 200 || again.endpoint != first.endpoint || again.servedBy != first.endpoint {
		t.Fatalf("follow-up went to %s (sim %s), warm on %s; decision %s; %s", again.endpoint, again.servedBy, first.endpoint, again.decision, again.body)
	}
	if hits(p, first.endpoint) <= before {
		t.Fatalf("no KV-exact hit counted on %s; decision %s", first.endpoint, again.decision)
	}
	if again.cached <= 0 {
		t.Fatalf("cached_tokens %d on the follow-up (decision %s)", again.cached, again.decision)
	}
	return first.endpoint
}

func TestE2ECacheSaltIsolation(t *testing.T) {
	for _, tc := range []struct{ family, release string }{{"vllm", "v0.25.1"}, {"sglang", "v0.5.18"}} {
		t.Run(tc.family, func(t *testing.T) {
			p := startPool(t, poolSpec{family: tc.family, release: tc.release, n: 2, seed: strp("0"), mode: 3, certify: true, blockSize: 16})
			doc := docs(1)[0]
			follow := doc + " And a follow-up question?"
			req := func(prompt, salt string) map[string]any {
				m := map[string]any{"model": "llama3", "prompt": prompt, "max_tokens": 2}
				if salt != "" {
					m["cache_salt"] = salt
				}
				return m
			}
			ep := warmHit(t, p, "/v1/completions", req(doc, "tenant-a"), req(follow, "tenant-a"))
			// Another tenant, and the unsalted prompt, see none of tenant-a's blocks.
			for _, salt := range []string{"tenant-b", ""} {
				if ov := p.explainOverlap("/v1/completions", req(follow, salt)); sum(ov) != 0 {
					t.Fatalf("salt %q sees tenant-a's blocks: %v", salt, ov)
				}
			}
			// The engine agrees: tenant-b sent to the endpoint holding tenant-a's blocks reuses nothing.
			i := 0
			if ep != p.sims[0].Config().Endpoint {
				i = 1
			}
			if c := p.direct(i, req(follow, "tenant-b")); c.cached != 0 {
				t.Fatalf("tenant-b reused %d tokens of tenant-a's", c.cached)
			}
			// And tenant-b's own blocks are its own: once stored, tenant-b hits them.
			eventually(t, 15*time.Second, "tenant-b's blocks in the inventory", func() bool {
				return p.explainOverlap("/v1/completions", req(follow, "tenant-b"))[ep] > 0
			})
			if ov := p.explainOverlap("/v1/completions", req(follow+" more", "tenant-a")); ov[ep] == 0 {
				t.Fatalf("tenant-a lost its blocks: %v", ov)
			}
		})
	}
}

func TestE2ELoRALandsWithItsAdapter(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true,
		simMod:  func(i int, c *sim.Config) { c.LoRAModules = []string{"sql-lora=/adapters/sql"} },
		ruleMod: func(r *rules.Rule) { r.Adapters = []rules.Adapter{{Name: "sql-lora"}} }})
	doc := docs(1)[0]
	follow := doc + " And a follow-up question?"
	// The same text under the base model on e0 and under the adapter on e1.
	p.direct(0, map[string]any{"model": "llama3", "prompt": doc, "max_tokens": 1})
	p.direct(1, map[string]any{"model": "sql-lora", "prompt": doc, "max_tokens": 1})
	lora := map[string]any{"model": "sql-lora", "prompt": follow, "max_tokens": 2}
	base := map[string]any{"model": "llama3", "prompt": follow, "max_tokens": 2}
	eventually(t, 15*time.Second, "both endpoints' blocks in the inventory", func() bool {
		return p.explainOverlap("/v1/completions", lora)["e1"] > 0 && p.explainOverlap("/v1/completions", base)["e0"] > 0
	})
	if ov := p.explainOverlap("/v1/completions", lora); ov["e0"] != 0 {
		t.Fatalf("the adapter request matches the base model's blocks: %v", ov)
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
	// The gateway lists the adapter with its base model, as vLLM does.
	if resp, err := http.Get(p.base + "/v1/models"); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), `"id":"sql-lora"`) || !strings.Contains(string(b), `"parent":"llama3"`) {
			t.Fatalf("/v1/models does not list the adapter: %s", b)
		}
	}
	// Chat through the adapter renders with the base model's template.
	chat := map[string]any{"model": "sql-lora", "messages": []any{map[string]any{"role": "user", "content": doc}}, "max_tokens": 2}
	warmHit(t, p, "/v1/chat/completions", chat, chat)
}

func TestE2EAddSpecialTokensAndTokenPrompts(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true})
	d := docs(2)
	noSpecial := func(prompt string) map[string]any {
		return map[string]any{"model": "llama3", "prompt": prompt, "max_tokens": 2, "add_special_tokens": false}
	}
	warmHit(t, p, "/v1/completions", noSpecial(d[0]), noSpecial(d[0]+" And a follow-up?"))
	// Without BOS the keys differ from the default request's: no overlap.
	if ov := p.explainOverlap("/v1/completions", map[string]any{"model": "llama3", "prompt": d[0]}); sum(ov) != 0 {
		t.Fatalf("add_special_tokens:false blocks match the BOS prompt: %v", ov)
	}
	tok, _ := tokenizerPool(t).Get("llama3")
	ids, err := tok.Encode(d[1], true)
	if err != nil {
		t.Fatal(err)
	}
	more, _ := tok.Encode(" And a follow-up?", false)
	idsReq := func(ids []uint32) map[string]any {
		return map[string]any{"model": "llama3", "prompt": ids, "max_tokens": 2}
	}
	ep := warmHit(t, p, "/v1/completions", idsReq(ids), idsReq(append(append([]uint32(nil), ids...), more...)))
	// A token-id prompt and the text it encodes share keys; [[ids]] is one prompt too.
	if ov := p.explainOverlap("/v1/completions", map[string]any{"model": "llama3", "prompt": d[1]}); ov[ep] == 0 {
		t.Fatalf("text prompt does not see its token-id twin's blocks: %v", ov)
	}
	if ov := p.explainOverlap("/v1/completions", map[string]any{"model": "llama3", "prompt": [][]uint32{ids}}); ov[ep] == 0 {
		t.Fatalf("[[ids]] does not see its blocks: %v", ov)
	}
}

func missCount(p *pool, reason string) float64 {
	return promtest.Value(p.t, p.reg, "kvexact_kv_exact_misses_total", map[string]string{"rule": "pool", "reason": reason})
}

func TestE2EMissReasons(t *testing.T) {
	doc := docs(1)[0]
	user := func(content any) []any { return []any{map[string]any{"role": "user", "content": content}} }
	cases := []struct {
		family, release string
		adapters        bool
		path            string
		body            map[string]any
		miss            string
	}{
		{"vllm", "v0.25.1", false, "/v1/chat/completions", map[string]any{"messages": user([]any{map[string]any{"type": "text", "text": doc},
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64,AAAA"}}})}, "multimodal"},
		{"vllm", "v0.25.1", false, "/v1/chat/completions", map[string]any{"messages": user(doc), "chat_template": "{{ messages[0].content }}"}, "request_template"},
		{"vllm", "v0.25.1", false, "/v1/completions", map[string]any{"prompt_embeds": "AAAA"}, "prompt_embeds"},
		{"sglang", "v0.5.18", true, "/v1/completions", map[string]any{"prompt": doc, "truncate_prompt_tokens": 20}, "truncation"},
		{"vllm", "v0.25.1", false, "/v1/completions", map[string]any{"prompt": doc, "truncate_prompt_tokens": -1}, "truncation"},
		{"vllm", "v0.25.1", false, "/v1/completions", map[string]any{"prompt": []string{doc, doc}}, "batch"},
		{"sglang", "v0.5.18", true, "/v1/completions", map[string]any{"prompt": doc, "model": "sql-lora"}, "lora"},
		{"trtllm", "1.2", false, "/v1/completions", map[string]any{"prompt": doc, "cache_salt": "tenant-a"}, "cache_salt"},
	}
	pools := map[string]*pool{}
	for _, tc := range cases {
		key := fmt.Sprint(tc.family, tc.adapters)
		p := pools[key]
		if p == nil {
			spec := poolSpec{family: tc.family, release: tc.release, n: 1, seed: strp("0"), mode: 3, certify: true, blockSize: 16}
			if tc.adapters {
				spec.ruleMod = func(r *rules.Rule) { r.Adapters = []rules.Adapter{{Name: "sql-lora"}} }
			}
			p = startPool(t, spec)
			pools[key] = p
		}
		body := map[string]any{"model": "llama3", "max_tokens": 2}
		for k, v := range tc.body {
			body[k] = v
		}
		before := missCount(p, tc.miss)
		c := p.send(tc.path, body)
		var d struct{ Miss, Reason string }
		if err := json.Unmarshal([]byte(c.decision), &d); err != nil || d.Miss != tc.miss || d.Reason == "" {
			t.Errorf("%s %v: decision %q (status %d), want miss %q with a reason", tc.family, tc.body, c.decision, c.status, tc.miss)
		}
		if after := missCount(p, tc.miss); after != before+1 {
			t.Errorf("%s: kvexact_kv_exact_misses_total{reason=%q} went %v → %v", tc.family, tc.miss, before, after)
		}
		if strings.Contains(c.decision, `"tier":"kv-exact"`) {
			t.Errorf("%s: KV-exact decided a request it cannot key: %s", tc.miss, c.decision)
		}
	}
}

// TestE2EExplainAnswersAsTheDataPath: /admin/explain parses through the data path's typed request,
// so what the data path refuses (415, 413, 400 on a bad field) explain refuses with the same status,
// and a request both accept is decided identically.
func TestE2EExplainAnswersAsTheDataPath(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true})
	do := func(url, ctype, body string, auth bool) (int, string) {
		req, _ := http.NewRequest("POST", url, strings.NewReader(body))
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		if auth {
			req.Header.Set("Authorization", "Bearer "+p.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	big := `{"model":"llama3","prompt":"` + strings.Repeat("x", 16<<20) + `"}`
	for _, tc := range []struct {
		name, ctype, body string
		want              int
	}{
		{"text/plain", "text/plain", `{"model":"llama3","prompt":"hi"}`, 415},
		{"over the body limit", "application/json", big, 413},
		{"empty cache_salt", "application/json", `{"model":"llama3","prompt":"hi","cache_salt":""}`, 400},
		{"bad add_special_tokens", "application/json", `{"model":"llama3","prompt":"hi","add_special_tokens":"no"}`, 400},
		{"bad truncation_side", "application/json", `{"model":"llama3","prompt":"hi","truncate_prompt_tokens":3,"truncation_side":"middle"}`, 400},
		{"valid", "application/json", `{"model":"llama3","prompt":"hi","max_tokens":1}`, 200},
	} {
		data, dbody := do(p.base+"/v1/completions", tc.ctype, tc.body, false)
		expl, ebody := do(p.admin+"/admin/explain", tc.ctype, tc.body, true)
		if data != tc.want || expl != tc.want {
			t.Errorf("%s: data path %d, explain %d, want %d both (%.200s | %.200s)", tc.name, data, expl, tc.want, dbody, ebody)
		}
	}
	// A salted request explains with the salt: the overlap of the salted prompt, not the plain one.
	doc := docs(1)[0]
	warm := map[string]any{"model": "llama3", "prompt": doc, "max_tokens": 1, "cache_salt": "t1"}
	first := p.send("/v1/completions", warm)
	eventually(t, 15*time.Second, "the salted blocks in the inventory", func() bool {
		return p.explainOverlap("/v1/completions", warm)[first.endpoint] > 0
	})
	raw, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": doc})
	code, body := do(p.admin+"/admin/explain", "application/json", string(raw), true)
	if code != 200 || !strings.Contains(body, `"overlap": 0`) || strings.Contains(body, `"tier": "kv-exact"`) {
		t.Fatalf("explain of the unsalted prompt: %d %s", code, body)
	}
}

// TestE2EPromptLogprobsPredictsZero: vLLM reads no prefix-cache block for a request asking for
// prompt_logprobs (its SamplingParams turn skip_reading_prefix_cache on), so the simulator reports 0
// cached tokens for it even where the prompt is cached, and the gateway predicts 0 with the reason
// instead of a KV-exact hit it would never get. skip_reading_prefix_cache: false restores the hit.
func TestE2EPromptLogprobsPredictsZero(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true, blockSize: 16})
	doc := docs(1)[0]
	req := func(extra map[string]any) map[string]any {
		m := map[string]any{"model": "llama3", "prompt": doc, "max_tokens": 2}
		maps.Copy(m, extra)
		return m
	}
	ep := warmHit(t, p, "/v1/completions", req(nil), req(nil))
	missesBefore := missCount(p, "no_cache_read")
	c := p.send("/v1/completions", req(map[string]any{"prompt_logprobs": 1}))
	if c.status != 200 || strings.Contains(c.decision, `"tier":"kv-exact"`) || !strings.Contains(c.decision, "no_cache_read") {
		t.Fatalf("prompt_logprobs: %d, decision %s", c.status, c.decision)
	}
	if missCount(p, "no_cache_read") != missesBefore+1 {
		t.Fatalf("no_cache_read misses: %v, want %v", missCount(p, "no_cache_read"), missesBefore+1)
	}
	// The engine agrees: sent where the prompt is cached, it reads none of it.
	i := 0
	if ep != p.sims[0].Config().Endpoint {
		i = 1
	}
	if d := p.direct(i, req(map[string]any{"prompt_logprobs": 1})); d.cached != 0 {
		t.Fatalf("the engine reported %d cached tokens for a prompt_logprobs request", d.cached)
	}
	if d := p.direct(i, req(map[string]any{"prompt_logprobs": 1, "skip_reading_prefix_cache": false})); d.cached == 0 {
		t.Fatal("skip_reading_prefix_cache false: the engine should read the cached prompt")
	}
	if c := p.send("/v1/completions", req(map[string]any{"prompt_logprobs": 1, "skip_reading_prefix_cache": false})); !strings.Contains(c.decision, `"tier":"kv-exact"`) {
		t.Fatalf("skip_reading_prefix_cache false: decision %s", c.decision)
	}
}

// TestE2ETruncatePromptTokensWithoutSide: vLLM truncates a prompt whose request sets
// truncate_prompt_tokens without truncation_side on its tokenizer's side, the left for generative
// models, keeping the BOS it adds and the text's last n − 1 tokens. The request goes straight to
// e0's engine, so the gateway knows its blocks only from the engine's events: they are the blocks
// of the BOS and the text's last n − 1 tokens sent as ids, and the gateway keys the truncated
// request onto exactly them, so the repeated request through the gateway is a KV-exact hit whose
// predicted blocks are the cached tokens the engine reports.
func TestE2ETruncatePromptTokensWithoutSide(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true, blockSize: 16})
	doc := docs(1)[0]
	const n, blocks = 200, (200 - 1) / 16
	req := map[string]any{"model": "llama3", "prompt": doc, "truncate_prompt_tokens": n, "max_tokens": 2}
	if c := p.direct(0, req); c.status != 200 || c.prompt != n {
		t.Fatalf("straight to e0: %d, prompt_tokens %d, want 200 and %d", c.status, c.prompt, n)
	}
	tok, _ := tokenize.NewPool("").Get("llama3")
	bos, _ := tok.Encode("", true)
	bare, _ := tok.Encode(doc, false)
	ids := append(append([]uint32{}, bos...), bare[len(bare)-(n-len(bos)):]...)
	asIDs := map[string]any{"model": "llama3", "prompt": ids, "max_tokens": 2}
	eventually(t, 15*time.Second, "e0's events to show the BOS and the text's last tokens", func() bool {
		return p.explainOverlap("/v1/completions", asIDs)["e0"] == blocks
	})
	if ov := p.explainOverlap("/v1/completions", req); ov["e0"] != blocks {
		t.Fatalf("the truncated request's keys: overlap %v, want %d blocks on e0 (the engine's)", ov, blocks)
	}
	again := p.send("/v1/completions", req)
	var d struct {
		Tier  string
		Score int
	}
	if err := json.Unmarshal([]byte(again.decision), &d); err != nil || d.Tier != "kv-exact" || again.endpoint != "e0" || again.cached != d.Score*16 || d.Score != blocks {
		t.Fatalf("truncated request: on %s, decision %s, cached %d; want KV-exact on e0 predicting %d blocks = the cached tokens", again.endpoint, again.decision, again.cached, blocks)
	}
}
