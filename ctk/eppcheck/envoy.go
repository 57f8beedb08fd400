package eppcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvexact/kvexact/engines/sim"
)

// EnvoyConfig is the self-starting mode: a simulated pool served on Pool, a real Envoy (Template,
// the deploy/envoy configuration) in front of the picker at Picker, and the checks sent as HTTP
// requests through Envoy. Between Envoy and the picker sits a recording relay, so each check sees
// the picker's own answers as well as what the client and the engines saw.
type EnvoyConfig struct {
	Picker string // the picker's ext_proc address
	Dial   []grpc.DialOption
	// Pool is where the simulated endpoints listen ("ip:port" on this machine): the addresses the
	// picker under test is configured to serve.
	Pool      []string
	Model     string // the model the simulators serve (a tokenizer slug or folder)
	Envoy     string // the Envoy binary
	Template  string // the Envoy configuration template
	Path      string // default /v1/completions
	AdminPath string // default /reset_prefix_cache
	Timeout   time.Duration
	Log       io.Writer // Envoy's log, when set
}

// Request headers the checks send through Envoy for the relay (the picker sees them too; no picker
// acts on them).
const (
	caseHeader      = "x-eppcheck-case"
	subsetHeader    = "x-eppcheck-subset"     // comma-separated subset hint the relay adds
	killFirstHeader = "x-eppcheck-kill-first" // the relay takes the first destination down
)

// record is what one check's request did on each hop.
type record struct {
	dest, metadata string
	action         corev3.HeaderValueOption_HeaderAppendAction
	removed        []string
	immediate      int
	served         string // Envoy's envoy.lb x-gateway-destination-endpoint-served
	answeredResp   bool   // the picker answered the response headers
	streamErr      error
	killFirst      bool // the check asked the relay to take the first destination down
}

type hit struct {
	path  string
	dests []string // the x-gateway-destination-endpoint lines the engine received
}

// front is one pool address: a reverse proxy to a simulator that records what reaches the engine,
// and can be taken down (connections reset, as a crashed engine's).
type front struct {
	addr string
	srv  *http.Server
	down atomic.Bool
	mu   sync.Mutex
	hits map[string][]hit // by case
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if f.down.Load() {
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				if tc, ok := c.(*net.TCPConn); ok {
					tc.SetLinger(0)
				}
				c.Close()
				return
			}
		}
	}
	f.mu.Lock()
	f.hits[r.Header.Get(caseHeader)] = append(f.hits[r.Header.Get(caseHeader)], hit{path: r.URL.Path, dests: r.Header.Values(destHeader)})
	f.mu.Unlock()
	next.ServeHTTP(w, r)
}

func (f *front) seen(c string) []hit {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.hits[c])
}

type envoyRun struct {
	c       EnvoyConfig
	base    string
	fronts  map[string]*front
	decoy   *front
	mu      sync.Mutex
	records map[string]*record
	client  extprocv3.ExternalProcessorClient
}

