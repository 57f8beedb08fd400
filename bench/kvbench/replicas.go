package kvbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// ---- standalone gateway replicas behind nginx over one simulated pool ----

// ReplicaOptions configure kvbench replicas: every variant (a replica count) runs the same seeded
// workload at the same offered rate over a fresh pool of the same simulated engines, the variants
// alternated within each round.
type ReplicaOptions struct {
	Gateway, Nginx string
	Counts         []int // replica counts, e.g. 1, 2, 4
	Rounds         int
	Workload       string
	Load           float64 // fraction of the pool's uncached capacity
	Requests       int
	Seed           uint64
	Model          string
	Tokenizers     *tokenize.Pool
	Shape          PoolShape
	SLO            time.Duration
	// MaxFails and FailTimeout are nginx's passive health check per upstream server.
	MaxFails    int
	FailTimeout time.Duration
	// KillReplicas, when > 1, adds the failover run: that many replicas, one killed (SIGKILL) after a
	// third of KillRequests arrivals (long enough to outlast a few fail_timeouts).
	KillReplicas, KillRequests int
	Log                        io.Writer
}

// ReplicaCell is one variant in one round.
type ReplicaCell struct {
	Round       int         `json:"round"`
	Replicas    int         `json:"replicas"`
	Requests    int         `json:"requests"`
	Measured    int         `json:"measured"`
	Errors      int         `json:"errors"`
	CachedRatio float64     `json:"cachedRatio"`
	CachedSE    float64     `json:"cachedRatioSE"`
	TTFT        Percentiles `json:"ttftMs"`
	KVExact     int         `json:"kvExactDecisions"` // measured requests the replica routed on a KV-exact hit
	// Served and CPUus are per replica in start order: requests nginx sent it (the whole cell) and
	// its process's CPU time per request it served, µs.
	Served []int     `json:"served"`
	CPUus  []float64 `json:"cpuUsPerRequest"`
	Wall   float64   `json:"wallSeconds"`
}

// ReplicaSummary is one replica count over the rounds: medians and the range of the per-round values.
type ReplicaSummary struct {
	Replicas       int        `json:"replicas"`
	Rounds         int        `json:"rounds"`
	CachedRatio    float64    `json:"cachedRatio"`
	CachedRange    [2]float64 `json:"cachedRatioRange"`
	CachedSE       float64    `json:"cachedRatioSE"` // median of the rounds' standard errors
	TTFTp90        float64    `json:"ttftP90Ms"`
	TTFTp90Range   [2]float64 `json:"ttftP90RangeMs"`
	CPUusPerReq    float64    `json:"cpuUsPerRequestPerReplica"` // median over rounds and replicas
	CPUusAllPerReq float64    `json:"cpuUsPerRequestAllReplicas"`
	Errors         int        `json:"errors"`
}

// Failover is the kill of one replica under load, as the client and nginx saw it.
type Failover struct {
	Replicas      int     `json:"replicas"`
	MaxFails      int     `json:"maxFails"`
	FailTimeoutS  float64 `json:"failTimeoutSeconds"`
	Killed        string  `json:"killed"`
	KilledAtS     float64 `json:"killedAtSeconds"` // into the run
	Requests      int     `json:"requests"`
	SentAfterKill int     `json:"sentAfterKill"`
	// InFlightFailed: requests sent before the kill that failed; FailedAfterKill: sent after it.
	InFlightFailed  int `json:"inFlightFailed"`
	FailedAfterKill int `json:"failedAfterKill"`
	// LastErrorMs: when the last failed request ended, ms after the kill (0: none failed).
	LastErrorMs float64 `json:"lastErrorMs"`
	// DeadTriesMs: arrivals (ms after the kill) of the requests nginx tried on the dead replica
	// after the kill; Retried of them went on to another replica in the same request.
	DeadTriesMs []float64 `json:"deadTriesMs"`
	Retried     int       `json:"retried"`
	// ExcludedAfterMs: from the kill to the first try on the dead replica, after which nginx held it
	// out for fail_timeout.
	ExcludedAfterMs float64 `json:"excludedAfterMs"`
}

