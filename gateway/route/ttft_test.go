package route

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/promtest"
	"github.com/prometheus/client_golang/prometheus"
)

// tc is a candidate on a constructed queue state.
func tq(score, load, ahead int, r Rates) Scored {
	return Scored{Score: score, Load: load, Ahead: ahead, Capacity: 1, Rates: r}
}

func TestTTFTLawPicksTheHandComputation(t *testing.T) {
	fast := Rates{Prefill: 100 * time.Microsecond, Interference: 10 * time.Millisecond, Queue: 1}
	slow := Rates{Prefill: 400 * time.Microsecond, Interference: 10 * time.Millisecond, Queue: 1}
	half := Rates{Prefill: 200 * time.Microsecond, Interference: 10 * time.Millisecond, Queue: 0.5, RequestTokens: 512}
	fixed := func(ms int) Rates {
		r := DefaultRates
		r.Fixed = time.Duration(ms) * time.Millisecond
		return r
	}
	waiting := func(c Scored, n int) Scored { c.EngineWaiting = n; return c }
	// dr is DefaultRates with an interference of 10 ms learned (the defaults assume none).
	dr := DefaultRates
	dr.Interference = 10 * time.Millisecond
	slots := func(c Scored, n int) Scored { c.Slots = n; return c }
	// A request here holds its slot for 5 + 500·0.2 + 15 = 120 ms (fixed, a typical prefill and
	// its decode); with 4 slots the j-th to free does so after j·120/5 = j·24 ms.
	sr := Rates{Fixed: 5 * time.Millisecond, Prefill: 200 * time.Microsecond, Queue: 1, RequestTokens: 500, Decode: 15 * time.Millisecond}
	law := Law{Kind: LawTTFT, BlockSize: 16}
	for _, tc := range []struct {
		name  string
		cands []Scored
		q     int // prompt blocks
		pos   int
		want  []float64 // predicted ms per candidate, computed by hand
		spill bool
	}{
		// 64 blocks = 1024 tokens. a holds 60 (64 own tokens), 2 in flight with 3000 tokens queued:
		// 3064·0.2 + 2·10 = 632.8 ms. b holds nothing, idle: 1024·0.2 = 204.8 ms → b, a spill.
		{"deep holder behind a long queue loses to an idle cold endpoint",
			withIndex(tq(60, 2, 3000, dr), tq(0, 0, 0, dr)), 64, 1, []float64{632.8, 204.8}, true},
		// Same, a's queue 500 tokens: 564·0.2 + 20 = 132.8 ms < 204.8 → a keeps it.
		{"a short queue keeps the holder",
			withIndex(tq(60, 2, 500, dr), tq(0, 0, 0, dr)), 64, 0, []float64{132.8, 204.8}, false},
		// Decode interference alone: a holds 32 (512 own) with 30 in flight: 102.4 + 300 = 402.4;
		// b holds 0, 1 in flight: 204.8 + 10 = 214.8 → b.
		{"decode interference moves a request",
			withIndex(tq(32, 30, 0, dr), tq(0, 1, 0, dr)), 64, 1, []float64{402.4, 214.8}, true},
		// Rates differ: a (slow, holds 16: 768 own) 307.2 ms; b (fast, holds 0) 102.4 ms → b.
		{"the learned rate decides between cold and warm",
			withIndex(tq(16, 0, 0, slow), tq(0, 0, 0, fast)), 64, 1, []float64{307.2, 102.4}, true},
		// Equal predictions: a holds 8 (896 own) with none queued, b holds 16 (768 own) with 128
		// queued → both 896·0.2 + 10 = 189.2 ms; the tie goes to the larger exact hit, b.
		{"tie to the larger exact hit",
			withIndex(tq(8, 1, 0, dr), tq(16, 1, 128, dr)), 64, 1, []float64{189.2, 189.2}, false},
		// An engine that overlaps half its queued work: a (queue 0.5) holds 60 with 3000 queued
		// and 2 in flight: 12.8 + 0.5·(600 + 20) = 322.8 ms; b idle cold 204.8 → b still; with
		// 1000 queued: 12.8 + 0.5·(200 + 20) = 122.8 → a.
		{"a learned queue share halves the wait",
			withIndex(tq(60, 2, 3000, half), tq(0, 0, 0, half)), 64, 1, []float64{322.8, 204.8}, true},
		{"a learned queue share keeps the holder",
			withIndex(tq(60, 2, 1000, half), tq(0, 0, 0, half)), 64, 0, []float64{122.8, 204.8}, false},
		// Zero rates are DefaultRates: one idle candidate holding everything but the last block.
		{"unset rates default", withIndex(tq(63, 0, 0, Rates{})), 64, 0, []float64{3.2}, false},
		// A fixed cost is paid by a full hit too: a holds all 64 blocks at a fixed 100 ms, b holds
		// nothing at 5 ms: 100 against 204.8 + 5 → a; at a fixed 300 ms b wins.
		{"a full hit still pays the fixed cost",
			withIndex(tq(64, 0, 0, fixed(100)), tq(0, 0, 0, fixed(5))), 64, 0, []float64{100, 209.8}, false},
		{"a large fixed cost moves the request",
			withIndex(tq(64, 0, 0, fixed(300)), tq(0, 0, 0, fixed(5))), 64, 1, []float64{300, 209.8}, true},
		// The engine reports 4 requests waiting beyond the gateway's own, 512 tokens each: a (holds
		// 60, 64 own) 12.8 + 2048·0.2 = 422.4 ms against b's idle cold 204.8 → b. Without the
		// report a keeps it (12.8, the case below).
		{"the engine's waiting requests queue ahead",
			withIndex(waiting(tq(60, 0, 0, DefaultRates), 4), tq(0, 0, 0, DefaultRates)), 64, 1, []float64{422.4, 204.8}, true},
		{"no engine report, the holder keeps it",
			withIndex(tq(60, 0, 0, DefaultRates), tq(0, 0, 0, DefaultRates)), 64, 0, []float64{12.8, 204.8}, false},
		// Under a learned queue share the engine's waiting work is discounted like the gateway's:
		// 12.8 + 0.5·(1000 + 2·512)·0.2 = 215.2 against b's 204.8 → b.
		{"the engine's waiting work shares the queue share",
			withIndex(waiting(tq(60, 0, 1000, half), 2), tq(0, 0, 0, half)), 64, 1, []float64{215.2, 204.8}, true},
		// The slot wait, a holding 60 of 64 blocks (64 own tokens: 12.8 ms) at sr, no interference:
		// below the limit (3 in flight of 4 slots) 5 + 12.8 = 17.8 ms; at it (4) the first slot to
		// free, 24 ms more: 41.8; one past it (5) the second: 65.8; 8 in flight (4 waiting ahead)
		// a whole round of 120 and the first of the next: 5 + 12.8 + 144 = 161.8.
		{"below the slot limit no slot wait", withIndex(slots(tq(60, 3, 0, sr), 4)), 64, 0, []float64{17.8}, false},
		{"at the slot limit the first slot to free", withIndex(slots(tq(60, 4, 0, sr), 4)), 64, 0, []float64{41.8}, false},
		{"one past the slot limit the second", withIndex(slots(tq(60, 5, 0, sr), 4)), 64, 0, []float64{65.8}, false},
		{"a round of slots costs a whole request", withIndex(slots(tq(60, 8, 0, sr), 4)), 64, 0, []float64{161.8}, false},
		{"an unknown slot count waits for none", withIndex(slots(tq(60, 5, 0, sr), 0)), 64, 0, []float64{17.8}, false},
		// 12 in flight on a (8 waiting ahead: 2·120 + 24): 5 + 12.8 + 264 = 281.8 against b idle
		// cold (5 + 204.8 = 209.8) → b; without the slot term a's 17.8 would keep it.
		{"a full engine sends the request to an idle cold one",
			withIndex(slots(tq(60, 12, 0, sr), 4), slots(tq(0, 0, 0, sr), 4)), 64, 1, []float64{281.8, 209.8}, true},
	} {
		v := law.Pick(tc.cands, tc.q)
		if v.Pos != tc.pos || v.Spill != tc.spill {
			t.Errorf("%s: pos %d spill %v, want %d %v (%+v)", tc.name, v.Pos, v.Spill, tc.pos, tc.spill, v.TTFT)
		}
		for i, w := range tc.want {
			p := v.TTFT[i]
			if math.Abs(p.TotalMS-w) > 1e-9 || math.Abs(p.FixedMS+p.AheadMS+p.OwnMS+p.InterferenceMS+p.SlotWaitMS-p.TotalMS) > 1e-6 {
				t.Errorf("%s: candidate %d predicted %+v, want %.1f ms", tc.name, i, p, w)
			}
		}
	}
}

