package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/rules"
)

// Wire-level tests: raw sockets on 127.0.0.1 against the client listener's server
// (gateway.NewHTTPServer) with the proxy behind it, for every malformed-request probe docs/proxy.md lists.

// rawConn is a client connection that writes raw bytes and reads what comes back.
type rawConn struct {
	t *testing.T
	c *net.TCPConn
	r *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// A bound on the whole test's wait only: every wait below ends on the server's action (an
	// answer or a close) long before it.
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawConn{t: t, c: c.(*net.TCPConn), r: bufio.NewReader(c)}
}

func (rc *rawConn) send(s string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatalf("write: %v", err)
	}
}

// response reads one response and its whole body (err: how the body ended).
func (rc *rawConn) response() (*http.Response, []byte, error) {
	rc.t.Helper()
	resp, err := http.ReadResponse(rc.r, nil)
	if err != nil {
		return nil, nil, err
	}
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// closed waits for the server to close the connection and returns what it sent before.
func (rc *rawConn) closed() []byte {
	rc.t.Helper()
	b, err := io.ReadAll(rc.r)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		rc.t.Fatalf("the server never closed the connection (sent %q)", b)
	}
	return b
}

const completionBody = `{"model":"m","prompt":"hi"}`

func post(path, body string, extra ...string) string {
	return "POST " + path + " HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n" + strings.Join(extra, "") +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

func TestWireHeaderFieldCountAnswered431(t *testing.T) {
	p, u := newPoolWith(t, completion, nil)
	rc := dialRaw(t, p.front.Addr)
	var extra strings.Builder
	for i := range 150 {
		fmt.Fprintf(&extra, "X-F%d: 1\r\n", i)
	}
	rc.send(post("/v1/completions", completionBody, extra.String()))
	resp, b, err := rc.response()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status %d, want 431: %s", resp.StatusCode, b)
	}
	if _, _, _, code := oaiError(t, b); code == nil || *code != "request_header_fields_too_large" {
		t.Fatalf("error body %s", b)
	}
	if u.count() != 0 {
		t.Fatal("a request over the field limit reached the upstream")
	}
	if got := p.metric(t, "kvexact_proxy_client_errors_total", map[string]string{"kind": "header_fields"}); got != 1 {
		t.Fatalf("header_fields errors = %v", got)
	}
	rc.closed()

	// At the limit it is served.
	rc = dialRaw(t, p.front.Addr)
	extra.Reset()
	for i := range 90 {
		fmt.Fprintf(&extra, "X-F%d: 1\r\n", i)
	}
	rc.send(post("/v1/completions", completionBody, extra.String()))
	if resp, b, err := rc.response(); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v %s", resp, err, b)
	}
}

func TestWireHeaderBytesLimit(t *testing.T) {
	p, u := newPoolWith(t, completion, nil)
	rc := dialRaw(t, p.front.Addr)
	rc.send(post("/v1/completions", completionBody, "X-Big: "+strings.Repeat("a", 100<<10)+"\r\n"))
	resp, _, err := rc.response()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status %d, want 431", resp.StatusCode)
	}
	if u.count() != 0 {
		t.Fatal("an oversized header block reached the upstream")
	}
}

// TestWireHeaderDeadline: every way of holding a connection without completing a request head is
// closed by the server: blank lines only, a partial head, an idle keep-alive connection, and a
// keep-alive connection whose previous request had a body.
func TestWireHeaderDeadline(t *testing.T) {
	p, _ := newPoolWith(t, completion, nil)
	front := newFrontServerWith(t, p.proxy.Handler("test"), rules.Server{
		ReadHeaderTimeout: rules.Duration(300 * time.Millisecond), IdleTimeout: rules.Duration(300 * time.Millisecond)})
	cases := map[string]func(rc *rawConn){
		"blank lines":  func(rc *rawConn) { rc.send("\r\n\r\n\r\n") },
		"partial head": func(rc *rawConn) { rc.send("POST /v1/completions HTTP/1.1\r\nHost: gw\r\n") },
		"nothing":      func(rc *rawConn) {},
		"idle keep-alive": func(rc *rawConn) {
			rc.send(post("/v1/completions", completionBody))
			if resp, _, err := rc.response(); err != nil || resp.StatusCode != 200 {
				t.Fatalf("first request: %v %v", resp, err)
			}
		},
		"keep-alive after a body, partial head": func(rc *rawConn) {
			rc.send(post("/v1/completions", completionBody))
			if resp, _, err := rc.response(); err != nil || resp.StatusCode != 200 {
				t.Fatalf("first request: %v %v", resp, err)
			}
			rc.send("POST /v1/completions HTTP/1.1\r\n")
		},
	}
	for name, setup := range cases {
		t.Run(name, func(t *testing.T) {
			rc := dialRaw(t, front.Addr)
			setup(rc)
			rc.closed()
		})
	}
}

