package gateway

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/rules"
)

// TestKeyCacheMetrics: the gateway has a key cache unless tokenizers.keyCacheBytes is 0, and its
// hits, misses, reused blocks, evictions and bytes are exported.
func TestKeyCacheMetrics(t *testing.T) {
	zero := int64(0)
	seed := "0"
	h, err := hashcore.New(hashcore.Binding{Algorithm: hashcore.VLLMSHA256, BlockSize: 16, Seed: &seed}, hashcore.Default())
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]uint32, 2000)
	for i := range ids {
		ids[i] = uint32(i)
	}
	for _, c := range []struct {
		bytes  *int64
		cached bool
	}{{nil, true}, {&zero, false}} {
		cfg := &rules.Config{Tokenizers: rules.Tokenizers{KeyCacheBytes: c.bytes}}
		reg := prometheus.NewRegistry()
		g, err := New(Options{Config: cfg, Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		if (g.keys != nil) != c.cached {
			t.Fatalf("keyCacheBytes %v: cache %v, want %v", c.bytes, g.keys != nil, c.cached)
		}
		for _, n := range []int{1000, 2000} { // a prompt, then its extension
			if _, err := g.keys.Keys(h, ids[:n], nil); err != nil {
				t.Fatal(err)
			}
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				got[mf.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
		want := map[bool]float64{true: 1, false: 0}[c.cached]
		for _, name := range []string{"kvexact_route_key_cache_hits_total", "kvexact_route_key_cache_misses_total"} {
			if v, ok := got[name]; !ok || v != want {
				t.Fatalf("keyCacheBytes %v: %s = %v (exported %v), want %v", c.bytes, name, v, ok, want)
			}
		}
		if v := got["kvexact_route_key_cache_reused_blocks_total"]; (v > 0) != c.cached || (got["kvexact_route_key_cache_bytes"] > 0) != c.cached {
			t.Fatalf("keyCacheBytes %v: reused blocks %v, bytes %v", c.bytes, v, got["kvexact_route_key_cache_bytes"])
		}
		if _, ok := got["kvexact_route_key_cache_evictions_total"]; !ok {
			t.Fatal("no evictions counter")
		}
	}
	neg := int64(-1)
	cfg := &rules.Config{Tokenizers: rules.Tokenizers{KeyCacheBytes: &neg}}
	if err := cfg.Normalize(); err == nil || !strings.Contains(err.Error(), "tokenizers.keyCacheBytes") {
		t.Fatalf("negative keyCacheBytes: %v", err)
	}
}
