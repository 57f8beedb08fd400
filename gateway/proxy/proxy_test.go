package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func singlePool(t *testing.T, h handleFunc, cfgMod func(*Config)) (*pool, *upstream) {
	u := newUpstream(t, "a", h)
	return newPool(t, "vllm", 0, []epSpec{{name: "a", addr: u.srv.URL}}, nil, nil, cfgMod), u
}

func TestBadInput(t *testing.T) {
	p, u := singlePool(t, completion, func(c *Config) { c.MaxBodyBytes = 4096 })
	big := `{"model":"m","prompt":"` + strings.Repeat("x", 5000) + `"}`
	type tcase struct {
		name, path, ctype, body string
		status                  int
		param, code             string
		hdr                     map[string]string
	}
	cases := []tcase{
		{"malformed json", "/v1/completions", "application/json", `{"model":"m",`, 400, "", "invalid_json", nil},
		{"empty body", "/v1/completions", "application/json", ``, 400, "", "invalid_json", nil},
		{"data after the object", "/v1/completions", "application/json", `{"model":"m","prompt":"x"} {}`, 400, "", "invalid_json", nil},
		{"not an object", "/v1/completions", "application/json", `[1,2]`, 400, "", "invalid_json", nil},
		{"missing model", "/v1/completions", "application/json", `{"prompt":"hi"}`, 400, "model", "missing_model", nil},
		{"empty model", "/v1/chat/completions", "application/json", `{"model":"","messages":[{"role":"user","content":"hi"}]}`, 400, "model", "missing_model", nil},
		{"model not a string", "/v1/completions", "application/json", `{"model":7,"prompt":"hi"}`, 400, "model", "invalid_type", nil},
		{"unknown model", "/v1/completions", "application/json", `{"model":"nope","prompt":"hi"}`, 404, "model", "model_not_found", nil},
		{"unknown model chat", "/v1/chat/completions", "application/json", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404, "model", "model_not_found", nil},
		{"wrong content type", "/v1/completions", "text/plain", `{"model":"m","prompt":"hi"}`, 415, "", "unsupported_media_type", nil},
		{"form content type", "/v1/chat/completions", "application/x-www-form-urlencoded", `model=m`, 415, "", "unsupported_media_type", nil},
		{"oversize body", "/v1/completions", "application/json", big, 413, "", "request_too_large", nil},
		{"oversize chunked body", "/v1/completions", "application/json", big, 413, "", "request_too_large", map[string]string{"chunked": "1"}},
		{"prompt number", "/v1/completions", "application/json", `{"model":"m","prompt":42}`, 400, "prompt", "invalid_type", nil},
		{"prompt object", "/v1/completions", "application/json", `{"model":"m","prompt":{"a":1}}`, 400, "prompt", "invalid_type", nil},
		{"prompt mixed array", "/v1/completions", "application/json", `{"model":"m","prompt":["a",1]}`, 400, "prompt", "invalid_type", nil},
		{"prompt negative token", "/v1/completions", "application/json", `{"model":"m","prompt":[1,-2]}`, 400, "prompt", "invalid_type", nil},
		{"prompt fractional token", "/v1/completions", "application/json", `{"model":"m","prompt":[1.5]}`, 400, "prompt", "invalid_type", nil},
		{"prompt token overflow", "/v1/completions", "application/json", `{"model":"m","prompt":[4294967296]}`, 400, "prompt", "invalid_type", nil},
		{"prompt empty array", "/v1/completions", "application/json", `{"model":"m","prompt":[]}`, 400, "prompt", "invalid_value", nil},
		{"prompt empty token batch", "/v1/completions", "application/json", `{"model":"m","prompt":[[1],[]]}`, 400, "prompt", "invalid_value", nil},
		{"prompt missing", "/v1/completions", "application/json", `{"model":"m"}`, 400, "prompt", "missing_prompt", nil},
		{"messages missing", "/v1/chat/completions", "application/json", `{"model":"m"}`, 400, "messages", "missing_messages", nil},
		{"messages not array", "/v1/chat/completions", "application/json", `{"model":"m","messages":"hi"}`, 400, "messages", "invalid_type", nil},
		{"messages empty", "/v1/chat/completions", "application/json", `{"model":"m","messages":[]}`, 400, "messages", "invalid_value", nil},
		{"stream not bool", "/v1/completions", "application/json", `{"model":"m","prompt":"hi","stream":"yes"}`, 400, "stream", "invalid_type", nil},
		{"user not string", "/v1/completions", "application/json", `{"model":"m","prompt":"hi","user":5}`, 400, "user", "invalid_type", nil},
		{"x-model disagrees", "/v1/completions", "application/json", `{"model":"m","prompt":"hi"}`, 400, "model", "model_mismatch", map[string]string{"X-Model": "other"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var rd io.Reader = strings.NewReader(tc.body)
			if tc.hdr["chunked"] != "" {
				rd = io.MultiReader(strings.NewReader(tc.body)) // unknown length: sent chunked
			}
			req, _ := http.NewRequest(http.MethodPost, p.front.URL+tc.path, rd)
			req.Header.Set("Content-Type", tc.ctype)
			for k, v := range tc.hdr {
				if k != "chunked" {
					req.Header.Set(k, v)
				}
			}
			resp, err := p.front.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("content type %q", ct)
			}
			msg, typ, param, code := oaiError(t, b)
			if msg == "" || typ != "invalid_request_error" {
				t.Fatalf("message %q type %q", msg, typ)
			}
			if tc.param == "" && param != nil || tc.param != "" && (param == nil || *param != tc.param) {
				t.Fatalf("param %v, want %q: %s", param, tc.param, b)
			}
			if code == nil || *code != tc.code {
				t.Fatalf("code %v, want %q: %s", code, tc.code, b)
			}
			if resp.Header.Get(HeaderRequestID) == "" {
				t.Fatal("no request id on an error answer")
			}
		})
	}
	if n := u.count(); n != 0 {
		t.Fatalf("bad input reached the upstream %d times", n)
	}
	// Other requests are unaffected.
	resp, b := p.post(t, "/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "served by a") {
		t.Fatalf("a good request after bad ones: %d %s", resp.StatusCode, b)
	}
	if got := p.metric(t, "kvexact_proxy_requests_total", map[string]string{"status": "404"}); got != 2 {
		t.Fatalf("404s counted %v", got)
	}
	p.allReleased(t)
}

