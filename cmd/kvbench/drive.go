package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvexact/kvexact/bench/kvbench"
	"github.com/kvexact/kvexact/gateway"
)

// drive is `kvbench drive`: it sends one seeded shared-prefix workload to running gateway listeners
// (one per policy), clearing the engines' caches before each run, and prints a table of what the
// backends' own receipts say: cached-token ratio and time to first token. `make demo` uses it.
func drive(args []string) int {
	fs := flag.NewFlagSet("kvbench drive", flag.ContinueOnError)
	var runs, clears multiFlag
	fs.Var(&runs, "run", "LABEL=URL of a gateway listener to drive (repeatable, run in order)")
	fs.Var(&clears, "clear", "URL to POST before each run to empty an engine's cache (repeatable)")
	var flushes multiFlag
	fs.Var(&flushes, "flush", "engine base URL to send a one-token completion after the clears (repeatable): vLLM announces a cache reset only at the end of its next step, so until then the gateway still mirrors the wiped blocks")
	model := fs.String("model", "llama3", "model name")
	n := fs.Int("requests", 120, "requests per run")
	conc := fs.Int("concurrency", 4, "requests in flight")
	prefixes := fs.Int("prefixes", 6, "shared system prompts (Zipf popularity)")
	seed := fs.Uint64("seed", 1, "workload seed")
	var engineURLs, peers multiFlag
	fs.Var(&engineURLs, "engine", "engine base URL a peer strategy routes to (repeatable, in pool order)")
	fs.Var(&peers, "peer", "LABEL=STRATEGY: a peer strategy deciding in the client and sending straight to the --engine URLs (repeatable, run after the --run listeners; strategies: "+strings.Join(peerNames(), ", ")+")")
	peerBS := fs.Int("block-size", 32, "the engines' block size, as the peer strategies assume it")
	peerCap := fs.Int("capacity-blocks", 96, "each engine's KV blocks, as the peer strategies assume it")
	peerConc := fs.Int("max-num-seqs", 16, "each engine's running-request limit, as the peer strategies assume it")
	slo := fs.Duration("slo", 500*time.Millisecond, "TTFT bound of goodput (requests per second answered within it)")
	rounds := fs.Int("rounds", 1, "rounds: each runs every policy once, the order rotated by one policy a round, the caches reset before each run; with more than one, a summary gives each policy's mean and range over the rounds")
	record := fs.String("record", "", "file to write one JSON line per request to (policy, round, endpoint, cached and prompt tokens, TTFT, and the gateway's decision header when it sends one)")
	checkBS := fs.Int("check-predicted", 0, "block size: compare, per KV-exact response whose prediction rests on engine-confirmed blocks, the cached tokens the decision header predicts (score × block size) with the engine's usage, print \"predicted = realized on N of M requests\" per run and fail when they differ (0: off)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if len(runs)+len(peers) == 0 {
		fmt.Fprintln(os.Stderr, "kvbench drive: --run LABEL=URL or --peer LABEL=STRATEGY is required")
		return 2
	}
	if *rounds < 1 {
		fmt.Fprintf(os.Stderr, "kvbench drive: --rounds %d: at least one\n", *rounds)
		return 2
	}
	if len(peers) > 0 && len(engineURLs) == 0 {
		fmt.Fprintln(os.Stderr, "kvbench drive: --peer needs the pool's --engine URLs")
		return 2
	}
	reqs := sharedPrefixWorkload(*n, *prefixes, *seed)
	var rows []driveResult
	var plan []policyRun
	for _, r := range runs {
		label, url, ok := strings.Cut(r, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "kvbench drive: --run %q: want LABEL=URL\n", r)
			return 2
		}
		to := func(string) (string, string, func(), error) { return url, "", func() {}, nil }
		plan = append(plan, policyRun{label, func() (router, error) { return to, nil }})
	}
	for _, p := range peers {
		label, strategy, ok := strings.Cut(p, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "kvbench drive: --peer %q: want LABEL=STRATEGY\n", p)
			return 2
		}
		// A new chooser for every run: the engines' caches are reset before it, and a peer's
		// approximate state would otherwise remember the previous run's prefixes.
		newPeer := func() (router, error) {
			pr, err := kvbench.NewPeerRouter(strategy, len(engineURLs), *peerBS, *peerCap, *peerConc, 8, *model)
			if err != nil {
				return nil, fmt.Errorf("--peer %q: %v", p, err)
			}
			return peerRoute(pr, engineURLs, *model), nil
		}
		if _, err := newPeer(); err != nil {
			fmt.Fprintf(os.Stderr, "kvbench drive: %v\n", err)
			return 2
		}
		plan = append(plan, policyRun{label, newPeer})
	}
	var rec *json.Encoder
	if *record != "" {
		f, err := os.Create(*record)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kvbench drive: --record: %v\n", err)
			return 2
		}
		defer f.Close()
		rec = json.NewEncoder(f)
	}
	for round := range *rounds {
		fmt.Printf("round %d of %d: load average %s\n", round+1, *rounds, loadAverage())
		for k := range plan {
			r := plan[(k+round)%len(plan)]
			route, err := r.route()
			if err != nil {
				fmt.Fprintf(os.Stderr, "kvbench drive: %v\n", err)
				return 1
			}
			res, err := runOnce(r.label, route, clears, flushes, *model, reqs, *conc, *checkBS)
			if err != nil {
				fmt.Fprintf(os.Stderr, "kvbench drive: %v\n", err)
				return 1
			}
			res.round = round + 1
			rows = append(rows, res)
			if rec != nil {
				for _, one := range res.log {
					one.Policy, one.Round = res.label, res.round
					if err := rec.Encode(one); err != nil {
						fmt.Fprintf(os.Stderr, "kvbench drive: --record: %v\n", err)
						return 1
					}
				}
			}
		}
	}
	fmt.Printf("load average at the end: %s\n", loadAverage())
	var labels []string
	for _, r := range plan {
		labels = append(labels, r.label)
	}
	return report(rows, labels, *rounds, *checkBS, *slo)
}

