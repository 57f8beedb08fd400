package rules

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

const base = `
listen: 127.0.0.1:18080
admin: {token: secret}
rules:
  - name: pool
    models: [llama3]
    engine: {family: vllm, release: v0.25.1}
    kvExactMode: 3
    seed: "0"
    endpoints:
      - {name: a, address: "http://127.0.0.1:8001", events: {zmq: ["tcp://127.0.0.1:5557"], replay: ["tcp://127.0.0.1:6557"]}}
      - {name: b, address: "http://127.0.0.1:8002/"}
`

func TestDefaults(t *testing.T) {
	c, err := Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rules[0]
	if r.BlockSize != 16 || r.HashAlgorithm != "sha256" || r.Binding != "auto" || r.Selector != "rr" || r.Scoring != "overlap" {
		t.Errorf("contract defaults not applied: %+v", r)
	}
	if *r.MinMatchTokens != 16 || r.LoadLaw.Kind != "hard" || *r.LoadLaw.Epsilon != 0.75 || !*r.LoadLaw.SpillRelief {
		t.Errorf("routing defaults wrong: %+v", r.LoadLaw)
	}
	if *r.LoadLaw.CapFloor != 8 {
		t.Errorf("loadLaw.capFloor default %d, want 8 (docs/routing.md, The load law at pool scale)", *r.LoadLaw.CapFloor)
	}
	if r.Breaker.FailureThreshold != 5 || time.Duration(r.Breaker.OpenFor) != 30*time.Second || *r.Breaker.OriginErrorThreshold != 3 {
		t.Errorf("breaker defaults wrong: %+v", r.Breaker)
	}
	if time.Duration(r.Session.TTL) != 300*time.Second || r.Endpoints[1].Address != "http://127.0.0.1:8002" || r.Endpoints[1].Role != "normal" {
		t.Errorf("endpoint/session defaults wrong: %+v", r)
	}
	if c.Admin.Listen != "127.0.0.1:9090" || c.MaxBodyBytes != 16<<20 {
		t.Errorf("config defaults wrong: %+v", c)
	}
}

