package kvbench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"sort"
	"syscall"
	"time"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// Scale cells (kvbench scale): the KV-exact decision of a rule with many endpoints whose
// inventory holds millions of resident keys, for long prompts. They run in one process without
// simulators: the router, its tokenizer keyer, the engine-binding hasher and the inventory are the
// gateway's own, and the inventory is filled directly (Store, as ingest does) with random keys,
// plus the measured prompt's keys on one endpoint so that every decision scores a real hit.

// ScaleCell is one (endpoints, resident keys, prompt size) measurement.
type ScaleCell struct {
	// MultiTurn: each decision is a chat request whose earlier turns the previous request sent
	// (their keys resident on one endpoint), plus one new user turn; the gateway's tokenizer pool
	// has its segment cache (tokenizers.segmentCacheBytes default). Otherwise every decision is a
	// cold completions prompt: no segment cache.
	MultiTurn bool `json:"multiTurn,omitempty"`
	// KeyCacheBytes is a multi-turn cell's key cache (route.KeyCache; 0: none): the gateway's
	// default reuses the earlier turns' block keys as well.
	KeyCacheBytes int64 `json:"keyCacheBytes,omitempty"`
	Endpoints     int   `json:"endpoints"`
	Resident      int   `json:"residentKeys"`
	PromptTokens  int   `json:"promptTokens"`
	Blocks        int   `json:"blocks"`
	Decisions     int   `json:"decisions"`
	// Decision is the whole KV-exact decision (Router.Explain: tokenize, hash, score, law), ms.
	Decision Percentiles `json:"decisionMs"`
	// CPUms is the process's CPU time (user + system, GC included) per decision, ms: what a
	// decision costs the gateway whatever the machine's contention does to its wall time.
	CPUms float64 `json:"cpuMsPerDecision"`
	// Tokenize is the tokenizer's share alone, ms.
	Tokenize Percentiles `json:"tokenizeMs"`
	Score    int         `json:"score"`
}

// ScaleInventory is one inventory fill: memory per resident (endpoint, key) and store rate.
type ScaleInventory struct {
	Endpoints int `json:"endpoints"`
	Resident  int `json:"residentKeys"`
	// BytesPerKey is the heap in use after the fill minus before, over resident keys (GC'd twice).
	BytesPerKey float64 `json:"bytesPerKey"`
	// StoreOpsPerSec is block stores per second while filling (one goroutine: one core).
	StoreOpsPerSec float64 `json:"storeOpsPerSec"`
}

// Scale is the result of kvbench scale.
type Scale struct {
	Command     string           `json:"command"`
	Machine     Machine          `json:"machine"`
	Inventories []ScaleInventory `json:"inventories"`
	Cells       []ScaleCell      `json:"cells"`
}

// ScalePlan is what kvbench scale measures.
type ScalePlan struct {
	Endpoints []int // endpoints per rule
	Resident  []int // resident keys per inventory (spread evenly over the endpoints)
	Prompts   []int // prompt sizes, tokens
	// Repeats bounds the decisions timed per cell; Budget bounds the time spent per cell.
	Repeats int
	Budget  time.Duration
	// MultiTurn adds a multi-turn cell (ScaleCell.MultiTurn) for every prompt size of at least
	// multiTurnMin tokens.
	MultiTurn bool
	// KeyCacheBytes: each multi-turn cell runs once per value, in this order (0: no key cache).
	KeyCacheBytes []int64
}

// multiTurnMin is the smallest prompt measured as a conversation (four turns of multiTurnTurn).
const multiTurnMin = 8192

// multiTurnTurn is the size of one turn of a multi-turn cell's conversation, tokens.
const multiTurnTurn = 2000

// DefaultScalePlan: 16 and 64 endpoints, 10M resident keys, prompts of 1k to 100k tokens. 100M
// keys need about 3 GiB of heap: kvbench scale --resident 100000000 runs them on purpose.
func DefaultScalePlan() ScalePlan {
	return ScalePlan{Endpoints: []int{16, 64}, Resident: []int{10_000_000}, Prompts: []int{1024, 8192, 32768, 102400}, Repeats: 200, Budget: 8 * time.Second, MultiTurn: true,
		KeyCacheBytes: []int64{route.DefaultKeyCacheBytes}}
}