// runOnce empties the engines' caches (the clears, then one flushing completion each) and drives
// the workload once through route.
func runOnce(label string, route router, clears, flushes []string, model string, reqs []string, conc, checkBS int) (driveResult, error) {
	for _, c := range clears {
		resp, err := http.Post(c, "application/json", nil)
		if err != nil {
			return driveResult{}, fmt.Errorf("--clear %s: %v", c, err)
		}
		resp.Body.Close()
	}
	for _, f := range flushes {
		body, _ := json.Marshal(map[string]any{"model": model, "prompt": "Hi", "max_tokens": 1})
		resp, err := http.Post(strings.TrimRight(f, "/")+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			return driveResult{}, fmt.Errorf("--flush %s: %v", f, err)
		}
		resp.Body.Close()
	}
	if len(flushes) > 0 {
		time.Sleep(time.Second) // the clear events reach the gateway
	}
	res := runWorkload(route, model, reqs, conc, checkBS)
	res.label = label
	return res, nil
}

// loadAverage is the machine's 1-, 5- and 15-minute load averages.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// report prints every run's row, and with several rounds each policy's mean and range, what the
// gateway's decisions said (tiers, misses, endpoints not eligible) and, under the ttft law, the
// error of its predictions; it returns the exit code.
func report(rows []driveResult, labels []string, rounds, checkBS int, slo time.Duration) int {
	failed := false
	if checkBS > 0 {
		for _, r := range rows {
			if r.confirmed == 0 {
				continue
			}
			fmt.Printf("%s: predicted = realized on %d of %d requests\n", r.label, r.equal, r.confirmed)
			for _, d := range r.differ {
				fmt.Printf("  %s\n", d)
			}
			failed = failed || r.equal != r.confirmed
		}
	}
	fmt.Printf("\n%-5s %-14s %8s %8s %14s %10s %10s %14s %s\n", "round", "policy", "requests", "errors", "cached tokens", "TTFT p50", "TTFT p90", "goodput", "served by")
	for _, r := range rows {
		fmt.Printf("%-5d %-14s %8d %8d %13.1f%% %10s %10s %10.2f r/s %s\n", r.round, r.label, r.requests, r.errors, 100*r.ratio(),
			pct(r.ttft, 50).Round(time.Millisecond), pct(r.ttft, 90).Round(time.Millisecond), r.goodput(slo), r.spread())
	}
	fmt.Printf("goodput: requests per second whose TTFT was within %v, over each run's wall time\n", slo)
	if rounds > 1 {
		fmt.Printf("\nover %d rounds: mean [min – max]\n%-14s %22s %22s %22s %26s %s\n", rounds, "policy", "cached tokens", "TTFT p50 ms", "TTFT p90 ms", "goodput r/s", "served by (all rounds)")
		for _, l := range labels {
			var cached, p50, p90, good []float64
			served := map[string]int{}
			for _, r := range rows {
				if r.label != l {
					continue
				}
				cached = append(cached, 100*r.ratio())
				p50 = append(p50, ms(pct(r.ttft, 50)))
				p90 = append(p90, ms(pct(r.ttft, 90)))
				good = append(good, r.goodput(slo))
				for e, n := range r.served {
					served[e] += n
				}
			}
			fmt.Printf("%-14s %22s %22s %22s %26s %s\n", l, spreadOf(cached, "%.1f%%"), spreadOf(p50, "%.0f"), spreadOf(p90, "%.0f"), spreadOf(good, "%.2f"),
				driveResult{served: served}.spread())
		}
	}
	// What the gateway's decision headers said, summed over the rounds.
	for _, l := range labels {
		var sum decisionSummary
		for _, r := range rows {
			if r.label == l {
				sum.add(r.decisions)
			}
		}
		if sum.n == 0 {
			continue
		}
		fmt.Printf("\n%s decisions (%d with a header): %s\n", l, sum.n, sum.tiers.String())
		if len(sum.ineligible) > 0 {
			fmt.Printf("  not eligible for KV-exact: %s\n", sum.ineligible.String())
		}
		if len(sum.ttftErr) > 0 {
			abs := make([]float64, len(sum.ttftErr))
			for i, e := range sum.ttftErr {
				abs[i] = math.Abs(e)
			}
			fmt.Printf("  ttft law, (predicted − realized) / realized over %d streamed answers: median %+.2f, median absolute %.2f, p10 %+.2f, p90 %+.2f\n",
				len(sum.ttftErr), quantile(sum.ttftErr, 0.5), quantile(abs, 0.5), quantile(sum.ttftErr, 0.1), quantile(sum.ttftErr, 0.9))
		}
	}
	if failed {
		fmt.Println("\nthe gateway's predicted cached tokens differ from the engines' on some requests")
		return 1
	}
	for _, r := range rows {
		if r.errors > 0 || r.mismatch > 0 {
			fmt.Printf("\n%s: %d errors, %d responses whose gateway receipt disagreed with the engine's: results not valid\n", r.label, r.errors, r.mismatch)
			return 1
		}
	}
	return 0
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// spreadOf is "mean [min – max]" of v, each formatted with f.
func spreadOf(v []float64, f string) string {
	if len(v) == 0 {
		return "-"
	}
	lo, hi, sum := v[0], v[0], 0.0
	for _, x := range v {
		lo, hi, sum = min(lo, x), max(hi, x), sum+x
	}
	return fmt.Sprintf(f+" ["+f+" – "+f+"]", sum/float64(len(v)), lo, hi)
}

// quantile is the q-quantile of v (nearest rank).
func quantile(v []float64, q float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// counts is a tally by name, printed largest first.
type counts map[string]int

func (c counts) String() string {
	names := make([]string, 0, len(c))
	for n := range c {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		return c[names[i]] > c[names[j]] || (c[names[i]] == c[names[j]] && names[i] < names[j])
	})
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %d", n, c[n])
	}
	return strings.Join(parts, ", ")
}

