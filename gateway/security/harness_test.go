package security

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/promtest"
)

const (
	model = "llama3"
	token = "admin-token"
)

// engine is the scripted upstream: a real HTTP server on 127.0.0.1 whose handler each case sets.
// It counts the requests that reach it and keeps the last request-target.
type engine struct {
	srv     *httptest.Server
	handler atomic.Pointer[http.HandlerFunc]
	hits    atomic.Int64
	target  atomic.Pointer[string]
}

func (e *engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.hits.Add(1)
	uri := r.RequestURI
	e.target.Store(&uri)
	if h := e.handler.Load(); h != nil {
		(*h)(w, r)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
}

func (e *engine) set(h http.HandlerFunc) { e.handler.Store(&h) }

// gw is one running gateway in front of one engine.
type gw struct {
	t      *testing.T
	client string // host:port of the client listener
	admin  string
	engine *engine
	reg    *prometheus.Registry
}

// start runs a gateway with one rule (vLLM's contract, routing off) whose only endpoint is a fresh
// scripted engine; mod edits the configuration before it is normalized.
func start(t *testing.T, mod func(*rules.Config)) *gw {
	t.Helper()
	e := &engine{}
	e.srv = httptest.NewServer(e)
	t.Cleanup(e.srv.Close)
	cfg := &rules.Config{
		Listen: "127.0.0.1:0",
		Admin:  rules.Admin{Listen: "127.0.0.1:0", Token: token},
		Rules: []rules.Rule{{Name: "pool", Models: []string{model}, Engine: rules.EngineRef{Family: "vllm", Release: "v0.25.1"},
			Endpoints: []rules.Endpoint{{Name: "e0", Address: e.srv.URL}}}},
	}
	if mod != nil {
		mod(cfg)
	}
	if err := cfg.Normalize(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	g, err := assemble.New(assemble.Config{Options: gateway.Options{Config: cfg, Registry: reg, ProbeInterval: -1, ReprobeInterval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := g.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		g.Shutdown(sctx)
		cancel()
	})
	return &gw{t: t, client: g.Servers.Client["127.0.0.1:0"], admin: g.Servers.Admin, engine: e, reg: reg}
}

// dial opens a raw connection with the test's own bound on every read and write (far past the
// gateway's deadlines: hitting it means the gateway held the connection).
func dial(t *testing.T, addr string, bound time.Duration) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(bound))
	return c
}

// exchange sends raw bytes and reads until the gateway closes the connection; held reports that
// the test's bound passed first.
func exchange(t *testing.T, addr, raw string, bound time.Duration) (out string, held bool) {
	t.Helper()
	c := dial(t, addr, bound)
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatalf("write: %v", err)
	}
	b, err := io.ReadAll(c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return string(b), true
	}
	return string(b), false
}

// status is the status code of the first response in raw ("" when there is none).
func status(raw string) string {
	line, _, _ := strings.Cut(raw, "\r\n")
	if f := strings.Fields(line); len(f) >= 2 && strings.HasPrefix(f[0], "HTTP/") {
		return f[1]
	}
	return ""
}

// responses counts the HTTP responses in raw (a smuggled second request would add one).
func responses(raw string) int {
	n := 0
	r := bufio.NewReader(strings.NewReader(raw))
	for {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			return n
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		n++
	}
}

func completionBody(extra string) string {
	return fmt.Sprintf(`{"model":%q,"prompt":"hello"%s}`, model, extra)
}

func post(path, body string, headers ...string) string {
	h := strings.Join(headers, "")
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s", path, h, len(body), body)
}

// long skips a many-connection case unless the long suite runs (make security).
func long(t *testing.T) {
	t.Helper()
	if os.Getenv("KVEXACT_SECURITY") != "long" {
		t.Skip("a many-connection case: run with KVEXACT_SECURITY=long (make security)")
	}
}

// metric sums the series of one counter of the gateway's registry that carry labels.
func (g *gw) metric(name string, labels map[string]string) float64 {
	return promtest.Sum(g.t, g.reg, name, labels)
}