func TestWireBodyDeadline(t *testing.T) {
	p, u := newPoolWith(t, completion, nil)
	p.proxy.cfg.BodyTimeout = 300 * time.Millisecond
	rc := dialRaw(t, p.front.Addr)
	rc.send("POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	resp, b, err := rc.response()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestTimeout || !resp.Close {
		t.Fatalf("status %d close=%v, want 408 and a closed connection: %s", resp.StatusCode, resp.Close, b)
	}
	rc.closed()
	if u.count() != 0 {
		t.Fatal("a body that never arrived reached the upstream")
	}
	if got := p.metric(t, "kvexact_proxy_client_errors_total", map[string]string{"kind": "body_timeout"}); got != 1 {
		t.Fatalf("body_timeout errors = %v", got)
	}
	// A body that arrives in time, slowly, is served: the deadline is for the whole body, and it
	// is cleared once the body is in (the response is not cut by it).
	p.proxy.cfg.BodyTimeout = 5 * time.Second
	rc = dialRaw(t, p.front.Addr)
	rc.send("POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(completionBody)) + "\r\n\r\n")
	for _, ch := range completionBody {
		rc.send(string(ch))
		time.Sleep(5 * time.Millisecond)
	}
	if resp, b, err := rc.response(); err != nil || resp.StatusCode != 200 {
		t.Fatalf("slow body: %v %v %s", resp, err, b)
	}
}

// firstReadCounter counts requests whose handler started reading the body.
type firstReadCounter struct {
	h http.Handler
	n atomic.Int64
}

type countingBody struct {
	io.ReadCloser
	once *sync.Once
	n    *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	b.once.Do(func() { b.n.Add(1) })
	return b.ReadCloser.Read(p)
}

func (f *firstReadCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.Body = countingBody{r.Body, new(sync.Once), &f.n}
	f.h.ServeHTTP(w, r)
}

// TestWireDeclaredLengthNotPreallocated: 200 connections each declaring a 1 MiB body and sending
// one byte cost the gateway a few MiB of heap, not the 200 MiB they declared (h1 allocated the
// declared length up front).
func TestWireDeclaredLengthNotPreallocated(t *testing.T) {
	const conns, declared = 200, 1 << 20
	p, u := newPoolWith(t, completion, nil)
	counter := &firstReadCounter{h: p.proxy.Handler("test")}
	front := newFrontServerWith(t, counter, rules.Server{})
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var cs []*rawConn
	for range conns {
		rc := dialRaw(t, front.Addr)
		rc.send("POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(declared) + "\r\n\r\n{")
		cs = append(cs, rc)
	}
	for counter.n.Load() < conns {
		time.Sleep(5 * time.Millisecond)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew %.1f MiB for %d connections declaring %d MiB each", float64(grown)/(1<<20), conns, declared>>20)
	if grown > 40<<20 {
		t.Fatalf("heap grew %d MiB: bodies are allocated from the declared length, not as they arrive", grown>>20)
	}
	for _, rc := range cs {
		rc.c.Close()
	}
	if u.count() != 0 {
		t.Fatal("an incomplete body reached the upstream")
	}
}

// TestWireSmuggling: ambiguous framing is refused (400/501) or, where net/http lets
// Transfer-Encoding win over a Content-Length (RFC 9112 §6.3), the connection is closed after the
// one response, so bytes after the body are never read as a second request.
func TestWireSmuggling(t *testing.T) {
	p, u := newPoolWith(t, completion, nil)
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: gw\r\n\r\n"
	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(completionBody), completionBody)
	head := "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
	cases := []struct {
		name, req string
		refused   bool // must be answered 4xx/5xx by the server, never reach the upstream
	}{
		{"CL.TE", head + "Content-Length: " + strconv.Itoa(len(chunked)+len(smuggled)) + "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked + smuggled, false},
		{"TE.CL", head + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" + chunked + smuggled, false},
		{"duplicate CL", head + "Content-Length: " + strconv.Itoa(len(completionBody)) + "\r\nContent-Length: 0\r\n\r\n" + completionBody + smuggled, true},
		{"obs-fold TE", head + "Transfer-Encoding:\r\n chunked\r\n\r\n" + chunked + smuggled, false},
		{"TE not chunked", head + "Transfer-Encoding: xchunked\r\n\r\n" + chunked + smuggled, true},
		{"TE chunked twice", head + "Transfer-Encoding: chunked, chunked\r\n\r\n" + chunked + smuggled, true},
		{"bad chunk size", head + "Transfer-Encoding: chunked\r\n\r\nzz\r\n" + completionBody + "\r\n0\r\n\r\n" + smuggled, true},
		{"chunk size overflow", head + "Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n" + completionBody + "\r\n0\r\n\r\n" + smuggled, true},
		{"space before colon", head + "Content-Length : 5\r\n\r\n" + completionBody + smuggled, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := u.count()
			rc := dialRaw(t, p.front.Addr)
			rc.send(tc.req)
			resp, b, err := rc.response()
			if err != nil {
				t.Fatalf("no response: %v", err)
			}
			if tc.refused && resp.StatusCode < 400 {
				t.Fatalf("status %d, want a refusal: %s", resp.StatusCode, b)
			}
			if tc.refused && u.count() != before {
				t.Fatal("a refused request reached the upstream")
			}
			rest := rc.closed()
			if bytes.Contains(rest, []byte("HTTP/1.1")) {
				t.Fatalf("a second response on the connection: the smuggled request was served: %q", rest)
			}
			for _, r := range u.requests() {
				if r.Path == "/smuggled" || bytes.Contains(r.Body, []byte("smuggled")) {
					t.Fatalf("the upstream saw the smuggled request: %+v", r)
				}
			}
		})
	}
}

// TestWireObsFold: a folded field line is unfolded to one value with a space (RFC 9112 §5.2), the
// same value the upstream then sees: no two readings of the field.
func TestWireObsFold(t *testing.T) {
	p, u := newPoolWith(t, completion, nil)
	rc := dialRaw(t, p.front.Addr)
	rc.send(post("/v1/completions", completionBody, "X-Folded: a\r\n b\r\n"))
	if resp, b, err := rc.response(); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v %s", resp, err, b)
	}
	if got := u.requests()[0].Header.Values("X-Folded"); len(got) != 1 || got[0] != "a b" {
		t.Fatalf("the upstream saw X-Folded %q", got)
	}
}

// TestWireHalfClose: a client that half-closes after its request gets a closed connection, never
// a 200 with an empty body nor a stream framed as complete; the outcome is counted.
func TestWireHalfClose(t *testing.T) {
	t.Run("before the response", func(t *testing.T) {
		release := make(chan struct{})
		p, _ := newPoolWith(t, func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			completion(u, w, r, body)
		}, nil)
		defer close(release)
		rc := dialRaw(t, p.front.Addr)
		rc.send(post("/v1/completions", completionBody))
		_ = rc.c.CloseWrite()
		if got := rc.closed(); len(got) != 0 {
			resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(got)), nil)
			if err != nil {
				t.Fatalf("a partial response: %q", got)
			}
			b, err := io.ReadAll(resp.Body)
			if err != nil || !strings.Contains(string(b), "served by a") {
				t.Fatalf("an incomplete response framed as complete: %q (%v)", got, err)
			}
		}
		eventually(t, func() bool {
			return p.metric(t, "kvexact_proxy_client_errors_total", map[string]string{"kind": "gone_early"}) == 1
		})
	})
	t.Run("mid-stream", func(t *testing.T) {
		next := make(chan struct{})
		p, _ := newPoolWith(t, func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Content-Type", "text/event-stream")
			rc := http.NewResponseController(w)
			_, _ = io.WriteString(w, "data: {\"n\":1}\n\n")
			_ = rc.Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
		}, nil)
		defer close(next)
		rc := dialRaw(t, p.front.Addr)
		rc.send(post("/v1/completions", `{"model":"m","prompt":"hi","stream":true}`))
		resp, err := http.ReadResponse(rc.r, nil)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		if l, err := br.ReadString('\n'); err != nil || l != "data: {\"n\":1}\n" {
			t.Fatalf("%q %v", l, err)
		}
		_ = rc.c.CloseWrite()
		b, err := io.ReadAll(br)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("the stream ended as if complete (%v) after %q", err, b)
		}
		eventually(t, func() bool {
			return p.metric(t, "kvexact_proxy_client_errors_total", map[string]string{"kind": "gone_midstream"}) == 1
		})
	})
}

