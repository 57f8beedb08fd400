package kvbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// Overhead holds the decision-time and proxy-throughput figures.
type Overhead struct {
	Decision []DecisionFigure `json:"decision"`
	Proxy    []ProxyRound     `json:"proxy,omitempty"`
	// Median ratios over the rounds (each round measures all three back to back): req/s, and the
	// gateway's CPU time per request over nginx's.
	RatioVsNginx    float64 `json:"ratioVsNginx,omitempty"`
	RatioVsDirect   float64 `json:"ratioVsDirect,omitempty"`
	CPURatioVsNginx float64 `json:"cpuRatioVsNginx,omitempty"`
	// Latency rounds at a fixed rate (LatencyRate small requests/s) and streaming time-to-first-
	// byte rounds, every target in each round; Added* are the medians of target − direct.
	LatencyRate  int                     `json:"latencyRate,omitempty"`
	Latency      []LatencyRound          `json:"latency,omitempty"`
	Stream       []LatencyRound          `json:"stream,omitempty"`
	AddedLatency map[string]AddedLatency `json:"addedLatency,omitempty"`
	AddedTTFB    map[string]AddedLatency `json:"addedTtfb,omitempty"`
	// AddedSaturation is the added p50/p99 under wrk's closed-loop saturation.
	AddedSaturation map[string]AddedLatency `json:"addedSaturation,omitempty"`
	// OverEnvoy is each target's latency at the fixed rate over Envoy alone's (medians of the
	// per-round differences): what the picker, or the minimal picker, adds to Envoy.
	OverEnvoy map[string]AddedLatency `json:"overEnvoy,omitempty"`
	// Baseline names the optional fourth target, another gateway build measured in the same
	// rounds (e.g. the previous release), and its binary.
	Baseline             string  `json:"baseline,omitempty"`
	BaselineBin          string  `json:"baselineBinary,omitempty"`
	RatioBaselineVsNginx float64 `json:"ratioBaselineVsNginx,omitempty"`
	// Command is the kvbench invocation that wrote this.
	Command        string `json:"command,omitempty"`
	WrkCommand     string `json:"wrkCommand,omitempty"`
	Nginx          string `json:"nginx,omitempty"`
	Gateway        string `json:"gateway,omitempty"`        // the gateway binary measured and its build
	Envoy          string `json:"envoy,omitempty"`          // the Envoy binary's version line, when Envoy ran
	GatewayCommand string `json:"gatewayCommand,omitempty"` // its arguments
	// Load average (1, 5, 15 min) when the proxy measurement started (everything running and
	// checked, before the warm-up runs) and when it ended.
	LoadAvg       string  `json:"loadAvg,omitempty"`
	WarmupSeconds float64 `json:"warmupSeconds,omitempty"` // the unrecorded wrk run per target before round 1
	LoadAvgAfter  string  `json:"loadAvgAfter,omitempty"`
	ProxyError    string  `json:"proxyError,omitempty"`
	Machine       Machine `json:"machine"`
}

// DecisionFigure is the time of one KV-exact decision for a prompt of a given size: tokenize, hash,
// and the whole of Router.Explain (tokenize + hash + inventory scoring + load law), which routes
// exactly as a request would without taking load.
type DecisionFigure struct {
	PromptTokens int     `json:"promptTokens"`
	Blocks       int     `json:"blocks"`
	TokenizeUs   float64 `json:"tokenizeUs"`
	HashUs       float64 `json:"hashUs"`
	DecisionUs   float64 `json:"decisionUs"`
	AllocsPerOp  int64   `json:"allocsPerOp"`
	Score        int     `json:"score"` // the winner's score: the benchmark scored a warm inventory
}

// decisionRig is a KV-exact pool whose inventory holds a prompt, for timing decisions on it.
type decisionRig struct {
	pool   *Pool
	router *route.Router
	req    *route.Request
	tok    *tokenize.Tokenizer
	text   string
	tokens int
}