// MeasureScale runs the plan; progress sees each cell.
func MeasureScale(ctx context.Context, toks *tokenize.Pool, model string, plan ScalePlan, progress func(any)) (*Scale, error) {
	tok, err := toks.Get(model)
	if err != nil {
		return nil, err
	}
	if tok.SegmentCached() {
		return nil, fmt.Errorf("the cold cells need a tokenizer pool without a segment cache")
	}
	// The multi-turn cells' pool: the same tokenizer folder, with the gateway's default cache.
	dir, err := filepath.Abs(tok.Dir())
	if err != nil {
		return nil, err
	}
	cached := tokenize.NewPool("", tokenize.WithFolder(model, dir), tokenize.WithSegmentCacheBytes(tokenize.DefaultSegmentCacheBytes))
	ctok, err := cached.Get(model)
	if err != nil {
		return nil, err
	}
	ct, err := contracts.Lookup(family, release)
	if err != nil {
		return nil, err
	}
	out := &Scale{Machine: ThisMachine()}
	texts := map[int]string{}
	for _, n := range plan.Prompts {
		texts[n] = promptOfTokens(tok, n)
	}
	for _, eps := range plan.Endpoints {
		for _, resident := range plan.Resident {
			rig, inv, err := newScaleRig(toks, model, ct, eps, resident)
			if err != nil {
				return nil, err
			}
			out.Inventories = append(out.Inventories, inv)
			if progress != nil {
				progress(inv)
			}
			for _, n := range plan.Prompts {
				if ctx.Err() != nil {
					return out, ctx.Err()
				}
				c, err := rig.measure(ctx, tok, texts[n], plan)
				if err != nil {
					return nil, fmt.Errorf("%d endpoints, %d keys, %d tokens: %w", eps, resident, n, err)
				}
				out.Cells = append(out.Cells, c)
				if progress != nil {
					progress(c)
				}
				if !plan.MultiTurn || n < multiTurnMin {
					continue
				}
				for i, kb := range plan.KeyCacheBytes {
					c, err = rig.measureMultiTurn(ctx, cached, ctok, n, plan, kb, i > 0)
					if err != nil {
						return nil, fmt.Errorf("%d endpoints, %d keys, %d tokens, multi-turn: %w", eps, resident, n, err)
					}
					out.Cells = append(out.Cells, c)
					if progress != nil {
						progress(c)
					}
				}
			}
			rig.inv = nil // the next fill starts from an empty heap
			runtime.GC()
		}
	}
	return out, nil
}

// promptOfTokens is synthetic text of at least n tokens.
func promptOfTokens(tok *tokenize.Tokenizer, n int) string {
	tpw := tokensPerWord(tok)
	words0 := int(float64(n) / tpw)
	for {
		s := words(textRand(5, "scale", n), words0)
		ids, _ := tok.Encode(s, true)
		if len(ids) >= n {
			return s
		}
		words0 += max(1, int(float64(n-len(ids))/tpw))
	}
}

type scaleRig struct {
	rule     *rules.Rule
	cert     inventory.Mask
	inv      *inventory.Index
	router   *route.Router
	eps      []*route.Endpoint
	hasher   *hashcore.Hasher
	model    string
	endpoint int
	resident int
}

