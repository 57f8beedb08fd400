// Command kvbench measures routing quality and overhead: it drives seeded workloads through the
// gateway (one pool of simulators per cell) under every routing policy and an oracle, checks the
// decision and delivery proofs of each cell, and writes JSON results and SVG charts.
//
//	kvbench [--quick] [--out dir] [--charts dir]   routing quality sweep
//	kvbench --seeds 1,2,3 [...]                    the sweep once per seed: results-seedN.json, seeds.md
//	kvbench overhead [--out dir] [--gateway bin] [--no-decision]  decision time and proxy throughput vs nginx
//	kvbench replicas [--counts 1,2,4] [--rounds 3] [--kill 2]  gateway replicas behind nginx: quality, CPU, failover
//	kvbench doc --raw dir --out docs/BENCHMARKS.md  assemble the benchmark document
//	kvbench drive --run LABEL=URL... [--clear URL]  drive running gateway listeners (make demo)
//	kvbench charts --results results.json --charts dir   redraw a sweep's charts
//	kvbench seeds --results a.json,b.json,... [--out table.md]  means and ranges over seeds, the verdicts
//	kvbench scale [--endpoints 16,64] [--resident 10000000] [--prompts 1024,...,102400] [--multiturn] [--key-cache-bytes 67108864]
//	                                                decision time, memory per key at pool scale
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvexact/kvexact/bench/kvbench"
	"github.com/kvexact/kvexact/gateway/tokenize"
	"github.com/kvexact/kvexact/internal/buildinfo"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	if buildinfo.Flag("kvbench", args, os.Stdout) {
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(args) > 0 {
		switch args[0] {
		case "overhead":
			return runOverhead(ctx, args[1:])
		case "doc":
			return runDoc(args[1:])
		case "upstream":
			return runUpstream(ctx, args[1:])
		case "drive":
			return drive(args[1:])
		case "scale":
			return runScale(ctx, args[1:])
		case "replicas":
			return runReplicas(ctx, args[1:])
		case "charts":
			return runCharts(args[1:])
		case "seeds":
			return runSeeds(args[1:])
		case "status":
			return status(args[1:])
		}
	}
	return runSweep(ctx, args)
}

