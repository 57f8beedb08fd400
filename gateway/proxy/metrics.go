package proxy

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/internal/cowmap"
)

// Metrics are the proxy's series, labelled by rule. A nil *Metrics records nothing.
type Metrics struct {
	requests  *prometheus.CounterVec   // rule, status, tier
	upstream  *prometheus.CounterVec   // rule, endpoint, kind
	failovers *prometheus.CounterVec   // rule, endpoint
	client    *prometheus.CounterVec   // rule, kind
	inflight  *prometheus.GaugeVec     // rule
	pdParams  *prometheus.CounterVec   // rule, dialect, result
	duration  *prometheus.HistogramVec // rule
	ttfb      *prometheus.HistogramVec // rule

	// rules caches each rule's children of the per-request series, so that a request pays a map
	// index instead of WithLabelValues' label hashing, checks and lock.
	rules cowmap.Map[string, *ruleMetrics]
}

// ruleMetrics are one rule's children of the series every request touches.
type ruleMetrics struct {
	duration prometheus.Observer
	ttfb     prometheus.Observer
	inflight prometheus.Gauge
	requests cowmap.Map[requestKey, prometheus.Counter]
}

type requestKey struct {
	status int
	tier   string
}

// rule returns the rule's cached children, creating them on first use.
func (m *Metrics) rule(name string) *ruleMetrics {
	return m.rules.LoadOrCreate(name, func(name string) *ruleMetrics {
		return &ruleMetrics{duration: m.duration.WithLabelValues(name), ttfb: m.ttfb.WithLabelValues(name), inflight: m.inflight.WithLabelValues(name)}
	})
}

func (rm *ruleMetrics) request(m *Metrics, rule string, status int, tier string) prometheus.Counter {
	return rm.requests.LoadOrCreate(requestKey{status, tier}, func(k requestKey) prometheus.Counter {
		return m.requests.WithLabelValues(rule, strconv.Itoa(k.status), k.tier)
	})
}

// Upstream error kinds (label "kind" of kvexact_proxy_upstream_errors_total).
const (
	errConnect     = "connect"      // no response at all (refused, reset before headers)
	errBreakerOpen = "breaker_open" // the breaker refused the request
	errMidstream   = "midstream"    // the response body broke off
	errStatus5xx   = "status_5xx"   // the origin answered 5xx
	errPrefill     = "prefill"      // a P/D prefill leg failed (status, body or transport)
	errTimeout     = "timeout"      // the prefill deadline passed
	errBadResponse = "bad_response" // a P/D leg answered something the dialect cannot use
)

// Client-side failure kinds (label "kind" of kvexact_proxy_client_errors_total).
const (
	clientHeaderFields = "header_fields"  // more header field lines than allowed: 431
	clientBodyTimeout  = "body_timeout"   // the body did not arrive within the body deadline: 408
	clientGoneEarly    = "gone_early"     // the client left (or half-closed) before any response byte
	clientGoneMidway   = "gone_midstream" // the client left while the response was being relayed
	clientWriteTimeout = "write_timeout"  // a write to the client made no progress within the write deadline
)

// NewMetrics registers the proxy metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	latency := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_proxy_requests_total",
			Help: "Client requests by rule, final status and the routing tier that decided (none when no decision was made)."}, []string{"rule", "status", "tier"}),
		upstream: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_proxy_upstream_errors_total",
			Help: "Upstream failures by endpoint and kind: connect, breaker_open, midstream, status_5xx, prefill, timeout, bad_response."}, []string{"rule", "endpoint", "kind"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_proxy_failovers_total",
			Help: "Selections re-run with a failed endpoint excluded (connect failure or open breaker), by the endpoint that failed."}, []string{"rule", "endpoint"}),
		client: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_proxy_client_errors_total",
			Help: "Requests the client side ended by kind: header_fields (431), body_timeout (408), gone_early (left or half-closed before any response byte; the connection is closed), gone_midstream (left during the relay), write_timeout (stopped reading: a write made no progress within server.writeTimeout)."}, []string{"rule", "kind"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvexact_proxy_inflight_requests",
			Help: "Client requests being served."}, []string{"rule"}),
		pdParams: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_proxy_pd_params_total",
			Help: "P/D transfer parameters read from the prefill leg: found, or missing (decode recomputes)."}, []string{"rule", "dialect", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvexact_proxy_request_duration_seconds",
			Help: "Time from request arrival to the last byte relayed.", Buckets: latency}, []string{"rule"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvexact_proxy_ttfb_seconds",
			Help: "Time from request arrival to the first response byte sent to the client (headers with the first body chunk).", Buckets: latency}, []string{"rule"}),
	}
	reg.MustRegister(m.requests, m.upstream, m.failovers, m.client, m.inflight, m.pdParams, m.duration, m.ttfb, unsolicitedCounter())
	return m
}

// Forget deletes a rule's series (a deleted rule leaves no ghost series).
func (m *Metrics) Forget(rule string) {
	if m == nil {
		return
	}
	m.rules.DeleteFunc(func(name string, _ *ruleMetrics) bool { return name == rule })
	l := prometheus.Labels{"rule": rule}
	m.requests.DeletePartialMatch(l)
	m.upstream.DeletePartialMatch(l)
	m.failovers.DeletePartialMatch(l)
	m.client.DeletePartialMatch(l)
	m.inflight.DeletePartialMatch(l)
	m.pdParams.DeletePartialMatch(l)
	m.duration.DeletePartialMatch(l)
	m.ttfb.DeletePartialMatch(l)
}

func (m *Metrics) done(rule string, status int, tier string, d time.Duration) {
	if m == nil {
		return
	}
	if tier == "" {
		tier = "none"
	}
	rm := m.rule(rule)
	rm.request(m, rule, status, tier).Inc()
	rm.duration.Observe(d.Seconds())
}

func (m *Metrics) firstByte(rule string, d time.Duration) {
	if m != nil {
		m.rule(rule).ttfb.Observe(d.Seconds())
	}
}

func (m *Metrics) upstreamError(rule, endpoint, kind string) {
	if m != nil {
		m.upstream.WithLabelValues(rule, endpoint, kind).Inc()
	}
}

func (m *Metrics) clientError(rule, kind string) {
	if m != nil {
		m.client.WithLabelValues(rule, kind).Inc()
	}
}

func (m *Metrics) failover(rule, endpoint string) {
	if m != nil {
		m.failovers.WithLabelValues(rule, endpoint).Inc()
	}
}

func (m *Metrics) inflightAdd(rule string, v float64) {
	if m != nil {
		m.rule(rule).inflight.Add(v)
	}
}

func (m *Metrics) params(rule, dialect string, found bool) {
	if m == nil {
		return
	}
	res := "missing"
	if found {
		res = "found"
	}
	m.pdParams.WithLabelValues(rule, dialect, res).Inc()
}
