package kvbench

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
)

func completionReq(prompt, salt string, tokens int) *Request {
	m := map[string]any{"model": "m", "prompt": prompt}
	if salt != "" {
		m["cache_salt"] = salt
	}
	b, _ := json.Marshal(m)
	toks := make([]uint32, tokens)
	for i := range toks {
		toks[i] = uint32(len(prompt)*31 + i) // distinct per prompt length, stable per prompt
	}
	return &Request{Body: b, Tokens: toks, CacheSalt: salt}
}

// tokensOf gives a request tokens derived from its prompt text, so equal prompts have equal tokens.
func tokensOf(prompt string) []uint32 {
	var out []uint32
	for i := 0; i < len(prompt); i++ {
		out = append(out, uint32(prompt[i]))
	}
	return out
}

func TestTextTreeMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var tr textTree
	var all []string
	gen := func() string {
		n := 1 + r.IntN(12)
		var b strings.Builder
		for i := 0; i < n; i++ {
			b.WriteByte("ab"[r.IntN(2)])
		}
		return b.String()
	}
	for i := 0; i < 300; i++ {
		s := gen()
		q := gen()
		want := 0
		for _, a := range all {
			want = max(want, lcp(a, q))
		}
		if got := tr.match(q); got != want {
			t.Fatalf("match(%q) = %d, want %d (texts %v)", q, got, want, all)
		}
		tr.insert(s)
		dup := false
		for _, a := range all {
			dup = dup || a == s
		}
		if !dup {
			all = append(all, s)
		}
		// The tree's size is its trie's character count: distinct non-empty prefixes.
		prefixes := map[string]bool{}
		for _, a := range all {
			for j := 1; j <= len(a); j++ {
				prefixes[a[:j]] = true
			}
		}
		if tr.size != len(prefixes) {
			t.Fatalf("size %d, trie has %d characters", tr.size, len(prefixes))
		}
	}
}

func TestDynamoApproxPredictsFromItsOwnDecisionsUntilTTL(t *testing.T) {
	now := time.Unix(0, 0)
	c := newChooser(PeerDynamoApprox, 4, 16, 512, 4, 6, "m", func() time.Time { return now }).(*dynamoApprox)
	p := strings.Repeat("shared prefix ", 40)
	q := &Request{Body: []byte(`{}`), Tokens: tokensOf(p)}
	first := c.pick(q, nil)
	if first.predicted != 0 {
		t.Fatalf("first request predicted %d cached tokens on an empty pool", first.predicted)
	}
	c.done(first)
	second := c.pick(q, nil)
	if second.idx != first.idx || second.predicted != len(q.Tokens)/16*16 {
		t.Fatalf("second request: endpoint %d predicted %d, want endpoint %d with %d", second.idx, second.predicted, first.idx, len(q.Tokens)/16*16)
	}
	c.done(second)
	now = now.Add(121 * time.Second)
	if third := c.pick(q, nil); third.predicted != 0 {
		t.Fatalf("after the 120 s TTL the router still predicts %d tokens", third.predicted)
	}
}

func TestDynamoApproxCostCountsActiveBlocks(t *testing.T) {
	c := newChooser(PeerDynamoApprox, 2, 16, 512, 4, 6, "m", time.Now).(*dynamoApprox)
	hot := &Request{Body: []byte(`{}`), Tokens: tokensOf(strings.Repeat("x", 64))}
	a := c.pick(hot, nil) // 4 blocks cached (predicted) on a
	// Load a with a long request so its decode blocks outweigh the 4-block overlap.
	long := &Request{Body: []byte(`{}`), Tokens: tokensOf(strings.Repeat("y", 2000))}
	c.blocks[a.idx] += 1000
	b := c.pick(long, nil)
	if b.idx == a.idx {
		t.Fatalf("a request without overlap went to the endpoint with 1000 more active blocks")
	}
	again := c.pick(hot, nil)
	if again.idx == a.idx {
		t.Fatalf("4 blocks of overlap beat 1000 active blocks: the cost ignores decode load")
	}
}

