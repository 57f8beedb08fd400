package epp_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/deploy"
	"github.com/kvexact/kvexact/gateway/epp"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/envoytest"
	"github.com/kvexact/kvexact/internal/openaisdk"
	"github.com/kvexact/kvexact/internal/promtest"
)

func envoyBinary(t *testing.T) string { return envoytest.Binary(t) }

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startEnvoy runs deploy/envoy/envoy.yaml.tmpl as it is in front of the picker.
func startEnvoy(t *testing.T, picker string) string { return envoytest.Start(t, picker) }

type envoyReply struct {
	status  int
	receipt string
	body    []byte
	header  http.Header
}

func post(t *testing.T, url string, body []byte, kv ...string) envoyReply {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Add(kv[i], kv[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return envoyReply{status: resp.StatusCode, receipt: resp.Header.Get(epp.ReceiptHeader), body: b, header: resp.Header}
}

// TestThroughEnvoy: a real Envoy (deploy/envoy/envoy.yaml.tmpl) in front of the picker, the
// simulators behind it. Completions and chat, streamed and not, reach the endpoint the standalone
// gateway picks on the same state, with the receipt on the response; a client's forged destination
// cannot steer the request; paths outside the API surface, an unknown model, an oversized body and
// a pool with nothing eligible get the proxy's OpenAI-shaped errors through Envoy.
func TestThroughEnvoy(t *testing.T) {
	w := startWorld(t, worldSpec{n: 3,
		cfg: func(c *rules.Config) { c.MaxBodyBytes = 64 << 10 }})
	base := startEnvoy(t, w.conn.Target())

	// The differential: a prompt the standalone proxy served goes, extended, through Envoy; both
	// front ends must choose the endpoint holding its blocks.
	for i := 0; i < 6; i++ {
		prefix := strings.Repeat(fmt.Sprintf("Envoy differential %d: the cached document. ", i), 20)
		ep, _ := w.proxied(completionBody(prefix))
		time.Sleep(50 * time.Millisecond)
		r := post(t, base+"/v1/completions", completionBody(prefix+" And a question."))
		if r.status != 200 {
			t.Fatalf("through Envoy: status %d: %s", r.status, r.body)
		}
		if r.receipt != ep {
			t.Fatalf("request %d: the picker behind Envoy chose %q, the standalone gateway %q", i, r.receipt, ep)
		}
	}

	// The cached-token account through Envoy: the picker reads the usage from the response body as
	// the override in its response-headers answer asked for it (a JSON answer in one message, a
	// stream chunk by chunk), so the realized counter grows by each hit's cached tokens. The
	// standalone proxy's own reports land first.
	realized := func() (n float64) {
		for ep := range 3 {
			n += promtest.Value(t, w.reg, "kvexact_realized_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": fmt.Sprintf("e%d", ep)})
		}
		return n
	}
	r0 := realized()
	eventually(t, 5*time.Second, "the standalone proxy's usage reports to settle", func() bool {
		time.Sleep(50 * time.Millisecond)
		r1 := realized()
		settled := r1 == r0
		r0 = r1
		return settled
	})
	hit := strings.Repeat("Envoy differential 0: the cached document. ", 20)
	for _, stream := range []bool{false, true} {
		req := map[string]any{"model": "llama3", "prompt": hit + fmt.Sprintf(" Accounted, streamed %v?", stream), "max_tokens": 2}
		if stream {
			req["stream"], req["stream_options"] = true, map[string]any{"include_usage": true}
		}
		b, _ := json.Marshal(req)
		before := realized()
		if r := post(t, base+"/v1/completions", b); r.status != 200 || !strings.Contains(string(r.body), `"cached_tokens"`) {
			t.Fatalf("accounted request (streamed %v): %d %s", stream, r.status, r.body)
		}
		eventually(t, 5*time.Second, fmt.Sprintf("the cached tokens of a hit through Envoy (streamed %v) accounted", stream), func() bool {
			return realized() > before
		})
	}

	// Streaming completion and chat.
	sb, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": "stream through envoy", "max_tokens": 4, "stream": true})
	r := post(t, base+"/v1/completions", sb)
	if r.status != 200 || !strings.Contains(string(r.body), "data: [DONE]") || r.receipt == "" {
		t.Fatalf("streamed completion: %d receipt %q body %q", r.status, r.receipt, r.body)
	}
	cb, _ := json.Marshal(map[string]any{"model": "llama3", "messages": []map[string]string{{"role": "user", "content": "hello through envoy"}}, "max_tokens": 3})
	if r = post(t, base+"/v1/chat/completions", cb); r.status != 200 || r.receipt == "" {
		t.Fatalf("chat: %d %s", r.status, r.body)
	}
	cs, _ := json.Marshal(map[string]any{"model": "llama3", "messages": []map[string]string{{"role": "user", "content": "stream chat"}}, "max_tokens": 3, "stream": true})
	if r = post(t, base+"/v1/chat/completions", cs); r.status != 200 || !strings.Contains(string(r.body), "data: [DONE]") {
		t.Fatalf("streamed chat: %d %s", r.status, r.body)
	}

	// A forged destination and prefill header naming a server of the test's own: with append
	// semantics Envoy would carry the forged value before the picker's, and the pool's first attempt
	// would go to it. The request must reach the picker's choice, and the forged server nothing.
	forged := make(chan string, 8)
	fs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		forged <- r.URL.Path
		w.Write([]byte(`{"forged":true}`))
	})}
	fl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go fs.Serve(fl)
	t.Cleanup(func() { fs.Close() })
	seen := map[string]string{}
	for _, h := range []string{epp.DestinationHeader, epp.PrefillHeader} {
		r = post(t, base+"/v1/completions", completionBody("forged "+h), h, fl.Addr().String(), h, fl.Addr().String())
		if r.status != 200 || r.receipt == "" || strings.Contains(string(r.body), "forged") {
			t.Fatalf("forged %s: status %d receipt %q: %s", h, r.status, r.receipt, r.body)
		}
		seen[h] = r.receipt
	}
	select {
	case p := <-forged:
		t.Fatalf("a forged routing header sent %s to the client's server", p)
	default:
	}

	code := func(b []byte) string {
		var e struct{ Error struct{ Code string } }
		json.Unmarshal(b, &e)
		return e.Error.Code
	}
	for _, c := range []struct {
		path string
		body []byte
		want int
		code string
	}{
		{"/reset_prefix_cache", completionBody("admin"), 404, "unknown_url"},
		{"/sim/clear", completionBody("admin"), 404, "unknown_url"},
		{"/v1/completions", []byte(`{"model":"nope","prompt":"x"}`), 404, "model_not_found"},
		{"/v1/completions", completionBody(strings.Repeat("big ", 20<<10)), 413, "request_too_large"},
	} {
		if r = post(t, base+c.path, c.body); r.status != c.want || code(r.body) != c.code {
			t.Fatalf("%s: want %d %s through Envoy, got %d %s", c.path, c.want, c.code, r.status, r.body)
		}
	}
	for _, n := range []string{"e0", "e1", "e2"} {
		w.g.SetEndpointState("pool", n, "down")
	}
	if r = post(t, base+"/v1/completions", completionBody("no one home")); r.status != 503 || code(r.body) != "no_healthy_endpoint" || r.header.Get("Retry-After") == "" {
		t.Fatalf("nothing eligible: want 503 no_healthy_endpoint with Retry-After, got %d %v %s", r.status, r.header, r.body)
	}
	w.noLeak()
}