// decisionSummary is what a run's decision headers said: the tier that decided each request (with
// KV-exact's miss when it passed), the endpoints KV-exact could not choose and why, and under the
// ttft law each streamed answer's prediction error.
type decisionSummary struct {
	n          int
	tiers      counts
	ineligible counts
	ttftErr    []float64
}

func (s *decisionSummary) add(o decisionSummary) {
	s.n += o.n
	if s.tiers == nil {
		s.tiers, s.ineligible = counts{}, counts{}
	}
	for k, v := range o.tiers {
		s.tiers[k] += v
	}
	for k, v := range o.ineligible {
		s.ineligible[k] += v
	}
	s.ttftErr = append(s.ttftErr, o.ttftErr...)
}

// note adds one response's decision.
func (s *decisionSummary) note(d decisionHeader, ttft time.Duration) {
	if d.Tier == "" {
		return
	}
	if s.tiers == nil {
		s.tiers, s.ineligible = counts{}, counts{}
	}
	s.n++
	t := d.Tier
	if d.Miss != "" {
		t += " (kv-exact missed: " + d.Miss + ")"
	}
	if d.Spill {
		t += " spilled"
	}
	s.tiers[t]++
	for _, e := range d.Endpoints {
		switch {
		case e.Excluded != "":
			// The reason up to its first instant ("fenced: unverified since restart at …"), so
			// one cause counts as one line however often it was raised.
			why, _, _ := strings.Cut(e.Excluded, " at ")
			s.ineligible[e.Name+": "+why]++
		case !e.Eligible:
			s.ineligible[e.Name+": not certified"]++
		}
		if e.Name == d.Target && e.TTFT != nil && ttft > 0 {
			s.ttftErr = append(s.ttftErr, (e.TTFT.TotalMS-ms(ttft))/ms(ttft))
		}
	}
}