func TestMethodNotAllowed(t *testing.T) {
	p, u := singlePool(t, completion, nil)
	resp, err := p.front.Client().Get(p.front.URL + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	oaiError(t, b)
	if u.count() != 0 {
		t.Fatal("reached the upstream")
	}
}

func TestForwardReceiptsAndHeaders(t *testing.T) {
	h := func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Connection", "X-Up-Hop")
		w.Header().Set("X-Up-Hop", "1")
		w.Header().Set("X-Up-End", "2")
		completion(u, w, r, body)
	}
	a, b := newUpstream(t, "a", h), newUpstream(t, "b", h)
	p := newPool(t, "vllm", 0, []epSpec{{name: "a", addr: a.srv.URL}, {name: "b", addr: b.srv.URL}}, nil, nil, func(c *Config) { c.DebugHeader = true })
	body := `{"model":"m","prompt":"hello","temperature":0.5,"max_tokens":7,"vendor_field":{"x":[1,2]}}`
	served := map[string]int{}
	for i, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		reqBody := body
		if i == 1 {
			reqBody = `{"model":"m","messages":[{"role":"user","content":"hello"}],"user":"u1"}`
		}
		hdr := map[string]string{"Connection": "X-Client-Hop", "X-Client-Hop": "secret", "X-Client-End": "kept"}
		if i == 0 {
			hdr[HeaderRequestID] = "client-id-1"
		}
		resp, out := p.post(t, path, reqBody, hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, out)
		}
		ep := resp.Header.Get(HeaderEndpoint)
		if !strings.Contains(string(out), "served by "+ep) {
			t.Fatalf("receipt %q does not name the server: %s", ep, out)
		}
		served[ep]++
		u := a
		if ep == "b" {
			u = b
		}
		got := u.requests()[len(u.requests())-1]
		if got.Path != path || string(got.Body) != reqBody {
			t.Fatalf("forwarded %s %s, want %s %s", got.Path, got.Body, path, reqBody)
		}
		id := resp.Header.Get(HeaderRequestID)
		if i == 0 && id != "client-id-1" || i == 1 && !strings.HasPrefix(id, "kvx-") {
			t.Fatalf("request id %q", id)
		}
		if got.Header.Get(HeaderRequestID) != id {
			t.Fatalf("upstream saw request id %q, client %q", got.Header.Get(HeaderRequestID), id)
		}
		if got.Header.Get("X-Client-Hop") != "" || got.Header.Get("X-Client-End") != "kept" {
			t.Fatalf("hop-by-hop handling of request headers: %v", got.Header)
		}
		if resp.Header.Get("X-Up-Hop") != "" || resp.Header.Get("X-Up-End") != "2" {
			t.Fatalf("hop-by-hop handling of response headers: %v", resp.Header)
		}
		if resp.Header.Get(HeaderRule) != "r1" {
			t.Fatalf("rule header %q", resp.Header.Get(HeaderRule))
		}
		var dec struct {
			Target string `json:"target"`
			Tier   string `json:"tier"`
			Miss   string `json:"miss"`
		}
		if err := json.Unmarshal([]byte(resp.Header.Get(HeaderDecision)), &dec); err != nil || dec.Target != ep || dec.Tier != "selector:rr" || dec.Miss != "mode_off" {
			t.Fatalf("decision header %q (%v)", resp.Header.Get(HeaderDecision), err)
		}
	}
	if served["a"] != 1 || served["b"] != 1 {
		t.Fatalf("round robin served %v", served)
	}
	if got := p.metric(t, "kvexact_proxy_requests_total", map[string]string{"rule": "r1", "status": "200", "tier": "selector:rr"}); got != 2 {
		t.Fatalf("requests counted %v", got)
	}
	p.allReleased(t)
}