// sdk runs one of the OpenAI SDK scripts in testdata (the same commands and output in both) against
// base and returns what it printed.
type sdk struct {
	name string
	run  func(t *testing.T, base string, args ...string) map[string]any
}

func sdks(t *testing.T) []sdk {
	script := func(t *testing.T, cmd *exec.Cmd) map[string]any {
		t.Helper()
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("%v: %v\n%s\n%s", cmd.Args, err, out, stderr)
		}
		var m map[string]any
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("%v printed %s", cmd.Args, out)
		}
		return m
	}
	py := openaisdk.Python(t)
	node := openaisdk.Node(t)
	return []sdk{
		{"python", func(t *testing.T, base string, args ...string) map[string]any {
			return script(t, exec.Command(py, append([]string{filepath.Join("testdata", "openai_sdk.py"), base}, args...)...))
		}},
		{"node", func(t *testing.T, base string, args ...string) map[string]any {
			cmd := exec.Command("node", append([]string{filepath.Join("testdata", "openai_sdk.js"), base}, args...)...)
			cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(node, "node_modules"))
			return script(t, cmd)
		}},
	}
}

// TestSDKThroughEnvoy: the OpenAI Python SDK and the npm openai SDK talk to Envoy in front of the
// picker: chat and completions, streamed and not, and the picker's 404, 413, 429 and 503 arrive as
// each SDK's typed errors with the proxy's codes.
func TestSDKThroughEnvoy(t *testing.T) {
	clients := sdks(t)
	w := startWorld(t, worldSpec{n: 1, cfg: func(c *rules.Config) { c.MaxBodyBytes = 64 << 10 }})
	base := startEnvoy(t, w.conn.Target())
	// Shedding (admission on a P/D rule): the only prefill endpoint's slot is held by a decided
	// request, so the next is answered 429.
	pd := startWorld(t, worldSpec{n: 2, roles: []string{"prefill", "decode"},
		mod: func(r *rules.Rule) {
			r.KVExactMode, r.Selector = 1, ""
			r.Admission = rules.Admission{Enabled: true, Mode: "shed", MaxInflightPerEndpoint: 1}
		}})
	pdBase := startEnvoy(t, pd.conn.Target())
	// The typed error classes: the Python SDK's and the Node SDK's names differ only for 413,
	// which neither SDK has a class of its own for.
	status413 := map[string]string{"python": "APIStatusError", "node": "APIError"}
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			ok := c.run(t, base, "ok")
			if ok["completion"] != true || ok["chat"] != "assistant" || ok["completion_chunks"].(float64) < 2 || ok["chat_chunks"].(float64) < 2 {
				t.Fatalf("the SDK's calls through Envoy: %v", ok)
			}
			want := func(m map[string]any, class string, status float64, code string) {
				t.Helper()
				if m["class"] != class || m["status"] != status || m["code"] != code {
					t.Fatalf("want %s %v %s, got %v", class, status, code, m)
				}
			}
			want(c.run(t, base, "error", "model"), "NotFoundError", 404, "model_not_found")
			want(c.run(t, base, "error", "big"), status413[c.name], 413, "request_too_large")
			// Held per client: the held stream's own deadline (the harness's 20 s) must not end
			// it before the SDK's request arrives.
			held := pd.request(envoyRequest{path: "/v1/completions", body: completionBody("holding the slot")})
			if held.header == "" {
				t.Fatalf("the held request got no destination: %+v", held.immediate)
			}
			want(c.run(t, pdBase, "error", "any"), "RateLimitError", 429, "overloaded")
			held.cancel()
			w.g.SetEndpointState("pool", "e0", "down")
			defer w.g.SetEndpointState("pool", "e0", "up")
			want(c.run(t, base, "error", "any"), "InternalServerError", 503, "no_healthy_endpoint")
		})
	}
	pd.noLeak()
	w.noLeak()
}