func TestSlotsAndDecodeAreLearned(t *testing.T) {
	// The slot count: configured wins; else the most running reported while some waited (a
	// report with none waiting, or a failed one, shows no limit).
	e := &Endpoint{}
	for _, r := range []EngineReport{{Running: 6}, {Running: 3, Waiting: 2}, {Running: 9, Waiting: 1, Err: "connect"}, {Running: 2, Waiting: 5}} {
		e.SetEngineReport(&r)
	}
	if e.Slots() != 3 {
		t.Fatalf("learned slots %d, want 3", e.Slots())
	}
	if e.MaxRunning = 8; e.Slots() != 8 {
		t.Fatalf("configured slots %d, want 8", e.Slots())
	}
	// A receipt's decode time feeds Decode; a predicted slot wait is taken out of what the queue
	// share learns: 100 ms of TTFT, 80 of them the slot wait, over 100 ms of queued work → 0.2.
	est := newEstimator(Rates{Prefill: time.Millisecond, Interference: 0, Queue: 1})
	est.observe(Receipt{TTFT: 100 * time.Millisecond, Ahead: 100, Load: 4, SlotWait: 80 * time.Millisecond, Decode: 30 * time.Millisecond})
	if r := est.Rates(); math.Abs(r.Queue-0.2) > 1e-9 || r.Decode != 30*time.Millisecond {
		t.Fatalf("learned %+v, want queue 0.2 and decode 30ms", r)
	}
}

func TestEstimatorConvergesAndResistsOutliers(t *testing.T) {
	// The interference is warm-started at its truth (the family's decode step); the prefill rate
	// and the queue share are learned.
	truth := Rates{Prefill: 80 * time.Microsecond, Interference: 25 * time.Millisecond, Queue: 0.3}
	e := newEstimator(Rates{Prefill: DefaultRates.Prefill, Interference: truth.Interference, Queue: 1})
	// Synthetic receipts from the model with ±5 % jitter; every 5th an outlier 20× slow (a stall).
	for i := 0; i < 300; i++ {
		jit := 0.95 + 0.1*float64(i%11)/10
		comp := 300 + 37*(i%13)
		load := i % 4
		ahead := 100 * load
		work := float64(time.Duration(comp) * truth.Prefill)
		work += truth.Queue * float64(time.Duration(ahead)*truth.Prefill+time.Duration(load)*truth.Interference)
		ttft := time.Duration(jit * work)
		if i%5 == 4 {
			ttft *= 20
		}
		e.observe(Receipt{TTFT: ttft, Computed: comp, Ahead: ahead, Load: load})
	}
	got := e.Rates()
	within := func(a, b, pct float64) bool { return math.Abs(a-b) <= pct*b }
	if !within(float64(got.Prefill), float64(truth.Prefill), 0.06) || !within(got.Queue, truth.Queue, 0.2) || got.Interference != truth.Interference {
		t.Fatalf("estimate %+v, truth %+v", got, truth)
	}
	// Before any receipt the seed stands; a receipt with no TTFT teaches nothing. An idle one
	// one token short of minPrefillSample measures the fixed cost, not the prefill rate; one at
	// it measures the prefill rate, net of that fixed cost, and the fixed cost is recomputed
	// against it: one round is (1 s − fx) / 256 and 1 s − 255 · that, the next round starts there.
	f := newEstimator(truth)
	f.observe(Receipt{Computed: 1000})
	if f.Rates() != truth {
		t.Fatalf("seed moved: %+v", f.Rates())
	}
	f.observe(Receipt{TTFT: time.Second, Computed: minPrefillSample - 1})
	if r := f.Rates(); r.Prefill != truth.Prefill || r.Fixed != time.Second-time.Duration(minPrefillSample-1)*truth.Prefill {
		t.Fatalf("a receipt below minPrefillSample taught %+v", r)
	}
	fx := f.Rates().Fixed
	f.observe(Receipt{TTFT: time.Second, Computed: minPrefillSample})
	if r := f.Rates(); r.Prefill >= (time.Second-fx)/minPrefillSample || r.Fixed <= fx {
		t.Fatalf("a receipt at minPrefillSample taught %+v", r)
	}
}

// TestFixedCostForgetsTheSeedPrefill: a new endpoint's first receipts are near-total hits read
// while the prefill rate is still its seed (200 µs a token, the engine's is 150 µs); the fixed cost
// they measure against the seed (TTFT 17.5 ms − 90 · 0.2 ms < 0: 0) must not stay once idle
// misses have taught the real rate. Near-total hits routed behind requests in flight (nothing
// queued ahead, no interference) measure it too. The truth: 4 ms + 150 µs a computed token.
func TestFixedCostForgetsTheSeedPrefill(t *testing.T) {
	truth := func(comp int) time.Duration { return 4*time.Millisecond + time.Duration(comp)*150*time.Microsecond }
	seed := DefaultRates
	seed.Interference = 0
	e := newEstimator(seed)
	for i := 0; i < 10; i++ {
		e.observe(Receipt{TTFT: truth(90), Computed: 90})
	}
	for i := 0; i < 3; i++ {
		e.observe(Receipt{TTFT: truth(1080), Computed: 1080})
	}
	for i := 0; i < 4; i++ {
		e.observe(Receipt{TTFT: truth(90), Computed: 90, Load: 2})
	}
	got := e.Rates()
	if d := got.Fixed - 4*time.Millisecond; d < -100*time.Microsecond || d > 100*time.Microsecond {
		t.Fatalf("fixed %v, want 4ms (rates %+v)", got.Fixed, got)
	}
	if d := got.Prefill - 150*time.Microsecond; d < -time.Microsecond || d > time.Microsecond {
		t.Fatalf("prefill %v, want 150µs", got.Prefill)
	}
	// An endpoint that is never idle on a near-total hit: its fixed cost is learned from the
	// near-total hits routed behind requests in flight.
	busy := newEstimator(seed)
	for i := 0; i < 3; i++ {
		busy.observe(Receipt{TTFT: truth(1080), Computed: 1080})
	}
	for i := 0; i < 5; i++ {
		busy.observe(Receipt{TTFT: truth(90), Computed: 90, Load: 1 + i%3})
	}
	if d := busy.Rates().Fixed - 4*time.Millisecond; d < -100*time.Microsecond || d > 100*time.Microsecond {
		t.Fatalf("fixed %v from loaded receipts, want 4ms (rates %+v)", busy.Rates().Fixed, busy.Rates())
	}
}