// newDecisionRig serves a prompt of about promptTokens tokens once through a KV-exact gateway and
// waits until the inventory holds it.
func newDecisionRig(ctx context.Context, toks *tokenize.Pool, model string, promptTokens int) (*decisionRig, error) {
	tok, err := toks.Get(model)
	if err != nil {
		return nil, err
	}
	shape := DefaultPoolShape()
	shape.PrefillPerToken, shape.DecodePerToken = time.Microsecond, time.Microsecond
	shape.CapacityBlocks, shape.MaxModelLen = 2048, 16384
	pool, err := StartPool(ctx, toks, model, shape, KVExact("overlap", "hard"))
	if err != nil {
		return nil, err
	}
	rig := &decisionRig{pool: pool, tok: tok}
	tpw := tokensPerWord(tok)
	n := int(float64(promptTokens) / tpw)
	for {
		rig.text = words(textRand(3, "decision", promptTokens), n)
		ids, _ := tok.Encode(rig.text, true)
		if len(ids) >= promptTokens {
			rig.tokens = len(ids)
			break
		}
		n += max(1, int(float64(promptTokens-len(ids))/tpw))
	}
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": rig.text, "max_tokens": 1})
	resp, err := http.Post(pool.URL+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		pool.Close()
		return nil, err
	}
	ep := resp.Header.Get(proxy.HeaderEndpoint)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if rig.router, err = pool.G.Routes().Resolve("127.0.0.1:0", model); err != nil {
		pool.Close()
		return nil, err
	}
	hr, _ := http.NewRequest(http.MethodPost, "/v1/completions", nil)
	if rig.req, err = proxy.ParseRequest(hr, body); err != nil {
		pool.Close()
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err := rig.router.Explain(ctx, rig.req)
		if err == nil && d.Tier == route.TierKVExact && d.TargetN == ep && d.Score >= d.Blocks-1 {
			break
		}
		if time.Now().After(deadline) {
			pool.Close()
			return nil, fmt.Errorf("the inventory did not learn the %d-token prompt on %s", rig.tokens, ep)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return rig, nil
}

// DecisionBenchmark times one decision (Router.Explain) on a warm inventory; b.N iterations.
func DecisionBenchmark(ctx context.Context, toks *tokenize.Pool, model string, promptTokens int) (func(b *testing.B), func(), error) {
	rig, err := newDecisionRig(ctx, toks, model, promptTokens)
	if err != nil {
		return nil, nil, err
	}
	return func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := rig.router.Explain(ctx, rig.req); err != nil {
				b.Fatal(err)
			}
		}
	}, rig.pool.Close, nil
}

// MeasureDecision times tokenize, hash and the whole decision for prompts of the given sizes.
func MeasureDecision(ctx context.Context, toks *tokenize.Pool, model string, sizes []int) ([]DecisionFigure, error) {
	var out []DecisionFigure
	for _, n := range sizes {
		rig, err := newDecisionRig(ctx, toks, model, n)
		if err != nil {
			return nil, err
		}
		f := DecisionFigure{PromptTokens: rig.tokens}
		var ids []uint32
		tr := testing.Benchmark(func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				ids, _ = rig.tok.AppendEncode(ids[:0], rig.text, true)
			}
		})
		var keys []uint64
		hr := testing.Benchmark(func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				keys, _ = rig.pool.Hasher.Keys(ids, nil, keys[:0])
			}
		})
		f.Blocks = len(keys)
		dr := testing.Benchmark(func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				d, err := rig.router.Explain(ctx, rig.req)
				if err != nil {
					b.Fatal(err)
				}
				f.Score = d.Score
			}
		})
		f.TokenizeUs = float64(tr.NsPerOp()) / 1e3
		f.HashUs = float64(hr.NsPerOp()) / 1e3
		f.DecisionUs = float64(dr.NsPerOp()) / 1e3
		f.AllocsPerOp = dr.AllocsPerOp()
		rig.pool.Close()
		out = append(out, f)
	}
	return out, nil
}

// ---- proxy throughput: direct vs nginx proxy_pass vs the gateway in round-robin ----

// ProxyRound is one round of the three targets measured back to back with the same load.
// CPU figures are the proxy's user + system time (every process of its process group, from
// /proc/PID/stat) over the wrk run, divided by the requests wrk completed.
type ProxyRound struct {
	Direct       float64 `json:"directRps"`
	Nginx        float64 `json:"nginxRps"`
	Gateway      float64 `json:"gatewayRps"`
	NginxCPUus   float64 `json:"nginxCpuUsPerRequest"`
	GatewayCPUus float64 `json:"gatewayCpuUsPerRequest"`
	DirectN      int64   `json:"directRequests"`
	NginxN       int64   `json:"nginxRequests"`
	GatewayN     int64   `json:"gatewayRequests"`
	Order        string  `json:"order"`
	// Baseline* are the optional baseline gateway's (ProxyOptions.Baseline).
	Baseline      float64 `json:"baselineRps,omitempty"`
	BaselineCPUus float64 `json:"baselineCpuUsPerRequest,omitempty"`
	BaselineN     int64   `json:"baselineRequests,omitempty"`
	// Saturation latency percentiles per target (wrk --latency), µs.
	Saturation map[string]LatencyFigure `json:"saturation,omitempty"`
}