// TestEnvoyHoldsStreamsPastItsDefaultBreaker: every request in flight holds an ext_proc stream to
// the picker, and Envoy's default circuit breaker on a cluster is 1,024 requests. With 1,100
// requests held open mid-body (each stream waiting for the rest of its body), one more request is
// still served: deploy/envoy's picker and pool clusters carry explicit, larger bounds. With the
// defaults that request fails with 500 (the picker cluster's upstream_rq_active_overflow).
func TestEnvoyHoldsStreamsPastItsDefaultBreaker(t *testing.T) {
	const held = 1100 // past Envoy's default max_requests of 1,024
	w := startWorld(t, worldSpec{n: 2})
	base := startEnvoy(t, w.conn.Target())
	addr := strings.TrimPrefix(base, "http://")
	body := completionBody("held open")
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < held; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:len(body)/2])
	}
	open := func() float64 { return promtest.Value(t, w.reg, "kvexact_epp_streams_active", nil) }
	for deadline := time.Now().Add(30 * time.Second); open() < held; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %v of %d held requests opened a stream at the picker: Envoy refused the rest (a circuit breaker of its picker cluster?)", open(), held)
		}
	}
	if r := post(t, base+"/v1/completions", completionBody("one more")); r.status != 200 || r.receipt == "" {
		t.Fatalf("with %d requests in flight, one more: status %d receipt %q: %s", held, r.status, r.receipt, r.body)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	w.noLeak()
}

// TestThroughEnvoyWithFullDuplexResponse: deploy/envoy with the response body FULL_DUPLEX_STREAMED
// (as other gateways configure the picker) instead of STREAMED. Envoy then needs every chunk back
// in a streamed body response (anything else it answers 500), and the picker reads that from the
// stream's protocol_config: JSON and streamed answers arrive whole, with the receipt, and their
// cached tokens are accounted.
func TestThroughEnvoyWithFullDuplexResponse(t *testing.T) {
	w := startWorld(t, worldSpec{n: 2})
	duplex := strings.Replace(deploy.EnvoyTemplate, "response_body_mode: STREAMED", "response_body_mode: FULL_DUPLEX_STREAMED", 1)
	if duplex == deploy.EnvoyTemplate {
		t.Fatal("deploy/envoy has no response_body_mode: STREAMED to replace")
	}
	base := envoytest.StartTemplate(t, w.conn.Target(), duplex)
	realized := func() (n float64) {
		for ep := range 2 {
			n += promtest.Value(t, w.reg, "kvexact_realized_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": fmt.Sprintf("e%d", ep)})
		}
		return n
	}
	hit := strings.Repeat("Full duplex: the cached document. ", 20)
	post(t, base+"/v1/completions", completionBody(hit)) // its blocks land on the endpoint
	time.Sleep(100 * time.Millisecond)
	for _, stream := range []bool{false, true} {
		req := map[string]any{"model": "llama3", "prompt": hit + fmt.Sprintf(" Streamed %v?", stream), "max_tokens": 2}
		if stream {
			req["stream"], req["stream_options"] = true, map[string]any{"include_usage": true}
		}
		b, _ := json.Marshal(req)
		before := realized()
		r := post(t, base+"/v1/completions", b)
		if r.status != 200 || r.receipt == "" || !strings.Contains(string(r.body), `"cached_tokens"`) || stream && !strings.Contains(string(r.body), "data: [DONE]") {
			t.Fatalf("streamed %v through a full-duplex response path: %d receipt %q: %s", stream, r.status, r.receipt, r.body)
		}
		eventually(t, 5*time.Second, fmt.Sprintf("the cached tokens (streamed %v) accounted", stream), func() bool { return realized() > before })
	}
	w.noLeak()
}
