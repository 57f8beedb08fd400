package kvbench

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// Env is what every cell of a run shares.
type Env struct {
	Tokenizers *tokenize.Pool
	Model      string
	Pool       PoolShape
	// SLO is the TTFT bound of goodput.
	SLO time.Duration
	// Warmup is the leading fraction of requests (by arrival) left out of the figures (they still
	// count for the evidence checks).
	Warmup float64
	// Drain bounds how long a cell waits for its last requests after the last arrival.
	Drain time.Duration
}

// Percentiles in milliseconds.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

// Evidence is the decision proof and the delivery proof of one cell.
type Evidence struct {
	// HitCounterDelta is kvexact_kv_exact_hits_total{rule,endpoint} after minus before.
	HitCounterDelta map[string]float64 `json:"hitCounterDelta,omitempty"`
	// Decisions counts X-Kvexact-Decision targets by tier; KVExactByEndpoint the kv-exact ones.
	Tiers             map[string]int `json:"tiers,omitempty"`
	KVExactByEndpoint map[string]int `json:"kvExactByEndpoint,omitempty"`
	// ReceiptMismatches: responses whose decision target, gateway receipt and simulator receipt
	// do not all name the same endpoint.
	ReceiptMismatches int `json:"receiptMismatches"`
	// Headerless: requests that never got response headers (their decision is unseen).
	Headerless int `json:"headerless"`
	// ConfirmedHits: KV-exact decisions whose backend receipt shows cached tokens; FalseHits: those
	// whose receipt shows none.
	ConfirmedHits int `json:"confirmedHits"`
	FalseHits     int `json:"falseHits"`
	// SeededHits: KV-exact decisions the cold-start seeding diverted to a cold endpoint (their
	// receipts are expected to show no cached tokens).
	SeededHits int `json:"seededHits"`
	// PredictedTokens and ActualTokens sum, over KV-exact decisions, the cached prefix the decision
	// expected and the cached tokens the backend reported.
	PredictedTokens int64 `json:"predictedTokens"`
	ActualTokens    int64 `json:"actualTokens"`
	// PredictedHits: KV-exact decisions that needed predict-on-route blocks; they are kept out of
	// ConfirmedHits and FalseHits, and PredictedConfirmed counts those whose receipt shows cached
	// tokens.
	PredictedHits      int `json:"predictedHits,omitempty"`
	PredictedConfirmed int `json:"predictedConfirmed,omitempty"`
	// TTFTPredictions: answers whose decision carried a ttft-law prediction; TTFTErrorMedian and
	// TTFTErrorMedianAbs the median of (predicted − realized) / realized and of its absolute value
	// over them, realized timed from the request's send.
	TTFTPredictions    int     `json:"ttftPredictions,omitempty"`
	TTFTErrorMedian    float64 `json:"ttftErrorMedian,omitempty"`
	TTFTErrorMedianAbs float64 `json:"ttftErrorMedianAbs,omitempty"`
	// GatewayTTFTReceipts: the receipts the gateway's error histogram observed, timed from the
	// upstream send; GatewayTTFTWithin10 and GatewayTTFTWithin25 the share of them within ±10 %
	// and ±25 % (a share within ±10 % of at least 0.5 is a median absolute error of at most 10 %).
	GatewayTTFTReceipts int     `json:"gatewayTTFTReceipts,omitempty"`
	GatewayTTFTWithin10 float64 `json:"gatewayTTFTWithin10,omitempty"`
	GatewayTTFTWithin25 float64 `json:"gatewayTTFTWithin25,omitempty"`
}