// TestEstimatorLearnsTheFixedCost: receipts from an engine with a fixed cost per request (a full
// hit still takes 32 ms), mixing near-total hits and larger prefills, idle and loaded, with
// jitter and stalls: every rate settles near its truth, and the prediction of a full hit is the
// fixed cost, not zero.
func TestEstimatorLearnsTheFixedCost(t *testing.T) {
	truth := Rates{Fixed: 32 * time.Millisecond, Prefill: 80 * time.Microsecond, Interference: 5 * time.Millisecond, Queue: 0.5}
	e := newEstimator(DefaultRates)
	for i := 0; i < 600; i++ {
		jit := 0.95 + 0.1*float64(i%11)/10
		comp := 16 * (i % 7) // near-total hits: 0–96 computed tokens
		if i%3 == 0 {
			comp = 300 + 37*(i%13)
		}
		load := (i / 2) % 3
		ahead := 0
		if i%4 == 3 && load > 0 {
			ahead = 400
		}
		work := float64(truth.Fixed + time.Duration(comp)*truth.Prefill)
		work += truth.Queue * float64(time.Duration(ahead)*truth.Prefill+time.Duration(load)*truth.Interference)
		if ahead == 0 {
			work = float64(truth.Fixed+time.Duration(comp)*truth.Prefill) + float64(time.Duration(load)*truth.Interference)
		}
		ttft := time.Duration(jit * work)
		if i%5 == 4 {
			ttft *= 20
		}
		e.observe(Receipt{TTFT: ttft, Computed: comp, Ahead: ahead, Load: load})
	}
	got := e.Rates()
	within := func(a, b, pct float64) bool { return math.Abs(a-b) <= pct*b }
	if !within(float64(got.Fixed), float64(truth.Fixed), 0.06) || !within(float64(got.Prefill), float64(truth.Prefill), 0.1) ||
		!within(float64(got.Interference), float64(truth.Interference), 0.25) || !within(got.Queue, truth.Queue, 0.25) {
		t.Fatalf("estimate %+v, truth %+v", got, truth)
	}
	if got.RequestTokens <= 0 || got.RequestTokens > 96 {
		t.Fatalf("median request %d tokens, want among the near-total hits' (≤ 96)", got.RequestTokens)
	}
	p := predictTTFT(Scored{Score: 64, Rates: got}, 64, 0, 16)
	if !within(p.TotalMS, 32, 0.06) || p.FixedMS != p.TotalMS {
		t.Fatalf("a full hit predicted %+v", p)
	}
}

// TestEngineWaitingCountsOthersOnce: the engine's waiting requests count beyond the gateway's own
// pending ones, only while the report is fresh (not once Until has passed), and the ttft
// decision's queue state includes them.
func TestEngineWaitingCountsOthersOnce(t *testing.T) {
	var e Endpoint
	if e.EngineWaiting() != 0 {
		t.Fatal("waiting without a report")
	}
	now := time.Now()
	e.SetEngineReport(&EngineReport{Waiting: 5, WaitingOthers: 3, Until: now.Add(time.Hour)})
	if got := e.EngineWaiting(); got != 3 {
		t.Fatalf("engine waiting %d, want 3", got)
	}
	e.SetEngineReport(&EngineReport{Waiting: 5, WaitingOthers: 3, Until: now.Add(-time.Millisecond)})
	if got := e.EngineWaiting(); got != 0 {
		t.Fatalf("a stale report still counts %d", got)
	}

	keys := keysN(64)
	f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keys}, func(r *rules.Rule) {
		r.LoadLaw.Kind = "ttft"
		r.PredictOnRoute = ttl(0)
	})
	bs := f.rt.rule.BlockSize
	f.inv.Store(f.eps[0].ID, keys[:60])
	ctx := context.Background()
	// One waiting beyond the gateway's own: a costs 64 own + 512 queued tokens (115.2 ms), which
	// still beats b's cold 1024 (204.8 ms); two would not (217.6 ms).
	f.eps[0].SetEngineReport(&EngineReport{Waiting: 1, WaitingOthers: 1, Until: time.Now().Add(time.Hour)})
	d, err := f.rt.Route(ctx, prompt, inventory.Mask{})
	if err != nil || d.Target != f.eps[0] {
		t.Fatalf("route: %v %+v", err, d)
	}
	ev := d.Endpoints[0]
	if ev.TTFT == nil || ev.TTFT.EngineWaiting != 1 || ev.TTFT.EngineWaitingTokens != DefaultRates.RequestTokens ||
		math.Abs(ev.TTFT.AheadMS-ms(time.Duration(DefaultRates.RequestTokens)*DefaultRates.Prefill)) > 1e-9 {
		t.Fatalf("a's prediction %+v", ev.TTFT)
	}
	if f.eps[0].Pending() != 1 || d.aheadAt != DefaultRates.RequestTokens {
		t.Fatalf("pending %d, queue state %d", f.eps[0].Pending(), d.aheadAt)
	}
	d.Receipt(10*time.Millisecond, 0, 64*bs, 60*bs)
	d.Release()
	if f.eps[0].Pending() != 0 || f.eps[0].Ahead() != 0 {
		t.Fatalf("after the receipt: pending %d, ahead %d", f.eps[0].Pending(), f.eps[0].Ahead())
	}
	// The receipt taught a request's size here (64 computed tokens): 20 waiting, 1280 tokens, put
	// a at 268.8 ms behind b's 204.8; released without a receipt, b's pending count drops once.
	if r := f.eps[0].rates.Load().Rates(); r.RequestTokens != 4*bs {
		t.Fatalf("learned request size %d", r.RequestTokens)
	}
	f.eps[0].SetEngineReport(&EngineReport{Waiting: 20, WaitingOthers: 20, Until: time.Now().Add(time.Hour)})
	d2, _ := f.rt.Route(ctx, prompt, inventory.Mask{})
	if d2.Target != f.eps[1] || f.eps[1].Pending() != 1 {
		t.Fatalf("twenty waiting: target %s, b pending %d", d2.TargetN, f.eps[1].Pending())
	}
	d2.Release()
	d2.Release()
	if f.eps[0].Pending() != 0 || f.eps[1].Pending() != 0 {
		t.Fatalf("pending after release: %d %d", f.eps[0].Pending(), f.eps[1].Pending())
	}
}

func TestWindowMedianKeepsTheLastWindow(t *testing.T) {
	var w window
	if _, ok := w.median(make([]float64, rateWindow)); ok {
		t.Fatal("empty window has a median")
	}
	for i := 0; i < rateWindow; i++ {
		w.add(1)
	}
	// rateWindow/2 samples of 9 leave the median at the midpoint of 1 and 9; one more tips it.
	for i := 0; i < rateWindow/2; i++ {
		w.add(9)
	}
	if m, _ := w.median(make([]float64, rateWindow)); m != 5 {
		t.Fatalf("median %v, want 5", m)
	}
	w.add(9)
	if m, _ := w.median(make([]float64, rateWindow)); m != 9 {
		t.Fatalf("median %v, want 9", m)
	}
}

