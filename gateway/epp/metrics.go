package epp

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the picker's own series. The routing decision's series (tiers, misses, KV-exact hits)
// are the routers' — the same ones the standalone gateway exports — so a dashboard reads both
// front ends alike.
type Metrics struct {
	streams   prometheus.Gauge
	malformd  prometheus.Counter
	decisions *prometheus.HistogramVec
	requests  *prometheus.CounterVec
	rejects   *prometheus.CounterVec
	failovers *prometheus.CounterVec
	unknown   *prometheus.CounterVec
	idles     prometheus.Counter
	buffer    prometheus.Gauge
	budget    prometheus.Counter
}

// NewMetrics registers the picker's series on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvexact_epp_streams_active",
			Help: "ext_proc streams open (one per HTTP request Envoy is processing)."}),
		malformd: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvexact_epp_malformed_streams_total",
			Help: "ext_proc streams ended with InvalidArgument (a message out of order or a malformed field)."}),
		decisions: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvexact_epp_decision_seconds",
			Help:    "From the request's end of stream to the destination sent: parse, route, answer.",
			Buckets: []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3}}, []string{"rule"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_epp_requests_total",
			Help: "Requests decided by the picker, by rule, the served endpoint and the origin status Envoy reported."}, []string{"rule", "endpoint", "code"}),
		rejects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_epp_immediate_responses_total",
			Help: "Requests the picker answered itself (ImmediateResponse), by status."}, []string{"code"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_epp_failovers_total",
			Help: "Responses served by a fallback endpoint instead of the destination (x-gateway-destination-endpoint-served)."}, []string{"rule"}),
		unknown: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_epp_served_unknown_total",
			Help: "Responses whose served endpoint is not one of the rule's endpoints."}, []string{"rule"}),
		idles: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvexact_epp_idle_streams_total",
			Help: "ext_proc streams ended with DeadlineExceeded after no message for the request or response idle limit."}),
		buffer: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvexact_epp_buffered_body_bytes",
			Help: "Request-body bytes the picker holds across streams until their decisions (the body budget's use)."}),
		budget: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvexact_epp_body_budget_exhausted_total",
			Help: "Requests answered 503 body_budget_exhausted: their body would have passed the process's body budget."}),
	}
	for _, c := range []prometheus.Collector{m.streams, m.malformd, m.decisions, m.requests, m.rejects, m.failovers, m.unknown, m.idles, m.buffer, m.budget} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) streamStarted() {
	if m != nil {
		m.streams.Inc()
	}
}

func (m *Metrics) streamEnded() {
	if m != nil {
		m.streams.Dec()
	}
}

func (m *Metrics) malformed() {
	if m != nil {
		m.malformd.Inc()
	}
}

func (m *Metrics) decided(rule string, d time.Duration) {
	if m != nil {
		m.decisions.WithLabelValues(rule).Observe(d.Seconds())
	}
}

func (m *Metrics) rejected(code int) {
	if m != nil {
		m.rejects.WithLabelValues(strconv.Itoa(code)).Inc()
	}
}

func (m *Metrics) failover(rule string) {
	if m != nil {
		m.failovers.WithLabelValues(rule).Inc()
	}
}

func (m *Metrics) servedUnknown(rule string) {
	if m != nil {
		m.unknown.WithLabelValues(rule).Inc()
	}
}

// served counts one finished request by rule, served endpoint and origin status. The cached-token
// account is the gateway's (Config.RecordUsage), shared with the standalone proxy.
func (m *Metrics) served(rule, endpoint string, code int) {
	if m == nil {
		return
	}
	if endpoint == "" {
		endpoint = "unknown"
	}
	m.requests.WithLabelValues(rule, endpoint, strconv.Itoa(code)).Inc()
}

func (m *Metrics) idle() {
	if m != nil {
		m.idles.Inc()
	}
}

func (m *Metrics) buffered(n int64) {
	if m != nil {
		m.buffer.Add(float64(n))
	}
}

func (m *Metrics) budgetExhausted() {
	if m != nil {
		m.budget.Inc()
	}
}