// decisionHeader is the part of the gateway's X-Kvexact-Decision header the drive reads.
type decisionHeader struct {
	Target    string `json:"target"`
	Tier      string `json:"tier"`
	Miss      string `json:"miss"`
	Score     int    `json:"score"`
	Predicted bool   `json:"predicted"`
	Spill     bool   `json:"spill"`
	Endpoints []struct {
		Name     string `json:"name"`
		Excluded string `json:"excluded"`
		Eligible bool   `json:"eligible"`
		TTFT     *struct {
			TotalMS float64 `json:"totalMs"`
		} `json:"ttft"`
	} `json:"endpoints"`
}

// policyRun is one policy of the plan: its label and the router of one run.
type policyRun struct {
	label string
	route func() (router, error)
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// sharedPrefixWorkload: n requests, each a popular system prompt (Zipf over prefixes) followed by a
// short distinct question — the shape where cache-aware routing pays.
func sharedPrefixWorkload(n, prefixes int, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	zipf := rand.NewZipf(rng, 1.2, 1, uint64(prefixes-1))
	sys := make([]string, prefixes)
	for i := range sys {
		var b strings.Builder
		fmt.Fprintf(&b, "You are assistant number %d for the kvexact demo. ", i)
		for j := 0; j < 60; j++ {
			fmt.Fprintf(&b, "Rule %d of persona %d: answer precisely, cite the section, keep a calm tone. ", j, i)
		}
		sys[i] = b.String()
	}
	out := make([]string, n)
	for i := range out {
		out[i] = sys[zipf.Uint64()] + fmt.Sprintf("\nUser question %d: what does rule %d mean?", i, rng.IntN(60))
	}
	return out
}

type driveResult struct {
	label            string
	round            int
	requests, errors int
	mismatch         int
	prompt, cached   int
	ttft             []time.Duration
	wall             time.Duration // from the first request sent to the last answered
	served           map[string]int
	// confirmed counts the KV-exact responses whose prediction rests on engine-confirmed blocks,
	// equal those whose prediction matched the engine's cached tokens; differ says the others.
	confirmed, equal int
	differ           []string
	decisions        decisionSummary
	log              []requestRecord // every answered request, for --record
}

// requestRecord is one answered request as --record writes it.
type requestRecord struct {
	Policy   string          `json:"policy"`
	Round    int             `json:"round"`
	Endpoint string          `json:"endpoint"`
	Prompt   int             `json:"prompt_tokens"`
	Cached   int             `json:"cached_tokens"`
	TTFTms   float64         `json:"ttft_ms"`
	Decision json.RawMessage `json:"decision,omitempty"`
}

// ratio is the cached share of the run's prompt tokens.
func (r driveResult) ratio() float64 {
	if r.prompt == 0 {
		return 0
	}
	return float64(r.cached) / float64(r.prompt)
}

// goodput is the requests per second whose TTFT was within slo, over the run's wall time.
func (r driveResult) goodput(slo time.Duration) float64 {
	good := 0
	for _, d := range r.ttft {
		if d <= slo {
			good++
		}
	}
	return float64(good) / r.wall.Seconds()
}

func (r driveResult) spread() string {
	var names []string
	for n := range r.served {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s:%d", n, r.served[n]))
	}
	return strings.Join(parts, " ")
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, len(s)*p/100)]
}

// runWorkload streams every request and reads, per response, the time to the first token, the
// usage the engine reported (prompt and cached tokens) and both receipts.
// router says where one prompt goes: the URL to send it to, the endpoint's name when the client
// chose it (a gateway names its own in a header), and the call that ends its load there.
type router func(prompt string) (url, endpoint string, done func(), err error)

