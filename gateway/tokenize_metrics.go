package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

// registerSegmentCacheMetrics exports the tokenizer pool's segment cache counters (read when
// scraped, so the encode path pays nothing for them).
func registerSegmentCacheMetrics(reg prometheus.Registerer, p *tokenize.Pool) error {
	stat := func(f func(tokenize.SegmentCacheStats) float64) func() float64 {
		return func() float64 { return f(p.SegmentCacheStats()) }
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvexact_tokenize_segment_cache_hits_total",
			Help: "Prompt segments (text between added tokens) whose ids came from the tokenizer segment cache."},
			stat(func(s tokenize.SegmentCacheStats) float64 { return float64(s.Hits) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvexact_tokenize_segment_cache_misses_total",
			Help: "Prompt segments looked up in the tokenizer segment cache and encoded."},
			stat(func(s tokenize.SegmentCacheStats) float64 { return float64(s.Misses) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvexact_tokenize_segment_cache_evictions_total",
			Help: "Segments dropped from the tokenizer segment cache to stay within tokenizers.segmentCacheBytes."},
			stat(func(s tokenize.SegmentCacheStats) float64 { return float64(s.Evictions) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvexact_tokenize_segment_cache_bytes",
			Help: "Bytes held by the tokenizer segment cache (text, ids and bookkeeping)."},
			stat(func(s tokenize.SegmentCacheStats) float64 { return float64(s.Bytes) })),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