func runSweep(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kvbench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "one workload, one load, three policies: checks the harness end to end in seconds")
	out := fs.String("out", ".cache/bench/kvbench", "directory for results.json")
	charts := fs.String("charts", "", "directory for the SVG charts (default: the --out directory)")
	model := fs.String("model", "llama3", "tokenizer model slug")
	slo := fs.Duration("slo", 300*time.Millisecond, "TTFT bound of goodput (default: twice an uncached 1k-token prefill)")
	seed := fs.Uint64("seed", 1, "workload seed")
	seedList := fs.String("seeds", "", "comma-separated workload seeds: every cell once per seed, the seeds of a cell one after the other (their order rotating from cell to cell), written to results-seedN.json and the seeds table to seeds.md (no charts); not with --seed")
	dur := fs.Duration("duration", 0, "arrival window per cell (default: the plan's)")
	workloads := fs.String("workloads", "", "comma-separated workloads (default: all)")
	loads := fs.String("loads", "", "comma-separated offered loads, fractions of the uncached pool capacity (default: the plan's)")
	noLaws := fs.Bool("no-laws", false, "skip the load-law variants")
	endpoints := fs.Int("endpoints", 4, "simulated engines (at most 256); above 4 their simulated time slows in proportion, so the offered rate stays that of 4")
	policies := fs.String("policies", "", "comma-separated policy names to run, of the plan's (default: all)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	plan := kvbench.DefaultPlan()
	if *quick {
		plan = kvbench.QuickPlan()
	}
	plan.Seed = *seed
	if *dur > 0 {
		plan.Duration = *dur
	}
	if *workloads != "" {
		plan.Workloads = strings.Split(*workloads, ",")
		var law []string
		for _, w := range plan.LawWorkloads {
			for _, x := range plan.Workloads {
				if w == x {
					law = append(law, w)
				}
			}
		}
		plan.LawWorkloads = law
	}
	if *loads != "" {
		plan.Loads = nil
		for _, f := range strings.Split(*loads, ",") {
			v, err := strconv.ParseFloat(f, 64)
			if err != nil || v <= 0 {
				fmt.Fprintf(os.Stderr, "kvbench: --loads: %q is not a positive number\n", f)
				return 2
			}
			plan.Loads = append(plan.Loads, v)
		}
	}
	if *policies != "" {
		keep, err := selectPolicies(*policies, slices.Concat(plan.Policies, plan.LawPolicies, kvbench.PredictTTLVariants(), kvbench.MissPlacementVariants(), []kvbench.Policy{kvbench.KVExactGPUOnly()}))
		if err != nil {
			fmt.Fprintf(os.Stderr, "kvbench: --policies: %v\n", err)
			return 2
		}
		plan.Policies = keep
		plan.LawPolicies, plan.LawWorkloads, plan.LawLoads = nil, nil, nil
	}
	if *noLaws {
		plan.LawPolicies, plan.LawWorkloads, plan.LawLoads = nil, nil, nil
	}
	toks := tokenize.NewPool("")
	if _, err := toks.Get(*model); err != nil {
		fmt.Fprintf(os.Stderr, "kvbench: tokenizer %s: %v (run make tokenizers or set KVEXACT_TOKENIZERS)\n", *model, err)
		return 1
	}
	if *endpoints < 1 || *endpoints > 256 {
		fmt.Fprintf(os.Stderr, "kvbench: --endpoints: %d is not in 1..256\n", *endpoints)
		return 2
	}
	shape := kvbench.DefaultPoolShape()
	if *endpoints != shape.Endpoints {
		// The SLO follows the slower simulated prefill unless given.
		sloSet := false
		fs.Visit(func(f *flag.Flag) { sloSet = sloSet || f.Name == "slo" })
		if !sloSet {
			*slo = time.Duration(float64(*slo) * float64(*endpoints) / float64(shape.Endpoints))
		}
		shape = shape.Scaled(*endpoints)
	}
	env := &kvbench.Env{Tokenizers: toks, Model: *model, Pool: shape, SLO: *slo, Warmup: 0.2, Drain: 30 * time.Second}
	command := "kvbench " + strings.Join(args, " ")
	if *seedList != "" {
		seedSet := false
		fs.Visit(func(f *flag.Flag) { seedSet = seedSet || f.Name == "seed" })
		seeds, err := parseSeeds(*seedList)
		if err != nil || seedSet {
			fmt.Fprintf(os.Stderr, "kvbench: --seeds: %v\n", cmp.Or(err, errors.New("not with --seed")))
			return 2
		}
		return runSeedSweep(ctx, env, plan, seeds, command, *out)
	}
	results := filepath.Join(*out, "results.json")
	var saveErr error
	// results.json is rewritten after every cell, so an interrupted or failing sweep keeps what it
	// measured; the document names the cells still missing.
	rep, err := kvbench.Run(ctx, env, plan, func(rep *kvbench.Report, c *kvbench.Cell) {
		printCell("", c)
		rep.Command = command
		if err := kvbench.SaveReport(results, rep); err != nil && saveErr == nil {
			saveErr = err
			fmt.Fprintf(os.Stderr, "kvbench: %v\n", err)
		}
	})
	if rep == nil {
		fmt.Fprintf(os.Stderr, "kvbench: %v\n", err)
		return 1
	}
	rep.Command = command
	if werr := writeReport(rep, results, *charts, *out); werr != nil {
		fmt.Fprintf(os.Stderr, "kvbench: %v\n", werr)
		return 1
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench: %v (results.json holds the %d cells measured)\n", err, len(rep.Cells))
		return 1
	}
	for _, t := range rep.Targets {
		status := "MISSED"
		switch {
		case !t.Evaluated:
			status = "NOT EVALUATED (" + t.Note + ")"
		case t.Met:
			status = "met"
		}
		fmt.Fprintf(os.Stderr, "target %-32s %-13s load %.2f: %s — %s\n", t.Name, t.Workload, t.Load, t.Got, status)
	}
	if saveErr != nil {
		return 1
	}
	if failed := rep.Failed(); len(failed) > 0 {
		for _, c := range failed {
			fmt.Fprintf(os.Stderr, "kvbench: cell %s / %s / load %.2f failed: %s\n", c.Workload, c.Policy, c.Load, c.Error)
		}
		return exitFailedCells
	}
	return 0
}