// Cell is one (workload, policy, load) measurement.
type Cell struct {
	Workload string  `json:"workload"`
	Policy   string  `json:"policy"`
	Load     float64 `json:"load"` // offered load as a fraction of the pool's uncached capacity
	Rate     float64 `json:"rate"` // offered requests/s
	Requests int     `json:"requests"`
	Measured int     `json:"measured"`
	Errors   int     `json:"errors"`

	MeanPromptTokens float64 `json:"meanPromptTokens"`
	CachedRatio      float64 `json:"cachedRatio"` // Σ cached_tokens / Σ prompt_tokens, from receipts
	// CachedRatioSE is the standard error of CachedRatio over the cell's requests (ratio estimator:
	// √Σ(cᵢ − R·pᵢ)² ÷ Σpᵢ), the noise the oracle check allows.
	CachedRatioSE float64     `json:"cachedRatioSE"`
	TTFT          Percentiles `json:"ttftMs"`
	E2E           Percentiles `json:"e2eMs"`
	Throughput    float64     `json:"throughput"` // completed requests/s
	OutputTokens  float64     `json:"outputTokensPerS"`
	Goodput       float64     `json:"goodput"` // requests/s with TTFT ≤ SLO
	GoodputFrac   float64     `json:"goodputFraction"`
	// Imbalance is max/mean of requests served per endpoint (1 = even).
	Imbalance   float64        `json:"imbalance"`
	PerEndpoint map[string]int `json:"perEndpoint"`
	Wall        float64        `json:"wallSeconds"`

	Evidence Evidence `json:"evidence"`
	Valid    bool     `json:"valid"`
	Invalid  []string `json:"invalid,omitempty"`
	// Error: the cell did not run to the end (its pool did not start, ...); it has no figures.
	Error string `json:"error,omitempty"`
	// Pool is the pool this cell ran on when it is not the report's (PoolShape.ShapeFor: the
	// offload tier, small-pool's 3 engines of 96 blocks, lora-tenants' adapters).
	Pool *PoolShape `json:"pool,omitempty"`
}

// RunCell drives one workload through one policy's pool at the workload's arrival times.
func RunCell(ctx context.Context, env *Env, w *Workload, pol Policy, load, rate float64) (*Cell, error) {
	shape := env.Pool.ShapeFor(w.Name)
	pool, err := StartPool(ctx, env.Tokenizers, env.Model, shape, pol)
	if err != nil {
		return nil, fmt.Errorf("%s: start pool: %w", pol.Name, err)
	}
	defer pool.Close()
	bs := pool.Sims[0].Config().BlockSize
	before := pool.HitCounters()
	var ch chooser
	switch {
	case pol.Oracle && pol.TTFT:
		ch = newTTFTOracle(pool.Sims, w.MaxTokens)
	case pol.Oracle:
		o := newOracle(pool.Sims, pool.Law, shape.CapacityBlocks)
		o.cacheFirst = pol.CacheFirst
		ch = o
	case pol.Peer != "":
		if ch = newChooser(pol.Peer, len(pool.Sims), bs, shape.CapacityBlocks, shape.MaxConcurrency, w.MaxTokens, env.Model, time.Now); ch == nil {
			return nil, fmt.Errorf("policy %s: unknown peer strategy %q", pol.Name, pol.Peer)
		}
	}
	transport := &http.Transport{MaxIdleConns: 2048, MaxIdleConnsPerHost: 2048, IdleConnTimeout: 30 * time.Second, DisableCompression: true}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}

	results := make([]Result, len(w.Requests))
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now().Add(20 * time.Millisecond)
	wallStart := time.Now()
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ch == nil {
				results[i] = send(rctx, client, pool.URL, q, at, bs)
				return
			}
			keys, err := pool.Hasher.Keys(q.Tokens, q.extras(), nil)
			if err != nil {
				results[i] = Result{Err: err.Error()}
				return
			}
			t := ch.pick(q, keys)
			defer ch.done(t)
			r := send(rctx, client, pool.URLs[t.idx], q, at, bs)
			r.Want, r.Predicted = pool.Sims[t.idx].Config().Endpoint, t.predicted
			if t.predicted > 0 {
				r.Tier = pol.clientTier()
			}
			results[i] = r
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(env.Drain):
		cancel()
		<-done
	case <-ctx.Done():
		cancel()
		<-done
	}
	wall := time.Since(wallStart)
	after := pool.HitCounters()
	c := summarize(env, w, pol, load, rate, results, start)
	if !reflect.DeepEqual(shape, env.Pool) {
		c.Pool = &shape
	}
	c.Wall = wall.Seconds()
	c.Evidence.HitCounterDelta = map[string]float64{}
	for ep, v := range after {
		if d := v - before[ep]; d != 0 {
			c.Evidence.HitCounterDelta[ep] = d
		}
	}
	if n, w10, w25 := pool.TTFTErrors(); n > 0 {
		c.Evidence.GatewayTTFTReceipts, c.Evidence.GatewayTTFTWithin10, c.Evidence.GatewayTTFTWithin25 = int(n), float64(w10)/float64(n), float64(w25)/float64(n)
	}
	judge(c, pol, results)
	if dir := os.Getenv("KVBENCH_TRACE"); dir != "" {
		writeTrace(dir, pool, w, pol, load, results, start)
	}
	return c, ctx.Err()
}