func TestTTFTRouterQueuesPrefillUntilReceipt(t *testing.T) {
	keys := keysN(64)
	f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keys}, func(r *rules.Rule) {
		r.LoadLaw.Kind = "ttft"
		r.PredictOnRoute = ttl(0)
	})
	bs := f.rt.rule.BlockSize
	f.inv.Store(f.eps[0].ID, keys[:60])
	f.inv.Store(f.eps[1].ID, keys[:1])
	ctx := context.Background()
	d1, err := f.rt.Route(ctx, prompt, inventory.Mask{})
	if err != nil || d1.Target != f.eps[0] {
		t.Fatalf("first: %v %+v", err, d1)
	}
	if got := f.eps[0].Ahead(); got != 4*bs {
		t.Fatalf("a's queued prefill %d, want %d", got, 4*bs)
	}
	var ev *EndpointEvidence
	for i := range d1.Endpoints {
		if d1.Endpoints[i].Name == "a" {
			ev = &d1.Endpoints[i]
		}
	}
	if ev == nil || ev.TTFT == nil || ev.TTFT.OwnTokens != 4*bs {
		t.Fatalf("evidence lacks the prediction: %+v", d1.Endpoints)
	}
	// The receipt drains a's queue and teaches a's rate; Release after it drains nothing more.
	d1.Receipt(50*time.Millisecond, 0, 64*bs, 64*bs-minPrefillSample)
	if got := f.eps[0].Ahead(); got != 0 {
		t.Fatalf("after the receipt a's queued prefill is %d", got)
	}
	if r := f.eps[0].rates.Load().Rates(); r.Prefill != 50*time.Millisecond/minPrefillSample {
		t.Fatalf("a's learned prefill %v", r.Prefill)
	}
	d1.Release()
	if got := f.eps[0].Ahead(); got != 0 {
		t.Fatalf("after release a's queued prefill is %d", got)
	}
	// b, with no receipt, is warm-started from a's rates.
	if f.rt.ratesOf(f.eps[1]) != f.eps[0].rates.Load().Rates() {
		t.Fatal("b not warm-started from its rule's rates")
	}
	// Without a receipt, Release drains the queue.
	d2, _ := f.rt.Route(ctx, prompt, inventory.Mask{})
	if f.eps[d2.Target.Index].Ahead() == 0 {
		t.Fatal("second decision queued nothing")
	}
	d2.Release()
	d2.Release()
	if f.eps[0].Ahead() != 0 || f.eps[1].Ahead() != 0 {
		t.Fatalf("queues after release: %d %d", f.eps[0].Ahead(), f.eps[1].Ahead())
	}
}

// TestTTFTLawPricesThePartialBlock: the engine computes every uncached prompt token, the partial
// last block's included (the score counts full blocks only). A prompt of 64 full blocks of 16 and
// 12 tokens more (1036 tokens): a holds 62 blocks at 200 µs a token, b 63 at 350 µs. Priced by
// blocks, a computes 32 tokens (6.4 ms) and b 16 (5.6 ms) → b; by tokens a computes 44 (8.8 ms)
// and b 28 (9.8 ms) → a.
func TestTTFTLawPricesThePartialBlock(t *testing.T) {
	a := Rates{Prefill: 200 * time.Microsecond, Queue: 1}
	b := Rates{Prefill: 350 * time.Microsecond, Queue: 1}
	law := Law{Kind: LawTTFT, BlockSize: 16}
	for _, tc := range []struct {
		name   string
		tokens int
		pos    int
		want   []float64
		own    []int
	}{
		{"the partial block is computed", 64*16 + 12, 0, []float64{8.8, 9.8}, []int{44, 28}},
		{"a prompt on a block boundary has none", 64 * 16, 1, []float64{6.4, 5.6}, []int{32, 16}},
		{"no token count: full blocks only", 0, 1, []float64{6.4, 5.6}, []int{32, 16}},
	} {
		v := law.PickPrompt(withIndex(tq(62, 0, 0, a), tq(63, 0, 0, b)), 64, tc.tokens)
		if v.Pos != tc.pos {
			t.Errorf("%s: pos %d, want %d (%+v)", tc.name, v.Pos, tc.pos, v.TTFT)
		}
		for i := range tc.want {
			if p := v.TTFT[i]; math.Abs(p.TotalMS-tc.want[i]) > 1e-9 || p.OwnTokens != tc.own[i] {
				t.Errorf("%s: candidate %d predicted %.3f ms over %d own tokens, want %.1f over %d", tc.name, i, p.TotalMS, p.OwnTokens, tc.want[i], tc.own[i])
			}
		}
	}
}

// TestTTFTRouterQueuesThePartialBlock: the decision's own prefill, which its target's queue holds
// until the receipt, counts the prompt's partial last block: 64 full blocks and 12 tokens, a holds
// 60 → 4 blocks and 12 tokens.
func TestTTFTRouterQueuesThePartialBlock(t *testing.T) {
	keys := keysN(64)
	f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, tokenKeyer{keys: keys, tokens: 64*16 + 12}, func(r *rules.Rule) {
		r.LoadLaw.Kind = "ttft"
		r.PredictOnRoute = ttl(0)
	})
	if bs := f.rt.rule.BlockSize; bs != 16 {
		t.Fatalf("block size %d", bs)
	}
	f.inv.Store(f.eps[0].ID, keys[:60])
	d, err := f.rt.Route(context.Background(), prompt, inventory.Mask{})
	if err != nil || d.Target != f.eps[0] {
		t.Fatalf("route: %v %+v", err, d)
	}
	if got := f.eps[0].Ahead(); got != 4*16+12 {
		t.Fatalf("a's queued prefill %d, want %d", got, 4*16+12)
	}
	for _, ev := range d.Endpoints {
		if ev.Name == "a" && (ev.TTFT == nil || ev.TTFT.OwnTokens != 4*16+12) {
			t.Fatalf("a's prediction %+v", ev.TTFT)
		}
	}
	// The first token ends the prefill: the queue drains then, once, not again at the receipt
	// (which still teaches) or the release.
	d.FirstToken()
	d.FirstToken()
	if got := f.eps[0].Ahead(); got != 0 {
		t.Fatalf("after the first token a's queued prefill is %d", got)
	}
	d.Receipt(20*time.Millisecond, 10*time.Millisecond, 64*16+12, 60*16)
	d.Release()
	if got := f.eps[0].Ahead(); got != 0 {
		t.Fatalf("after the receipt and the release a's queued prefill is %d", got)
	}
	if _, ok := f.eps[0].Rates(); !ok {
		t.Fatal("the receipt after the first token taught nothing")
	}
}