func TestStreamingFlushesEachChunk(t *testing.T) {
	release := make(chan struct{})
	h := func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"n\":1}\n\n")
		_ = http.NewResponseController(w).Flush()
		select { // the last chunk is sent only once the client has seen the first
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "data: {\"n\":2}\n\ndata: [DONE]\n\n")
	}
	p, _ := singlePool(t, h, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.front.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi","stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get(HeaderEndpoint) != "a" || !isSSE(resp.Header) {
		t.Fatalf("headers %v", resp.Header)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: {\"n\":1}\n" {
		t.Fatalf("first chunk %q %v (the proxy buffered it?)", line, err)
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || !strings.Contains(string(rest), `{"n":2}`) {
		t.Fatalf("rest %q %v", rest, err)
	}
	p.allReleased(t)
	if p.metric(t, "kvexact_proxy_ttfb_seconds", map[string]string{"rule": "r1"}) != 1 {
		t.Fatal("ttfb not observed")
	}
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	before := runtime.NumGoroutine()
	observed := make(chan struct{})
	h := func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"n\":1}\n\n")
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done() // streams forever unless cancelled
		close(observed)
	}
	func() {
		p, u := singlePool(t, h, nil)
		defer u.srv.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.front.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi","stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := p.front.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		cancel()
		resp.Body.Close()
		select {
		case <-observed:
		case <-time.After(10 * time.Second):
			t.Fatal("the upstream never saw the cancellation")
		}
		p.allReleased(t)
		if st := p.ep("a").Health.Breaker.State(); st != health.Closed {
			t.Fatalf("a client cancel moved the breaker to %v", st)
		}
		deadline := time.Now().Add(5 * time.Second)
		for p.metric(t, "kvexact_proxy_requests_total", map[string]string{"status": "200"}) != 1 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if p.metric(t, "kvexact_proxy_inflight_requests", map[string]string{"rule": "r1"}) != 0 {
			t.Fatal("in-flight gauge not back to 0")
		}
		p.front.Client().CloseIdleConnections()
		p.front.Close()
		p.proxy.CloseIdleConnections()
	}()
	noLeak(t, before)
}

func TestMidStreamUpstreamDeath(t *testing.T) {
	die := func(sse bool) handleFunc {
		return func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "100")
			_, _ = io.WriteString(w, `{"id":"x",`)
			_ = http.NewResponseController(w).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close() // the engine process died
			}
		}
	}
	t.Run("sse", func(t *testing.T) {
		dieNow := make(chan struct{})
		h := func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Content-Type", "text/event-stream")
			rc := http.NewResponseController(w)
			_, _ = io.WriteString(w, "data: {\"n\":1}\n\n")
			_ = rc.Flush()
			<-dieNow
			_, _ = io.WriteString(w, "data: {\"n\":2, \"half")
			_ = rc.Flush()
			if conn, _, err := rc.Hijack(); err == nil {
				conn.Close() // the engine process died mid-event
			}
		}
		p, _ := newPoolWith(t, h, func(r *rules.Rule) { r.Breaker.FailureThreshold = 1 })
		req, _ := http.NewRequest(http.MethodPost, p.front.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi","stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := p.front.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		if l, err := br.ReadString('\n'); err != nil || l != "data: {\"n\":1}\n" {
			t.Fatalf("%q %v", l, err)
		}
		close(dieNow)
		// The error event arrives, then the connection is cut: a stream that broke off is never
		// framed as complete (no final chunk).
		b, err := io.ReadAll(br)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("the stream must be cut after the error event (unexpected EOF), got %v", err)
		}
		data := sseData(b)
		if len(data) != 1 {
			t.Fatalf("events after the first: %q", b)
		}
		_, typ, _, code := oaiError(t, []byte(data[0]))
		if typ != "server_error" || code == nil || *code != "upstream_died" {
			t.Fatalf("error event %s", data[0])
		}
		if strings.Contains(string(b), "half") {
			t.Fatal("a half event reached the client")
		}
		if p.ep("a").Health.Breaker.State() != health.Open {
			t.Fatal("the breaker did not hear of the death")
		}
		p.allReleased(t)
	})
	t.Run("json-after-first-bytes", func(t *testing.T) {
		dieNow := make(chan struct{})
		h := func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "100")
			_, _ = io.WriteString(w, `{"id":"x",`)
			_ = http.NewResponseController(w).Flush()
			<-dieNow
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
		}
		p, _ := newPoolWith(t, h, nil)
		// stream:true with a JSON answer: the proxy flushes each chunk, so the client holds the
		// headers and the first bytes before the upstream dies.
		req, _ := http.NewRequest(http.MethodPost, p.front.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi","stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := p.front.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.Header.Get(HeaderEndpoint) != "a" {
			t.Fatalf("%d %v", resp.StatusCode, resp.Header)
		}
		close(dieNow)
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !errors.Is(err, io.ErrUnexpectedEOF) || string(out) != `{"id":"x",` {
			t.Fatalf("a truncated JSON body must not look complete: %q %v", out, err)
		}
		p.allReleased(t)
		if got := p.metric(t, "kvexact_proxy_upstream_errors_total", map[string]string{"kind": "midstream"}); got != 1 {
			t.Fatalf("midstream errors %v", got)
		}
	})
	t.Run("json-immediately", func(t *testing.T) {
		p, _ := newPoolWith(t, die(false), nil)
		req, _ := http.NewRequest(http.MethodPost, p.front.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := p.front.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		// Either the death was seen with the first bytes (a clean 502), or the client got the
		// truncated body with a read error: never a body that looks complete, never a hang.
		switch resp.StatusCode {
		case 502:
			if _, _, _, code := oaiError(t, out); *code != "upstream_died" {
				t.Fatalf("%s", out)
			}
		case 200:
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("a truncated JSON body must not look complete: %q %v", out, err)
			}
		default:
			t.Fatalf("status %d", resp.StatusCode)
		}
		p.allReleased(t)
	})
}

