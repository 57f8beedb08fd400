package gateway

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/rules"
)

// TestSegmentCacheMetrics: the gateway's pool gets a segment cache unless tokenizers.segmentCacheBytes
// is 0, and its hits, misses and evictions are exported.
func TestSegmentCacheMetrics(t *testing.T) {
	zero := int64(0)
	for _, c := range []struct {
		bytes  *int64
		cached bool
	}{{nil, true}, {&zero, false}} {
		cfg := &rules.Config{Tokenizers: rules.Tokenizers{SegmentCacheBytes: c.bytes}}
		reg := prometheus.NewRegistry()
		g, err := New(Options{Config: cfg, Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		tok, err := g.pool.Get("qwen3")
		if err != nil {
			t.Skipf("qwen3 tokenizer not found (%v): run make tokenizers", err)
		}
		if tok.SegmentCached() != c.cached {
			t.Fatalf("segmentCacheBytes %v: cached %v, want %v", c.bytes, tok.SegmentCached(), c.cached)
		}
		turn := strings.Repeat("one turn of a conversation, long enough to be kept. ", 4)
		if _, err := tok.Encode(turn+"<|im_end|>"+turn, false); err != nil {
			t.Fatal(err)
		}
		want := map[bool]float64{true: 1, false: 0}[c.cached]
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
		for _, name := range []string{"kvexact_tokenize_segment_cache_hits_total", "kvexact_tokenize_segment_cache_misses_total"} {
			if v, ok := got[name]; !ok || v != want {
				t.Fatalf("segmentCacheBytes %v: %s = %v (exported %v), want %v", c.bytes, name, v, ok, want)
			}
		}
		if _, ok := got["kvexact_tokenize_segment_cache_evictions_total"]; !ok {
			t.Fatal("no evictions counter")
		}
	}
}