// TestGatewayTimeLearned: each receipt's time in the gateway before its upstream send
// (Receipt.Gateway; 0: not measured) feeds Rates.Gateway, their median, which every prediction
// adds. Seed: prefill 1 ms a token, interference 10 ms, queue share 1. Receipts computing nothing:
// idle 5 ms, 2 in flight 25 ms, idle 5 ms, 2 in flight 25 ms → the line: fixed 5, interference 10
// (each load held by two receipts, as the line needs before it takes a slope). A full hit then
// predicts gateway + 5 idle, gateway + 5 + 2·10 at 2 in flight.
func TestGatewayTimeLearned(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	seed := Rates{Prefill: time.Millisecond, Interference: 10 * time.Millisecond, Queue: 1}
	line := []Receipt{{TTFT: ms(5)}, {TTFT: ms(25), Load: 2}, {TTFT: ms(5)}, {TTFT: ms(25), Load: 2}}
	withGW := func(gw ...float64) []Receipt {
		out := make([]Receipt, len(line))
		for i := range line {
			out[i] = line[i]
			if i < len(gw) {
				out[i].Gateway = ms(gw[i])
			}
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		receipts []Receipt
		load     int
		gateway  float64 // learned, ms
		want     float64 // predicted total, ms
	}{
		{"no gateway time measured", withGW(), 0, 0, 5},
		{"no gateway time, 2 in flight", withGW(), 2, 0, 25},
		// 2, 3 and 40 ms (a stalled one): the median, 3 ms, on top.
		{"the gateway's own time, its median", withGW(2, 3, 40), 0, 3, 8},
		{"the gateway's own time, 2 in flight", withGW(2, 3, 40), 2, 3, 28},
		// Two receipts measured it (1.5 and 2.5 ms), the others did not: the median of the two.
		{"an unmeasured gateway time teaches nothing", withGW(1.5, 2.5, 0), 0, 2, 7},
	} {
		e := newEstimator(seed)
		for _, r := range tc.receipts {
			e.observe(r)
		}
		r := e.Rates()
		if r.Fixed != ms(5) || r.Interference != ms(10) || r.Gateway != ms(tc.gateway) {
			t.Errorf("%s: learned %+v, want fixed 5ms, interference 10ms, gateway %.1fms", tc.name, r, tc.gateway)
			continue
		}
		p := predictTTFT(Scored{Score: 4, Load: tc.load, Rates: r}, 4, 0, 16)
		if math.Abs(p.TotalMS-tc.want) > 1e-9 || p.GatewayMS != tc.gateway ||
			math.Abs(p.GatewayMS+p.FixedMS+p.AheadMS+p.OwnMS+p.InterferenceMS+p.SlotWaitMS-p.TotalMS) > 1e-9 {
			t.Errorf("%s: predicted %+v, want %.1f ms with %.1f of the gateway's", tc.name, p, tc.want, tc.gateway)
		}
	}
}

// TestTTFTDecisionLearnsTheGatewayTime: the time the proxy reports the request spent in the
// gateway before its send (Decision.Sent) reaches the target's rates at the receipt, and the next
// decision's prediction holds it: a holds all 64 blocks but the last (16 own tokens), its first
// receipt 3 ms in the gateway. A receipt without a send teaches none.
func TestTTFTDecisionLearnsTheGatewayTime(t *testing.T) {
	keys := keysN(64)
	for _, tc := range []struct {
		name string
		sent bool
		want time.Duration
	}{{"sent after 3 ms", true, 3 * time.Millisecond}, {"no send reported", false, 0}} {
		f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, tokenKeyer{keys: keys, tokens: 64 * 16}, func(r *rules.Rule) {
			r.LoadLaw.Kind = "ttft"
			r.PredictOnRoute = ttl(0)
		})
		f.inv.Store(f.eps[0].ID, keys)
		d, err := f.rt.Route(context.Background(), prompt, inventory.Mask{})
		if err != nil || d.Target != f.eps[0] {
			t.Fatalf("%s: route: %v %+v", tc.name, err, d)
		}
		if tc.sent {
			d.Sent(3 * time.Millisecond)
		}
		d.FirstToken()
		d.Receipt(10*time.Millisecond, 0, 64*16, 63*16)
		d.Release()
		r, ok := f.eps[0].Rates()
		if !ok || r.Gateway != tc.want {
			t.Errorf("%s: learned %+v, want the gateway's time %v", tc.name, r, tc.want)
			continue
		}
		d2, err := f.rt.Route(context.Background(), prompt, inventory.Mask{})
		if err != nil {
			t.Fatalf("%s: route: %v", tc.name, err)
		}
		for _, ev := range d2.Endpoints {
			if ev.Name == "a" && (ev.TTFT == nil || ev.TTFT.GatewayMS != ms(tc.want)) {
				t.Errorf("%s: a's prediction %+v, want %v of the gateway's", tc.name, ev.TTFT, tc.want)
			}
		}
		d2.Release()
	}
}

// TestInterferenceLine: the line TTFT − computed · prefill = fixed + load · interference through
// near-total hits with nothing queued ahead, the prefill rate known (150 µs a token). Each case
// builds its receipts from a truth (fixed, interference) with ±0.4 ms of jitter, some of them
// carrying a wait (a slot, KV-block or host wait: time no line through the others explains), and
// wants the learned interference within tol of the truth and the fixed cost within 0.5 ms.
func TestInterferenceLine(t *testing.T) {
	type rc struct {
		load int
		wait float64 // ms added to the line's TTFT
	}
	spread := func(n int, loads ...int) []rc {
		out := make([]rc, n)
		for i := range out {
			out[i].load = loads[i%len(loads)]
		}
		return out
	}
	waited := func(rs []rc, every int, ms float64) []rc {
		for i := every - 1; i < len(rs); i += every {
			rs[i].wait = ms
		}
		return rs
	}
	for _, tc := range []struct {
		name       string
		fixed, itf float64 // truth, ms
		seed       float64 // the seed's interference, ms
		receipts   []rc
		want, tol  float64 // learned interference, ms
	}{
		// Running requests that do not slow a new one (the simulated engines): no slope.
		{"no interference, loads 0–3", 3, 0, 0, spread(40, 0, 1, 2, 3), 0, 0.3},
		{"no interference, seeded at 10 ms", 3, 0, 10, spread(40, 0, 1, 2, 3), 0, 0.3},
		// A known slope is learned as it is.
		{"5 ms a request in flight", 32, 5, 0, spread(40, 0, 1, 2, 3), 5, 0.3},
		{"1 ms a request in flight, loads 0–6", 4, 1, 0, spread(42, 0, 1, 2, 3, 4, 5, 6), 1, 0.2},
		// Waits of 100 ms on every 5th receipt, at every load: neither slope moves.
		{"no interference, a fifth waited", 3, 0, 0, waited(spread(40, 0, 1, 2, 3), 5, 100), 0, 0.3},
		{"5 ms, a fifth waited", 32, 5, 0, waited(spread(40, 0, 1, 2, 3), 5, 100), 5, 0.5},
		// The traced case: idle near-hits and one receipt routed behind a request in flight that
		// waited 130 ms. All its slopes are that wait; a load held once gives none.
		{"one waited receipt alone at its load", 3, 0, 0, []rc{{0, 0}, {0, 0}, {1, 130}, {0, 0}, {0, 0}}, 0, 0},
		{"one receipt alone at its load, no wait", 3, 0, 0, []rc{{0, 0}, {0, 0}, {2, 0}, {0, 0}}, 0, 0},
		// Two waited receipts at load 2 against idle ones: far above the rest, they are waits.
		{"two waited receipts at a load of their own", 3, 0, 0, []rc{{0, 0}, {0, 0}, {2, 60}, {0, 0}, {2, 80}, {0, 0}}, 0, 0},
		// Idle receipts only: nothing tells the interference from the fixed cost; the seed stands.
		{"idle receipts keep the seed", 3, 0, 10, spread(8, 0), 10, 0},
	} {
		seed := Rates{Prefill: 150 * time.Microsecond, Interference: time.Duration(tc.seed * float64(time.Millisecond)), Queue: 1}
		e := newEstimator(seed)
		for i, r := range tc.receipts {
			comp := 80 + i%17
			jit := 0.4 * (float64(i%9)/4 - 1) // −0.4 … +0.4 ms
			ttft := tc.fixed + float64(r.load)*tc.itf + jit + r.wait
			e.observe(Receipt{TTFT: time.Duration(ttft*float64(time.Millisecond)) + time.Duration(comp)*seed.Prefill, Computed: comp, Load: r.load})
		}
		got := e.Rates()
		if d := ms(got.Interference) - tc.want; math.Abs(d) > tc.tol+1e-9 {
			t.Errorf("%s: interference %v, want %.1f ± %.1f ms (rates %+v)", tc.name, got.Interference, tc.want, tc.tol, got)
		}
		if d := ms(got.Fixed) - tc.fixed; math.Abs(d) > 0.5 {
			t.Errorf("%s: fixed %v, want %.1f ms", tc.name, got.Fixed, tc.fixed)
		}
	}
	// No interference and a prefill rate of 0: a receipt with prefill queued ahead has no queued
	// work to be a share of, and leaves the share as it was (not NaN).
	e := newEstimator(Rates{Queue: 1})
	e.observe(Receipt{TTFT: 10 * time.Millisecond, Computed: 300, Ahead: 100, Load: 2})
	if q := e.Rates().Queue; q != 1 {
		t.Fatalf("queue share %v from no queued work, want the seed's 1", q)
	}
}