func TestSGLangTreeAffinityThresholdAndSmallestTree(t *testing.T) {
	c := newChooser(PeerSGLangTree, 3, 16, 512, 4, 6, "m", time.Now).(*sglangTree)
	a := completionReq(strings.Repeat("alpha ", 50)+"one", "", 100)
	first := c.pick(a, nil)
	again := c.pick(completionReq(strings.Repeat("alpha ", 50)+"two", "", 100), nil)
	if again.idx != first.idx || again.predicted == 0 {
		t.Fatalf("a text sharing > 30%% went to %d (predicted %d), want %d", again.idx, again.predicted, first.idx)
	}
	other := c.pick(completionReq(strings.Repeat("omega ", 50), "", 100), nil)
	if other.idx == first.idx {
		t.Fatalf("an unmatched text went to the worker with the largest tree")
	}
	// Imbalance: more than 64 apart and 1.5× → shortest queue regardless of the match.
	c.load[first.idx] += 100
	if d := c.pick(completionReq(strings.Repeat("alpha ", 50)+"three", "", 100), nil); d.idx == first.idx {
		t.Fatalf("an imbalanced pool still followed the tree")
	}
}

func TestAIBrixMeanPlusKSigma(t *testing.T) {
	// 16 pods: with n pods the largest z-score is (n−1)/√n, so with 4 a single hot pod can never
	// exceed mean + 2σ (1.5σ at most) and only the imbalance check protects it.
	c := newChooser(PeerAIBrix, 16, 16, 512, 4, 6, "m", time.Now).(*aibrixPrefix)
	p := strings.Repeat("prefix text ", 40)
	first := c.pick(completionReq(p, "", 100), nil)
	c.done(first) // with one request running on 1 of 16 pods, that pod is above mean + 2σ already
	if d := c.pick(completionReq(p+" more", "", 100), nil); d.idx != first.idx || d.predicted == 0 {
		t.Fatalf("matching prefix went to %d (predicted %d), want %d", d.idx, d.predicted, first.idx)
	}
	// Loads 10, 0, 0, …: mean + 2σ ≈ 5.5 is below the matched pod's running count.
	for i := range c.load {
		c.load[i] = 0
	}
	c.load[first.idx] = 10
	if d := c.pick(completionReq(p+" again", "", 100), nil); d.idx == first.idx {
		t.Fatalf("a pod above mean + 2σ kept the request")
	}
	// Imbalance over 16 → least running, even for a full match.
	c.load[first.idx] = 30
	if d := c.pick(completionReq(p, "", 100), nil); d.idx == first.idx || d.predicted != 0 {
		t.Fatalf("imbalanced pool: endpoint %d predicted %d", d.idx, d.predicted)
	}
}

func TestLLMDEstimateSaltAndBlocks(t *testing.T) {
	c := newChooser(PeerLLMDEstimate, 4, 16, 512, 4, 6, "m", time.Now).(*llmdEstimate)
	if got := len(chainBytes("m", strings.Repeat("z", 64*3+10), 64, 256)); got != 3 {
		t.Fatalf("%d blocks of 64 bytes in 202 bytes, want 3", got)
	}
	if got := len(chainBytes("m", strings.Repeat("z", 64*300), 64, 256)); got != 256 {
		t.Fatalf("%d blocks, want the 256-block cap", got)
	}
	p := strings.Repeat("system prompt ", 60)
	first := c.pick(completionReq(p, "tenant-a", 200), nil)
	c.done(first)
	same := c.pick(completionReq(p, "tenant-a", 200), nil)
	c.done(same)
	if same.idx != first.idx || same.predicted == 0 {
		t.Fatalf("same tenant, same prompt: endpoint %d predicted %d, want %d", same.idx, same.predicted, first.idx)
	}
	if other := c.pick(completionReq(p, "tenant-b", 200), nil); other.predicted != 0 {
		t.Fatalf("another tenant's salt matched %d tokens", other.predicted)
	}
}

func TestLRUEvictsLeastRecent(t *testing.T) {
	var l lru
	l.add([]uint64{1, 2, 3}, 3)
	l.add([]uint64{1}, 3) // 1 is now the most recent
	l.add([]uint64{4}, 3)
	if l.has(2) || !l.has(1) || !l.has(3) || !l.has(4) {
		t.Fatalf("after touching 1 and adding 4 at capacity 3: has 1=%v 2=%v 3=%v 4=%v", l.has(1), l.has(2), l.has(3), l.has(4))
	}
}