func newPoolWith(t *testing.T, h handleFunc, mod func(*rules.Rule)) (*pool, *upstream) {
	u := newUpstream(t, "a", h)
	return newPool(t, "vllm", 0, []epSpec{{name: "a", addr: u.srv.URL}}, nil, mod, nil), u
}

func TestConnectFailureRetriesSecondBest(t *testing.T) {
	b, c := newUpstream(t, "b", completion), newUpstream(t, "c", completion)
	keys := []uint64{11, 12, 13, 14, 15, 16, 17, 18}
	p := newPool(t, "vllm", 3, []epSpec{{name: "a", addr: closedAddr(t)}, {name: "b", addr: b.srv.URL}, {name: "c", addr: c.srv.URL}},
		fixedKeyer{keys: keys}, func(r *rules.Rule) { r.Breaker.FailureThreshold = 1 }, func(c *Config) { c.DebugHeader = true })
	// a holds the most, b the second most: a is the winner, b the second best; rr would pick a, b, c…
	_ = p.inv.Store(p.ep("a").ID, keys[:7])
	_ = p.inv.Store(p.ep("b").ID, keys[:4])
	_ = p.inv.Store(p.ep("c").ID, keys[:2])
	resp, out := p.post(t, "/v1/completions", `{"model":"m","prompt":"a long shared prefix"}`, nil)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderEndpoint) != "b" || !strings.Contains(string(out), "served by b") {
		t.Fatalf("%d %s %s", resp.StatusCode, resp.Header.Get(HeaderEndpoint), out)
	}
	var dec struct {
		Target string `json:"target"`
		Tier   string `json:"tier"`
	}
	_ = json.Unmarshal([]byte(resp.Header.Get(HeaderDecision)), &dec)
	if dec.Target != "b" || dec.Tier != "kv-exact" {
		t.Fatalf("decision %s", resp.Header.Get(HeaderDecision))
	}
	if c.count() != 0 || b.count() != 1 {
		t.Fatalf("b %d c %d", b.count(), c.count())
	}
	if p.ep("a").Health.Breaker.State() != health.Open {
		t.Fatal("the breaker did not see the connect failure")
	}
	if got := p.metric(t, "kvexact_proxy_failovers_total", map[string]string{"rule": "r1"}); got != 1 {
		t.Fatalf("failovers %v", got)
	}
	if got := p.metric(t, "kvexact_proxy_upstream_errors_total", map[string]string{"kind": "connect"}); got != 1 {
		t.Fatalf("connect errors %v", got)
	}
	p.allReleased(t)
	// Next request: a's breaker is open, so a is excluded up front and b serves without a retry.
	resp, _ = p.post(t, "/v1/completions", `{"model":"m","prompt":"again"}`, nil)
	if resp.Header.Get(HeaderEndpoint) != "b" {
		t.Fatalf("served by %s", resp.Header.Get(HeaderEndpoint))
	}
}