// printCell writes one measured cell's line (and its TTFT prediction error) to stderr.
func printCell(prefix string, c *kvbench.Cell) {
	valid := "valid"
	if !c.Valid {
		valid = "INVALID: " + strings.Join(c.Invalid, "; ")
	}
	fmt.Fprintf(os.Stderr, "%s%-13s %-24s load %.2f (%5.1f rps) n=%3d cached %.3f ttft p50/p90/p99 %4.0f/%4.0f/%4.0f ms tput %5.1f good %5.1f imb %.2f err %d wall %.1fs %s\n",
		prefix, c.Workload, c.Policy, c.Load, c.Rate, c.Requests, c.CachedRatio, c.TTFT.P50, c.TTFT.P90, c.TTFT.P99, c.Throughput, c.Goodput, c.Imbalance, c.Errors, c.Wall, valid)
	if ev := c.Evidence; ev.TTFTPredictions > 0 {
		fmt.Fprintf(os.Stderr, "%s%-13s %-24s load %.2f ttft prediction error over %d answers: median %+.3f, median absolute %.3f; gateway's receipts %d, within ±10 %% %.2f, ±25 %% %.2f\n",
			prefix, c.Workload, c.Policy, c.Load, ev.TTFTPredictions, ev.TTFTErrorMedian, ev.TTFTErrorMedianAbs, ev.GatewayTTFTReceipts, ev.GatewayTTFTWithin10, ev.GatewayTTFTWithin25)
	}
}

// exitFailedCells is the sweep's exit status when it ran every cell but some failed: results.json
// and the charts are written, the failures recorded with their reasons (scripts/bench.sh goes on).
const exitFailedCells = 3

func writeReport(rep *kvbench.Report, results, charts, out string) error {
	if err := kvbench.SaveReport(results, rep); err != nil {
		return err
	}
	if charts == "" {
		charts = out
	}
	return kvbench.WriteCharts(rep, charts)
}