func summarize(env *Env, w *Workload, pol Policy, load, rate float64, rs []Result, start time.Time) *Cell {
	c := &Cell{Workload: w.Name, Policy: pol.Name, Load: load, Rate: rate, Requests: len(rs), MeanPromptTokens: w.MeanPromptTokens,
		PerEndpoint: map[string]int{}}
	skip := int(math.Round(env.Warmup * float64(len(rs))))
	var ttft, e2e []float64
	var prompt, cached, out int64
	var good int
	var first, last time.Duration = -1, 0
	for i := skip; i < len(rs); i++ {
		r := &rs[i]
		c.Measured++
		arr := w.Requests[i].Arrival
		if first < 0 {
			first = arr
		}
		if r.Status != http.StatusOK || r.Err != "" {
			c.Errors++
			continue
		}
		ttft = append(ttft, ms(r.TTFT))
		e2e = append(e2e, ms(r.E2E))
		prompt += int64(r.Prompt)
		cached += int64(r.Cached)
		out += int64(r.Output)
		if r.TTFT <= env.SLO {
			good++
		}
		c.PerEndpoint[r.ServedBy]++
		if end := arr + r.E2E; end > last {
			last = end
		}
	}
	if prompt > 0 {
		c.CachedRatio = float64(cached) / float64(prompt)
		var ss float64
		for i := skip; i < len(rs); i++ {
			if r := &rs[i]; r.Status == http.StatusOK && r.Err == "" {
				d := float64(r.Cached) - c.CachedRatio*float64(r.Prompt)
				ss += d * d
			}
		}
		c.CachedRatioSE = math.Sqrt(ss) / float64(prompt)
	}
	c.TTFT, c.E2E = pct(ttft), pct(e2e)
	if window := (last - first).Seconds(); window > 0 {
		c.Throughput = float64(len(ttft)) / window
		c.OutputTokens = float64(out) / window
		c.Goodput = float64(good) / window
	}
	if c.Measured > 0 {
		c.GoodputFrac = float64(good) / float64(c.Measured)
	}
	if n := len(ttft); n > 0 {
		mx := 0
		for _, v := range c.PerEndpoint {
			mx = max(mx, v)
		}
		c.Imbalance = float64(mx) / (float64(n) / float64(env.Pool.ShapeFor(w.Name).Endpoints))
	}
	return c
}