// UpstreamResponse is the tiny upstream's answer: a 1-token completion with a usage receipt.
const upstreamResponse = `{"id":"cmpl-up","object":"text_completion","created":0,"model":"llama3","choices":[{"index":0,"text":" hello","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}}`

const smallRequest = `{"model":"llama3","prompt":"Say hello.","max_tokens":1}`

// ServeUpstream serves the tiny upstream on n loopback ports until ctx ends; ready gets the
// addresses. It reads each request body and answers a fixed completion with a served-by receipt.
func ServeUpstream(ctx context.Context, n int, ready func([]string)) error {
	var addrs []string
	var srvs []*http.Server
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		name := fmt.Sprintf("u%d", i)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			if bytes.Contains(body, []byte(`"stream":true`)) {
				w.Header().Set(sim.ReceiptHeader, name)
				serveStream(w, name)
				return
			}
			h := w.Header()
			h.Set("Content-Type", "application/json")
			h.Set(sim.ReceiptHeader, name)
			io.WriteString(w, upstreamResponse)
		})}
		srvs = append(srvs, srv)
		go srv.Serve(l)
		addrs = append(addrs, l.Addr().String())
	}
	ready(addrs)
	<-ctx.Done()
	for _, s := range srvs {
		s.Close()
	}
	return nil
}

// ProxyOptions configure the throughput comparison.
type ProxyOptions struct {
	// UpstreamCmd starts the tiny upstream in its own process (e.g. kvbench upstream); it prints its
	// addresses on one stdout line, space-separated.
	UpstreamCmd []string
	Rounds      int
	Duration    time.Duration
	// Warmup is the length of the one unrecorded wrk run per target before round 1 (0: none).
	Warmup      time.Duration
	Connections int
	Threads     int
	Nginx       string // nginx binary
	Wrk         string // wrk binary
	Gateway     string // gateway binary (cmd/gateway), see ResolveGateway
	// Baseline, when set, is a second gateway binary measured as a fourth target in the same
	// rounds (BaselineName labels it, e.g. "gateway-h1").
	Baseline     string
	BaselineName string
	// LatencyRate is the fixed rate of the latency rounds (0: no latency rounds); LatencyDuration
	// their length; StreamRequests the streaming requests per target per round (0: none).
	LatencyRate     int
	LatencyDuration time.Duration
	StreamRequests  int
	// Envoy, when set, is an Envoy binary: two more targets run in the same rounds, "envoy" (a
	// round-robin cluster over the same upstreams) and "envoy+picker" (deploy/envoy's Envoy in
	// front of the gateway's Endpoint Picker, rule rr over the same upstreams), charged with
	// Envoy's CPU and, for the second, the picker process's too.
	Envoy string
	// BaselineEnvoyTemplate, when set, is the Envoy template (deploy/envoy/envoy.yaml.tmpl's
	// shape) the baseline's picker runs behind: a previous build's own, when the shipped one
	// changed with the picker.
	BaselineEnvoyTemplate string
	// MinPicker, with Envoy, is the minimal picker's binary (bench/minpicker; "" builds it): the
	// target "envoy+minpicker", the shipped template in front of a picker that decides nothing,
	// joins the same rounds, so the ext_proc exchange's own cost is told from the picker's.
	MinPicker string
	Log       io.Writer
}

// MissingTool names a program the proxy comparison needs and how to install it.
type MissingTool struct {
	Name, Flag, Path string
	Err              error
}

func (e *MissingTool) Error() string {
	return fmt.Sprintf("%s not found (%s %s: %v): apt-get install -y nginx-light wrk, or pass --no-proxy for decision time only", e.Name, e.Flag, e.Path, e.Err)
}

