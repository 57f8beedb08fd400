package route

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/internal/cowmap"
)

// counters caches the children of a CounterVec labelled (rule, x): WithLabelValues hashes and
// validates the labels and takes the vector's lock on every call, which the per-request path
// (decisions, misses) need not pay once a series exists.
type counters struct {
	vec *prometheus.CounterVec
	m   cowmap.Map[labelPair, prometheus.Counter]
}

type labelPair struct{ rule, x string }

func (c *counters) get(rule, x string) prometheus.Counter {
	return c.m.LoadOrCreate(labelPair{rule, x}, func(k labelPair) prometheus.Counter {
		return c.vec.WithLabelValues(k.rule, k.x)
	})
}

// forget drops a rule's cached children (before its series are deleted).
func (c *counters) forget(rule string) {
	c.m.DeleteFunc(func(k labelPair, _ prometheus.Counter) bool { return k.rule == rule })
}

// gauges caches a gauge vector's children like counters, so setting one per receipt allocates
// nothing.
type gauges struct {
	vec *prometheus.GaugeVec
	m   cowmap.Map[labelTriple, prometheus.Gauge]
}

type labelTriple struct{ rule, x, y string }

func (g *gauges) get(rule, x, y string) prometheus.Gauge {
	return g.m.LoadOrCreate(labelTriple{rule, x, y}, func(k labelTriple) prometheus.Gauge {
		return g.vec.WithLabelValues(k.rule, k.x, k.y)
	})
}

func (g *gauges) forget(rule string) {
	g.m.DeleteFunc(func(k labelTriple, _ prometheus.Gauge) bool { return k.rule == rule })
}

// Metrics are the routing counters, labelled by rule (and endpoint or reason).
type Metrics struct {
	decisions *prometheus.CounterVec   // rule, tier
	misses    *prometheus.CounterVec   // rule, reason
	hits      *prometheus.CounterVec   // rule, endpoint
	hitsBy    *prometheus.CounterVec   // rule, endpoint, evidence
	spills    *prometheus.CounterVec   // rule, endpoint
	seeds     *prometheus.CounterVec   // rule, endpoint
	zeroHits  *prometheus.CounterVec   // rule
	ttftErr   *prometheus.HistogramVec // rule, endpoint

	decisionsC, missesC, hitsC counters
	evicted                    gauges // rule, endpoint, evidence
}

// NewMetrics registers the routing metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_route_decisions_total", Help: "Routing decisions by the tier that decided."}, []string{"rule", "tier"}),
		misses:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_kv_exact_misses_total", Help: "KV-exact misses by reason (one reason per miss)."}, []string{"rule", "reason"}),
		hits:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_kv_exact_hits_total", Help: "Requests KV-exact routed to an endpoint."}, []string{"rule", "endpoint"}),
		hitsBy: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_kv_exact_hits_by_evidence_total",
			Help: "KV-exact hits by the evidence the winning score stood on: engine_confirmed (only blocks the engine's events published) or predicted (it needed at least one block predict-on-route assumed, no event confirmed). kvexact_realized_cached_tokens_total has what the engines then reported."}, []string{"rule", "endpoint", "evidence"}),
		spills:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_kv_exact_spills_total", Help: "KV-exact decisions the load law moved off the best-scoring endpoint."}, []string{"rule", "endpoint"}),
		seeds:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_kv_exact_coldstart_seeds_total", Help: "KV-exact hits diverted to a cold endpoint."}, []string{"rule", "endpoint"}),
		zeroHits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_kv_exact_zero_hit_watchdog_total", Help: "Lookups at or past 50 consecutive zero-overlap results against a non-empty inventory (a parity leg probably differs)."}, []string{"rule"}),
	}
	m.ttftErr = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvexact_ttft_prediction_error_ratio",
		Help:    "The ttft law's predicted time to first token minus the realized one, over the realized one, per serving endpoint (0: exact; -0.5: the prediction was half the realized).",
		Buckets: []float64{-0.9, -0.5, -0.25, -0.1, -0.05, 0, 0.05, 0.1, 0.25, 0.5, 1, 2}}, []string{"rule", "endpoint"})
	m.evicted.vec = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvexact_ttft_evicted_hit_ratio",
		Help: "The ttft law's learned share of the prompt tokens predicted cached on an endpoint's GPU that the engine computed anyway (its cached_tokens fell short: the hit was evicted before the request ran), per serving endpoint and evidence (engine_confirmed: blocks the engine's events published; predicted: blocks predict-on-route assumed past them); the law prices that share of every predicted hit as prefill."}, []string{"rule", "endpoint", "evidence"})
	reg.MustRegister(m.decisions, m.misses, m.hits, m.hitsBy, m.spills, m.seeds, m.zeroHits, m.ttftErr, m.evicted.vec)
	m.decisionsC.vec, m.missesC.vec, m.hitsC.vec = m.decisions, m.misses, m.hits
	return m
}

func (m *Metrics) decided(rule string, d *Decision) {
	m.decisionsC.get(rule, d.Tier).Inc()
	if d.Tier == TierKVExact {
		m.hitsC.get(rule, d.Target.Name).Inc()
		evidence := "engine_confirmed"
		if d.Predicted {
			evidence = "predicted"
		}
		m.hitsBy.WithLabelValues(rule, d.Target.Name, evidence).Inc()
		if d.Spill {
			m.spills.WithLabelValues(rule, d.Target.Name).Inc()
		}
		if d.Seeded {
			m.seeds.WithLabelValues(rule, d.Target.Name).Inc()
		}
	}
}

func (m *Metrics) missed(rule string, reason Miss) {
	m.missesC.get(rule, string(reason)).Inc()
}

func (m *Metrics) ttftError(rule, endpoint string, realized, predicted time.Duration) {
	if realized > 0 {
		m.ttftErr.WithLabelValues(rule, endpoint).Observe(float64(predicted-realized) / float64(realized))
	}
}

func (m *Metrics) evictedHit(rule, endpoint string, confirmed, assumed float64) {
	m.evicted.get(rule, endpoint, "engine_confirmed").Set(confirmed)
	m.evicted.get(rule, endpoint, "predicted").Set(assumed)
}

func (m *Metrics) zeroHit(rule string) { m.zeroHits.WithLabelValues(rule).Inc() }

// Forget deletes a rule's series (a deleted rule leaves no ghost series).
func (m *Metrics) Forget(rule string) {
	m.decisionsC.forget(rule)
	m.missesC.forget(rule)
	m.hitsC.forget(rule)
	for _, v := range []*prometheus.CounterVec{m.decisions, m.misses, m.hits, m.hitsBy, m.spills, m.seeds, m.zeroHits} {
		v.DeletePartialMatch(prometheus.Labels{"rule": rule})
	}
	m.ttftErr.DeletePartialMatch(prometheus.Labels{"rule": rule})
	m.evicted.forget(rule)
	m.evicted.vec.DeletePartialMatch(prometheus.Labels{"rule": rule})
}