func TestAllEndpointsUnreachable(t *testing.T) {
	p := newPool(t, "vllm", 0, []epSpec{{name: "a", addr: closedAddr(t)}, {name: "b", addr: closedAddr(t)}}, nil, nil, nil)
	resp, b := p.post(t, "/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
	if resp.StatusCode != 503 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if _, _, _, code := oaiError(t, b); *code != "no_healthy_endpoint" {
		t.Fatalf("%s", b)
	}
	if got := p.metric(t, "kvexact_proxy_upstream_errors_total", map[string]string{"kind": "connect"}); got != 2 {
		t.Fatalf("connect errors %v", got)
	}
	p.allReleased(t)
}

func TestOrigin5xxRelayedNotRetried(t *testing.T) {
	h := func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(500)
		_, _ = io.WriteString(w, `{"error":{"message":"engine `+u.name+` broke","type":"server_error","param":null,"code":null}}`)
	}
	a, b := newUpstream(t, "a", h), newUpstream(t, "b", h)
	p := newPool(t, "vllm", 0, []epSpec{{name: "a", addr: a.srv.URL}, {name: "b", addr: b.srv.URL}}, nil,
		func(r *rules.Rule) { one := 1; r.Breaker.OriginErrorThreshold = &one }, nil)
	resp, out := p.post(t, "/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
	if resp.StatusCode != 500 || !strings.Contains(string(out), "engine "+resp.Header.Get(HeaderEndpoint)+" broke") {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	if a.count()+b.count() != 1 {
		t.Fatalf("retried: a %d b %d", a.count(), b.count())
	}
	if p.ep(resp.Header.Get(HeaderEndpoint)).Health.Breaker.State() != health.Open {
		t.Fatal("the origin 5xx did not feed the breaker")
	}
	p.allReleased(t)
}

func TestClient4xxNeutral(t *testing.T) {
	h := func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(400)
		_, _ = io.WriteString(w, `{"error":{"message":"max_tokens too large","type":"invalid_request_error","param":"max_tokens","code":null}}`)
	}
	p, _ := newPoolWith(t, h, func(r *rules.Rule) { r.Breaker.FailureThreshold = 1; one := 1; r.Breaker.OriginErrorThreshold = &one })
	for range 3 {
		resp, out := p.post(t, "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":99999999}`, nil)
		if resp.StatusCode != 400 || !strings.Contains(string(out), "max_tokens too large") {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
	}
	if p.ep("a").Health.Breaker.State() != health.Closed {
		t.Fatal("a 4xx moved the breaker")
	}
}

func TestModels(t *testing.T) {
	list := func(ids ...string) handleFunc {
		return func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
			var data []string
			for _, id := range ids {
				data = append(data, `{"id":"`+id+`","object":"model","owned_by":"`+u.name+`","max_model_len":4096}`)
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[`+strings.Join(data, ",")+`]}`)
		}
	}
	a, b := newUpstream(t, "a", list("m1", "m2")), newUpstream(t, "b", list("m2", "m3"))
	wild := newPool(t, "vllm", 0, []epSpec{{name: "a", addr: a.srv.URL}, {name: "b", addr: b.srv.URL}, {name: "dead", addr: closedAddr(t)}}, nil,
		func(r *rules.Rule) { r.Models = nil }, nil)
	get := func(p *pool, path string) (int, []byte) {
		resp, err := p.front.Client().Get(p.front.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
	st, out := get(wild, "/v1/models")
	var v struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			OwnedBy string `json:"owned_by"`
			MaxLen  int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(out, &v); st != 200 || err != nil || v.Object != "list" || len(v.Data) != 3 {
		t.Fatalf("%d %s", st, out)
	}
	if v.Data[0].ID != "m1" || v.Data[1].ID != "m2" || v.Data[1].OwnedBy != "a" || v.Data[2].ID != "m3" || v.Data[2].MaxLen != 4096 {
		t.Fatalf("union %s", out)
	}
	if st, out = get(wild, "/v1/models/m3"); st != 200 || !strings.Contains(string(out), `"id":"m3"`) {
		t.Fatalf("%d %s", st, out)
	}
	st, out = get(wild, "/v1/models/zz")
	if _, _, _, code := oaiError(t, out); st != 404 || *code != "model_not_found" {
		t.Fatalf("%d %s", st, out)
	}
	// A rule with configured models lists them without asking the endpoints.
	configured := newPool(t, "vllm", 0, []epSpec{{name: "a", addr: a.srv.URL}}, nil, func(r *rules.Rule) { r.Models = []string{"x", "y"} }, nil)
	n := a.count()
	st, out = get(configured, "/v1/models")
	if st != 200 || !strings.Contains(string(out), `"id":"x"`) || !strings.Contains(string(out), `"id":"y"`) || a.count() != n {
		t.Fatalf("%d %s", st, out)
	}
}

func TestPassThroughPaths(t *testing.T) {
	a := newUpstream(t, "a", func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"path":"`+r.URL.Path+`","from":"a"}`)
	})
	p := newPool(t, "vllm", 0, []epSpec{{name: "a", addr: a.srv.URL}}, nil, func(r *rules.Rule) { r.Passthrough = []string{"/tokenize"} }, nil)
	resp, out := p.post(t, "/v1/embeddings?x=1", `{"model":"m","input":"hi"}`, nil)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderEndpoint) != "a" || !strings.Contains(string(out), `"/v1/embeddings"`) {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	if got := a.requests()[0]; got.Path != "/v1/embeddings?x=1" || string(got.Body) != `{"model":"m","input":"hi"}` {
		t.Fatalf("forwarded %+v", got)
	}
	resp, out = p.post(t, "/v1/embeddings", `{"model":"other","input":"hi"}`, nil)
	if resp.StatusCode != 404 {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	// A listed passthrough path, with no model anywhere and no wildcard rule: the client must say
	// which model.
	resp, out = p.post(t, "/tokenize", `{"prompt":"hi"}`, nil)
	if _, _, _, code := oaiError(t, out); resp.StatusCode != 400 || *code != "missing_model" {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	// X-Model routes a body without one.
	resp, out = p.post(t, "/tokenize", `{"prompt":"hi"}`, map[string]string{"X-Model": "m"})
	if resp.StatusCode != 200 || !strings.Contains(string(out), `"/tokenize"`) {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	p.allReleased(t)
}

// TestPassthroughRefused: only the API surface and a rule's passthrough paths reach an engine;
// engine admin routes and every other path are 404 unknown_url without a byte sent upstream, even
// disguised as a listed path.
func TestPassthroughRefused(t *testing.T) {
	a := newUpstream(t, "a", completion)
	p := newPool(t, "vllm", 0, []epSpec{{name: "a", addr: a.srv.URL}}, nil, func(r *rules.Rule) { r.Passthrough = []string{"/v1/responses/*", "/tokenize"} }, nil)
	for _, path := range []string{"/sim/clear", "/reset_prefix_cache", "/sleep?level=1", "/collective_rpc", "/flush_cache", "/kv_cache_events",
		"/v1/responses/../../reset_prefix_cache", "/v1/responses/x/..%2F..%2Freset_prefix_cache", "/v1/responses/%2E%2E/%2E%2E/sleep", "//reset_prefix_cache",
		"/tokenize/", "/v1/responses", "/v1/responsesx", "/"} {
		resp, out := p.post(t, path, `{"model":"m"}`, nil)
		if path == "/v1/responses" { // in the API surface
			if resp.StatusCode != 200 {
				t.Fatalf("%s: %d %s", path, resp.StatusCode, out)
			}
			continue
		}
		if _, _, _, code := oaiError(t, out); resp.StatusCode != 404 || code == nil || *code != "unknown_url" {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, out)
		}
	}
	for _, r := range a.requests() {
		if r.Path != "/v1/responses" {
			t.Fatalf("the upstream saw %s", r.Path)
		}
	}
	if resp, out := p.post(t, "/v1/responses/abc/cancel", `{"model":"m"}`, nil); resp.StatusCode != 200 {
		t.Fatalf("a listed wildcard path: %d %s", resp.StatusCode, out)
	}
	// Listing an admin route is refused by the rule's validation.
	for _, pt := range []string{"/reset_prefix_cache", "/sim/*", "/sim/clear", "/v1/load_lora_adapter", "/tokenize?x", "/a/../sleep", "/a\r\nb"} {
		r := rules.Rule{Name: "x", Engine: rules.EngineRef{Family: "vllm", Release: "v0.25.1"}, Passthrough: []string{pt},
			Endpoints: []rules.Endpoint{{Address: "http://127.0.0.1:1"}}}
		if err := r.Normalize(); err == nil || !strings.Contains(err.Error(), "passthrough[0]") {
			t.Fatalf("passthrough %q accepted: %v", pt, err)
		}
	}
}

// TestAPISurfacePerFamily: the forwarded OpenAI paths are those the rule's engine family serves
// (its contract's api list): trtllm-serve mounts no /v1/embeddings, so a TensorRT-LLM rule answers
// it with OpenAI's 404 without a byte sent upstream, while a vLLM rule forwards it and its audio
// routes; a passthrough entry adds a path the family does not list.
func TestAPISurfacePerFamily(t *testing.T) {
	for _, tc := range []struct {
		family      string
		passthrough []string
		path        string
		forwarded   bool
	}{
		{"vllm", nil, "/v1/embeddings", true},
		{"vllm", nil, "/v1/audio/translations", true},
		{"trtllm", nil, "/v1/responses", true},
		{"trtllm", nil, "/v1/embeddings", false},
		{"trtllm", nil, "/v1/kv_cache_hints", false},
		{"sglang", nil, "/v1/audio/transcriptions", false},
		{"sglang", []string{"/v1/rerank"}, "/v1/rerank", true},
	} {
		a := newUpstream(t, "a", completion)
		p := newPool(t, tc.family, 0, []epSpec{{name: "a", addr: a.srv.URL}}, nil, func(r *rules.Rule) { r.Passthrough = tc.passthrough }, nil)
		resp, out := p.post(t, tc.path, `{"model":"m"}`, nil)
		if tc.forwarded {
			if resp.StatusCode != 200 || a.count() != 1 || a.requests()[0].Path != tc.path {
				t.Errorf("%s %s: %d %s, upstream saw %d", tc.family, tc.path, resp.StatusCode, out, a.count())
			}
			continue
		}
		msg, typ, _, code := oaiError(t, out)
		if resp.StatusCode != 404 || code == nil || *code != "unknown_url" || typ != "invalid_request_error" || !strings.Contains(msg, tc.path) || a.count() != 0 {
			t.Errorf("%s %s: %d %s, upstream saw %d", tc.family, tc.path, resp.StatusCode, out, a.count())
		}
		p.allReleased(t)
	}
}

// unmarshalString's fast path must agree with json.Unmarshal on every string value.
func TestUnmarshalStringMatchesJSON(t *testing.T) {
	for _, in := range []string{`""`, `"llama3"`, `"a\"b"`, `"tab\tx"`, `"\u00e9t\u00e9"`, `"été"`, "\"bad\xff\"", `"x\\y"`, `12`, `null`, `["a"]`} {
		var want, got string
		werr := json.Unmarshal([]byte(in), &want)
		gerr := unmarshalString([]byte(in), &got)
		if (werr == nil) != (gerr == nil) || got != want {
			t.Errorf("%s: got %q, %v; json.Unmarshal %q, %v", in, got, gerr, want, werr)
		}
	}
}

// The upstream URL keeps the endpoint's scheme, host and path prefix and the client's escaped path
// and query, exactly.
func TestUpstreamRequestURL(t *testing.T) {
	for _, tc := range []struct{ addr, target, want string }{
		{"http://127.0.0.1:8000", "/v1/completions?a=1", "http://127.0.0.1:8000/v1/completions?a=1"},
		{"http://127.0.0.1:8000/", "/v1/x%2Fy?q=%20", "http://127.0.0.1:8000/v1/x%2Fy?q=%20"},
		{"http://h:1/engine/a", "/v1/models", "http://h:1/engine/a/v1/models"},
		{"http://h:1/en%2Fgine/", "/v1/a%2Fb", "http://h:1/en%2Fgine/v1/a%2Fb"},
	} {
		r := httptest.NewRequest(http.MethodPost, tc.target, nil)
		c := &call{r: r}
		out, err := c.upstreamRequest(context.Background(), &route.Endpoint{Name: "e", Address: tc.addr}, []byte("{}"), new(outbound))
		if err != nil {
			t.Fatalf("%s + %s: %v", tc.addr, tc.target, err)
		}
		if got := out.URL.String(); got != tc.want || out.Host != out.URL.Host || out.ContentLength != 2 {
			t.Errorf("%s + %s = %s (host %s, length %d), want %s", tc.addr, tc.target, got, out.Host, out.ContentLength, tc.want)
		}
	}
	if _, err := (&call{r: httptest.NewRequest("GET", "/", nil)}).upstreamRequest(context.Background(), &route.Endpoint{Address: "127.0.0.1:80"}, nil, new(outbound)); err == nil {
		t.Fatal("an address without a scheme was accepted")
	}
}
