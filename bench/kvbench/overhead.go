package kvbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// Overhead holds the decision-time and proxy-throughput figures.
type Overhead struct {
	Decision []DecisionFigure `json:"decision"`
	Proxy    []ProxyRound     `json:"proxy,omitempty"`
	// Median ratios over the rounds (each round measures all three back to back).
	RatioVsNginx  float64 `json:"ratioVsNginx,omitempty"`
	RatioVsDirect float64 `json:"ratioVsDirect,omitempty"`
	WrkCommand    string  `json:"wrkCommand,omitempty"`
	Nginx         string  `json:"nginx,omitempty"`
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
	if rig.router, err = pool.G.Resolve("127.0.0.1:0", model); err != nil {
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
type ProxyRound struct {
	Direct  float64 `json:"directRps"`
	Nginx   float64 `json:"nginxRps"`
	Gateway float64 `json:"gatewayRps"`
	Order   string  `json:"order"`
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
			io.Copy(io.Discard, r.Body)
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
	Connections int
	Threads     int
	Nginx       string // nginx binary
	Wrk         string // wrk binary
	Log         io.Writer
}

// MeasureProxy runs wrk against the upstream directly, through nginx proxy_pass (round robin over
// the same upstreams, keep-alive) and through the gateway (rule selector rr, mode 0), alternating
// the three in each round and rotating the order between rounds.
func MeasureProxy(ctx context.Context, o ProxyOptions, ov *Overhead) error {
	if o.Log == nil {
		o.Log = io.Discard
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

	dir, err := os.MkdirTemp("", "kvbench-nginx-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
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
  }
}
`, ThisMachine().Cores, dir, ub.String(), nport)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
		return err
	}
	if v, err := exec.Command(o.Nginx, "-v").CombinedOutput(); err == nil {
		ov.Nginx = strings.TrimSpace(string(v))
	}
	ng := exec.CommandContext(ctx, o.Nginx, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;")
	ng.Stderr = o.Log
	ng.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := ng.Start(); err != nil {
		return fmt.Errorf("nginx: %w", err)
	}
	defer func() {
		_ = syscall.Kill(-ng.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = ng.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-ng.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}()

	// The gateway: one rule, round robin over the same upstreams, no KV-exact, no debug header.
	rule := rules.Rule{Name: "rr", Models: []string{"llama3"}, Engine: rules.EngineRef{Family: family, Release: release}, Selector: "rr"}
	for i, a := range ups {
		rule.Endpoints = append(rule.Endpoints, rules.Endpoint{Name: fmt.Sprintf("u%d", i), Address: "http://" + a})
	}
	cfg := &rules.Config{Listen: "127.0.0.1:0", Admin: rules.Admin{Listen: "127.0.0.1:0", Token: "bench"}, Rules: []rules.Rule{rule}}
	if err := cfg.Normalize(); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	g, err := gateway.New(gateway.Options{Config: cfg, Tokenizers: tokenize.NewPool(""), Registry: reg, ProbeInterval: -1, Log: quiet})
	if err != nil {
		return err
	}
	if err := g.Start(ctx); err != nil {
		return err
	}
	defer g.Close()
	px := proxy.New(proxy.Config{Resolve: func(l, m string) (*route.Router, error) {
		r, err := g.Resolve(l, m)
		if err != nil {
			return nil, &proxy.ModelNotFound{Listener: l, Model: m}
		}
		return r, nil
	}, Routers: g.Routers, Metrics: proxy.NewMetrics(reg)})
	srv, err := g.Serve(px.Handler, proxy.ParseRequest)
	if err != nil {
		return err
	}
	defer func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		srv.Shutdown(sctx)
	}()

	targets := map[string]string{
		"direct":  "http://" + ups[0],
		"nginx":   fmt.Sprintf("http://127.0.0.1:%d", nport),
		"gateway": "http://" + srv.Client["127.0.0.1:0"],
	}
	// Delivery check before measuring: every target answers 200 with the upstream's receipt.
	for name, base := range targets {
		if err := waitServing(ctx, base, name == "gateway"); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	script := filepath.Join(dir, "post.lua")
	lua := fmt.Sprintf("wrk.method = \"POST\"\nwrk.body = '%s'\nwrk.headers[\"Content-Type\"] = \"application/json\"\n", smallRequest)
	if err := os.WriteFile(script, []byte(lua), 0o644); err != nil {
		return err
	}
	ov.WrkCommand = fmt.Sprintf("wrk -t%d -c%d -d%s -s post.lua <target>/v1/completions (body %s)", o.Threads, o.Connections, o.Duration, smallRequest)
	order := []string{"direct", "nginx", "gateway"}
	for round := 0; round < o.Rounds; round++ {
		var pr ProxyRound
		rot := append(append([]string{}, order[round%3:]...), order[:round%3]...)
		pr.Order = strings.Join(rot, ",")
		for _, name := range rot {
			rps, err := runWrk(ctx, o, script, targets[name]+"/v1/completions")
			if err != nil {
				return fmt.Errorf("round %d %s: %w", round+1, name, err)
			}
			fmt.Fprintf(o.Log, "round %d %-8s %9.0f req/s\n", round+1, name, rps)
			switch name {
			case "direct":
				pr.Direct = rps
			case "nginx":
				pr.Nginx = rps
			case "gateway":
				pr.Gateway = rps
			}
		}
		ov.Proxy = append(ov.Proxy, pr)
	}
	var vn, vd []float64
	for _, r := range ov.Proxy {
		vn, vd = append(vn, r.Gateway/r.Nginx), append(vd, r.Gateway/r.Direct)
	}
	ov.RatioVsNginx, ov.RatioVsDirect = median(vn), median(vd)
	return nil
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
			err = fmt.Errorf("status %d, receipt %q: %s", resp.StatusCode, served, b)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var (
	reqPerSec = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	non2xx    = regexp.MustCompile(`Non-2xx or 3xx responses:\s+(\d+)`)
	sockErr   = regexp.MustCompile(`Socket errors:.*`)
)

func runWrk(ctx context.Context, o ProxyOptions, script, url string) (float64, error) {
	secs := int(math.Max(1, math.Round(o.Duration.Seconds())))
	out, err := exec.CommandContext(ctx, o.Wrk, "-t"+strconv.Itoa(o.Threads), "-c"+strconv.Itoa(o.Connections), "-d"+strconv.Itoa(secs)+"s", "-s", script, url).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("wrk: %v: %s", err, out)
	}
	if m := non2xx.FindSubmatch(out); m != nil {
		return 0, fmt.Errorf("wrk: %s non-2xx responses: the run is invalid", m[1])
	}
	if m := sockErr.Find(out); m != nil {
		return 0, fmt.Errorf("wrk: %s: the run is invalid", m)
	}
	m := reqPerSec.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("wrk: no Requests/sec in %s", out)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// proxyChart is a bar chart of the median requests/s per target.
func proxyChart(ov *Overhead) string {
	var d, n, g []float64
	for _, r := range ov.Proxy {
		d, n, g = append(d, r.Direct), append(n, r.Nginx), append(g, r.Gateway)
	}
	bars := []struct {
		name string
		v    float64
		col  string
	}{{"direct", median(d), "#7f7f7f"}, {"nginx proxy_pass", median(n), "#1f77b4"}, {"kvexact gateway (rr)", median(g), "#d62728"}}
	top := 0.0
	for _, b := range bars {
		top = math.Max(top, b.v)
	}
	const W, H, ml, bw = 560.0, 240.0, 150.0, 340.0
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
	fmt.Fprintf(&b, `<text x="8" y="%.0f" fill="#333">gateway / nginx = %.2f, gateway / direct = %.2f (medians of per-round ratios)</text>`+"\n", H-12, ov.RatioVsNginx, ov.RatioVsDirect)
	b.WriteString("</svg>\n")
	return b.String()
}