// TestWireUnsolicitedUpstreamResponse: an upstream that writes an extra response on an idle
// keep-alive connection never gets it handed to the next client (net/http's transport drops the
// connection), and each one is counted and logged (net/http only tells the standard logger).
func TestWireUnsolicitedUpstreamResponse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var served atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					body := fmt.Sprintf(`{"served":%d}`, served.Add(1))
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
					time.Sleep(20 * time.Millisecond)
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 6\r\n\r\n\"evil\"")
				}
			}()
		}
	}()
	var logged syncBuffer
	p := newPool(t, "vllm", 0, []epSpec{{name: "a", addr: "http://" + l.Addr().String()}}, nil, nil,
		func(c *Config) { c.Log = slog.New(slog.NewTextHandler(&logged, nil)) })
	const metric = "kvexact_proxy_upstream_unsolicited_responses_total"
	before := p.metric(t, metric, nil)
	for i := range 3 {
		resp, b := p.post(t, "/v1/completions", completionBody, nil)
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"served"`) {
			t.Fatalf("request %d got %d %s: the unsolicited response reached a client", i, resp.StatusCode, b)
		}
		time.Sleep(100 * time.Millisecond) // the extra response is on the idle connection now
	}
	// The count is process-wide (the standard logger is): at least one of the three, at most three
	// more than before (a fourth would be another test's upstream).
	eventually(t, func() bool { return p.metric(t, metric, nil) >= before+1 })
	if got := p.metric(t, metric, nil); got > before+3 {
		t.Fatalf("%s rose by %v for three unsolicited responses", metric, got-before)
	}
	eventually(t, func() bool {
		return strings.Contains(logged.String(), "unsolicited upstream response") && strings.Contains(logged.String(), `"evil`)
	})
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rawUpstream serves each connection with answer (after reading one request head and body).
func rawUpstream(t *testing.T, answer func(c net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				answer(c)
			}()
		}
	}()
	return "http://" + l.Addr().String()
}