func runOverhead(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kvbench overhead", flag.ContinueOnError)
	out := fs.String("out", ".cache/bench/kvbench", "directory for overhead.json")
	charts := fs.String("charts", "", "directory for proxy-throughput.svg (default: the --out directory)")
	model := fs.String("model", "llama3", "tokenizer model slug")
	rounds := fs.Int("rounds", 5, "rounds of direct / nginx / gateway, the order rotating (the median ratio needs at least 5)")
	dur := fs.Duration("duration", 3*time.Second, "wrk duration per measurement (whole seconds)")
	warmup := fs.Duration("warmup", time.Second, "one unrecorded wrk run per target before round 1 (0: none)")
	conns := fs.Int("c", 32, "wrk connections")
	threads := fs.Int("t", 2, "wrk threads")
	nginx := fs.String("nginx", "nginx", "nginx binary (Debian nginx-light)")
	wrk := fs.String("wrk", "wrk", "wrk binary")
	gatewayBin := fs.String("gateway", "", "`PATH` of the gateway binary to measure (default: a gateway binary beside this executable, else go build ./cmd/gateway into a temporary directory)")
	skipProxy := fs.Bool("no-proxy", false, "decision time only")
	skipDecision := fs.Bool("no-decision", false, "proxy comparison only (no decision-time benchmarks): for alternating gateway builds quickly")
	latencyRate := fs.Int("latency-rate", 1000, "fixed rate of the latency rounds, small requests/s (0: no latency rounds)")
	latencyDur := fs.Duration("latency-duration", 3*time.Second, "length of each fixed-rate run")
	streamN := fs.Int("stream-requests", 300, "streaming requests per target per round for time to first byte (0: none)")
	baseline := fs.String("baseline", "", "`PATH` of a second gateway binary measured in the same rounds (e.g. the previous release); with --envoy, its picker behind its own Envoy too")
	baselineName := fs.String("baseline-name", "baseline", "the baseline's name in the tables")
	baselineEnvoy := fs.String("baseline-envoy-template", "", "`PATH` of the Envoy template the baseline's picker runs behind (default: the shipped deploy/envoy/envoy.yaml.tmpl)")
	minPicker := fs.String("min-picker", "", "`PATH` of the minimal picker (go build ./bench/minpicker; default: built from this module), measured behind its own Envoy with --envoy")
	envoy := fs.String("envoy", "", "`PATH` of an Envoy binary: Envoy alone (round robin) and Envoy in front of the gateway's Endpoint Picker join the same rounds")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ov := &kvbench.Overhead{Machine: kvbench.ThisMachine(), Command: strings.TrimSpace("kvbench overhead " + strings.Join(args, " "))}
	// The proxy comparison's prerequisites are checked before the decision benchmarks, so a missing
	// nginx or wrk fails in a second, not after them.
	var proxyErr error
	var gw string
	if !*skipProxy {
		if proxyErr = kvbench.CheckProxyTools(*nginx, *wrk); proxyErr == nil {
			var cleanup func()
			gw, cleanup, proxyErr = kvbench.ResolveGateway(ctx, *gatewayBin, os.Stderr)
			defer cleanup()
		}
		if proxyErr != nil {
			fmt.Fprintf(os.Stderr, "kvbench overhead: proxy comparison cannot run: %v\n", proxyErr)
		} else {
			fmt.Fprintf(os.Stderr, "kvbench overhead: gateway binary %s\n", gw)
		}
	}
	if *skipDecision && *skipProxy {
		fmt.Fprintln(os.Stderr, "kvbench overhead: --no-decision and --no-proxy together leave nothing to measure")
		return 2
	}
	if !*skipDecision {
		var err error
		if ov.Decision, err = kvbench.MeasureDecision(ctx, tokenize.NewPool(""), *model, []int{1024, 8192}); err != nil {
			fmt.Fprintf(os.Stderr, "kvbench overhead: decision: %v\n", err)
			return 1
		}
	}
	for _, d := range ov.Decision {
		fmt.Fprintf(os.Stderr, "decision %5d tokens (%d blocks): tokenize %.0f µs, hash %.0f µs, whole decision %.0f µs (%d allocs), score %d\n",
			d.PromptTokens, d.Blocks, d.TokenizeUs, d.HashUs, d.DecisionUs, d.AllocsPerOp, d.Score)
	}
	if !*skipProxy {
		if proxyErr == nil {
			var self string
			if self, proxyErr = os.Executable(); proxyErr == nil {
				proxyErr = kvbench.MeasureProxy(ctx, kvbench.ProxyOptions{UpstreamCmd: []string{self, "upstream"}, Rounds: *rounds, Duration: *dur,
					Warmup: *warmup, Connections: *conns, Threads: *threads, Nginx: *nginx, Wrk: *wrk, Gateway: gw, Log: os.Stderr,
					Baseline: *baseline, BaselineName: *baselineName, LatencyRate: *latencyRate, LatencyDuration: *latencyDur, StreamRequests: *streamN, Envoy: *envoy, BaselineEnvoyTemplate: *baselineEnvoy, MinPicker: *minPicker}, ov)
			}
		}
		if proxyErr != nil {
			// Reported, not hidden: the JSON and the document say the comparison did not run and why,
			// and the command fails (exitNoProxy) once they are written.
			ov.ProxyError = proxyErr.Error()
			ov.Proxy = nil
			fmt.Fprintf(os.Stderr, "kvbench overhead: proxy comparison: %v\n", proxyErr)
		} else {
			m := ov.Medians()
			fmt.Fprintf(os.Stderr, "medians of %d rounds: direct %.0f req/s; nginx %.0f req/s, %.1f CPU µs/request; gateway %.0f req/s, %.1f CPU µs/request\n",
				len(ov.Proxy), m.Direct, m.Nginx, m.NginxCPUus, m.Gateway, m.GatewayCPUus)
			fmt.Fprintf(os.Stderr, "gateway/nginx median ratio %.2f (CPU per request %.2f), gateway/direct %.2f; load average %s at the start, %s at the end\n",
				ov.RatioVsNginx, ov.CPURatioVsNginx, ov.RatioVsDirect, ov.LoadAvg, ov.LoadAvgAfter)
		}
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "kvbench overhead: %v\n", err)
		return 1
	}
	b, _ := json.MarshalIndent(ov, "", "  ")
	if err := os.WriteFile(filepath.Join(*out, "overhead.json"), b, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "kvbench overhead: %v\n", err)
		return 1
	}
	if *charts == "" {
		*charts = *out
	}
	// The overhead section as BENCHMARKS.md renders it, for this run alone.
	if err := os.WriteFile(filepath.Join(*out, "overhead.md"), []byte(kvbench.OverheadSection(ov, *charts)), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "kvbench overhead: %v\n", err)
		return 1
	}
	if err := kvbench.WriteProxyChart(ov, *charts); err != nil {
		fmt.Fprintf(os.Stderr, "kvbench overhead: %v\n", err)
		return 1
	}
	if proxyErr != nil {
		return exitNoProxy
	}
	return 0
}