// peerRoute is a peer strategy's client-side decision over the engines: it tokenizes the prompt
// with the first engine's /tokenize (what a peer that tokenizes exactly knows) before the request
// is timed.
func peerRoute(pr *kvbench.PeerRouter, engines []string, model string) router {
	return func(prompt string) (string, string, func(), error) {
		body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt})
		resp, err := http.Post(strings.TrimRight(engines[0], "/")+"/tokenize", "application/json", bytes.NewReader(body))
		if err != nil {
			return "", "", nil, err
		}
		defer resp.Body.Close()
		var tk struct {
			Tokens []uint32 `json:"tokens"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&tk); err != nil || resp.StatusCode != http.StatusOK {
			return "", "", nil, fmt.Errorf("/tokenize: status %d: %v", resp.StatusCode, err)
		}
		i, done := pr.Pick(body, tk.Tokens)
		return engines[i], fmt.Sprintf("engine-%d", i), done, nil
	}
}

func peerNames() []string {
	var out []string
	for _, p := range kvbench.Peers() {
		out = append(out, p.Peer)
	}
	return out
}

func runWorkload(route router, model string, prompts []string, conc, blockSize int) driveResult {
	res := driveResult{served: map[string]int{}}
	started := time.Now()
	var mu sync.Mutex
	work := make(chan string)
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 2 * time.Minute}
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range work {
				url, endpoint, done, err := route(p)
				var one oneResult
				if err != nil {
					one.err = err
				} else {
					one = streamOnce(client, url, model, p)
					done()
					if endpoint != "" {
						one.endpoint = endpoint
					}
				}
				mu.Lock()
				res.requests++
				if one.err != nil {
					res.errors++
					fmt.Fprintf(os.Stderr, "request failed: %v\n", one.err)
				} else {
					res.prompt += one.prompt
					res.cached += one.cached
					res.ttft = append(res.ttft, one.ttft)
					res.served[one.endpoint]++
					// Simulated engines sign what they served (X-Kvexact-Served-By); real ones send
					// no such header, so there is nothing to compare.
					if one.servedBy != "" && one.endpoint != one.servedBy {
						res.mismatch++
					}
					res.decisions.note(one.decision, one.ttft)
					rec := requestRecord{Endpoint: one.endpoint, Prompt: one.prompt, Cached: one.cached, TTFTms: ms(one.ttft)}
					if one.rawDecision != "" {
						rec.Decision = json.RawMessage(one.rawDecision)
					}
					res.log = append(res.log, rec)
					if d := one.decision; blockSize > 0 && d.Tier == "kv-exact" && !d.Predicted {
						res.confirmed++
						if d.Score*blockSize == one.cached {
							res.equal++
						} else {
							res.differ = append(res.differ, fmt.Sprintf("%s: predicted %d blocks (%d tokens), the engine cached %d of %d", one.endpoint, d.Score, d.Score*blockSize, one.cached, one.prompt))
						}
					}
				}
				mu.Unlock()
			}
		}()
	}
	for _, p := range prompts {
		work <- p
	}
	close(work)
	wg.Wait()
	res.wall = time.Since(started)
	return res
}

type oneResult struct {
	ttft               time.Duration
	prompt, cached     int
	endpoint, servedBy string
	decision           decisionHeader
	rawDecision        string
	err                error
}

func streamOnce(client *http.Client, url, model, prompt string) oneResult {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 8, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(url, "/")+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return oneResult{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return oneResult{err: fmt.Errorf("status %d: %s", resp.StatusCode, b)}
	}
	r := oneResult{endpoint: resp.Header.Get("X-Kvexact-Endpoint"), servedBy: resp.Header.Get("X-Kvexact-Served-By")}
	if d := resp.Header.Get("X-Kvexact-Decision"); d != "" {
		if json.Unmarshal([]byte(d), &r.decision) == nil { // unreadable: not counted
			r.rawDecision = d
		}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens int `json:"prompt_tokens"`
				Details      struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return oneResult{err: fmt.Errorf("bad SSE chunk %q: %w", data, err)}
		}
		if r.ttft == 0 && len(chunk.Choices) > 0 && chunk.Choices[0].Text != "" {
			r.ttft = time.Since(start)
		}
		if chunk.Usage != nil {
			r.prompt, r.cached = chunk.Usage.PromptTokens, chunk.Usage.Details.Cached
		}
	}
	if err := sc.Err(); err != nil {
		return oneResult{err: err}
	}
	if r.prompt == 0 {
		return oneResult{err: fmt.Errorf("no usage in the stream")}
	}
	return r
}

// status is `kvbench status --file status.json --rule NAME`: prints one rule's KV-exact verdict
// from a saved /admin/status answer (make demo shows it without depending on jq).
func status(args []string) int {
	fs := flag.NewFlagSet("kvbench status", flag.ContinueOnError)
	file := fs.String("file", "", "saved /admin/status JSON (gateway status --admin URL reads it live)")
	rule := fs.String("rule", "", "rule name")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	b, err := os.ReadFile(*file)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench status: %v\n", err)
		return 2
	}
	var st gateway.Status
	if err := json.Unmarshal(b, &st); err != nil {
		fmt.Fprintf(os.Stderr, "kvbench status: %s: %v\n", *file, err)
		return 2
	}
	if *rule == "" || !gateway.WriteStatusText(os.Stdout, st, *rule) {
		fmt.Fprintf(os.Stderr, "kvbench status: no rule %q in %s\n", *rule, *file)
		return 1
	}
	return 0
}