// RunThroughEnvoy starts the pool, the relay and Envoy, runs every check through Envoy and stops
// what it started. An error means the run could not be set up (no result is then meaningful).
func RunThroughEnvoy(ctx context.Context, c EnvoyConfig) ([]Result, error) {
	if c.Path == "" {
		c.Path = "/v1/completions"
	}
	if c.AdminPath == "" {
		c.AdminPath = "/reset_prefix_cache"
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	e := &envoyRun{c: c, fronts: map[string]*front{}, records: map[string]*record{}}
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	serve := func(addr string, f *front, next http.Handler) error {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		f.addr, f.hits = l.Addr().String(), map[string][]hit{}
		f.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f.ServeHTTP(w, r, next) })}
		go f.srv.Serve(l)
		closers = append(closers, func() { f.srv.Close() })
		return nil
	}
	for i, addr := range c.Pool {
		eng, err := sim.New(sim.Config{Family: "vllm", Release: "v0.25.1", Model: c.Model, Endpoint: fmt.Sprintf("pool-%d", i), NoEvents: true})
		if err != nil {
			return nil, fmt.Errorf("simulated endpoint %s: %w", addr, err)
		}
		if err := eng.Start(ctx); err != nil {
			return nil, fmt.Errorf("simulated endpoint %s: %w", addr, err)
		}
		closers = append(closers, func() { eng.Close() })
		u, _ := url.Parse(eng.URL())
		rp := httputil.NewSingleHostReverseProxy(u)
		rp.FlushInterval = -1
		f := &front{}
		if err := serve(addr, f, rp); err != nil {
			return nil, fmt.Errorf("--pool %s: %w", addr, err)
		}
		e.fronts[addr] = f
	}
	e.decoy = &front{}
	if err := serve("127.0.0.1:0", e.decoy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"decoy":true}`)) })); err != nil {
		return nil, err
	}

	conn, err := grpc.NewClient(c.Picker, c.Dial...)
	if err != nil {
		return nil, fmt.Errorf("--picker %s: %w", c.Picker, err)
	}
	closers = append(closers, func() { conn.Close() })
	e.client = extprocv3.NewExternalProcessorClient(conn)
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, relay{e})
	go gs.Serve(rl)
	closers = append(closers, gs.Stop)

	stop, err := e.startEnvoy(rl.Addr().(*net.TCPAddr).Port)
	if err != nil {
		return nil, err
	}
	closers = append(closers, stop)
	return []Result{
		e.destination(ctx),
		e.fallbacks(ctx),
		e.subset(ctx),
		e.emptySubset(ctx),
		e.served(ctx),
		e.surface(ctx),
		e.override(ctx),
	}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (e *envoyRun) startEnvoy(relayPort int) (func(), error) {
	tmpl, err := template.New("envoy").Option("missingkey=error").Parse(e.c.Template)
	if err != nil {
		return nil, fmt.Errorf("the Envoy template: %w", err)
	}
	admin, err1 := freePort()
	listen, err2 := freePort()
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, map[string]any{"AdminPort": admin, "ListenAddress": "127.0.0.1", "ListenPort": listen, "PickerAddress": "127.0.0.1", "PickerPort": relayPort}); err != nil {
		return nil, fmt.Errorf("the Envoy template: %w", err)
	}
	dir, err := os.MkdirTemp("", "ctk-epp-envoy")
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfg, b.Bytes(), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(e.c.Envoy, "-c", cfg, "--concurrency", "1", "--base-id", fmt.Sprint(admin), "-l", "warn", "--disable-hot-restart")
	cmd.Stdout, cmd.Stderr = e.c.Log, e.c.Log
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("--envoy %s: %w", e.c.Envoy, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop := func() {
		cmd.Process.Kill()
		<-exited
		os.RemoveAll(dir)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/ready", admin)); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				e.base = fmt.Sprintf("http://127.0.0.1:%d", listen)
				return stop, nil
			}
		}
		select {
		case <-exited:
			os.RemoveAll(dir)
			return nil, fmt.Errorf("envoy exited before it was ready (its log: --envoy-log)")
		case <-time.After(50 * time.Millisecond):
		}
	}
	stop()
	return nil, fmt.Errorf("envoy not ready after 30 s")
}

// relay passes every ext_proc message between Envoy and the picker unchanged, but for the subset
// hint it adds on request (the data plane's duty the check plays) and records the picker's answers
// and Envoy's served-endpoint report per check.
type relay struct{ e *envoyRun }

func (rl relay) Process(down extprocv3.ExternalProcessor_ProcessServer) error {
	ctx, cancel := context.WithCancel(down.Context())
	defer cancel()
	up, err := rl.e.client.Process(ctx)
	if err != nil {
		return err
	}
	rec := &record{}
	errc := make(chan error, 2)
	go func() {
		for {
			m, err := down.Recv()
			if err != nil {
				up.CloseSend()
				errc <- nil
				return
			}
			if h := m.GetRequestHeaders(); h != nil {
				get := func(k string) string {
					for _, v := range h.GetHeaders().GetHeaders() {
						if strings.EqualFold(v.Key, k) {
							return string(v.RawValue) + v.Value
						}
					}
					return ""
				}
				rl.e.mu.Lock()
				rl.e.records[get(caseHeader)] = rec
				rec.killFirst = get(killFirstHeader) != ""
				rl.e.mu.Unlock()
				if s := get(subsetHeader); s != "" {
					vals := []any{}
					for _, a := range strings.Split(s, ",") {
						vals = append(vals, a)
					}
					sv, _ := structpb.NewStruct(map[string]any{subsetKey: vals})
					if m.MetadataContext == nil {
						m.MetadataContext = &corev3.Metadata{}
					}
					if m.MetadataContext.FilterMetadata == nil {
						m.MetadataContext.FilterMetadata = map[string]*structpb.Struct{}
					}
					m.MetadataContext.FilterMetadata[subsetNS] = sv
				}
			}
			if m.GetResponseHeaders() != nil {
				rl.e.mu.Lock()
				rec.served = m.GetMetadataContext().GetFilterMetadata()[lbNS].GetFields()[servedKey].GetStringValue()
				rl.e.mu.Unlock()
			}
			if err := up.Send(m); err != nil {
				errc <- nil
				return
			}
		}
	}()
	go func() {
		for {
			m, err := up.Recv()
			if err != nil {
				// Canceled: Envoy ended its side once the response was through, and the relay's
				// stream to the picker with it; anything else is the picker's.
				if err != io.EOF && status.Code(err) != codes.Canceled {
					rl.e.mu.Lock()
					rec.streamErr = err
					rl.e.mu.Unlock()
				}
				errc <- err
				return
			}
			rl.e.mu.Lock()
			switch r := m.Response.(type) {
			case *extprocv3.ProcessingResponse_ImmediateResponse:
				rec.immediate = int(r.ImmediateResponse.GetStatus().GetCode())
			case *extprocv3.ProcessingResponse_RequestHeaders:
				mut := r.RequestHeaders.GetResponse().GetHeaderMutation()
				for _, h := range mut.GetSetHeaders() {
					if strings.EqualFold(h.GetHeader().GetKey(), destHeader) {
						rec.dest = string(h.Header.RawValue) + h.Header.Value
						rec.action = h.AppendAction
					}
				}
				rec.removed = mut.GetRemoveHeaders()
				rec.metadata = m.GetDynamicMetadata().GetFields()[lbNS].GetStructValue().GetFields()[destHeader].GetStringValue()
				if first, _, _ := strings.Cut(rec.dest, ","); rec.killFirst && rl.e.fronts[strings.TrimSpace(first)] != nil {
					rl.e.fronts[strings.TrimSpace(first)].down.Store(true)
				}
			case *extprocv3.ProcessingResponse_ResponseHeaders:
				rec.answeredResp = true
			}
			rl.e.mu.Unlock()
			if err := down.Send(m); err != nil {
				errc <- err
				return
			}
		}
	}()
	return <-errc
}

// reply is what the client got through Envoy.
type reply struct {
	status int
	body   []byte
	err    error
}

func (e *envoyRun) send(ctx context.Context, name, path string, body []byte, kv ...string) (reply, *record) {
	ctx, cancel := context.WithTimeout(ctx, e.c.Timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.base+path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(caseHeader, name)
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Add(kv[i], kv[i+1])
	}
	var r reply
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.err = err
	} else {
		r.status = resp.StatusCode
		r.body, r.err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	// The picker's stream ends just after the response: give the relay a moment to record it.
	time.Sleep(20 * time.Millisecond)
	e.mu.Lock()
	defer e.mu.Unlock()
	rec := e.records[name]
	if rec == nil {
		rec = &record{}
	} else {
		cp := *rec
		rec = &cp
	}
	return r, rec
}

func (e *envoyRun) body(prompt string) []byte {
	b, _ := json.Marshal(map[string]any{"model": e.c.Model, "prompt": prompt, "max_tokens": 1})
	return b
}

// hits is every request a pool engine (or the decoy, under "decoy") received for one check.
func (e *envoyRun) hits(name string) map[string][]hit {
	out := map[string][]hit{}
	for a, f := range e.fronts {
		if h := f.seen(name); len(h) > 0 {
			out[a] = h
		}
	}
	if h := e.decoy.seen(name); len(h) > 0 {
		out["decoy"] = h
	}
	return out
}

func (e *envoyRun) inPool(a string) bool { return e.fronts[strings.TrimSpace(a)] != nil }

func (rp reply) ok() error {
	if rp.err != nil {
		return rp.err
	}
	if rp.status != http.StatusOK {
		return fmt.Errorf("status %d through Envoy: %.200s", rp.status, rp.body)
	}
	return nil
}

// destination: the header and the envoy.lb metadata carry the same value, and Envoy delivered the
// request to its first entry.
func (e *envoyRun) destination(ctx context.Context) Result {
	const name = "destination header and metadata agree"
	rp, rec := e.send(ctx, name, e.c.Path, e.body("eppcheck destination"))
	if err := rp.ok(); err != nil {
		return fail(name, "%v", err)
	}
	if rec.dest == "" || rec.metadata != rec.dest {
		return fail(name, "header %q, %s.%s metadata %q: the protocol asks for the same value", rec.dest, lbNS, destHeader, rec.metadata)
	}
	first, _, _ := strings.Cut(rec.dest, ",")
	if got := e.hits(name); len(got) != 1 || got[strings.TrimSpace(first)] == nil {
		return fail(name, "destination %q, but the engines that received the request: %v", rec.dest, keys(got))
	}
	return Result{Name: name, Pass: true, Detail: rec.dest + ", delivered by Envoy to " + first}
}

func keys(m map[string][]hit) []string {
	var k []string
	for a := range m {
		k = append(k, a)
	}
	slices.Sort(k)
	return k
}

// fallbacks: every entry a pool endpoint, none twice; with the first entry dead, Envoy goes down the
// list and the second serves.
func (e *envoyRun) fallbacks(ctx context.Context) Result {
	const name = "fallback endpoints are pool endpoints, distinct"
	rp, rec := e.send(ctx, name, e.c.Path, e.body("eppcheck fallbacks"))
	if err := rp.ok(); err != nil {
		return fail(name, "%v", err)
	}
	list := strings.Split(rec.dest, ",")
	seen := map[string]bool{}
	for _, a := range list {
		if a = strings.TrimSpace(a); !e.inPool(a) || seen[a] {
			return fail(name, "%q in %q is not a pool endpoint, or appears twice", a, rec.dest)
		}
		seen[a] = true
	}
	if len(list) < 2 {
		return Result{Name: name, Pass: true, Detail: "1 endpoint listed: no fallback to exercise"}
	}
	const kill = name + " (first down)"
	rp, rec = e.send(ctx, kill, e.c.Path, e.body("eppcheck failover"), killFirstHeader, "1")
	for _, f := range e.fronts {
		f.down.Store(false)
	}
	if err := rp.ok(); err != nil {
		return fail(name, "with the first of %q down: %v", rec.dest, err)
	}
	list = strings.Split(rec.dest, ",")
	second := strings.TrimSpace(list[min(1, len(list)-1)])
	if got := e.hits(kill); got[second] == nil || rec.served != second {
		return fail(name, "with the first of %q down, the engines reached: %v, Envoy reported %q served", rec.dest, keys(got), rec.served)
	}
	return Result{Name: name, Pass: true, Detail: fmt.Sprintf("%d endpoints; with the first down Envoy's retry reached %s", len(list), second)}
}

// subset: with the subset hint naming one pool endpoint, the picker picks only it and the request
// reaches only it.
func (e *envoyRun) subset(ctx context.Context) Result {
	const name = "subset hint honoured"
	for _, only := range e.c.Pool {
		n := name + " " + only
		rp, rec := e.send(ctx, n, e.c.Path, e.body("eppcheck subset "+only), subsetHeader, only)
		if err := rp.ok(); err != nil {
			return fail(name, "subset [%s]: %v", only, err)
		}
		for _, a := range strings.Split(rec.dest, ",") {
			if strings.TrimSpace(a) != only {
				return fail(name, "subset [%s]: destination list %q leaves the subset", only, rec.dest)
			}
		}
		if got := e.hits(n); len(got) != 1 || got[only] == nil {
			return fail(name, "subset [%s]: the engines reached: %v", only, keys(got))
		}
	}
	return Result{Name: name, Pass: true, Detail: fmt.Sprintf("each of %d endpoints alone, and only it reached", len(e.c.Pool))}
}

// emptySubset: a subset of no pool endpoint is an ImmediateResponse 503, which Envoy gives the
// client as an HTTP answer with a body; no engine is reached.
func (e *envoyRun) emptySubset(ctx context.Context) Result {
	const name = "immediate response shaped (503 for an unservable subset)"
	rp, rec := e.send(ctx, name, e.c.Path, e.body("eppcheck empty subset"), subsetHeader, "192.0.2.1:1")
	if rp.err != nil {
		return fail(name, "%v", rp.err)
	}
	if rec.immediate != 503 || rp.status != 503 || len(rp.body) == 0 {
		return fail(name, "the picker answered %d (destination %q), the client got %d %.200q; want 503 with a body", rec.immediate, rec.dest, rp.status, rp.body)
	}
	if got := e.hits(name); len(got) > 0 {
		return fail(name, "the engines reached: %v", keys(got))
	}
	return Result{Name: name, Pass: true, Detail: "503 " + string(rp.body)}
}

// served: Envoy reports the endpoint that served on the response path; the picker answers the
// response headers and body, and the client gets the whole response.
func (e *envoyRun) served(ctx context.Context) Result {
	const name = "served-endpoint receipt read"
	rp, rec := e.send(ctx, name, e.c.Path, e.body("eppcheck served"))
	if err := rp.ok(); err != nil {
		return fail(name, "%v", err)
	}
	first, _, _ := strings.Cut(rec.dest, ",")
	if rec.served != strings.TrimSpace(first) {
		return fail(name, "destination %q, Envoy reported %q served", rec.dest, rec.served)
	}
	if !rec.answeredResp || rec.streamErr != nil || !json.Valid(rp.body) {
		return fail(name, "the picker answered the response headers: %v, its stream ended with %v, the client's body is JSON: %v", rec.answeredResp, rec.streamErr, json.Valid(rp.body))
	}
	return Result{Name: name, Pass: true, Detail: "served " + rec.served + ", the response passed whole"}
}

// surface: a completion body on an engine's admin path gets no destination, and no engine sees it.
func (e *envoyRun) surface(ctx context.Context) Result {
	name := "no destination outside the API surface (" + e.c.AdminPath + ")"
	rp, rec := e.send(ctx, name, e.c.AdminPath, e.body("eppcheck admin path"))
	if rp.err != nil {
		return fail(name, "%v", rp.err)
	}
	if got := e.hits(name); len(got) > 0 || rec.dest != "" {
		return fail(name, "destination %q; the engines reached: %v", rec.dest, keys(got))
	}
	if rec.immediate == 0 || rp.status < 400 {
		return fail(name, "the picker answered %d, the client got %d", rec.immediate, rp.status)
	}
	return Result{Name: name, Pass: true, Detail: fmt.Sprintf("%d, no engine reached", rp.status)}
}

// override: a client's forged x-gateway-destination-endpoint naming a server outside the pool never
// reaches it, and the engine that serves receives exactly one value of the header, the picker's.
func (e *envoyRun) override(ctx context.Context) Result {
	const name = "client routing headers cannot override"
	rp, rec := e.send(ctx, name, e.c.Path, e.body("eppcheck forged"), destHeader, e.decoy.addr, destHeader, e.decoy.addr)
	if err := rp.ok(); err != nil {
		return fail(name, "%v", err)
	}
	got := e.hits(name)
	if got["decoy"] != nil {
		return fail(name, "the client's %s reached its own server", destHeader)
	}
	for a, hs := range got {
		for _, h := range hs {
			if len(h.dests) != 1 || h.dests[0] != rec.dest {
				return fail(name, "%s received %s %q; want only the picker's %q", a, destHeader, h.dests, rec.dest)
			}
		}
	}
	if len(got) != 1 {
		return fail(name, "the engines reached: %v", keys(got))
	}
	// Envoy 1.40's ext_proc replaced the client's value even for an append; another data plane
	// may keep both, so the picker's own message must ask for the replacement.
	if rec.action != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD && !slices.Contains(rec.removed, destHeader) {
		return fail(name, "%s set with %v and the client's not removed: this Envoy replaced it anyway, a data plane honouring the action keeps the client's beside it", destHeader, rec.action)
	}
	return Result{Name: name, Pass: true, Detail: "the engine received only the picker's value (set with " + rec.action.String() + ")"}
}