// judge applies the evidence rules: a cache win is claimed only when the hit counters moved for the
// endpoints the decisions named and the backends' receipts confirm both the endpoint and the
// cached tokens. Anything else marks the cell invalid.
func judge(c *Cell, pol Policy, rs []Result) {
	ev := &c.Evidence
	ev.Tiers, ev.KVExactByEndpoint = map[string]int{}, map[string]int{}
	completed := 0
	var errs, abs []float64
	for i := range rs {
		r := &rs[i]
		if r.PredictedTTFT > 0 && r.SentTTFT > 0 && r.Err == "" {
			e := float64(r.PredictedTTFT-r.SentTTFT) / float64(r.SentTTFT)
			errs, abs = append(errs, e), append(abs, math.Abs(e))
		}
		if !r.Headers {
			ev.Headerless++
			continue
		}
		if r.Status == http.StatusOK && r.Err == "" {
			completed++
		}
		if r.Tier != "" {
			ev.Tiers[r.Tier]++
		}
		if pol.clientSide() && r.Tier != pol.clientTier() && !strings.HasPrefix(r.Tier, route.TierSelector) {
			ev.Tiers["unexpected "+r.Tier]++
		}
		if r.Target == "" || r.Target != r.Endpoint || r.Endpoint != r.ServedBy || (pol.clientSide() && r.Target != r.Want) {
			ev.ReceiptMismatches++
		}
		if r.Tier == route.TierKVExact || r.Tier == "oracle" || r.Tier == "peer" {
			if r.Tier == route.TierKVExact {
				ev.KVExactByEndpoint[r.Target]++
			}
			if r.Seeded {
				ev.SeededHits++
			}
			ev.PredictedTokens += int64(r.Predicted)
			ev.ActualTokens += int64(r.Cached)
			if r.PredictedHit {
				ev.PredictedHits++
				if r.Status == http.StatusOK && r.Err == "" && r.Cached > 0 {
					ev.PredictedConfirmed++
				}
			} else if r.Status == http.StatusOK && r.Err == "" {
				if r.Cached > 0 {
					ev.ConfirmedHits++
				} else {
					ev.FalseHits++
				}
			}
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		slices.Sort(abs)
		ev.TTFTPredictions, ev.TTFTErrorMedian, ev.TTFTErrorMedianAbs = len(errs), errs[len(errs)/2], abs[len(abs)/2]
	}
	var bad []string
	if completed == 0 {
		bad = append(bad, "no request completed")
	}
	if ev.ReceiptMismatches > 0 {
		bad = append(bad, fmt.Sprintf("%d responses whose decision, gateway receipt and simulator receipt disagree", ev.ReceiptMismatches))
	}
	var moved float64
	for _, v := range ev.HitCounterDelta {
		moved += v
	}
	switch {
	case pol.Exact:
		if Sharing(c.Workload) && moved == 0 {
			bad = append(bad, "the gateway's KV-exact hit counters did not move")
		}
		eps := map[string]bool{}
		for ep := range ev.HitCounterDelta {
			eps[ep] = true
		}
		for ep := range ev.KVExactByEndpoint {
			eps[ep] = true
		}
		for ep := range eps {
			// Every decision seen must be counted; unseen ones (no headers) may add to the counter.
			seen, counted := ev.KVExactByEndpoint[ep], int(ev.HitCounterDelta[ep])
			if counted < seen || counted > seen+ev.Headerless {
				bad = append(bad, fmt.Sprintf("endpoint %s: hit counter moved %d, decision headers name it %d times", ep, counted, seen))
			}
		}
		if Sharing(c.Workload) && ev.ConfirmedHits == 0 {
			bad = append(bad, "no backend receipt confirms a KV-exact hit (cached_tokens is 0 on every one)")
		}
	case pol.clientSide():
		if moved != 0 {
			bad = append(bad, "KV-exact hit counters moved under a client-side policy")
		}
		if pol.Oracle && Sharing(c.Workload) && ev.ConfirmedHits == 0 {
			bad = append(bad, "no backend receipt confirms an oracle hit")
		}
		for t := range ev.Tiers {
			if strings.HasPrefix(t, "unexpected") {
				bad = append(bad, "decision tier "+t+" on a client-side listener")
			}
		}
	default:
		if moved != 0 {
			bad = append(bad, fmt.Sprintf("KV-exact hit counters moved (%v) under a policy without KV-exact", moved))
		}
		for t := range ev.Tiers {
			if !strings.HasPrefix(t, route.TierSelector) {
				bad = append(bad, "decision tier "+t+" under a selector-only policy")
			}
		}
	}
	sort.Strings(bad)
	c.Invalid, c.Valid = bad, len(bad) == 0
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func pct(v []float64) Percentiles {
	if len(v) == 0 {
		return Percentiles{}
	}
	sort.Float64s(v)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(v)))) - 1
		return v[min(max(i, 0), len(v)-1)]
	}
	return Percentiles{P50: q(0.50), P90: q(0.90), P99: q(0.99)}
}
