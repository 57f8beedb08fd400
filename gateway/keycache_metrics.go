package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/route"
)

// registerKeyCacheMetrics exports the key cache's counters (read when scraped, so the keying path
// pays nothing for them; all zero when the cache is off).
func registerKeyCacheMetrics(reg prometheus.Registerer, c *route.KeyCache) error {
	stat := func(f func(route.KeyCacheStats) float64) func() float64 {
		return func() float64 { return f(c.Stats()) }
	}
	for _, m := range []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvexact_route_key_cache_hits_total",
			Help: "Prompts whose token ids extended a prompt in the key cache: the common blocks' keys were reused."},
			stat(func(s route.KeyCacheStats) float64 { return float64(s.Hits) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvexact_route_key_cache_misses_total",
			Help: "Prompts looked up in the key cache and hashed whole."},
			stat(func(s route.KeyCacheStats) float64 { return float64(s.Misses) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvexact_route_key_cache_reused_blocks_total",
			Help: "Block keys copied from the key cache instead of hashed."},
			stat(func(s route.KeyCacheStats) float64 { return float64(s.ReusedBlocks) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvexact_route_key_cache_evictions_total",
			Help: "Prompts dropped from the key cache to stay within tokenizers.keyCacheBytes."},
			stat(func(s route.KeyCacheStats) float64 { return float64(s.Evictions) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvexact_route_key_cache_bytes",
			Help: "Bytes held by the key cache (ids, keys, checkpoints and bookkeeping)."},
			stat(func(s route.KeyCacheStats) float64 { return float64(s.Bytes) })),
	} {
		if err := reg.Register(m); err != nil {
			return err
		}
	}
	return nil
}
