package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"github.com/kvexact/kvexact/internal/promtest"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/resolver"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
)

// recorded is one request an upstream received.
type recorded struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
}

// upstream is a small OpenAI-ish server on 127.0.0.1 that records what it received.
type upstream struct {
	name string
	srv  *httptest.Server

	mu   sync.Mutex
	reqs []recorded
}

type handleFunc func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte)

func newUpstream(t testing.TB, name string, h handleFunc) *upstream {
	t.Helper()
	u := &upstream{name: name}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.reqs = append(u.reqs, recorded{Method: r.Method, Path: r.URL.RequestURI(), Header: r.Header.Clone(), Body: body})
		u.mu.Unlock()
		h(u, w, r, body)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) requests() []recorded {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]recorded(nil), u.reqs...)
}

func (u *upstream) count() int { return len(u.requests()) }

// completion answers a JSON completion naming the upstream (the delivery proof).
func completion(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"served by `+u.name+`","finish_reason":"stop"}]}`)
}

// streamEvents answers an SSE stream of n events then [DONE].
func streamEvents(n int) handleFunc {
	return func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range n {
			_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"text":"`+u.name+`-`+string(rune('a'+i))+`"}]}`+"\n\n")
			_ = rc.Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}
}

// closedAddr is a 127.0.0.1 address nothing listens on (connect refused).
func closedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "http://" + ln.Addr().String()
	ln.Close()
	return addr
}

type epSpec struct {
	name, addr, role string
	bootstrapPort    int
}

type fixedKeyer struct{ keys []uint64 }

func (k fixedKeyer) Keys(context.Context, *route.Request) ([]uint64, int, route.Miss, string) {
	return k.keys, 0, route.MissNone, ""
}

// pool is a proxy in front of one rule's router.
type pool struct {
	proxy *Proxy
	front *frontServer
	rt    *route.Router
	eps   []*route.Endpoint
	inv   *inventory.Index
	reg   *prometheus.Registry
	rule  *rules.Rule
}

var releases = map[string]string{"vllm": "v0.25.1", "sglang": "v0.5.18", "trtllm": "1.2"}

func newPool(t testing.TB, family string, mode int, specs []epSpec, keyer route.Keyer, mod func(*rules.Rule), cfgMod func(*Config)) *pool {
	t.Helper()
	r := &rules.Rule{Name: "r1", Engine: rules.EngineRef{Family: family, Release: releases[family]}, KVExactMode: mode, Models: []string{"m"}}
	for _, s := range specs {
		r.Endpoints = append(r.Endpoints, rules.Endpoint{Name: s.name, Address: s.addr, Role: s.role, BootstrapPort: s.bootstrapPort})
	}
	zero := 0
	r.LoadLaw.ColdStartSeedN = &zero
	if mod != nil {
		mod(r)
	}
	if err := r.Normalize(); err != nil {
		t.Fatal(err)
	}
	inv := inventory.New(inventory.Config{})
	var eps []*route.Endpoint
	var cert inventory.Mask
	bc := health.BreakerConfig{FailureThreshold: r.Breaker.FailureThreshold, OpenFor: time.Duration(r.Breaker.OpenFor),
		HalfOpenRequests: r.Breaker.HalfOpenRequests, OriginErrorThreshold: *r.Breaker.OriginErrorThreshold}
	for i, e := range r.Endpoints {
		id, err := inv.AddEndpoint(e.Name)
		if err != nil {
			t.Fatal(err)
		}
		cert.Set(id)
		eps = append(eps, &route.Endpoint{ID: id, Index: i, Name: e.Name, Address: e.Address, Role: route.Role(e.Role),
			Weight: e.Weight, Capacity: 1, Health: health.NewEndpoint(e.Name, e.Address, bc)})
	}
	rt, err := route.New(route.Config{Rule: r, Endpoints: eps, Index: inv, Keyer: keyer, Certified: cert})
	if err != nil {
		t.Fatal(err)
	}
	routes := new(resolver.Table)
	routes.Set("test", rt)
	reg := prometheus.NewRegistry()
	cfg := Config{
		Routes:  routes,
		Metrics: NewMetrics(reg),
		Log:     quietLog(),
	}
	if cfgMod != nil {
		cfgMod(&cfg)
	}
	p := New(cfg)
	front := newFrontServer(t, p.Handler("test"))
	return &pool{proxy: p, front: front, rt: rt, eps: eps, inv: inv, reg: reg, rule: r}
}

// frontServer serves the proxy on 127.0.0.1 with the server the gateway's client listeners run
// (gateway.NewHTTPServer, default limits), so these tests exercise the production path.
type frontServer struct {
	URL    string
	Addr   string // host:port, for raw-socket tests
	srv    *http.Server
	client *http.Client
	once   sync.Once
}

func newFrontServer(t testing.TB, h http.Handler) *frontServer {
	t.Helper()
	return newFrontServerWith(t, h, rules.Server{})
}

// newFrontServerWith is newFrontServer with the listener settings sc (zero fields: defaults).
func newFrontServerWith(t testing.TB, h http.Handler, sc rules.Server) *frontServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &frontServer{URL: "http://" + l.Addr().String(), Addr: l.Addr().String(), srv: gateway.NewHTTPServer(h, sc, nil, quietLog()),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}}
	go f.srv.Serve(l)
	t.Cleanup(f.Close)
	return f
}

// Client is a client for the front (its idle connections are closed with it).
func (f *frontServer) Client() *http.Client { return f.client }

// Close stops the front and drops the client's idle connections.
func (f *frontServer) Close() {
	f.once.Do(func() {
		f.client.CloseIdleConnections()
		f.srv.Close()
	})
}

func (p *pool) ep(name string) *route.Endpoint {
	for _, e := range p.eps {
		if e.Name == name {
			return e
		}
	}
	return nil
}

// post sends a JSON body to the proxy.
func (p *pool) post(t testing.TB, path, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.front.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := p.front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	return resp, b
}

// allReleased waits until no endpoint holds a load unit (every decision was released).
func (p *pool) allReleased(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		busy := ""
		for _, e := range p.eps {
			if e.Active() != 0 {
				busy = e.Name
			}
		}
		if busy == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoint %s still holds a load unit: a decision was not released", busy)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// metric returns the value of a counter or gauge series with the given labels (0 when absent).
func (p *pool) metric(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	return promtest.Sum(t, p.reg, name, labels)
}

// oaiError decodes an OpenAI error body and checks its shape.
func oaiError(t testing.TB, b []byte) (msg, typ string, param, code *string) {
	t.Helper()
	var v struct {
		Error *struct {
			Message *string `json:"message"`
			Type    *string `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	var keys struct {
		Error map[string]json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(b, &v); err != nil || v.Error == nil || v.Error.Message == nil || v.Error.Type == nil {
		t.Fatalf("not an OpenAI error body: %s", b)
	}
	_ = json.Unmarshal(b, &keys)
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := keys.Error[k]; !ok {
			t.Fatalf("error body lacks %q: %s", k, b)
		}
	}
	return *v.Error.Message, *v.Error.Type, v.Error.Param, v.Error.Code
}

// jsonMap decodes a JSON object.
func jsonMap(t testing.TB, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatalf("not a JSON object: %v: %s", err, b)
	}
	return m
}

// sseData returns the data payloads of an SSE body.
func sseData(b []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// noLeak waits until the goroutine count is back to about before, then fails with the stacks.
func noLeak(t testing.TB, before int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+2 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("goroutine leak: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:n])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