// ReplicaRun is what kvbench replicas writes.
type ReplicaRun struct {
	Command      string           `json:"command"`
	Machine      Machine          `json:"machine"`
	LoadAvg      string           `json:"loadAvg"`
	LoadAvgAfter string           `json:"loadAvgAfter"`
	Nginx        string           `json:"nginx"`
	NginxConf    string           `json:"nginxUpstream"`
	Gateway      string           `json:"gateway"`
	Workload     string           `json:"workload"`
	Load         float64          `json:"load"`
	Rate         float64          `json:"rate"`
	Requests     int              `json:"requests"`
	Pool         PoolShape        `json:"pool"`
	Cells        []ReplicaCell    `json:"cells"`
	Summary      []ReplicaSummary `json:"summary"`
	Failover     *Failover        `json:"failover,omitempty"`
}

// MeasureReplicas runs the rounds and, when asked, the failover run.
func MeasureReplicas(ctx context.Context, o ReplicaOptions) (*ReplicaRun, error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Rounds < 1 || len(o.Counts) == 0 {
		return nil, errors.New("at least one round and one replica count")
	}
	tok, err := o.Tokenizers.Get(o.Model)
	if err != nil {
		return nil, err
	}
	probe, err := BuildWorkload(o.Workload, o.Seed, 200, 1, DefaultShape(), o.Model, tok)
	if err != nil {
		return nil, err
	}
	rate := o.Load * o.Shape.Capacity(probe.MeanPromptTokens, DefaultShape().MaxTokens)
	w, err := BuildWorkload(o.Workload, o.Seed, o.Requests, rate, DefaultShape(), o.Model, tok)
	if err != nil {
		return nil, err
	}
	run := &ReplicaRun{Machine: ThisMachine(), Workload: o.Workload, Load: o.Load, Rate: rate, Requests: len(w.Requests), Pool: o.Shape,
		Gateway: describeBinary(o.Gateway), NginxConf: fmt.Sprintf("server … max_fails=%d fail_timeout=%s; proxy_next_upstream error timeout; keepalive 64", o.MaxFails, nginxDuration(o.FailTimeout))}
	if v, err := exec.Command(o.Nginx, "-v").CombinedOutput(); err == nil {
		run.Nginx = strings.TrimSpace(string(v))
	}
	env := &Env{Tokenizers: o.Tokenizers, Model: o.Model, Pool: o.Shape, SLO: o.SLO, Warmup: 0.2, Drain: 30 * time.Second}
	run.LoadAvg = loadAvg()
	fmt.Fprintf(o.Log, "replicas: %s, %d requests at %.1f req/s (load %.2f); load average %s\n", o.Workload, len(w.Requests), rate, o.Load, run.LoadAvg)
	for round := 0; round < o.Rounds; round++ {
		k := round % len(o.Counts)
		for _, n := range append(slices.Clone(o.Counts[k:]), o.Counts[:k]...) {
			c, _, err := replicaCell(ctx, o, env, w, n, -1)
			if err != nil {
				return run, fmt.Errorf("round %d, %d replicas: %w", round+1, n, err)
			}
			c.Round = round + 1
			fmt.Fprintf(o.Log, "round %d  %d replicas: cached %.3f ±%.3f, TTFT p50/p90 %.0f/%.0f ms, kv-exact %d/%d, errors %d, served %v, CPU µs/request %s\n",
				c.Round, n, c.CachedRatio, c.CachedSE, c.TTFT.P50, c.TTFT.P90, c.KVExact, c.Measured, c.Errors, c.Served, floats(c.CPUus))
			run.Cells = append(run.Cells, *c)
		}
	}
	run.Summary = SummarizeReplicas(run.Cells)
	if o.KillReplicas > 1 {
		kw, err := BuildWorkload(o.Workload, o.Seed, max(o.KillRequests, 30), rate, DefaultShape(), o.Model, tok)
		if err != nil {
			return run, err
		}
		_, f, err := replicaCell(ctx, o, env, kw, o.KillReplicas, 1)
		if err != nil {
			return run, fmt.Errorf("failover: %w", err)
		}
		run.Failover = f
		fmt.Fprintf(o.Log, "failover: %d replicas, %s killed at %.1fs: excluded after %.0f ms, tried at %s ms after the kill (%d retried elsewhere); in-flight failed %d, failed after the kill %d, last error %.0f ms after it\n",
			f.Replicas, f.Killed, f.KilledAtS, f.ExcludedAfterMs, floats(f.DeadTriesMs), f.Retried, f.InFlightFailed, f.FailedAfterKill, f.LastErrorMs)
	}
	run.LoadAvgAfter = loadAvg()
	return run, nil
}