func newScaleRig(toks *tokenize.Pool, model string, ct *contracts.Contract, n, resident int) (*scaleRig, ScaleInventory, error) {
	r := &rules.Rule{Name: "scale", Models: []string{model}, Engine: rules.EngineRef{Family: family, Release: release}, KVExactMode: rules.KVExactPool,
		Binding: "engine", Seed: &seed0}
	for i := 0; i < n; i++ {
		r.Endpoints = append(r.Endpoints, rules.Endpoint{Name: fmt.Sprintf("e%d", i), Address: fmt.Sprintf("http://127.0.0.1:%d", 20000+i)})
	}
	zero := 0
	r.LoadLaw.ColdStartSeedN = &zero // every decision measures the same path
	if err := r.Normalize(); err != nil {
		return nil, ScaleInventory{}, err
	}
	h, err := hashcore.New(hashcore.Binding{Algorithm: hashcore.Algorithm(r.HashAlgorithm), BlockSize: r.BlockSize, Seed: &seed0}, hashcore.Default())
	if err != nil {
		return nil, ScaleInventory{}, err
	}
	before := heapNow()
	inv := inventory.New(inventory.Config{})
	rig := &scaleRig{inv: inv, hasher: h, model: model, resident: resident}
	var cert inventory.Mask
	for i, e := range r.Endpoints {
		id, err := inv.AddEndpoint(e.Name)
		if err != nil {
			return nil, ScaleInventory{}, err
		}
		cert.Set(id)
		rig.eps = append(rig.eps, &route.Endpoint{ID: id, Index: i, Name: e.Name, Address: e.Address, Role: route.RoleNormal, Weight: 1, Capacity: 1,
			Health: health.NewEndpoint(e.Name, e.Address, health.BreakerConfig{})})
	}
	// Random resident keys, evenly over the endpoints, stored in batches of 64 as events carry them.
	rnd := rand.New(rand.NewPCG(uint64(n), uint64(resident)))
	batch := make([]uint64, 64)
	start := time.Now()
	for stored, ep := 0, 0; stored < resident; ep = (ep + 1) % n {
		k := min(len(batch), resident-stored)
		for i := range batch[:k] {
			batch[i] = rnd.Uint64()
		}
		if err := inv.Store(rig.eps[ep].ID, batch[:k]); err != nil {
			return nil, ScaleInventory{}, err
		}
		stored += k
	}
	fill := time.Since(start)
	after := heapNow()
	si := ScaleInventory{Endpoints: n, Resident: resident, BytesPerKey: float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(resident),
		StoreOpsPerSec: float64(resident) / fill.Seconds()}
	rig.rule, rig.cert = r, cert
	if rig.router, err = rig.routerOn(toks, nil); err != nil {
		return nil, ScaleInventory{}, err
	}
	return rig, si, nil
}

// routerOn is the rig's router with its keyer on the tokenizers of toks and the key cache keys
// (nil: none).
func (s *scaleRig) routerOn(toks *tokenize.Pool, keys *route.KeyCache) (*route.Router, error) {
	return route.New(route.Config{Rule: s.rule, Endpoints: s.eps, Index: s.inv, Keyer: &route.PromptKeyer{Pool: toks, Hasher: s.hasher, Cache: keys}, Certified: s.cert})
}

// selfCPU is the process's user + system time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func heapNow() runtime.MemStats {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m
}

// measure stores the prompt's keys on one endpoint (rotating per prompt) and times decisions.
func (s *scaleRig) measure(ctx context.Context, tok *tokenize.Tokenizer, text string, plan ScalePlan) (ScaleCell, error) {
	ids, err := tok.Encode(text, true)
	if err != nil {
		return ScaleCell{}, err
	}
	keys, err := s.hasher.Keys(ids, nil, nil)
	if err != nil {
		return ScaleCell{}, err
	}
	s.endpoint = (s.endpoint + 1) % len(s.eps)
	want := s.eps[s.endpoint]
	if err := s.inv.Store(want.ID, keys); err != nil {
		return ScaleCell{}, err
	}
	req := &route.Request{Model: s.model, Prompt: text}
	c := ScaleCell{Endpoints: len(s.eps), Resident: s.resident, PromptTokens: len(ids), Blocks: len(keys)}
	var dec, tk []float64
	deadline := time.Now().Add(plan.Budget / 2)
	cpu0 := selfCPU()
	for i := 0; i < plan.Repeats && (i < 5 || time.Now().Before(deadline)); i++ {
		t0 := time.Now()
		d, err := s.router.Explain(ctx, req)
		dec = append(dec, ms(time.Since(t0)))
		if err != nil {
			return c, err
		}
		if d.Tier != route.TierKVExact || d.TargetN != want.Name || d.Score != len(keys) {
			return c, fmt.Errorf("decision %s → %s score %d, want kv-exact → %s with %d (%s)", d.Tier, d.TargetN, d.Score, want.Name, len(keys), d.Reason)
		}
		c.Score = d.Score
	}
	c.CPUms = ms(selfCPU()-cpu0) / float64(len(dec))
	deadline = time.Now().Add(plan.Budget / 2)
	for i := 0; i < len(dec) && (i < 5 || time.Now().Before(deadline)); i++ {
		t0 := time.Now()
		_, _ = tok.Encode(text, true)
		tk = append(tk, ms(time.Since(t0)))
	}
	c.Decisions = len(dec)
	c.Decision, c.Tokenize = pct(dec), pct(tk)
	return c, nil
}

