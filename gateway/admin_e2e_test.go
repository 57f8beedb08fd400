package gateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func (p *pool) adminDo(method, path, token, body string) (int, string) {
	p.t.Helper()
	req, _ := http.NewRequest(method, p.admin+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestAdminRequiresToken(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 3})
	for _, path := range []string{"/admin/status", "/admin/rules", "/metrics", "/admin/inventory/pool/e0", "/nope"} {
		for _, tok := range []string{"", "wrong", p.token + "x"} {
			code, body := p.adminDo("GET", path, tok, "")
			if code != 401 || strings.Contains(body, "pool") || strings.Contains(body, "e0") || len(body) > 20 {
				t.Fatalf("GET %s with token %q: %d %q", path, tok, code, body)
			}
		}
	}
	if code, _ := p.adminDo("GET", "/admin/status", p.token, ""); code != 200 {
		t.Fatalf("right token refused: %d", code)
	}
}

func TestAdminStatusInventoryExplain(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true})
	doc := docs(1)[0]
	first := p.complete(doc, false)
	eventually(t, 5*time.Second, "learned", func() bool { return p.overlap(doc, first.endpoint) > 0 })

	code, body := p.adminDo("GET", "/admin/status", p.token, "")
	var st struct {
		Rules []struct {
			Name  string
			Exact struct {
				Enabled bool
				Binding string
			}
			Endpoints []struct {
				Name     string
				Resident int `json:"resident_blocks"`
				Breaker  string
			}
		}
	}
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil || len(st.Rules) != 1 || !st.Rules[0].Exact.Enabled || st.Rules[0].Exact.Binding != "engine" {
		t.Fatalf("status: %d %s", code, body)
	}
	code, body = p.adminDo("GET", "/admin/inventory/pool/"+first.endpoint, p.token, "")
	var inv struct {
		Total  int
		Blocks []struct {
			Key   string
			Count int
		}
	}
	if code != 200 || json.Unmarshal([]byte(body), &inv) != nil || inv.Total == 0 || len(inv.Blocks) != inv.Total || inv.Blocks[0].Count < 1 {
		t.Fatalf("inventory: %d %s", code, body)
	}
	if code, _ := p.adminDo("GET", "/admin/inventory/pool/nope", p.token, ""); code != 404 {
		t.Fatalf("unknown endpoint: %d", code)
	}
	code, body = p.adminDo("POST", "/admin/explain", p.token, `{"model":"llama3","prompt":`+mustJSON(doc)+`}`)
	if code != 200 || !strings.Contains(body, `"tier": "kv-exact"`) || !strings.Contains(body, `"target": "`+first.endpoint+`"`) {
		t.Fatalf("explain: %d %s", code, body)
	}
	if code, body := p.adminDo("POST", "/admin/explain", p.token, `{"model":"other","prompt":"x"}`); code != 404 {
		t.Fatalf("explain unknown model: %d %s", code, body)
	}
	if code, _ := p.adminDo("POST", "/admin/explain", p.token, `{"model":`); code != 400 {
		t.Fatalf("explain malformed: %d", code)
	}
	// Explain changed nothing: the served counters did not move.
	before := p.g.Status().Rules[0].Endpoints
	p.adminDo("POST", "/admin/explain", p.token, `{"model":"llama3","prompt":"hello"}`)
	after := p.g.Status().Rules[0].Endpoints
	for i := range before {
		if before[i].Served != after[i].Served {
			t.Fatal("explain counted as served")
		}
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestAdminRuleCRUDLive(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 0})
	code, body := p.adminDo("GET", "/admin/rules/pool", p.token, "")
	if code != 200 {
		t.Fatalf("get rule: %d %s", code, body)
	}
	// A rejected change names the field and mutates nothing.
	bad := strings.Replace(body, `"selector": "rr"`, `"selector": "random"`, 1)
	if code, msg := p.adminDo("PUT", "/admin/rules/pool", p.token, bad); code != 422 || !strings.Contains(msg, "selector") {
		t.Fatalf("bad update: %d %s", code, msg)
	}
	if _, after := p.adminDo("GET", "/admin/rules/pool", p.token, ""); !strings.Contains(after, `"selector": "rr"`) {
		t.Fatalf("rejected update mutated the rule: %s", after)
	}
	// Names that would break a header or a metrics line are rejected, naming the field.
	for _, name := range []string{"a\r\nX-Evil: 1", "a b", `a"b`, "ü"} {
		var r map[string]any
		json.Unmarshal([]byte(body), &r)
		r["name"], r["models"] = name, []string{"other"}
		if code, msg := p.adminDo("POST", "/admin/rules", p.token, mustJSON(r)); code != 422 || !strings.Contains(msg, "name") {
			t.Fatalf("rule name %q: %d %s", name, code, msg)
		}
		r["name"] = "ok"
		r["endpoints"].([]any)[0].(map[string]any)["name"] = name
		if code, msg := p.adminDo("POST", "/admin/rules", p.token, mustJSON(r)); code != 422 || !strings.Contains(msg, "endpoints[0].name") {
			t.Fatalf("endpoint name %q: %d %s", name, code, msg)
		}
	}
	// Unknown JSON fields are rejected too.
	if code, msg := p.adminDo("PUT", "/admin/rules/pool", p.token, `{"name":"pool","selektor":"rr"}`); code != 400 || !strings.Contains(msg, "selektor") {
		t.Fatalf("unknown field: %d %s", code, msg)
	}
	// A new rule for another model is live without restart.
	var rule map[string]any
	json.Unmarshal([]byte(body), &rule)
	rule["name"] = "second"
	rule["models"] = []string{"qwen3"}
	b, _ := json.Marshal(rule)
	if code, msg := p.adminDo("POST", "/admin/rules", p.token, string(b)); code != 201 {
		t.Fatalf("create: %d %s", code, msg)
	}
	p.model = "qwen3"
	// The gateway now routes qwen3 (the simulators serve only llama3, so the engine's own 404 comes
	// back through the new rule, not the gateway's model_not_found).
	if c := p.complete("hello world", false); c.decision == "" || c.servedBy == "" || strings.Contains(c.body, "model_not_found") {
		t.Fatalf("new rule not live: %+v", c)
	}
	proxySeries := func() []string {
		_, m := p.adminDo("GET", "/metrics", p.token, "")
		var out []string
		for _, l := range strings.Split(m, "\n") {
			if strings.HasPrefix(l, "kvexact_proxy_") && strings.Contains(l, `rule="second"`) {
				out = append(out, l)
			}
		}
		return out
	}
	if len(proxySeries()) == 0 {
		t.Fatal("the new rule has no proxy series")
	}
	if code, _ := p.adminDo("DELETE", "/admin/rules/second", p.token, ""); code != 204 {
		t.Fatalf("delete: %d", code)
	}
	if left := proxySeries(); len(left) > 0 {
		t.Fatalf("the deleted rule's series remain: %q", left)
	}
	if c := p.complete("hello world", false); c.status != 404 || !strings.Contains(c.body, "model_not_found") {
		t.Fatalf("deleted rule still serves: %+v", c)
	}
	p.model = "llama3"
	// Endpoint states: down takes it out of rotation, up brings it back.
	if code, _ := p.adminDo("POST", "/admin/rules/pool/endpoints/e0/down", p.token, ""); code != 200 {
		t.Fatal("down refused")
	}
	for i := 0; i < 4; i++ {
		if c := p.complete("hi there", false); c.endpoint != "e1" {
			t.Fatalf("admin-down endpoint served: %+v", c)
		}
	}
	p.adminDo("POST", "/admin/rules/pool/endpoints/e0/up", p.token, "")
	seen := map[string]bool{}
	for i := 0; i < 4; i++ {
		seen[p.complete("hi there", false).endpoint] = true
	}
	if !seen["e0"] {
		t.Fatal("endpoint not back after up")
	}
	if code, _ := p.adminDo("POST", "/admin/rules/pool/endpoints/e0/sideways", p.token, ""); code != 400 {
		t.Fatal("bad state accepted")
	}
}