// TestWireUpstreamMisbehaviour: each way an upstream can break its side ends in a defined outcome
// for the client (an OpenAI-shaped 5xx while nothing was sent, a cut connection after), with the
// failure counted.
func TestWireUpstreamMisbehaviour(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(c net.Conn)
		status int    // the client's status (0: the connection is cut after the headers)
		kind   string // kvexact_proxy_upstream_errors_total kind
	}{
		{"reset before the headers", func(c net.Conn) { c.(*net.TCPConn).SetLinger(0) }, 503, "connect"},
		{"garbage status line", func(c net.Conn) { io.WriteString(c, "HTTP/1.1 abc nonsense\r\n\r\n") }, 503, "connect"},
		{"headers then nothing", func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n")
		}, 502, "midstream"},
		{"truncated body", func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{\"id\":")
		}, 0, "midstream"},
		{"bad chunk", func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n10\r\ndata: {\"n\":1}\n\n\r\nzz\r\n")
		}, 0, "midstream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := rawUpstream(t, tc.answer)
			p := newPool(t, "vllm", 0, []epSpec{{name: "a", addr: addr}}, nil, nil, nil)
			rc := dialRaw(t, p.front.Addr)
			rc.send(post("/v1/completions", `{"model":"m","prompt":"hi","stream":true}`))
			resp, b, err := rc.response()
			switch {
			case tc.status != 0:
				if err != nil || resp.StatusCode != tc.status {
					t.Fatalf("got %v %v %s, want %d", resp, err, b, tc.status)
				}
				oaiError(t, b)
			default:
				if err == nil || resp == nil {
					t.Fatalf("the response was framed as complete: %v %s", resp, b)
				}
			}
			if got := p.metric(t, "kvexact_proxy_upstream_errors_total", map[string]string{"kind": tc.kind}); got < 1 {
				t.Fatalf("upstream errors of kind %s: %v", tc.kind, got)
			}
			p.allReleased(t)
		})
	}
}

// TestWireTinyHeaderFloodCost: a request of 1 MiB of tiny header lines is refused at the header
// limit (431) and costs the gateway little memory (h1 parsed and forwarded all of it, ≈ 42 MB per
// request). Allocation is measured over ten such requests, each read to its refusal.
func TestWireTinyHeaderFloodCost(t *testing.T) {
	p, u := newPoolWith(t, completion, nil)
	var fb strings.Builder
	for i := 0; fb.Len() < 1<<20; i++ {
		fmt.Fprintf(&fb, "x%d: 1\r\n", i)
	}
	flood := fb.String()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		rc := dialRaw(t, p.front.Addr)
		// The server may answer and close before the whole flood is written: a write error is fine.
		go func() { _, _ = io.WriteString(rc.c, "POST /v1/completions HTTP/1.1\r\nHost: gw\r\n"+flood+"\r\n") }()
		resp, _, err := rc.response()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("status %d, want 431", resp.StatusCode)
		}
		rc.c.Close()
	}
	runtime.ReadMemStats(&after)
	per := float64(after.TotalAlloc-before.TotalAlloc) / 10
	t.Logf("%.2f MiB allocated per 1 MiB header flood (the whole test process)", per/(1<<20))
	if per > 8<<20 {
		t.Fatalf("%.1f MiB allocated per request: the header block is not bounded", per/(1<<20))
	}
	if u.count() != 0 {
		t.Fatal("a flood reached the upstream")
	}
}