// The oracle counts what is in flight: a burst of one new prefix follows the first request before
// any block is cached, and the blocks stop counting once the request ends.
func TestOracleSeesInFlightWork(t *testing.T) {
	caches := []map[uint64]int{{}, {}, {}, {}}
	law := route.Law{Kind: route.LawHard, FactorPct: 175}
	o := newOracleOf(4, func(i int) map[uint64]int { return caches[i] }, law, 16, 512)
	keys := []uint64{1, 2, 3, 4}
	a := o.pick(nil, keys)
	b := o.pick(nil, keys)
	if b.idx != a.idx || b.predicted != 4*16 {
		t.Fatalf("second of a burst: endpoint %d predicted %d, want %d with 64", b.idx, b.predicted, a.idx)
	}
	o.done(a)
	o.done(b)
	if c := o.pick(nil, keys); c.predicted != 0 {
		t.Fatalf("finished requests whose blocks were never cached still predict %d", c.predicted)
	}
	// True cache contents win over load up to the law's cap.
	caches[2] = map[uint64]int{1: 1, 2: 1}
	o2 := newOracleOf(4, func(i int) map[uint64]int { return caches[i] }, law, 16, 512)
	if d := o2.pick(nil, keys); d.idx != 2 || d.predicted != 32 {
		t.Fatalf("endpoint %d predicted %d, want endpoint 2 with its 2 cached blocks", d.idx, d.predicted)
	}
}

// Prompts held nowhere, each done before the next: the hard-law oracle spreads them over the idle
// engines as the gateway's least-load selector does, not all onto the first.
func TestOracleRotatesMissTies(t *testing.T) {
	caches := []map[uint64]int{{}, {}, {}, {}}
	o := newOracleOf(4, func(i int) map[uint64]int { return caches[i] }, route.Law{Kind: route.LawHard, FactorPct: 175, CapFloor: 8, SpillRelief: true}, 16, 512)
	per := map[int]int{}
	for i := range 8 {
		tk := o.pick(nil, []uint64{uint64(100 + i)})
		per[tk.idx]++
		o.done(tk)
	}
	for i := range 4 {
		if per[i] != 2 {
			t.Fatalf("8 misses on 4 idle engines went %v, want 2 each", per)
		}
	}
}

func TestOracleChecksFlagABeatenOracle(t *testing.T) {
	rep := &Report{Cells: []*Cell{
		{Workload: "w", Policy: PolicyOracle, Load: 0.6, CachedRatio: 0.50, CachedRatioSE: 0.01, Valid: true},
		{Workload: "w", Policy: "a", Load: 0.6, CachedRatio: 0.52, CachedRatioSE: 0.01, Valid: true},   // within 2σ
		{Workload: "w", Policy: "bad", Load: 0.6, CachedRatio: 0.9, CachedRatioSE: 0.01, Valid: false}, // invalid: ignored
	}}
	got := OracleChecks(rep)
	if len(got) != 1 || !got[0].Evaluated || !got[0].Met {
		t.Fatalf("within noise: %+v", got)
	}
	rep.Cells = append(rep.Cells, &Cell{Workload: "w", Policy: "b", Load: 0.6, CachedRatio: 0.60, CachedRatioSE: 0.01, Valid: true})
	got = OracleChecks(rep)
	if len(got) != 1 || got[0].Met || !strings.Contains(got[0].Got, "NOT an upper bound") || !strings.Contains(got[0].Got, "b 0.600") {
		t.Fatalf("beaten oracle not reported: %+v", got)
	}
}

func TestCachedRatioSE(t *testing.T) {
	env := &Env{Pool: DefaultPoolShape(), SLO: time.Second}
	w := &Workload{Name: "w", Requests: make([]Request, 4)}
	same := []Result{{Status: 200, Prompt: 100, Cached: 50}, {Status: 200, Prompt: 100, Cached: 50}, {Status: 200, Prompt: 100, Cached: 50}, {Status: 200, Prompt: 100, Cached: 50}}
	if c := summarize(env, w, Policy{}, 1, 1, same, time.Now()); c.CachedRatio != 0.5 || c.CachedRatioSE != 0 {
		t.Fatalf("identical requests: ratio %v SE %v, want 0.5 and 0", c.CachedRatio, c.CachedRatioSE)
	}
	spread := []Result{{Status: 200, Prompt: 100, Cached: 0}, {Status: 200, Prompt: 100, Cached: 100}, {Status: 200, Prompt: 100, Cached: 0}, {Status: 200, Prompt: 100, Cached: 100}}
	if c := summarize(env, w, Policy{}, 1, 1, spread, time.Now()); c.CachedRatio != 0.5 || c.CachedRatioSE != 0.25 {
		t.Fatalf("all-or-nothing requests: ratio %v SE %v, want 0.5 and 0.25", c.CachedRatio, c.CachedRatioSE)
	}
}