// TestFixedCostFromTheFamily: under load an endpoint can go a run with no receipt that measures
// its fixed cost (every one queued behind others or waiting for a slot) or its prefill rate
// (never idle on a miss); it then uses the median of what its rule's other endpoints measured
// from their own receipts, not its seed (no fixed cost, 200 µs a token). The truth: 3 ms + 150 µs
// a computed token with ±0.3 ms of jitter. Siblings learn from near-total hits with nothing
// queued ahead (every sixth waited 60 ms for a slot the gateway did not predict) and idle misses;
// a "stalled" sibling's receipts all carry 40 ms more (its host was slow the whole run); d gets
// only queued receipts (prefill ahead of it) and slot waits, or, in the last case, its own line
// receipts of a different truth, which win over the family's.
func TestFixedCostFromTheFamily(t *testing.T) {
	truth := func(fixed time.Duration, comp, i int) time.Duration {
		return fixed + time.Duration(comp)*150*time.Microsecond + time.Duration(i%7-3)*100*time.Microsecond
	}
	measured := func(e *estimator, fixed time.Duration) {
		for i := range 40 {
			e.observe(Receipt{TTFT: truth(fixed, 1000+i, i), Computed: 1000 + i})
			ttft := truth(fixed, 90, i)
			if i%6 == 5 {
				ttft += 60 * time.Millisecond
			}
			e.observe(Receipt{TTFT: ttft, Computed: 90, Load: i % 3})
		}
	}
	queued := func(e *estimator, fam familyRates) {
		for i := range 40 {
			e.observeIn(Receipt{TTFT: truth(3*time.Millisecond, 90, i), Computed: 90, Ahead: 1000, Load: 1 + i%3}, fam)
			e.observeIn(Receipt{TTFT: truth(3*time.Millisecond, 90, i) + 20*time.Millisecond, Computed: 90, Load: 5, SlotWait: 15 * time.Millisecond}, fam)
		}
	}
	for _, c := range []struct {
		name       string
		siblings   []time.Duration // each sibling's true fixed cost; 0: it measures nothing either
		own        time.Duration   // d's own line receipts' true fixed cost; 0: none
		fixed      time.Duration
		prefill    time.Duration
		tolF, tolP time.Duration
	}{
		{name: "queued only, siblings measured", siblings: []time.Duration{3 * time.Millisecond, 3 * time.Millisecond, 3 * time.Millisecond},
			fixed: 3 * time.Millisecond, prefill: 150 * time.Microsecond, tolF: 300 * time.Microsecond, tolP: 2 * time.Microsecond},
		{name: "one sibling stalled", siblings: []time.Duration{3 * time.Millisecond, 43 * time.Millisecond, 3 * time.Millisecond},
			fixed: 3 * time.Millisecond, prefill: 150 * time.Microsecond, tolF: 300 * time.Microsecond, tolP: 2 * time.Microsecond},
		{name: "no sibling measured: the seed", siblings: []time.Duration{0, 0, 0},
			fixed: 0, prefill: DefaultRates.Prefill},
		{name: "own line receipts win", siblings: []time.Duration{3 * time.Millisecond, 3 * time.Millisecond, 3 * time.Millisecond}, own: 8 * time.Millisecond,
			fixed: 8 * time.Millisecond, prefill: 150 * time.Microsecond, tolF: 300 * time.Microsecond, tolP: 2 * time.Microsecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, []Role{RoleNormal, RoleNormal, RoleNormal, RoleNormal}, 3, nil, func(r *rules.Rule) { r.LoadLaw.Kind = "ttft" })
			for i, fx := range c.siblings {
				e := newEstimator(DefaultRates)
				f.eps[i].rates.Store(e)
				if fx > 0 {
					measured(e, fx)
				} else {
					queued(e, familyRates{})
				}
			}
			d := newEstimator(DefaultRates)
			f.eps[3].rates.Store(d)
			if c.own > 0 {
				for i := range 20 {
					d.observeIn(Receipt{TTFT: truth(c.own, 90, i), Computed: 90, Load: i % 2}, f.rt.familyRates())
				}
			}
			queued(d, f.rt.familyRates())
			got := d.Rates()
			if df := got.Fixed - c.fixed; df < -c.tolF || df > c.tolF {
				t.Errorf("fixed %v, want %v ± %v (rates %+v)", got.Fixed, c.fixed, c.tolF, got)
			}
			if dp := got.Prefill - c.prefill; dp < -c.tolP || dp > c.tolP {
				t.Errorf("prefill %v, want %v ± %v", got.Prefill, c.prefill, c.tolP)
			}
			// The family is what the siblings measured, never d's borrowed values.
			if d.ownFixed.Load() != (c.own > 0) || d.ownPrefill.Load() {
				t.Errorf("d counts as measuring: fixed %v prefill %v", d.ownFixed.Load(), d.ownPrefill.Load())
			}
		})
	}
}