func floats(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.FormatFloat(x, 'f', 0, 64)
	}
	return "[" + strings.Join(s, " ") + "]"
}

// nginxDuration is d as fail_timeout takes it: whole seconds, at least one.
func nginxDuration(d time.Duration) string {
	return strconv.Itoa(max(1, int(d.Round(time.Second).Seconds()))) + "s"
}

// replicaCell starts a fresh pool, n gateway processes over it and nginx in front, and drives w
// through nginx. kill ≥ 0 kills that replica after a third of the arrivals and returns the failover
// figures.
func replicaCell(ctx context.Context, o ReplicaOptions, env *Env, w *Workload, n, kill int) (*ReplicaCell, *Failover, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var cleanup []func()
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()
	tok, err := o.Tokenizers.Get(o.Model)
	if err != nil {
		return nil, nil, err
	}
	sims, eps, err := startSims(ctx, tok, o.Model, o.Shape, true, &cleanup)
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "kvbench-replicas-")
	if err != nil {
		return nil, nil, err
	}
	cleanup = append(cleanup, func() { os.RemoveAll(dir) })
	// The rule as each replica reads it, and the certificate ctk certify would issue for it.
	// The replicas read the tokenizer from the folder this process found it in.
	root := ""
	for _, r := range tokenize.DefaultRoots() {
		if _, err := os.Stat(filepath.Join(r, o.Model, "tokenizer.json")); err == nil {
			root = r
			break
		}
	}
	var y strings.Builder
	fmt.Fprintf(&y, "listen: 127.0.0.1:0\nadmin: {listen: \"127.0.0.1:0\", token: bench}\ndebugHeader: true\ntokenizers: {root: %q}\nrules:\n", root)
	fmt.Fprintf(&y, "  - name: %s\n    models: [%s]\n    engine: {family: %s, release: %s}\n    seed: %q\n    kvExactMode: 3\n    binding: engine\n    endpoints:\n", ruleName, o.Model, family, release, seed0)
	for _, ep := range eps {
		fmt.Fprintf(&y, "      - {name: %s, address: %q, capacityBlocks: %d, events: {zmq: [%q], replay: [%q]}}\n", ep.Name, ep.Address, ep.CapacityBlocks, ep.Events.ZMQ[0], ep.Events.Replay[0])
	}
	cfgPath := filepath.Join(dir, "rule.yaml")
	if err := os.WriteFile(cfgPath, []byte(y.String()), 0o644); err != nil {
		return nil, nil, err
	}
	cfg, err := rules.Load(cfgPath)
	if err != nil {
		return nil, nil, err
	}
	ct, err := contracts.Lookup(family, release)
	if err != nil {
		return nil, nil, err
	}
	cert := filepath.Join(dir, "certificate.json")
	if err := Certificate(cfg.Rules[0], ct, tok, o.Model).Write(cert); err != nil {
		return nil, nil, err
	}
	type replica struct {
		p             *groupProc
		client, admin string
	}
	reps := make([]replica, n)
	for i := range reps {
		rdir := filepath.Join(dir, fmt.Sprintf("r%d", i))
		if err := os.MkdirAll(rdir, 0o755); err != nil {
			return nil, nil, err
		}
		p, client, admin, err := startGatewayConfig(ctx, o.Gateway, y.String(), rdir, o.Log, "--certificate", cert)
		if err != nil {
			return nil, nil, fmt.Errorf("replica %d: %w", i, err)
		}
		cleanup = append(cleanup, p.stop)
		reps[i] = replica{p, client, admin}
	}
	// Every replica ready and its inventory fed by every engine before the run.
	for i, r := range reps {
		if err := waitReplica(ctx, r.client, r.admin, o.Model, eps); err != nil {
			return nil, nil, r.p.explain(fmt.Errorf("replica %d: %w", i, err))
		}
	}
	nport, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	var ub strings.Builder
	for _, r := range reps {
		fmt.Fprintf(&ub, "    server %s max_fails=%d fail_timeout=%s;\n", r.client, o.MaxFails, nginxDuration(o.FailTimeout))
	}
	// One worker: nginx's passive health state is per worker without a shared zone, and one
	// worker carries these rates easily.
	conf := fmt.Sprintf(`worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log crit;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  upstream replicas {
%[2]s    keepalive 64;
  }
  server {
    listen 127.0.0.1:%[3]d;
    location / {
      proxy_pass http://replicas;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_next_upstream error timeout;
      add_header X-Upstream $upstream_addr always;
    }
  }
}
`, dir, ub.String(), nport)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
		return nil, nil, err
	}
	ntail := &tailBuffer{max: 4096}
	ng := exec.Command(o.Nginx, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;")
	ng.Stderr = io.MultiWriter(o.Log, ntail)
	np, err := startGroup("nginx", ng, ntail)
	if err != nil {
		return nil, nil, err
	}
	cleanup = append(cleanup, np.stop)
	front := fmt.Sprintf("http://127.0.0.1:%d", nport)
	if err := waitListening(ctx, fmt.Sprintf("127.0.0.1:%d", nport)); err != nil {
		return nil, nil, np.explain(err)
	}

	before := make([]time.Duration, n)
	for i, r := range reps {
		if before[i], _, err = groupCPU("/proc", r.p.pgid); err != nil {
			return nil, nil, err
		}
	}
	bs := sims[0].Config().BlockSize
	transport := &http.Transport{MaxIdleConns: 2048, MaxIdleConnsPerHost: 2048, IdleConnTimeout: 30 * time.Second, DisableCompression: true}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}
	results := make([]Result, len(w.Requests))
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	var wg sync.WaitGroup
	start := time.Now().Add(20 * time.Millisecond)
	wallStart := time.Now()
	var killedAt time.Time
	killIdx := len(w.Requests) / 3
	for i := range w.Requests {
		q := &w.Requests[i]
		at := start.Add(q.Arrival)
		if d := time.Until(at); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		if kill >= 0 && i == killIdx {
			syscall.Kill(-reps[kill].p.pgid, syscall.SIGKILL)
			killedAt = time.Now()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = send(rctx, client, front, q, at, bs)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(env.Drain):
		rcancel()
		<-done
	}
	c := &ReplicaCell{Replicas: n, Wall: time.Since(wallStart).Seconds(), Served: make([]int, n), CPUus: make([]float64, n)}
	addrs := make([]string, n)
	for i, r := range reps {
		addrs[i] = r.client
	}
	for _, r := range results {
		if i := slices.Index(addrs, lastUpstream(r.Upstream)); i >= 0 {
			c.Served[i]++
		}
	}
	for i, r := range reps {
		if i == kill {
			continue // its process is gone
		}
		after, _, err := groupCPU("/proc", r.p.pgid)
		if err != nil {
			return nil, nil, err
		}
		c.CPUus[i] = cpuPerRequest(after-before[i], int64(c.Served[i]))
	}
	sum := summarize(env, w, Policy{Name: fmt.Sprintf("%d replicas", n)}, o.Load, 0, results, start)
	c.Requests, c.Measured, c.Errors, c.CachedRatio, c.CachedSE, c.TTFT = sum.Requests, sum.Measured, sum.Errors, sum.CachedRatio, sum.CachedRatioSE, sum.TTFT
	skip := len(results) - sum.Measured
	for _, r := range results[skip:] {
		if r.Tier == "kv-exact" {
			c.KVExact++
		}
	}
	if kill < 0 {
		return c, nil, ctx.Err()
	}
	sent := make([]time.Time, len(results))
	for i := range results {
		sent[i] = start.Add(w.Requests[i].Arrival)
	}
	f := AnalyzeFailover(results, sent, killedAt, addrs[kill])
	f.Replicas, f.MaxFails, f.FailTimeoutS, f.KilledAtS = n, o.MaxFails, o.FailTimeout.Seconds(), killedAt.Sub(start).Seconds()
	return c, f, ctx.Err()
}