// A scaled pool keeps the 4-engine pool's capacity in requests/s: the offered rate at a load is the
// same, whatever the engine count.
func TestScaledPoolKeepsTheRate(t *testing.T) {
	s := DefaultPoolShape()
	for _, n := range []int{16, 64} {
		x := s.Scaled(n)
		if x.Endpoints != n || x.PrefillPerToken != s.PrefillPerToken*time.Duration(n/4) {
			t.Fatalf("scaled to %d: %+v", n, x)
		}
		if a, b := s.Capacity(1000, 6), x.Capacity(1000, 6); a < b*0.999 || a > b*1.001 {
			t.Fatalf("%d engines: capacity %.2f req/s, the 4-engine pool's is %.2f", n, b, a)
		}
	}
}

// The oracle decides with mode 3's law even though its own rules are selector-only: when the only
// endpoint holding a short shared prefix is at its cap, the request spills to an idle endpoint
// instead of piling up (the first oracle sent a whole RAG run to one engine).
func TestOracleSpillsPastItsCap(t *testing.T) {
	r := &rules.Rule{Name: "oracle-e0", Engine: rules.EngineRef{Family: family, Release: release}, Seed: &seed0,
		Endpoints: []rules.Endpoint{{Name: "e0", Address: "http://127.0.0.1:1"}}}
	if err := r.Normalize(); err != nil {
		t.Fatal(err)
	}
	law := lawOf(r)
	if law.Kind != route.LawHard || law.FactorPct != 175 || !law.SpillRelief {
		t.Fatalf("oracle law %+v, want mode 3's default (hard, ε 0.75, spill relief)", law)
	}
	// The oracle follows the gateway's default law field by field (a new default moves both).
	r3 := &rules.Rule{Name: "kvx", KVExactMode: rules.KVExactPool, Engine: r.Engine, Seed: &seed0, Endpoints: r.Endpoints}
	if err := r3.Normalize(); err != nil {
		t.Fatal(err)
	}
	if gw := route.LawOf(r3.LoadLaw); law != gw {
		t.Fatalf("oracle law %+v, the gateway's default mode-3 law %+v", law, gw)
	}
	caches := []map[uint64]int{{1: 1}, {}, {}, {}}
	o := newOracleOf(4, func(i int) map[uint64]int { return caches[i] }, law, 16, 512)
	per := map[int]int{}
	// 3·floor + 2 concurrent requests sharing block 1, then each its own: a holder keeps at most
	// max(floor, its cap), so at least three engines serve them.
	n := 3*law.CapFloor + 2
	for i := 0; i < n; i++ {
		per[o.pick(nil, []uint64{1, uint64(100 + i)}).idx]++
	}
	if per[0] == n || len(per) < 3 {
		t.Fatalf("%d concurrent requests sharing one block went %v", n, per)
	}
}

// The cache-first oracle keeps affinity above 30 % of the prompt whatever the load, and sends a
// shallower match to the least loaded; the upper-bound check takes the better oracle.
func TestOracleCacheFirst(t *testing.T) {
	caches := []map[uint64]int{{1: 1, 2: 1, 3: 1}, {}, {}, {}}
	o := newOracleOf(4, func(i int) map[uint64]int { return caches[i] }, route.Law{Kind: route.LawHard, FactorPct: 175, SpillRelief: true}, 16, 512)
	o.cacheFirst = true
	for i := 0; i < 6; i++ { // 3 of 4 blocks cached on e0: every one of a concurrent burst stays
		if d := o.pick(nil, []uint64{1, 2, 3, uint64(10 + i)}); d.idx != 0 {
			t.Fatalf("request %d of a deep match went to %d", i, d.idx)
		}
	}
	if d := o.pick(nil, []uint64{1, 20, 21, 22}); d.idx == 0 {
		t.Fatal("a 25 % match kept the loaded endpoint")
	}
	rep := &Report{Cells: []*Cell{
		{Workload: "w", Policy: PolicyOracle, Load: 1, CachedRatio: 0.50, CachedRatioSE: 0.01, Valid: true},
		{Workload: "w", Policy: PolicyOracleCacheFirst, Load: 1, CachedRatio: 0.70, CachedRatioSE: 0.01, Valid: true},
		{Workload: "w", Policy: "sticky", Load: 1, CachedRatio: 0.69, CachedRatioSE: 0.01, Valid: true},
	}}
	if got := OracleChecks(rep); len(got) != 1 || !got[0].Met || !strings.Contains(got[0].Got, PolicyOracleCacheFirst) {
		t.Fatalf("best oracle not used: %+v", got)
	}
}