// TestReceiptLearnsFromTheFamily: a decision's receipt reads its target's missing rates from the
// rule's other endpoints. b's estimator started before a measured anything (its seed has no fixed
// cost); a then measured a fixed cost of 3 ms; b's next receipt, an idle miss, measures b's
// prefill rate net of a's fixed cost, and b's fixed cost is a's.
func TestReceiptLearnsFromTheFamily(t *testing.T) {
	keys := keysN(64)
	f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, tokenKeyer{keys: keys, tokens: 64 * 16}, func(r *rules.Rule) {
		r.LoadLaw.Kind = "ttft"
		r.PredictOnRoute = ttl(0)
	})
	a := newEstimator(DefaultRates)
	f.eps[0].rates.Store(a)
	for range 5 {
		a.observe(Receipt{TTFT: 3*time.Millisecond + 10*DefaultRates.Prefill, Computed: 10})
	}
	if r := a.Rates(); r.Fixed != 3*time.Millisecond {
		t.Fatalf("a learned %+v", r)
	}
	f.eps[1].rates.Store(newEstimator(DefaultRates))
	f.inv.Store(f.eps[1].ID, keys)
	d, err := f.rt.Route(context.Background(), prompt, inventory.Mask{})
	if err != nil || d.Target != f.eps[1] {
		t.Fatalf("route: %v %+v", err, d)
	}
	d.FirstToken()
	d.Receipt(3*time.Millisecond+1024*150*time.Microsecond, 0, 1024, 0)
	d.Release()
	r, ok := f.eps[1].Rates()
	if !ok || r.Fixed != 3*time.Millisecond || r.Prefill != 150*time.Microsecond {
		t.Fatalf("b learned %+v, want a's fixed cost 3ms and its own 150µs a token", r)
	}
}

// TestEvictedShareConvergesAndIsBounded: each evicted share is the mean over the window of each
// receipt's lost part of its hit, the assumed tokens (past the confirmed ones) lost first. Of
// every four receipts predicted to hit 640 confirmed and 320 assumed tokens, one is served all
// 960, one 800 (assumed half lost), one 320 (assumed all lost, confirmed half) and one none:
// assumed (0 + 0.5 + 1 + 1) / 4 = 0.625, confirmed (0 + 0 + 0.5 + 1) / 4 = 0.375. A receipt with
// absurd values (cached far beyond or below the hit, a hit of 10⁹ tokens) moves either by at
// most one window slot's 1/rateWindow; one without a hit, with a negative one, or with tokens
// from a lower tier (which engines count as cached too) teaches nothing.
func TestEvictedShareConvergesAndIsBounded(t *testing.T) {
	e := newEstimator(DefaultRates)
	hit := HitTokens{Confirmed: 640, Assumed: 320}
	cached := [4]int{960, 800, 320, 0}
	for i := range 200 {
		e.observe(Receipt{TTFT: 20 * time.Millisecond, Computed: 1024 - cached[i%4], Hit: hit, Cached: cached[i%4], Load: 1})
	}
	if r := e.Rates(); math.Abs(r.EvictedAssumed-0.625) > 1e-9 || math.Abs(r.Evicted-0.375) > 1e-9 {
		t.Fatalf("evicted %v, assumed %v; want 0.375, 0.625", r.Evicted, r.EvictedAssumed)
	}
	for _, r := range []Receipt{
		{TTFT: time.Hour, Computed: 1 << 30, Hit: HitTokens{1e9, 1e9}, Cached: -5e9},
		{TTFT: time.Nanosecond, Hit: HitTokens{10, 10}, Cached: 1e9},
		{TTFT: time.Hour, Computed: 1 << 30, Hit: HitTokens{1e9, 0}, Cached: 0},
	} {
		before := e.Rates()
		e.observe(r)
		after := e.Rates()
		if math.Abs(after.Evicted-before.Evicted) > 1.0/rateWindow+1e-9 || math.Abs(after.EvictedAssumed-before.EvictedAssumed) > 1.0/rateWindow+1e-9 {
			t.Fatalf("%+v moved the shares from %v, %v to %v, %v", r, before.Evicted, before.EvictedAssumed, after.Evicted, after.EvictedAssumed)
		}
	}
	before := e.Rates()
	e.observe(Receipt{TTFT: time.Millisecond, Computed: 1000, Cached: 0})
	e.observe(Receipt{TTFT: time.Millisecond, Computed: 1000, Hit: HitTokens{-960, 5000}, Cached: 0})
	e.observe(Receipt{TTFT: time.Millisecond, Computed: 1000, Hit: HitTokens{960, 0}, Cached: 0, Lower: [nLower]int{960}})
	if r := e.Rates(); r.Evicted != before.Evicted || r.EvictedAssumed != before.EvictedAssumed {
		t.Fatalf("a receipt without a GPU hit moved the shares: %+v → %+v", before, r)
	}
}

// TestTTFTLawDiscountsEvictedHits: the prediction prices the evicted shares of the request's
// predicted GPU hit, and of the hits queued ahead, as prefill. 64 blocks of 16 (1024 tokens),
// 100 µs a token; a holds 60 blocks (960 tokens predicted cached, 64 own).
func TestTTFTLawDiscountsEvictedHits(t *testing.T) {
	rates := func(confirmed, assumed, queue float64) Rates {
		return Rates{Prefill: 100 * time.Microsecond, Queue: queue, Evicted: confirmed, EvictedAssumed: assumed}
	}
	with := func(c Scored, assumed int, ahead HitTokens) Scored { c.Assumed, c.AheadHit = assumed, ahead; return c }
	law := Law{Kind: LawTTFT, BlockSize: 16}
	for _, tc := range []struct {
		name              string
		cands             []Scored
		pos               int
		want              []float64 // predicted ms, by hand
		evicted, aheadEvc []int     // EvictedTokens, AheadEvictedTokens
	}{
		// Nothing evicted: a computes 64 tokens, 6.4 ms; b, cold, 1024: 102.4 ms.
		{"no evictions", withIndex(tq(60, 0, 0, rates(0, 0, 1)), tq(0, 0, 0, rates(0, 0, 1))), 0,
			[]float64{6.4, 102.4}, []int{0, 0}, []int{0, 0}},
		// A quarter of the confirmed hit evicted: a computes 64 + 240 = 304 tokens, 30.4 ms; b
		// has no hit to lose.
		{"a quarter of the hit evicted", withIndex(tq(60, 0, 0, rates(0.25, 1, 1)), tq(0, 0, 0, rates(0.25, 1, 1))), 0,
			[]float64{30.4, 102.4}, []int{240, 0}, []int{0, 0}},
		// 20 of a's 60 blocks assumed, all of those lost, a quarter of the 40 confirmed:
		// 64 + 320 + 160 = 544 tokens, 54.4 ms.
		{"assumed blocks at their own share", withIndex(with(tq(60, 0, 0, rates(0.25, 1, 1)), 20, HitTokens{}), tq(0, 0, 0, rates(0.25, 1, 1))), 0,
			[]float64{54.4, 102.4}, []int{480, 0}, []int{0, 0}},
		// The queue ahead: 100 uncached tokens and 800 confirmed cached, a quarter of them (200)
		// computed anyway, at a queue share of 0.5: (100 + 200) · 0.1 · 0.5 = 15 ms + 30.4.
		{"the queued hits are discounted too", withIndex(with(tq(60, 1, 100, rates(0.25, 1, 0.5)), 0, HitTokens{Confirmed: 800}), tq(0, 0, 0, rates(0.25, 1, 0.5))), 0,
			[]float64{45.4, 102.4}, []int{240, 0}, []int{200, 0}},
		// All of a's blocks assumed and lost, 500 assumed tokens queued ahead: 1024 + 500 tokens,
		// 152.4 ms > b's 102.4 → b. Without the shares a took it at 6.4 ms.
		{"a holder on assumed blocks loses to a cold endpoint", withIndex(with(tq(60, 1, 0, rates(0, 1, 1)), 60, HitTokens{Assumed: 500}), tq(0, 0, 0, rates(0, 1, 1))), 1,
			[]float64{152.4, 102.4}, []int{960, 0}, []int{500, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := law.PickPrompt(tc.cands, 64, 64*16)
			if v.Pos != tc.pos {
				t.Errorf("picked %d, want %d", v.Pos, tc.pos)
			}
			for i, p := range v.TTFT {
				if math.Abs(p.TotalMS-tc.want[i]) > 1e-9 || p.EvictedTokens != tc.evicted[i] || p.AheadEvictedTokens != tc.aheadEvc[i] {
					t.Errorf("candidate %d: %.3f ms, evicted %d, ahead evicted %d; want %.3f, %d, %d",
						i, p.TotalMS, p.EvictedTokens, p.AheadEvictedTokens, tc.want[i], tc.evicted[i], tc.aheadEvc[i])
				}
			}
		})
	}
}

