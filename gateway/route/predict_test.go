package route

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/rules"
)

// Predict-on-route: a prefix routed once sticks to its endpoint before any event arrives, the
// decision says the hit is predicted, the prediction ends with its TTL, and the engine's events
// supersede it.
func TestPredictOnRoute(t *testing.T) {
	keys := keysN(8)
	three := []Role{RoleNormal, RoleNormal, RoleNormal}
	ctx := context.Background()

	// Off (predictOnRoute: 0): with an empty inventory every request of the burst misses and the
	// selector (round robin) spreads them.
	off := newFixture(t, three, 3, fixedKeyer{keys: keys}, func(r *rules.Rule) { r.PredictOnRoute = ttl(0) })
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		d, err := off.rt.Route(ctx, prompt, inventory.Mask{})
		if err != nil || d.Tier == TierKVExact || d.Predicted {
			t.Fatalf("off: %+v %v", d, err)
		}
		seen[d.TargetN] = true
		d.Release()
	}
	if len(seen) != 3 {
		t.Fatalf("off: the burst went to %v, want all three by round robin", seen)
	}

	f := newFixture(t, three, 3, fixedKeyer{keys: keys}, func(r *rules.Rule) { r.PredictOnRoute = ttl(2 * time.Second) })
	now := time.Unix(1000, 0)
	f.rt.predict.now = func() time.Time { return now }
	first, err := f.rt.Route(ctx, prompt, inventory.Mask{})
	if err != nil || first.Miss != MissNoWorker || first.Predicted {
		t.Fatalf("first of the burst: %+v %v", first, err)
	}
	first.Release()
	for i := 0; i < 3; i++ {
		d, err := f.rt.Route(ctx, prompt, inventory.Mask{})
		if err != nil || d.Tier != TierKVExact || d.TargetN != first.TargetN || !d.Predicted || d.Score != 8 {
			t.Fatalf("burst request %d: %+v %v (first went to %s)", i, d, err, first.TargetN)
		}
		for _, ev := range d.Endpoints {
			if want := map[bool]int{true: 8, false: 0}[ev.Name == first.TargetN]; ev.Predicted != want || ev.Prefix != want {
				t.Fatalf("evidence of %s: %+v, want %d predicted blocks", ev.Name, ev, want)
			}
		}
		d.Release()
	}
	// Explain predicts nothing new: the side index holds the same blocks.
	before := f.rt.predict.size(first.Target.ID)
	if _, err := f.rt.Explain(ctx, prompt); err != nil || f.rt.predict.size(first.Target.ID) != before {
		t.Fatalf("explain changed the side index: %v", err)
	}

	// The engine confirms 5 of the 8 blocks: they leave the side index; 3 stay predicted.
	f.inv.Store(first.Target.ID, keys[:5])
	d, _ := f.rt.Route(ctx, prompt, inventory.Mask{})
	if d.TargetN != first.TargetN || !d.Predicted || d.Endpoints[first.Target.Index].Predicted != 3 || d.Score != 8 {
		t.Fatalf("partly confirmed: %+v", d)
	}
	d.Release()
	if n := f.rt.predict.size(first.Target.ID); n != 3 {
		t.Fatalf("%d predicted blocks left, want the 3 the engine has not confirmed", n)
	}

	// Past the TTL only the confirmed blocks count.
	now = now.Add(3 * time.Second)
	d, _ = f.rt.Route(ctx, prompt, inventory.Mask{})
	if d.Predicted || d.Score != 5 || d.TargetN != first.TargetN {
		t.Fatalf("after the TTL: %+v", d)
	}
	d.Release()
}

func TestPredictionsAreBounded(t *testing.T) {
	now := time.Unix(0, 0)
	p := newPredictions(time.Second, func() time.Time { return now })
	keys := make([]uint64, MaxPredictedPerEndpoint+10)
	for i := range keys {
		keys[i] = uint64(i + 1)
	}
	p.add(0, keys)
	if n := p.size(0); n != MaxPredictedPerEndpoint {
		t.Fatalf("%d predicted blocks, want the cap %d", n, MaxPredictedPerEndpoint)
	}
	now = now.Add(2 * time.Second) // all expired: the next add sweeps them
	p.add(0, keys[:10])
	if n := p.size(0); n != 10 {
		t.Fatalf("%d predicted blocks after the sweep, want 10", n)
	}
	if newPredictions(0, time.Now) != nil {
		t.Fatal("a zero TTL must turn predict-on-route off")
	}
}

func TestPredictOnRouteRuleLimits(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, 61 * time.Second} {
		r := &rules.Rule{Name: "r", Engine: rules.EngineRef{Family: "vllm", Release: "v0.25.1"}, KVExactMode: 3, PredictOnRoute: ttl(d),
			Endpoints: []rules.Endpoint{{Name: "a", Address: "http://127.0.0.1:1"}}}
		if err := r.Normalize(); err == nil || !strings.Contains(err.Error(), "predictOnRoute") {
			t.Errorf("predictOnRoute %v: error %v, want one naming the field", d, err)
		}
	}
}

func ttl(d time.Duration) *rules.OffDuration {
	v := rules.OffDuration(d)
	return &v
}

// Unset, predictOnRoute is on for a single-pool rule (the default TTL: a burst sticks) and off for
// a P/D rule, whose decisions never record predictions.
func TestPredictOnRouteDefault(t *testing.T) {
	keys := keysN(8)
	ctx := context.Background()
	f := newFixture(t, []Role{RoleNormal, RoleNormal, RoleNormal}, 3, fixedKeyer{keys: keys}, nil)
	if f.rt.predict == nil || f.rt.predict.ttl != rules.DefaultPredictOnRoute {
		t.Fatalf("single pool, predictOnRoute unset: predictions %+v, want TTL %s", f.rt.predict, rules.DefaultPredictOnRoute)
	}
	first, err := f.rt.Route(ctx, prompt, inventory.Mask{})
	if err != nil {
		t.Fatal(err)
	}
	first.Release()
	d, err := f.rt.Route(ctx, prompt, inventory.Mask{})
	if err != nil || d.Tier != TierKVExact || d.TargetN != first.TargetN || !d.Predicted {
		t.Fatalf("second of a burst with the default: %+v %v (first went to %s)", d, err, first.TargetN)
	}
	d.Release()
	pd := newFixture(t, []Role{RolePrefill, RoleDecode}, 1, fixedKeyer{keys: keys}, nil)
	if pd.rt.predict != nil {
		t.Fatalf("P/D rule, predictOnRoute unset: predictions on (TTL %s), want off", pd.rt.predict.ttl)
	}
}