// lastUpstream is the upstream that answered: the last of nginx's $upstream_addr list.
func lastUpstream(s string) string {
	tried := upstreamsTried(s)
	if len(tried) == 0 {
		return ""
	}
	return tried[len(tried)-1]
}

// upstreamsTried splits nginx's $upstream_addr into the addresses tried, in order.
func upstreamsTried(s string) []string {
	var out []string
	for _, part := range strings.Split(strings.ReplaceAll(s, " : ", ", "), ",") {
		if p := strings.TrimSpace(part); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// AnalyzeFailover reads the failover run's results: sent[i] is request i's send time, dead the
// killed replica's address.
func AnalyzeFailover(rs []Result, sent []time.Time, killedAt time.Time, dead string) *Failover {
	f := &Failover{Killed: dead, Requests: len(rs), DeadTriesMs: []float64{}}
	first := true
	for i, r := range rs {
		ok := r.Err == "" && r.Status == http.StatusOK
		after := !sent[i].Before(killedAt)
		if after {
			f.SentAfterKill++
		}
		if !ok {
			if after {
				f.FailedAfterKill++
			} else {
				f.InFlightFailed++
			}
			if end := ms(sent[i].Add(r.E2E).Sub(killedAt)); end > f.LastErrorMs {
				f.LastErrorMs = end
			}
		}
		if !after {
			continue
		}
		tried := upstreamsTried(r.Upstream)
		if slices.Contains(tried, dead) {
			at := ms(sent[i].Sub(killedAt))
			f.DeadTriesMs = append(f.DeadTriesMs, at)
			if first || at < f.ExcludedAfterMs {
				f.ExcludedAfterMs, first = at, false
			}
			if ok && len(tried) > 1 {
				f.Retried++
			}
		}
	}
	slices.Sort(f.DeadTriesMs)
	return f
}

// SummarizeReplicas reduces the cells to one summary per replica count, in the order counts first
// appear.
func SummarizeReplicas(cells []ReplicaCell) []ReplicaSummary {
	var order []int
	by := map[int][]ReplicaCell{}
	for _, c := range cells {
		if _, ok := by[c.Replicas]; !ok {
			order = append(order, c.Replicas)
		}
		by[c.Replicas] = append(by[c.Replicas], c)
	}
	slices.Sort(order)
	var out []ReplicaSummary
	for _, n := range order {
		cs := by[n]
		s := ReplicaSummary{Replicas: n, Rounds: len(cs)}
		var cached, se, p90, cpu, cpuAll []float64
		for _, c := range cs {
			cached, se, p90 = append(cached, c.CachedRatio), append(se, c.CachedSE), append(p90, c.TTFT.P90)
			s.Errors += c.Errors
			var tot float64
			var served int
			for i, v := range c.CPUus {
				if c.Served[i] > 0 {
					cpu = append(cpu, v)
					tot += v * float64(c.Served[i])
					served += c.Served[i]
				}
			}
			if served > 0 {
				cpuAll = append(cpuAll, tot/float64(served))
			}
		}
		s.CachedRatio, s.CachedSE, s.TTFTp90 = median(cached), median(se), median(p90)
		s.CachedRange = [2]float64{slices.Min(cached), slices.Max(cached)}
		s.TTFTp90Range = [2]float64{slices.Min(p90), slices.Max(p90)}
		s.CPUusPerReq, s.CPUusAllPerReq = median(cpu), median(cpuAll)
		out = append(out, s)
	}
	return out
}

// ReplicaTable is the run as a Markdown table, with its command, machine and load.
func ReplicaTable(r *ReplicaRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "`%s` — %d cores, load average %s at the start, %s at the end; %s; workload %s, %d requests at %.1f req/s (load %.2f of the uncached capacity of %d simulated engines); gateway %s.\n\n",
		r.Command, r.Machine.Cores, r.LoadAvg, r.LoadAvgAfter, r.Nginx, r.Workload, r.Requests, r.Rate, r.Load, r.Pool.Endpoints, r.Gateway)
	b.WriteString("| replicas | rounds | cached ratio (median; range; SE) | TTFT p90 ms (median; range) | CPU µs/request per replica | errors |\n|---|---|---|---|---|---|\n")
	for _, s := range r.Summary {
		fmt.Fprintf(&b, "| %d | %d | %.3f; %.3f–%.3f; ±%.3f | %.0f; %.0f–%.0f | %.0f | %d |\n", s.Replicas, s.Rounds, s.CachedRatio, s.CachedRange[0], s.CachedRange[1], s.CachedSE,
			s.TTFTp90, s.TTFTp90Range[0], s.TTFTp90Range[1], s.CPUusPerReq, s.Errors)
	}
	if f := r.Failover; f != nil {
		fmt.Fprintf(&b, "\nFailover: %d replicas behind nginx (%s), one killed with SIGKILL %.1f s into the run. nginx's first try on it after the kill came %.0f ms after it; its tries on it, ms after the kill: %s (%d of them retried on another replica within the same request). Requests failed: %d in flight at the kill, %d sent after it; the last error ended %.0f ms after the kill.\n",
			f.Replicas, r.NginxConf, f.KilledAtS, f.ExcludedAfterMs, floats(f.DeadTriesMs), f.Retried, f.InFlightFailed, f.FailedAfterKill, f.LastErrorMs)
	}
	return b.String()
}

// waitReplica waits until the replica answers /readyz 200 and its inventory holds keys of every
// engine: each engine gets one short prompt directly until the replica's admin shows its events
// (ZeroMQ drops what is published before a subscription reaches the publisher).
func waitReplica(ctx context.Context, client, admin, model string, eps []rules.Endpoint) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + client + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			err = fmt.Errorf("/readyz %d: %s", resp.StatusCode, b)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not ready within 30s (%v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, ep := range eps {
		for n := 0; ; n++ {
			k, err := inventorySize(admin, ep.Name)
			if err != nil {
				return err
			}
			if k > 0 {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("endpoint %s: no KV event seen within 30s", ep.Name)
			}
			body, _ := json.Marshal(map[string]any{"model": model, "prompt": fmt.Sprintf("Warm up endpoint %d, round %d: one short line of text, a little longer than a block.", i, n), "max_tokens": 1})
			if resp, err := http.Post(ep.Address+"/v1/completions", "application/json", bytes.NewReader(body)); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

func inventorySize(admin, ep string) (int, error) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+admin+"/admin/inventory/"+ruleName+"/"+ep, nil)
	req.Header.Set("Authorization", "Bearer bench")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var d struct {
		Blocks []json.RawMessage `json:"blocks"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &d) != nil {
		return 0, fmt.Errorf("inventory of %s: %d %s", ep, resp.StatusCode, raw)
	}
	return len(d.Blocks), nil
}

func waitListening(ctx context.Context, addr string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not listening within 10s: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