// exitNoProxy is kvbench overhead's exit status when the decision figures were measured and
// written but the proxy comparison did not run (overhead.json's proxyError says why).
const exitNoProxy = 3

// runUpstream is the tiny upstream of the proxy comparison, in its own process so that neither
// proxy shares a Go runtime with it. It prints its addresses on one line and exits when its stdin
// closes (its parent ended).
func runUpstream(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kvbench upstream", flag.ContinueOnError)
	n := fs.Int("n", 4, "number of upstream listeners")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { io.Copy(io.Discard, os.Stdin); cancel() }()
	err := kvbench.ServeUpstream(ctx, *n, func(addrs []string) {
		fmt.Println(strings.Join(addrs, " "))
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench upstream: %v\n", err)
		return 1
	}
	return 0
}

func runDoc(args []string) int {
	fs := flag.NewFlagSet("kvbench doc", flag.ContinueOnError)
	raw := fs.String("raw", ".cache/bench", "directory of the raw results (bench.sh output, kvbench/results.json, kvbench/overhead.json)")
	sections := fs.String("sections", "docs/benchmarks", "directory of the earlier benchmark sections")
	charts := fs.String("charts", "docs/bench", "directory of the charts, as linked from the document")
	out := fs.String("out", "docs/BENCHMARKS.md", "document to write")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := kvbench.WriteDocument(*raw, *sections, *charts, *out); err != nil {
		fmt.Fprintf(os.Stderr, "kvbench doc: %v\n", err)
		return 1
	}
	return 0
}

func runScale(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kvbench scale", flag.ContinueOnError)
	out := fs.String("out", ".cache/bench/kvbench", "directory for scale.json and scale.md")
	model := fs.String("model", "llama3", "tokenizer model slug")
	def := kvbench.DefaultScalePlan()
	eps := fs.String("endpoints", ints(def.Endpoints), "comma-separated endpoint counts (at most 256)")
	resident := fs.String("resident", ints(def.Resident), "comma-separated resident key counts (100000000 needs about 3 GiB)")
	prompts := fs.String("prompts", ints(def.Prompts), "comma-separated prompt sizes, tokens")
	repeats := fs.Int("repeats", def.Repeats, "decisions timed per cell (at most; --budget bounds the time)")
	budget := fs.Duration("budget", def.Budget, "time spent per cell at most (at least 5 decisions)")
	multiTurn := fs.Bool("multiturn", def.MultiTurn, "also time prompts of 8k tokens or more as multi-turn chats with one new turn (segment cache)")
	keyCache := fs.String("key-cache-bytes", ints64(def.KeyCacheBytes), "comma-separated key cache sizes, one multi-turn cell each, in this order (0: none)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	plan := kvbench.ScalePlan{Repeats: *repeats, Budget: *budget, MultiTurn: *multiTurn}
	for _, x := range strings.Split(*keyCache, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
		if err != nil || n < 0 {
			fmt.Fprintf(os.Stderr, "kvbench scale: --key-cache-bytes: %q is not a whole number of bytes (0: none)\n", x)
			return 2
		}
		plan.KeyCacheBytes = append(plan.KeyCacheBytes, n)
	}
	for _, f := range []struct {
		name, v string
		dst     *[]int
		lim     int
	}{{"endpoints", *eps, &plan.Endpoints, 256}, {"resident", *resident, &plan.Resident, 1 << 30}, {"prompts", *prompts, &plan.Prompts, 1 << 20}} {
		for _, x := range strings.Split(f.v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(x))
			if err != nil || n <= 0 || n > f.lim {
				fmt.Fprintf(os.Stderr, "kvbench scale: --%s: %q is not a whole number in 1..%d\n", f.name, x, f.lim)
				return 2
			}
			*f.dst = append(*f.dst, n)
		}
	}
	toks := tokenize.NewPool("")
	sc, err := kvbench.MeasureScale(ctx, toks, *model, plan, func(v any) {
		switch c := v.(type) {
		case kvbench.ScaleInventory:
			fmt.Fprintf(os.Stderr, "inventory %d endpoints, %d keys: %.1f B/key, %.2f M stores/s\n", c.Endpoints, c.Resident, c.BytesPerKey, c.StoreOpsPerSec/1e6)
		case kvbench.ScaleCell:
			fmt.Fprintf(os.Stderr, "decision %d endpoints, %d keys, %6d tokens%s: p50 %.2f ms p99 %.2f ms, CPU %.2f ms (tokenize p50 %.2f ms), %d decisions\n",
				c.Endpoints, c.Resident, c.PromptTokens, map[bool]string{true: " multi-turn" + fmt.Sprintf(" (key cache %d B)", c.KeyCacheBytes)}[c.MultiTurn], c.Decision.P50, c.Decision.P99, c.CPUms, c.Tokenize.P50, c.Decisions)
		}
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench scale: %v\n", err)
		return 1
	}
	sc.Command = strings.TrimSpace("kvbench scale " + strings.Join(args, " "))
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "kvbench scale: %v\n", err)
		return 1
	}
	b, _ := json.MarshalIndent(sc, "", "  ")
	if err := os.WriteFile(filepath.Join(*out, "scale.json"), b, 0o644); err == nil {
		err = os.WriteFile(filepath.Join(*out, "scale.md"), []byte(kvbench.ScaleTable(sc)), 0o644)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench scale: %v\n", err)
		return 1
	}
	return 0
}

