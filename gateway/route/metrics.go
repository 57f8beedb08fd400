package route

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the routing counters, labelled by rule (and endpoint or reason).
type Metrics struct {
	decisions *prometheus.CounterVec // rule, tier
	misses    *prometheus.CounterVec // rule, reason
	hits      *prometheus.CounterVec // rule, endpoint
	spills    *prometheus.CounterVec // rule, endpoint
	seeds     *prometheus.CounterVec // rule, endpoint
	zeroHits  *prometheus.CounterVec // rule
}

// NewMetrics registers the routing metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_route_decisions_total", Help: "Routing decisions by the tier that decided."}, []string{"rule", "tier"}),
		misses:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_kv_exact_miss_total", Help: "KV-exact misses by reason (one reason per miss)."}, []string{"rule", "reason"}),
		hits:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_kv_exact_hits_total", Help: "Requests KV-exact routed to an endpoint."}, []string{"rule", "endpoint"}),
		spills:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_kv_exact_spills_total", Help: "KV-exact decisions the load law moved off the best-scoring endpoint."}, []string{"rule", "endpoint"}),
		seeds:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_kv_exact_coldstart_seeds_total", Help: "KV-exact hits diverted to a cold endpoint."}, []string{"rule", "endpoint"}),
		zeroHits:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_kv_exact_zero_hit_watchdog_total", Help: "Lookups at or past 50 consecutive zero-overlap results against a non-empty inventory (a parity leg probably differs)."}, []string{"rule"}),
	}
	reg.MustRegister(m.decisions, m.misses, m.hits, m.spills, m.seeds, m.zeroHits)
	return m
}

func (m *Metrics) decided(rule string, d *Decision) {
	m.decisions.WithLabelValues(rule, d.Tier).Inc()
	if d.Tier == TierKVExact {
		m.hits.WithLabelValues(rule, d.Target.Name).Inc()
		if d.Spill {
			m.spills.WithLabelValues(rule, d.Target.Name).Inc()
		}
		if d.Seeded {
			m.seeds.WithLabelValues(rule, d.Target.Name).Inc()
		}
	}
}

func (m *Metrics) missed(rule string, reason Miss) {
	m.misses.WithLabelValues(rule, string(reason)).Inc()
}

func (m *Metrics) zeroHit(rule string) { m.zeroHits.WithLabelValues(rule).Inc() }

// Forget deletes a rule's series (a deleted rule leaves no ghost series).
func (m *Metrics) Forget(rule string) {
	for _, v := range []*prometheus.CounterVec{m.decisions, m.misses, m.hits, m.spills, m.seeds, m.zeroHits} {
		v.DeletePartialMatch(prometheus.Labels{"rule": rule})
	}
}