func TestSGLangAndTRTDefaults(t *testing.T) {
	c, err := Parse([]byte(`
rules:
  - name: sg
    models: [m1]
    engine: {family: sglang, release: v0.5.18}
    kvExactMode: 3
    endpoints: [{address: "http://127.0.0.1:1"}]
  - name: trt
    models: [m2]
    engine: {family: trtllm, release: "1.2"}
    kvExactMode: 3
    endpoints: [{address: "http://127.0.0.1:2"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Rules[0].BlockSize != 1 || c.Rules[0].HashAlgorithm != "sglang_sha256" {
		t.Errorf("sglang defaults: %+v", c.Rules[0])
	}
	if c.Rules[1].BlockSize != 32 || c.Rules[1].Endpoints[0].Events.Drain != "http://127.0.0.1:2" {
		t.Errorf("trtllm defaults: %+v", c.Rules[1])
	}
}

func TestRejections(t *testing.T) {
	for _, tc := range []struct {
		from, to, want string
	}{
		{"kvExactMode: 3", "kvExactMode: 2", "rules[0].kvExactMode: 2 is not one of 0 (off), 1 (P/D ladder), 3 (single pool) (2 is reserved)"},
		{"kvExactMode: 3", "kvExactMode: 1", "rules[0].kvExactMode: 1 (P/D ladder) needs at least one prefill and one decode"},
		{`name: b, address`, `name: b, role: prefill, address`, "rules[0].kvExactMode: 3 (single pool) needs role-less endpoints"},
		{`name: b, address`, `name: b, role: prefil, address`, `rules[0].endpoints[1].role: "prefil" is not one of normal, prefill, decode`},
		{"release: v0.25.1", "release: v0.9.2", "rules[0].engine: contracts: no pinned contract for vllm v0.9.2; known releases:"},
		{"family: vllm", "family: vlm", `rules[0].engine: contracts: unknown engine family "vlm"`},
		{"seed: \"0\"", "seed: \"0\"\n    hashAlgorithm: sglang_sha256", `rules[0].hashAlgorithm: "sglang_sha256" does not fit vllm v0.25.1; it offers sha256, sha256_cbor, xxhash, xxhash_cbor`},
		{"seed: \"0\"", "binding: engine", "rules[0].seed: required for the engine binding"},
		{"seed: \"0\"", "blockSize: 5000", "rules[0].blockSize: 5000 is outside 1..4096"},
		{"seed: \"0\"", "selector: random", `rules[0].selector: "random" is not one of rr, wrr, least-load, chwbl`},
		{"seed: \"0\"", "loadLaw: {kind: medium}", `rules[0].loadLaw.kind: "medium" is not one of hard, soft, adaptive, off`},
		{"seed: \"0\"", "loadLaw: {capFloor: 0}", "rules[0].loadLaw.capFloor: 0 is outside 1..100000"},
		{"seed: \"0\"", "loadLaw: {capFloor: 100001}", "rules[0].loadLaw.capFloor: 100001 is outside 1..100000"},
		{"seed: \"0\"", "minMatchTokens: 5000", "rules[0].minMatchTokens: 5000 is outside 0..4096"},
		{"seed: \"0\"", "sed: \"0\"", "field sed not found"},
		{`replay: ["tcp://127.0.0.1:6557"]`, `replay: ["tcp://127.0.0.1:6557", "tcp://127.0.0.1:6558"]`, "rules[0].endpoints[0].events.replay: 2 addresses for 1 ranks"},
		{`replay: ["tcp://127.0.0.1:6557"]`, `replay: ["tcp://127.0.0.1:6557"], queueLimit: -1`, "rules[0].endpoints[0].events.queueLimit: -1 is outside 1..1000000 messages (0: the default, 10000)"},
		{`replay: ["tcp://127.0.0.1:6557"]`, `replay: ["tcp://127.0.0.1:6557"], queueLimit: 1000001`, "rules[0].endpoints[0].events.queueLimit: 1000001 is outside 1..1000000"},
		{`name: b, address`, `name: b, maxRunning: -1, address`, "rules[0].endpoints[1].maxRunning: -1 is outside 0..1000000"},
		{`"http://127.0.0.1:8002/"`, `"127.0.0.1:8002"`, `rules[0].endpoints[1].address: "127.0.0.1:8002" must start with http://`},
		{`name: b, address`, `name: a, address`, `rules[0].endpoints[1].name: "a" is used by another endpoint`},
		{"seed: \"0\"", "breaker: {openFor: soon}", `"soon" is not a duration`},
		{`name: b, address`, `name: "b\r\nX-Evil: 1", address`, `rules[0].endpoints[1].name: "b\r\nX-Evil: 1": byte 1 (CR) is not allowed`},
		{`name: b, address`, `name: "b c", address`, `rules[0].endpoints[1].name: "b c": byte 1 (" ") is not allowed`},
		{`name: b, address`, `name: "b\u00e9", address`, `rules[0].endpoints[1].name: "bé": byte 1 (non-ASCII byte 0xc3) is not allowed`},
		{`"http://127.0.0.1:8002/"`, `"http://u:p@127.0.0.1:8002/"`, `rules[0].endpoints[1].address: "http://u:p@127.0.0.1:8002" is not a base URL`},
		{"seed: \"0\"", "passthrough: [/reset_prefix_cache]", `rules[0].passthrough[0]: "/reset_prefix_cache" reaches the engine admin route /reset_prefix_cache`},
		{"seed: \"0\"", "passthrough: [\"/tokenize?a=1\"]", `rules[0].passthrough[0]: "/tokenize?a=1": byte 9 ("?") is not allowed`},
		{"seed: \"0\"", "passthrough: [tokenize]", `rules[0].passthrough[0]: "tokenize" must be an absolute path`},
		{"seed: \"0\"", "upstream: {caFile: /nonexistent.pem}", `rules[0].upstream.caFile: open /nonexistent.pem`},
		{"seed: \"0\"", "upstream: {maxConnsPerHost: -1}", `rules[0].upstream.maxConnsPerHost: -1 is outside`},
		{"listen: ", "server: {maxHeaderFields: 5}\nlisten: ", `server.maxHeaderFields: 5 is outside 16..10000`},
		{"listen: ", "server: {writeTimeout: -1s}\nlisten: ", `server.writeTimeout: must be positive`},
		{"listen: ", "server: {lingerTimeout: 61s}\nlisten: ", `server.lingerTimeout: 1m1s is outside 0..1m`},
		{"listen: ", "server: {lingerBytes: 1073741825}\nlisten: ", `server.lingerBytes: 1073741825 is outside 0..1073741824`},
		{"seed: \"0\"", "upstream: {idleTimeout: -1s}", `rules[0].upstream.idleTimeout: must be positive`},
		{"models: [llama3]", "models: [\"llama3\\r\\n\"]", `rules[0].models[0]: "llama3\r\n": byte 6 (CR) is not allowed`},
		{"models: [llama3]", "models: [" + strings.Repeat("m", 257) + "]", `rules[0].models[0]: 257 bytes; at most 256`},
		{"listen: ", "server: {tls: {certFile: /nonexistent.pem}}\nlisten: ", `server.tls.keyFile: required with certFile`},
		{"listen: ", "server: {tls: {certFile: a, keyFile: b, clientCAFile: c}}\nlisten: ", `server.tls.clientCAFile: client certificates are asked for on the admin listener only`},
	} {
		src := strings.Replace(base, tc.from, tc.to, 1)
		if src == base {
			t.Fatalf("edit %q changed nothing", tc.from)
		}
		_, err := Parse([]byte(src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("edit %q→%q: want error containing %q, got %v", tc.from, tc.to, tc.want, err)
		}
	}
}

func TestLlamaCppRefusesKV(t *testing.T) {
	tmpl := `
rules:
  - name: l
    engine: {family: llamacpp, release: b10573}
    selector: chwbl
    %s
    endpoints: [{address: "http://127.0.0.1:1"}]
`
	if _, err := Parse([]byte(strings.Replace(tmpl, "%s", "", 1))); err != nil {
		t.Fatalf("plain llama.cpp rule rejected: %v", err)
	}
	for field, line := range map[string]string{
		"kvExactMode":   "kvExactMode: 3",
		"blockSize":     "blockSize: 16",
		"hashAlgorithm": "hashAlgorithm: sha256",
		"binding":       "binding: router",
		"seed":          `seed: "0"`,
	} {
		_, err := Parse([]byte(strings.Replace(tmpl, "%s", line, 1)))
		if err == nil || !strings.Contains(err.Error(), "rules[0]."+field) || !strings.Contains(err.Error(), "no KV-cache events") {
			t.Errorf("%s: want refusal naming the field and the reason, got %v", field, err)
		}
	}
}

func TestPDRule(t *testing.T) {
	c, err := Parse([]byte(`
rules:
  - name: pd
    engine: {family: vllm, release: v0.25.1}
    kvExactMode: 1
    trie: {enabled: true}
    endpoints:
      - {name: p, role: prefill, address: "http://127.0.0.1:1"}
      - {name: d, role: decode, address: "http://127.0.0.1:2"}
`))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rules[0]
	if r.Breaker.FailureThreshold != 3 || *r.LoadLaw.SpillRelief || r.Trie.ThresholdPct != 20 || r.Trie.BalanceAbs != 3 {
		t.Errorf("P/D defaults wrong: %+v %+v %+v", r.Breaker, r.LoadLaw, r.Trie)
	}
}

func TestStoreRejectsWithoutMutation(t *testing.T) {
	c, err := Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	s := NewStore(c)
	var changes []Change
	s.Watch(func(ch Change) { changes = append(changes, ch) })
	bad := c.Rules[0].Clone()
	bad.Selector = "nope"
	if _, err := s.Put(bad); err == nil || !strings.Contains(err.Error(), "selector") {
		t.Fatalf("bad rule accepted: %v", err)
	}
	got, _ := s.Get("pool")
	if got.Selector != "rr" || len(changes) != 0 || s.Generation() != 0 {
		t.Fatalf("store mutated by a rejected change: %+v, %d changes", got, len(changes))
	}
	// Overlap with an existing rule on the same listener and model is rejected.
	dup := c.Rules[0].Clone()
	dup.Name = "pool2"
	if _, err := s.Put(dup); err == nil || !strings.Contains(err.Error(), `model "llama3" on 127.0.0.1:18080 is already served by rule "pool"`) {
		t.Fatalf("overlap accepted: %v", err)
	}
	ok := c.Rules[0].Clone()
	ok.Selector = "least-load"
	if _, err := s.Put(ok); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get("pool"); got.Selector != "least-load" || len(changes) != 1 || changes[0].Old.Selector != "rr" {
		t.Fatalf("accepted change not applied/announced: %+v %+v", got, changes)
	}
	if err := s.Delete("pool"); err != nil || len(s.List()) != 0 || len(changes) != 2 || changes[1].New != nil {
		t.Fatalf("delete: %v", err)
	}
	if err := s.Delete("pool"); err == nil {
		t.Fatal("deleting a missing rule succeeded")
	}
}

// TestEventsQueueLimit: events.queueLimit is kept as written (0 when absent: the ingest default),
// and refused where there is no ZeroMQ reader queue (an HTTP drain).
func TestEventsQueueLimit(t *testing.T) {
	c, err := Parse([]byte(strings.Replace(base, `replay: ["tcp://127.0.0.1:6557"]`, `replay: ["tcp://127.0.0.1:6557"], queueLimit: 500`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Rules[0].Endpoints[0].Events.QueueLimit; got != 500 {
		t.Errorf("queueLimit %d, want 500", got)
	}
	if c, err = Parse([]byte(base)); err != nil || c.Rules[0].Endpoints[0].Events.QueueLimit != 0 {
		t.Errorf("absent queueLimit: %v, %+v", err, c.Rules[0].Endpoints[0].Events)
	}
	_, err = Parse([]byte(`
rules:
  - name: trt
    models: [m2]
    engine: {family: trtllm, release: "1.2"}
    kvExactMode: 3
    endpoints: [{address: "http://127.0.0.1:2", events: {queueLimit: 10}}]
`))
	if err == nil || !strings.Contains(err.Error(), "rules[0].endpoints[0].events.queueLimit: ") || !strings.Contains(err.Error(), "no ZeroMQ reader queue") {
		t.Errorf("queueLimit on a drain: %v", err)
	}
}

// predictOnRoute: unset is the default TTL on a single-pool rule and off elsewhere; an explicit 0
// stays off and an explicit TTL stays itself, in YAML and in JSON.
func TestPredictOnRouteDefault(t *testing.T) {
	pd := `
rules:
  - name: pd
    models: [m]
    engine: {family: vllm, release: v0.25.1}
    kvExactMode: 1
    endpoints: [{name: p, address: "http://127.0.0.1:1", role: prefill}, {name: d, address: "http://127.0.0.1:2", role: decode}]
`
	for _, c := range []struct {
		name, yaml string
		want       time.Duration
	}{
		{"single pool, unset", base, DefaultPredictOnRoute},
		{"single pool, 0", strings.Replace(base, "kvExactMode: 3", "kvExactMode: 3\n    predictOnRoute: 0", 1), 0},
		{"single pool, 0s", strings.Replace(base, "kvExactMode: 3", "kvExactMode: 3\n    predictOnRoute: 0s", 1), 0},
		{"single pool, off", strings.Replace(base, "kvExactMode: 3", "kvExactMode: 3\n    predictOnRoute: off", 1), 0},
		{"single pool, 5s", strings.Replace(base, "kvExactMode: 3", "kvExactMode: 3\n    predictOnRoute: 5s", 1), 5 * time.Second},
		{"kv-exact off, unset", strings.Replace(base, "kvExactMode: 3", "kvExactMode: 0", 1), 0},
		{"P/D, unset", pd, 0},
	} {
		cfg, err := Parse([]byte(c.yaml))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		r := &cfg.Rules[0]
		if r.PredictOnRoute == nil || r.PredictTTL() != c.want {
			t.Errorf("%s: predictOnRoute %v, want %s", c.name, r.PredictOnRoute, c.want)
		}
		// JSON keeps the explicit value: a normalized rule read back normalizes to itself.
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var back Rule
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if back.PredictOnRoute == nil || back.PredictTTL() != c.want {
			t.Errorf("%s: JSON %s read back as %v, want %s", c.name, b, back.PredictOnRoute, c.want)
		}
	}
	var unset Rule
	if err := json.Unmarshal([]byte(`{"name":"r"}`), &unset); err != nil || unset.PredictOnRoute != nil {
		t.Errorf("JSON without predictOnRoute: %v %v, want unset", unset.PredictOnRoute, err)
	}
	if err := json.Unmarshal([]byte(`{"name":"r","predictOnRoute":"off"}`), &unset); err != nil || unset.PredictOnRoute == nil || unset.PredictTTL() != 0 {
		t.Errorf(`JSON predictOnRoute "off": %v %v, want an explicit 0`, unset.PredictOnRoute, err)
	}
	for _, v := range []string{"61s", "-1s", "soon"} {
		_, err := Parse([]byte(strings.Replace(base, "kvExactMode: 3", "kvExactMode: 3\n    predictOnRoute: "+v, 1)))
		if err == nil || !strings.Contains(err.Error(), "predictOnRoute") && !strings.Contains(err.Error(), "not a duration") {
			t.Errorf("predictOnRoute: %s: error %v, want one naming the field", v, err)
		}
	}
}