// ScaleTable is the Markdown of a scale run, each figure beside the peer figure it is compared
// with (docs/benchmarks/peers.md cites them).
func ScaleTable(s *Scale) string {
	var b []byte
	app := func(f string, a ...any) { b = fmt.Appendf(b, f, a...) }
	app("Command: `%s` — %d cores (%s), load average %s.\n\n", s.Command, s.Machine.Cores, s.Machine.CPU, s.Machine.Load)
	app("| endpoints | resident (endpoint, key) | heap B / resident key | inventory stores / s (1 goroutine) | target |\n|---|---|---|---|---|\n")
	for _, in := range s.Inventories {
		met := "missed"
		if in.BytesPerKey <= 24 {
			met = "met"
		}
		app("| %d | %d | %.1f | %.2f M | ≤ 24 B/key: %s; ≥ 2 M ops/s/core: %s |\n", in.Endpoints, in.Resident, in.BytesPerKey, in.StoreOpsPerSec/1e6, met,
			map[bool]string{true: "met", false: "missed"}[in.StoreOpsPerSec >= 2e6])
	}
	app("\n| endpoints | resident keys | prompt tokens | blocks | decisions | decision p50 / p99 ms | CPU ms / decision | tokenize p50 / p99 ms | p50 ≤ 3 ms at 100k |\n|---|---|---|---|---|---|---|---|---|\n")
	cells := append([]ScaleCell(nil), s.Cells...)
	sort.SliceStable(cells, func(i, j int) bool { return cells[i].Endpoints < cells[j].Endpoints })
	for _, c := range cells {
		t := "—"
		if c.PromptTokens >= 100_000 {
			t = map[bool]string{true: "met", false: "missed"}[c.Decision.P50 <= 3]
		}
		prompt := fmt.Sprint(c.PromptTokens)
		if c.MultiTurn {
			prompt += " multi-turn" + c.keyCacheLabel()
		}
		app("| %d | %d | %s | %d | %d | %.2f / %.2f | %.2f | %.2f / %.2f | %s |\n", c.Endpoints, c.Resident, prompt, c.Blocks, c.Decisions,
			c.Decision.P50, c.Decision.P99, c.CPUms, c.Tokenize.P50, c.Tokenize.P99, t)
	}
	return string(b)
}

