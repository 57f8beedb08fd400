package gateway

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/exactness"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/route"
)

// BenchmarkTokenCheck is the router binding's token-side check per routed response, on a rule of
// 16 endpoints holding 50,000 keys each: "schedule+check" is CheckRoutedPrompt (the inventory's
// counters, a runtime timer) and the check when its timer fires (counters again, one key looked
// up), waited for; "reproduced" and "not_reproduced" are the check alone.
func BenchmarkTokenCheck(b *testing.B) {
	g, rt := tokenCheckRule(b, 16, 50_000)
	x := rt.epExact[7]
	held := uint64(7)<<40 | 12_345
	b.Run("schedule+check", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			g.CheckRoutedPrompt("pool", "e7", held, 32)
			for {
				x.mu.Lock()
				p := x.tokenPending
				x.mu.Unlock()
				if p == 0 {
					break
				}
				runtime.Gosched() // let the timer's goroutine run (with -cpu 1 too)
			}
		}
	})
	before, _ := endpointCounters(rt.index, x.ep.ID)
	before.Stored-- // the engine stored a block in the window
	for _, tc := range []struct {
		name string
		key  uint64
	}{{"reproduced", held}, {"not_reproduced", 1 << 63}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				x.mu.Lock()
				x.tokenPending++
				x.mu.Unlock()
				g.finishTokenCheck(rt, x, tc.key, 32, before, time.Time{}, time.Second)
			}
		})
	}
	if x.tokens.NotReproduced == 0 || x.tokens.Reproduced == 0 {
		b.Fatalf("the cases did not take their paths: %+v", x.tokens)
	}
}

// tokenCheckRule is a router-binding rule runtime of n certified endpoints e0… holding keys each
// (endpoint i holds i<<40 | j for j < keys), without ingest or a router.
func tokenCheckRule(tb testing.TB, n, keys int) (*Gateway, *ruleRuntime) {
	ix := inventory.New(inventory.Config{})
	var eps []*route.Endpoint
	for i := range n {
		name := fmt.Sprintf("e%d", i)
		id, err := ix.AddEndpoint(name)
		if err != nil {
			tb.Fatal(err)
		}
		keys := make([]uint64, keys)
		for j := range keys {
			keys[j] = uint64(i)<<40 | uint64(j)
		}
		if err := ix.Store(id, keys); err != nil {
			tb.Fatal(err)
		}
		eps = append(eps, &route.Endpoint{Name: name, ID: id})
	}
	g := &Gateway{opts: Options{TokenCheckGrace: time.Nanosecond, TokenDriftChecks: 1 << 30}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), now: time.Now,
		runtimes: map[string]*ruleRuntime{}}
	rt := &ruleRuntime{index: ix, eps: eps, exact: ExactStatus{Enabled: true, Binding: "router"}}
	for _, e := range eps {
		rt.epExact = append(rt.epExact, newEndpointExact("pool", e, exactness.Config{}, true, "certified (router)", time.Now, nil, nil))
	}
	g.runtimes["pool"] = rt
	return g, rt
}