// CheckProxyTools fails early, before anything is measured, when nginx or wrk is missing or /proc
// cannot be read for the CPU accounting.
func CheckProxyTools(nginx, wrk string) error {
	var errs []error
	for _, t := range []struct{ name, flag, path string }{{"nginx", "--nginx", nginx}, {"wrk", "--wrk", wrk}} {
		if _, err := exec.LookPath(t.path); err != nil {
			errs = append(errs, &MissingTool{Name: t.name, Flag: t.flag, Path: t.path, Err: err})
		}
	}
	if err := checkProc(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// proxyTarget is one thing wrk measures: its URL and, for a proxy, the process group whose CPU
// time the run is charged with.
type proxyTarget struct {
	url   string
	pgids []int  // the process groups charged with its CPU time; none: not accounted (direct)
	admin string // Envoy's admin URL, for the counters that explain failed requests
}

// envoyCounters are the nonzero counters of the Envoy at admin that say why requests failed:
// circuit-breaker overflows, ext_proc stream failures and timeouts, resets and 5xx answers.
func envoyCounters(admin string) string {
	resp, err := http.Get(admin + "/stats?filter=" + url.QueryEscape(`overflow|ext_proc\.|rq_5xx|rq_timeout|_reset|cx_destroy_with_active_rq|local_rq`))
	if err != nil {
		return "Envoy's counters not read: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ": "); ok && v != "0" && !strings.Contains(k, "histogram") {
			out = append(out, k+"="+v)
		}
	}
	return "Envoy's counters: " + strings.Join(out, ", ")
}

// groupsCPU is the CPU time of every process in the groups.
func groupsCPU(pgids []int) (time.Duration, error) {
	var total time.Duration
	for _, g := range pgids {
		d, _, err := groupCPU("/proc", g)
		if err != nil {
			return 0, err
		}
		total += d
	}
	return total, nil
}

// proxyRun is one wrk run against one target.
type proxyRun struct {
	wrkResult
	CPUus float64 // the target's CPU µs per completed request (0 when not accounted)
}

// MeasureProxy runs wrk against the upstream directly, through nginx proxy_pass (round robin over
// the same upstreams, keep-alive) and through the gateway (rule selector rr, mode 0), each proxy in
// its own process group. Each target gets one unrecorded warm-up run, then every round measures
// the three back to back, the order rotating between rounds; the proxies' CPU time per request is
// read from /proc around every run.
func MeasureProxy(ctx context.Context, o ProxyOptions, ov *Overhead) error {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Rounds < 1 {
		return fmt.Errorf("%d rounds: at least one is needed (five for a quotable median)", o.Rounds)
	}
	if err := CheckProxyTools(o.Nginx, o.Wrk); err != nil {
		return err
	}
	if o.Gateway == "" {
		return errors.New("no gateway binary (ResolveGateway)")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	up := exec.CommandContext(ctx, o.UpstreamCmd[0], o.UpstreamCmd[1:]...)
	up.Stderr = o.Log
	stdout, err := up.StdoutPipe()
	if err != nil {
		return err
	}
	// The upstream exits when its stdin closes, so it cannot outlive this process.
	stdin, err := up.StdinPipe()
	if err != nil {
		return err
	}
	defer stdin.Close()
	if err := up.Start(); err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	defer func() { _ = up.Process.Kill(); _ = up.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		return fmt.Errorf("upstream: no addresses: %w", err)
	}
	ups := strings.Fields(line)
	if len(ups) == 0 {
		return errors.New("upstream: no addresses")
	}

	dir, err := os.MkdirTemp("", "kvbench-proxy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	// nginx: its own process group (master and workers), stopped with it at the end.
	nport, err := freePort()
	if err != nil {
		return err
	}
	var ub strings.Builder
	for _, a := range ups {
		fmt.Fprintf(&ub, "    server %s;\n", a)
	}
	conf := fmt.Sprintf(`worker_processes %d;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[2]s/body;
  proxy_temp_path %[2]s/proxy;
  fastcgi_temp_path %[2]s/fastcgi;
  uwsgi_temp_path %[2]s/uwsgi;
  scgi_temp_path %[2]s/scgi;
  upstream pool {
%[3]s    keepalive 64;
  }
  server {
    listen 127.0.0.1:%[4]d;
    location / {
      proxy_pass http://pool;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
    location /stream/ {
      proxy_pass http://pool;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`, ThisMachine().Cores, dir, ub.String(), nport)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
		return err
	}
	if v, err := exec.Command(o.Nginx, "-v").CombinedOutput(); err == nil {
		ov.Nginx = strings.TrimSpace(string(v))
	}
	nginxTail := &tailBuffer{max: 4096}
	ng := exec.Command(o.Nginx, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;")
	ng.Stderr = io.MultiWriter(o.Log, nginxTail)
	nginxProc, err := startGroup("nginx", ng, nginxTail)
	if err != nil {
		return err
	}
	defer nginxProc.stop()

	// The gateway: the cmd/gateway binary, one rule, round robin over the same upstreams, no
	// KV-exact, no debug header; its own process group like nginx.
	gw, gwAddr, err := startGateway(ctx, o.Gateway, ups, dir, o.Log)
	if err != nil {
		return err
	}
	defer gw.stop()
	ov.Gateway = describeBinary(o.Gateway)
	ov.GatewayCommand = "gateway " + strings.Join(gatewayArgs("gateway.yaml"), " ")

	targets := map[string]proxyTarget{
		"direct":  {url: "http://" + ups[0]},
		"nginx":   {url: fmt.Sprintf("http://127.0.0.1:%d", nport), pgids: []int{nginxProc.pgid}},
		"gateway": {url: "http://" + gwAddr, pgids: []int{gw.pgid}},
	}
	order := []string{"direct", "nginx", "gateway"}
	procs := map[string]*groupProc{"nginx": nginxProc, "gateway": gw}
	if o.Baseline != "" {
		if o.BaselineName == "" {
			o.BaselineName = "baseline"
		}
		bdir := filepath.Join(dir, "baseline")
		if err := os.MkdirAll(bdir, 0o755); err != nil {
			return err
		}
		bg, bAddr, err := startGateway(ctx, o.Baseline, ups, bdir, o.Log)
		if err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		defer bg.stop()
		targets[o.BaselineName] = proxyTarget{url: "http://" + bAddr, pgids: []int{bg.pgid}}
		procs[o.BaselineName] = bg
		order = append(order, o.BaselineName)
		ov.Baseline, ov.BaselineBin = o.BaselineName, describeBinary(o.Baseline)
	}
	if o.Envoy != "" {
		err := startEnvoyTargets(ctx, o, ups, dir, targets, procs, ov)
		for _, n := range []string{"envoy", "envoy+picker", "picker", "envoy+minpicker", "minpicker", "envoy+" + o.BaselineName, "picker-baseline"} {
			if p := procs[n]; p != nil {
				defer p.stop()
			}
		}
		if err != nil {
			return err
		}
		order = append(order, "envoy", "envoy+picker", "envoy+minpicker")
		if o.Baseline != "" {
			order = append(order, "envoy+"+o.BaselineName)
		}
	}
	isGateway := func(name string) bool {
		return name == "gateway" || name == "envoy+picker" || o.Baseline != "" && (name == o.BaselineName || name == "envoy+"+o.BaselineName)
	}
	// Delivery check before measuring: every target answers 200 with the upstream's receipt.
	for _, name := range order {
		if err := waitServing(ctx, targets[name].url, isGateway(name)); err != nil {
			if p := procs[name]; p != nil {
				err = p.explain(err)
			}
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	script := filepath.Join(dir, "post.lua")
	lua := fmt.Sprintf("wrk.method = \"POST\"\nwrk.body = '%s'\nwrk.headers[\"Content-Type\"] = \"application/json\"\n", smallRequest)
	if err := os.WriteFile(script, []byte(lua), 0o644); err != nil {
		return err
	}
	ov.WrkCommand = fmt.Sprintf("wrk -t%d -c%d -d%s --latency -s post.lua <target>/v1/completions (body %s)", o.Threads, o.Connections, wrkSeconds(o.Duration), smallRequest)
	ov.LoadAvg = loadAvg()
	fmt.Fprintf(o.Log, "proxy comparison: load average %s at the start\n", ov.LoadAvg)
	measure := func(name string, d time.Duration) (proxyRun, error) {
		t := targets[name]
		before, err := groupsCPU(t.pgids)
		if err != nil {
			return proxyRun{}, err
		}
		res, err := runWrk(ctx, o, script, t.url+"/v1/completions", d)
		if err != nil {
			if t.admin != "" {
				err = fmt.Errorf("%w; %s", err, envoyCounters(t.admin))
			}
			return proxyRun{}, err
		}
		run := proxyRun{wrkResult: res}
		if len(t.pgids) > 0 {
			after, err := groupsCPU(t.pgids)
			if err != nil {
				return proxyRun{}, err
			}
			run.CPUus = cpuPerRequest(after-before, res.Requests)
		}
		return run, nil
	}
	// accounted runs f against target name, charging the target's process group's CPU time to the
	// requests f reports.
	accounted := func(name string, f func(url string) LatencyFigure) (LatencyFigure, error) {
		t := targets[name]
		before, err := groupsCPU(t.pgids)
		if err != nil {
			return LatencyFigure{}, err
		}
		fig := f(t.url)
		if len(t.pgids) > 0 {
			after, err := groupsCPU(t.pgids)
			if err != nil {
				return LatencyFigure{}, err
			}
			fig.CPUus = cpuPerRequest(after-before, int64(fig.Requests))
		}
		if fig.Errors > 0 {
			why := fmt.Sprint(fig.Failures)
			if t.admin != "" {
				why += "; " + envoyCounters(t.admin)
			}
			return fig, fmt.Errorf("%s: %d failed requests (%s): the run is invalid", name, fig.Errors, why)
		}
		return fig, nil
	}
	if o.Warmup > 0 {
		ov.WarmupSeconds, _ = strconv.ParseFloat(strings.TrimSuffix(wrkSeconds(o.Warmup), "s"), 64)
		for _, name := range order {
			r, err := measure(name, o.Warmup)
			if err != nil {
				return fmt.Errorf("warm-up %s: %w", name, err)
			}
			fmt.Fprintf(o.Log, "warm-up  %-8s %9.0f req/s %s (not recorded)\n", name, r.RPS, cpuNote(r))
		}
	}
	for round := 0; round < o.Rounds; round++ {
		var pr ProxyRound
		k := round % len(order)
		rot := append(append([]string{}, order[k:]...), order[:k]...)
		pr.Order = strings.Join(rot, ",")
		pr.Saturation = map[string]LatencyFigure{}
		for _, name := range rot {
			r, err := measure(name, o.Duration)
			if err != nil {
				return fmt.Errorf("round %d %s: %w", round+1, name, err)
			}
			fmt.Fprintf(o.Log, "round %d  %-10s %9.0f req/s %s, p50 %.0f µs, p99 %.0f µs\n", round+1, name, r.RPS, cpuNote(r), r.P50us, r.P99us)
			pr.Saturation[name] = LatencyFigure{P50us: r.P50us, P99us: r.P99us, Requests: int(r.Requests), CPUus: r.CPUus}
			switch name {
			case "direct":
				pr.Direct, pr.DirectN = r.RPS, r.Requests
			case "nginx":
				pr.Nginx, pr.NginxN, pr.NginxCPUus = r.RPS, r.Requests, r.CPUus
			case "gateway":
				pr.Gateway, pr.GatewayN, pr.GatewayCPUus = r.RPS, r.Requests, r.CPUus
			case o.BaselineName:
				pr.Baseline, pr.BaselineN, pr.BaselineCPUus = r.RPS, r.Requests, r.CPUus
			}
		}
		ov.Proxy = append(ov.Proxy, pr)
		if o.LatencyRate > 0 {
			lr := LatencyRound{Order: pr.Order, Targets: map[string]LatencyFigure{}}
			for _, name := range rot {
				f, err := accounted(name, func(url string) LatencyFigure {
					return fixedRate(ctx, url+"/v1/completions", o.LatencyRate, o.LatencyDuration)
				})
				if err != nil {
					return fmt.Errorf("round %d latency: %w", round+1, err)
				}
				fmt.Fprintf(o.Log, "round %d  %-10s at %d req/s: p50 %.0f µs, p99 %.0f µs, %.1f CPU µs/request (%d requests)\n", round+1, name, o.LatencyRate, f.P50us, f.P99us, f.CPUus, f.Requests)
				lr.Targets[name] = f
			}
			ov.Latency = append(ov.Latency, lr)
		}
		if o.StreamRequests > 0 {
			sr := LatencyRound{Order: pr.Order, Targets: map[string]LatencyFigure{}}
			for _, name := range rot {
				path := "/v1/completions"
				if name == "nginx" {
					path = "/stream/v1/completions" // nginx's unbuffered location
				}
				f, err := accounted(name, func(url string) LatencyFigure { return ttfb(ctx, url+path, o.StreamRequests) })
				if err != nil {
					return fmt.Errorf("round %d stream: %w", round+1, err)
				}
				fmt.Fprintf(o.Log, "round %d  %-10s stream: TTFB p50 %.0f µs, p99 %.0f µs (%d requests)\n", round+1, name, f.P50us, f.P99us, f.Requests)
				sr.Targets[name] = f
			}
			ov.Stream = append(ov.Stream, sr)
		}
	}
	ov.LatencyRate = o.LatencyRate
	ov.AddedLatency, ov.AddedTTFB = added(ov.Latency), added(ov.Stream)
	if o.Envoy != "" {
		ov.OverEnvoy = addedOver(ov.Latency, "envoy")
		for _, n := range []string{"envoy+picker", "envoy+minpicker"} {
			a := ov.OverEnvoy[n]
			fmt.Fprintf(o.Log, "%s over envoy at %d req/s (medians of the per-round differences): %+.0f µs p50, %+.0f µs p99\n", n, o.LatencyRate, a.P50us, a.P99us)
		}
		a := addedOver(ov.Latency, "envoy+minpicker")["envoy+picker"]
		fmt.Fprintf(o.Log, "envoy+picker over envoy+minpicker at %d req/s: %+.0f µs p50, %+.0f µs p99\n", o.LatencyRate, a.P50us, a.P99us)
	}
	sat := make([]LatencyRound, len(ov.Proxy))
	for i, r := range ov.Proxy {
		sat[i] = LatencyRound{Order: r.Order, Targets: r.Saturation}
	}
	ov.AddedSaturation = added(sat)
	ov.LoadAvgAfter = loadAvg()
	var vn, vd, vc []float64
	for _, r := range ov.Proxy {
		vn, vd = append(vn, r.Gateway/r.Nginx), append(vd, r.Gateway/r.Direct)
		if r.NginxCPUus > 0 {
			vc = append(vc, r.GatewayCPUus/r.NginxCPUus)
		}
	}
	ov.RatioVsNginx, ov.RatioVsDirect, ov.CPURatioVsNginx = median(vn), median(vd), median(vc)
	if o.Baseline != "" {
		var vb []float64
		for _, r := range ov.Proxy {
			vb = append(vb, r.Baseline/r.Nginx)
		}
		ov.RatioBaselineVsNginx = median(vb)
	}
	return nil
}

func cpuNote(r proxyRun) string {
	if r.CPUus == 0 {
		return fmt.Sprintf("(%d requests)", r.Requests)
	}
	return fmt.Sprintf("%6.1f CPU µs/request (%d requests)", r.CPUus, r.Requests)
}

// cpuPerRequest is CPU time per request in microseconds.
func cpuPerRequest(cpu time.Duration, requests int64) float64 {
	if requests <= 0 {
		return 0
	}
	return float64(cpu) / float64(time.Microsecond) / float64(requests)
}

// ProxyMedians are the medians over the rounds of each column.
type ProxyMedians struct {
	Direct, Nginx, Gateway   float64 // req/s
	NginxCPUus, GatewayCPUus float64 // CPU µs per request
}

// Medians computes the per-column medians of the proxy rounds.
func (ov *Overhead) Medians() ProxyMedians {
	var d, n, g, nc, gc []float64
	for _, r := range ov.Proxy {
		d, n, g = append(d, r.Direct), append(n, r.Nginx), append(g, r.Gateway)
		if r.NginxCPUus > 0 || r.GatewayCPUus > 0 {
			nc, gc = append(nc, r.NginxCPUus), append(gc, r.GatewayCPUus)
		}
	}
	return ProxyMedians{Direct: median(d), Nginx: median(n), Gateway: median(g), NginxCPUus: median(nc), GatewayCPUus: median(gc)}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func waitServing(ctx context.Context, base string, gw bool) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(smallRequest))
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			served := resp.Header.Get(sim.ReceiptHeader)
			ok := resp.StatusCode == 200 && served != "" && bytes.Contains(b, []byte(`"cached_tokens"`))
			if gw && resp.Header.Get(proxy.HeaderEndpoint) != served {
				ok = false
			}
			if ok {
				return nil
			}
			err = fmt.Errorf("status %d, receipt %q, gateway receipt %q: %s", resp.StatusCode, served, resp.Header.Get(proxy.HeaderEndpoint), b)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var (
	reqPerSec = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	reqsIn    = regexp.MustCompile(`(?m)^\s*(\d+) requests in `)
	non2xx    = regexp.MustCompile(`Non-2xx or 3xx responses:\s+(\d+)`)
	sockErr   = regexp.MustCompile(`Socket errors:.*`)
)

// wrkResult is what a valid wrk run reports.
type wrkResult struct {
	RPS          float64 // Requests/sec
	Requests     int64   // "N requests in T": requests completed
	P50us, P99us float64 // from --latency's distribution (0 when absent)
}

// parseWrk reads wrk's report; a run with non-2xx responses or socket errors is invalid.
func parseWrk(out []byte) (wrkResult, error) {
	var r wrkResult
	if m := non2xx.FindSubmatch(out); m != nil {
		return r, fmt.Errorf("wrk: %s non-2xx responses: the run is invalid", m[1])
	}
	if m := sockErr.Find(out); m != nil {
		return r, fmt.Errorf("wrk: %s: the run is invalid", m)
	}
	m := reqPerSec.FindSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("wrk: no Requests/sec in %s", out)
	}
	var err error
	if r.RPS, err = strconv.ParseFloat(string(m[1]), 64); err != nil {
		return r, fmt.Errorf("wrk: Requests/sec: %v", err)
	}
	m = reqsIn.FindSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("wrk: no \"N requests in\" in %s", out)
	}
	if r.Requests, err = strconv.ParseInt(string(m[1]), 10, 64); err != nil {
		return r, fmt.Errorf("wrk: requests: %v", err)
	}
	if r.Requests == 0 {
		return r, errors.New("wrk: 0 requests completed: the run is invalid")
	}
	r.P50us, r.P99us = parseWrkLatency(out)
	return r, nil
}

// wrkSeconds is wrk's -d argument for d: whole seconds, at least one.
func wrkSeconds(d time.Duration) string {
	return strconv.Itoa(int(math.Max(1, math.Round(d.Seconds())))) + "s"
}

func runWrk(ctx context.Context, o ProxyOptions, script, url string, d time.Duration) (wrkResult, error) {
	out, err := exec.CommandContext(ctx, o.Wrk, "-t"+strconv.Itoa(o.Threads), "-c"+strconv.Itoa(o.Connections), "-d"+wrkSeconds(d), "--latency", "-s", script, url).CombinedOutput()
	if err != nil {
		return wrkResult{}, fmt.Errorf("wrk: %v: %s", err, out)
	}
	return parseWrk(out)
}

// proxyChart is a bar chart of the median requests/s per target.
func proxyChart(ov *Overhead) string {
	md := ov.Medians()
	bars := []struct {
		name string
		v    float64
		col  string
	}{{"direct", md.Direct, "#7f7f7f"}, {"nginx proxy_pass", md.Nginx, "#1f77b4"}, {"kvexact gateway (rr)", md.Gateway, "#d62728"}}
	top := 0.0
	for _, b := range bars {
		top = math.Max(top, b.v)
	}
	const W, H, ml, bw = 560.0, 260.0, 150.0, 340.0
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica,Arial,sans-serif" font-size="12">`+"\n", W, H, W, H)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	fmt.Fprintf(&b, `<text x="8" y="20" font-size="14" font-weight="bold">Small-request throughput, median of %d rounds (req/s)</text>`+"\n", len(ov.Proxy))
	for i, bar := range bars {
		y := 50 + float64(i)*55
		w := bw * bar.v / math.Max(top, 1)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="end">%s</text>`, ml-8, y+22, bar.name)
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.1f" height="34" fill="%s"/>`, ml, y, w, bar.col)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f">%.0f</text>`+"\n", ml+w+6, y+22, bar.v)
	}
	if md.NginxCPUus > 0 {
		fmt.Fprintf(&b, `<text x="8" y="%.0f" fill="#333">CPU per request (median): nginx %.1f µs, gateway %.1f µs; load average %s</text>`+"\n", H-30, md.NginxCPUus, md.GatewayCPUus, ov.LoadAvg)
	}
	fmt.Fprintf(&b, `<text x="8" y="%.0f" fill="#333">gateway / nginx = %.2f, gateway / direct = %.2f (medians of per-round ratios)</text>`+"\n", H-12, ov.RatioVsNginx, ov.RatioVsDirect)
	b.WriteString("</svg>\n")
	return b.String()
}