func runReplicas(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kvbench replicas", flag.ContinueOnError)
	out := fs.String("out", ".cache/bench/kvbench", "directory for replicas.json and replicas.md")
	model := fs.String("model", "llama3", "tokenizer model slug")
	counts := fs.String("counts", "1,2,4", "comma-separated replica counts, alternated in every round")
	rounds := fs.Int("rounds", 3, "rounds (each runs every count once, the order rotating)")
	workload := fs.String("workload", kvbench.WorkloadSystemPrompt, "workload")
	load := fs.Float64("load", 0.6, "offered load, a fraction of the pool's uncached capacity")
	requests := fs.Int("requests", 200, "requests per cell (the first 20 % are warm-up)")
	seed := fs.Uint64("seed", 1, "workload seed")
	maxFails := fs.Int("max-fails", 1, "nginx max_fails per replica")
	failTimeout := fs.Duration("fail-timeout", 2*time.Second, "nginx fail_timeout per replica")
	kill := fs.Int("kill", 2, "replicas of the failover run, one killed under load (0: no failover run)")
	killRequests := fs.Int("kill-requests", 500, "requests of the failover run, the kill after a third of them")
	nginx := fs.String("nginx", "nginx", "nginx binary (Debian nginx-light)")
	gatewayBin := fs.String("gateway", "", "`PATH` of the gateway binary (default: beside this executable, else go build ./cmd/gateway)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	o := kvbench.ReplicaOptions{Nginx: *nginx, Rounds: *rounds, Workload: *workload, Load: *load, Requests: *requests, Seed: *seed, Model: *model,
		Tokenizers: tokenize.NewPool(""), Shape: kvbench.DefaultPoolShape(), SLO: 300 * time.Millisecond, MaxFails: *maxFails, FailTimeout: *failTimeout,
		KillReplicas: *kill, KillRequests: *killRequests, Log: os.Stderr}
	for _, x := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(x))
		if err != nil || n < 1 || n > 16 {
			fmt.Fprintf(os.Stderr, "kvbench replicas: --counts: %q is not a whole number in 1..16\n", x)
			return 2
		}
		o.Counts = append(o.Counts, n)
	}
	if *kill == 1 || *kill < 0 || *kill > 16 {
		fmt.Fprintf(os.Stderr, "kvbench replicas: --kill: %d is not 0 or in 2..16\n", *kill)
		return 2
	}
	if _, err := exec.LookPath(*nginx); err != nil {
		fmt.Fprintf(os.Stderr, "kvbench replicas: %v\n", err)
		return 1
	}
	gw, cleanup, err := kvbench.ResolveGateway(ctx, *gatewayBin, os.Stderr)
	defer cleanup()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench replicas: %v\n", err)
		return 1
	}
	o.Gateway = gw
	run, err := kvbench.MeasureReplicas(ctx, o)
	if run == nil {
		fmt.Fprintf(os.Stderr, "kvbench replicas: %v\n", err)
		return 1
	}
	run.Command = strings.TrimSpace("kvbench replicas " + strings.Join(args, " "))
	if run.Summary == nil {
		run.Summary = kvbench.SummarizeReplicas(run.Cells)
	}
	if merr := os.MkdirAll(*out, 0o755); merr != nil {
		fmt.Fprintf(os.Stderr, "kvbench replicas: %v\n", merr)
		return 1
	}
	b, _ := json.MarshalIndent(run, "", "  ")
	werr := os.WriteFile(filepath.Join(*out, "replicas.json"), b, 0o644)
	if werr == nil {
		werr = os.WriteFile(filepath.Join(*out, "replicas.md"), []byte(kvbench.ReplicaTable(run)), 0o644)
	}
	fmt.Fprint(os.Stderr, kvbench.ReplicaTable(run))
	if werr != nil {
		fmt.Fprintf(os.Stderr, "kvbench replicas: %v\n", werr)
		return 1
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench replicas: %v (replicas.json holds the %d cells measured)\n", err, len(run.Cells))
		return 1
	}
	return 0
}