// TestReceiptLearnsTheEvictedShare: a decision queues its predicted GPU hit on its target until
// its first token, and its receipt's cached_tokens against that hit teach the evicted share,
// which the metric shows; a sibling with no receipt of its own borrows it from the family.
func TestReceiptLearnsTheEvictedShare(t *testing.T) {
	keys := keysN(64)
	f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, tokenKeyer{keys: keys, tokens: 64 * 16}, func(r *rules.Rule) {
		r.LoadLaw.Kind = "ttft"
		r.PredictOnRoute = ttl(0)
	})
	reg := prometheus.NewRegistry()
	f.rt.cfg.Metrics = NewMetrics(reg)
	bs := f.rt.rule.BlockSize
	f.inv.Store(f.eps[0].ID, keys[:60])
	d, err := f.rt.Route(context.Background(), prompt, inventory.Mask{})
	if err != nil || d.Target != f.eps[0] {
		t.Fatalf("route: %v %+v", err, d)
	}
	if got := f.eps[0].AheadHit(); got != (HitTokens{Confirmed: 60 * bs}) {
		t.Fatalf("queued hit %d, want %d", got, 60*bs)
	}
	d.FirstToken()
	if got := f.eps[0].AheadHit(); got != (HitTokens{}) {
		t.Fatalf("queued hit %d after the first token", got)
	}
	// The engine served 15 of the 60 predicted blocks: three quarters computed anyway.
	d.Receipt(50*time.Millisecond, 0, 64*bs, 15*bs)
	d.Release()
	r, _ := f.eps[0].Rates()
	if r.Evicted != 0.75 {
		t.Fatalf("a learned evicted %v, want 0.75", r.Evicted)
	}
	if got := promtest.Value(t, reg, "kvexact_ttft_evicted_hit_ratio", map[string]string{"rule": "r", "endpoint": "a", "evidence": "engine_confirmed"}); got != 0.75 {
		t.Fatalf("metric %v", got)
	}
	b := newEstimator(DefaultRates)
	f.eps[1].rates.Store(b)
	b.observeIn(Receipt{TTFT: 10 * time.Millisecond, Computed: 10, Load: 1}, f.rt.familyRates())
	if got := b.Rates().Evicted; got != 0.75 || b.ownEvicted.Load() {
		t.Fatalf("b's evicted %v (own %v), want the family's 0.75", got, b.ownEvicted.Load())
	}
}

// TestReceiptLearnsTheAssumedShare: blocks predict-on-route assumed past the confirmed ones are
// a hit part of their own. a confirmed 40 of the prompt's blocks; a first request routed there
// lets predict-on-route assume the other 24, so a second one predicts 40 confirmed and 24
// assumed; the engine serves the 40: the assumed share is 1, the confirmed 0.
func TestReceiptLearnsTheAssumedShare(t *testing.T) {
	keys := keysN(64)
	f := newFixture(t, []Role{RoleNormal, RoleNormal}, 3, tokenKeyer{keys: keys, tokens: 64 * 16}, func(r *rules.Rule) {
		r.LoadLaw.Kind = "ttft"
		r.PredictOnRoute = ttl(time.Minute)
	})
	bs := f.rt.rule.BlockSize
	f.inv.Store(f.eps[0].ID, keys[:40])
	ctx := context.Background()
	first, err := f.rt.Route(ctx, prompt, inventory.Mask{})
	if err != nil || first.Target != f.eps[0] {
		t.Fatalf("first: %v %+v", err, first)
	}
	first.Release()
	d, err := f.rt.Route(ctx, prompt, inventory.Mask{})
	if err != nil || d.Target != f.eps[0] {
		t.Fatalf("second: %v %+v", err, d)
	}
	if got, want := f.eps[0].AheadHit(), (HitTokens{Confirmed: 40 * bs, Assumed: 24 * bs}); got != want {
		t.Fatalf("queued hit %+v, want %+v", got, want)
	}
	d.Receipt(20*time.Millisecond, 0, 64*bs, 40*bs)
	if got := f.eps[0].AheadHit(); got != (HitTokens{}) {
		t.Fatalf("queued hit %+v after the receipt", got)
	}
	d.Release()
	if r, _ := f.eps[0].Rates(); r.EvictedAssumed != 1 || r.Evicted != 0 {
		t.Fatalf("learned confirmed %v, assumed %v; want 0 and 1", r.Evicted, r.EvictedAssumed)
	}
	// The next prediction on a prices the 24 assumed blocks as prefill.
	next, err := f.rt.Explain(ctx, prompt)
	if err != nil {
		t.Fatal(err)
	}
	if p := next.Endpoints[0].TTFT; p == nil || p.EvictedTokens != 24*bs {
		t.Fatalf("a's prediction %+v, want %d evicted tokens", p, 24*bs)
	}
}

// TestReceiptAllocations: a receipt allocates only the estimate it publishes (the Rates its
// readers load without a lock); the family's rates and the windows' medians allocate nothing.
func TestReceiptAllocations(t *testing.T) {
	// 16 endpoints: a few would fit the compiler's stack buffer for a small append.
	f := newFixture(t, slices.Repeat([]Role{RoleNormal}, 16), 3, nil, func(r *rules.Rule) { r.LoadLaw.Kind = "ttft" })
	for _, ep := range f.eps {
		e := newEstimator(DefaultRates)
		ep.rates.Store(e)
		for i := range 80 {
			e.observe(Receipt{TTFT: time.Duration(5+i%7) * time.Millisecond, Computed: 300 + i, Load: i % 3, Ahead: 100 * (i % 2),
				Decode: time.Millisecond, Gateway: time.Millisecond, Hit: HitTokens{400, 100}, Cached: 400})
		}
	}
	if n := testing.AllocsPerRun(100, func() { f.rt.familyRates() }); n != 0 {
		t.Errorf("familyRates: %v allocations", n)
	}
	e := f.eps[0].rates.Load()
	r := Receipt{TTFT: 9 * time.Millisecond, Computed: 320, Load: 2, Ahead: 100, Decode: time.Millisecond, Gateway: time.Millisecond, Hit: HitTokens{400, 100}, Cached: 250}
	if n := testing.AllocsPerRun(100, func() { e.observeIn(r, f.rt.familyRates()) }); n > 1 {
		t.Errorf("a receipt: %v allocations, want the published estimate's 1", n)
	}
}