// conversation is a chat body of about n tokens: alternating user and assistant turns of
// multiTurnTurn tokens, then (when next ≥ 0) new user turn number next, with the generation prompt;
// without it, the rendering of the turns alone is the prefix every later request starts with.
func conversation(tok *tokenize.Tokenizer, n, next int) (*tokenize.ChatRequest, error) {
	tpw := tokensPerWord(tok)
	var msgs []map[string]string
	for k := 0; k < max(1, n/multiTurnTurn); k++ {
		msgs = append(msgs, map[string]string{"role": []string{"user", "assistant"}[k%2], "content": words(textRand(5, "turn", k), int(multiTurnTurn/tpw))})
	}
	body := map[string]any{"messages": msgs, "add_generation_prompt": false}
	if next >= 0 {
		msgs = append(msgs, map[string]string{"role": "user", "content": words(textRand(5, "new turn", next), int(200/tpw))})
		body = map[string]any{"messages": msgs}
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	return tokenize.ParseChatRequest(b)
}

// measureMultiTurn stores the conversation's earlier turns on one endpoint and times decisions of
// chat requests that append one new user turn each (a different one per decision), the segment
// cache (and the key cache of keyCacheBytes, 0: none) warmed by one untimed request — the previous
// turn of the conversation. again: the same conversation as the cell before, on the same endpoint.
func (s *scaleRig) measureMultiTurn(ctx context.Context, cached *tokenize.Pool, tok *tokenize.Tokenizer, n int, plan ScalePlan, keyCacheBytes int64, again bool) (ScaleCell, error) {
	router, err := s.routerOn(cached, route.NewKeyCache(keyCacheBytes))
	if err != nil {
		return ScaleCell{}, err
	}
	base, err := conversation(tok, n, -1)
	if err != nil {
		return ScaleCell{}, err
	}
	prefix, _, err := tok.EncodeChat(base)
	if err != nil {
		return ScaleCell{}, err
	}
	keys, err := s.hasher.Keys(prefix, nil, nil)
	if err != nil {
		return ScaleCell{}, err
	}
	if !again {
		s.endpoint = (s.endpoint + 1) % len(s.eps)
	}
	want := s.eps[s.endpoint]
	if err := s.inv.Store(want.ID, keys); err != nil {
		return ScaleCell{}, err
	}
	request := func(i int) (*route.Request, error) {
		cr, err := conversation(tok, n, i)
		if err != nil {
			return nil, err
		}
		return &route.Request{Model: s.model, Chat: true, ChatRequest: cr}, nil
	}
	c := ScaleCell{MultiTurn: true, KeyCacheBytes: keyCacheBytes, Endpoints: len(s.eps), Resident: s.resident, Blocks: len(keys)}
	warm, err := request(0)
	if err != nil {
		return c, err
	}
	if _, err := router.Explain(ctx, warm); err != nil {
		return c, err
	}
	var dec, tk []float64
	var cpu time.Duration
	deadline := time.Now().Add(plan.Budget / 2)
	for i := 1; i <= plan.Repeats && (i <= 5 || time.Now().Before(deadline)); i++ {
		req, err := request(i) // built untimed: the proxy parses the body before the decision
		if err != nil {
			return c, err
		}
		cpu0, t0 := selfCPU(), time.Now()
		d, err := router.Explain(ctx, req)
		dec = append(dec, ms(time.Since(t0)))
		cpu += selfCPU() - cpu0
		if err != nil {
			return c, err
		}
		if d.Tier != route.TierKVExact || d.TargetN != want.Name || d.Score < len(keys) {
			return c, fmt.Errorf("decision %s → %s score %d, want kv-exact → %s with at least %d (%s)", d.Tier, d.TargetN, d.Score, want.Name, len(keys), d.Reason)
		}
		c.Score = d.Score
	}
	c.CPUms = ms(cpu) / float64(len(dec))
	deadline = time.Now().Add(plan.Budget / 2)
	for i := 0; i < len(dec) && (i < 5 || time.Now().Before(deadline)); i++ {
		req, err := request(plan.Repeats + 1 + i) // new turns: cached earlier turns only
		if err != nil {
			return c, err
		}
		t0 := time.Now()
		ids, _, err := tok.EncodeChat(req.ChatRequest)
		tk = append(tk, ms(time.Since(t0)))
		if err != nil {
			return c, err
		}
		c.PromptTokens = len(ids)
	}
	c.Decisions = len(dec)
	c.Decision, c.Tokenize = pct(dec), pct(tk)
	return c, nil
}

// keyCacheLabel marks a multi-turn cell whose key cache is not the gateway's default.
func (c ScaleCell) keyCacheLabel() string {
	switch c.KeyCacheBytes {
	case route.DefaultKeyCacheBytes:
		return ""
	case 0:
		return ", no key cache"
	}
	return fmt.Sprintf(", key cache %d B", c.KeyCacheBytes)
}