func ints(v []int) string {
	var s []string
	for _, x := range v {
		s = append(s, strconv.Itoa(x))
	}
	return strings.Join(s, ",")
}

func ints64(v []int64) string {
	var s []string
	for _, x := range v {
		s = append(s, strconv.FormatInt(x, 10))
	}
	return strings.Join(s, ",")
}

// runCharts redraws the charts of a sweep already measured (results.json), e.g. after a chart change.
func runCharts(args []string) int {
	fs := flag.NewFlagSet("kvbench charts", flag.ContinueOnError)
	results := fs.String("results", ".cache/bench/kvbench/results.json", "a sweep's results.json")
	charts := fs.String("charts", "docs/bench", "directory for the SVG charts")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	b, err := os.ReadFile(*results)
	if err == nil {
		var rep kvbench.Report
		if err = json.Unmarshal(b, &rep); err == nil {
			err = kvbench.WriteCharts(&rep, *charts)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench charts: %v\n", err)
		return 1
	}
	return 0
}

// selectPolicies returns the policies a --policies list names, in the list's order, so one
// invocation can alternate variants (a named law or TTL variant runs on every workload and load of
// the run, like the main policies). A name that is none of known's, or is named twice, is an error:
// a misspelt variant must not silently drop out of a comparison.
func selectPolicies(list string, known []kvbench.Policy) ([]kvbench.Policy, error) {
	var keep []kvbench.Policy
	seen := map[string]bool{}
	for _, w := range strings.Split(list, ",") {
		name := strings.TrimSpace(w)
		if seen[name] {
			return nil, fmt.Errorf("%q is named twice", name)
		}
		seen[name] = true
		i := slices.IndexFunc(known, func(p kvbench.Policy) bool { return p.Name == name })
		if i < 0 {
			var names []string
			for _, p := range known {
				names = append(names, p.Name)
			}
			return nil, fmt.Errorf("%q is not one of: %s", name, strings.Join(names, ", "))
		}
		keep = append(keep, known[i])
	}
	return keep, nil
}
