package gateway

import (
	"encoding/json"
	"net/http"
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/health"
)

// Readiness is whether the gateway can serve every rule it runs, as /readyz and the picker's gRPC
// readiness answer it. It is read from the state selection reads (each endpoint's health.Endpoint)
// and the rule's tokenizer state; nothing is probed to answer it.
type Readiness struct {
	Ready bool `json:"ready"`
	// Reason is the gateway-wide cause when there is one: "not_started" or "no_rules".
	Reason string          `json:"reason,omitempty"`
	Rules  []RuleReadiness `json:"rules"`
}

// RuleReadiness is one rule's readiness: ready when its tokenizer is present (where the rule
// needs one), at least one of its endpoints is ready, and every endpoint still in rotation has
// been synchronized with its engine at least once since the gateway started (its inventory was
// rebuilt from the engine's replay, not started empty): a replica that starts after the engines
// is not ready until it holds what they cache. An endpoint out of rotation (admin_down, draining,
// unhealthy, breaker_open) is excluded explicitly and does not hold the rule back; one whose
// stream is lost after it was synchronized is fenced from KV-exact (exactness events_unsynced)
// rather than taking the whole replica out of its load balancer.
type RuleReadiness struct {
	Name  string `json:"name"`
	Ready bool   `json:"ready"`
	// Reasons are the rule's causes, a closed set: tokenizer_missing, no_ready_endpoint,
	// endpoint_unsynchronized.
	Reasons []string `json:"reasons,omitempty"`
	// Tokenizer says why the rule's tokenizer is missing (absent when it is present).
	Tokenizer string              `json:"tokenizer,omitempty"`
	Endpoints []EndpointReadiness `json:"endpoints"`
}

// EndpointReadiness is one endpoint's readiness: routable, and every event stream connected.
type EndpointReadiness struct {
	Name  string `json:"name"`
	Ready bool   `json:"ready"`
	// Reason is health.Reason's code: admin_down, draining, unhealthy, breaker_open,
	// events_unsynced, events_syncing.
	Reason string `json:"reason,omitempty"`
	// Unsynchronized: the endpoint is in rotation but its inventory has never been synchronized
	// with the engine since the gateway started (its rule is not ready).
	Unsynchronized bool `json:"unsynchronized,omitempty"`
}

// Rule readiness causes (RuleReadiness.Reasons).
const (
	ReasonTokenizerMissing = "tokenizer_missing"
	ReasonNoReadyEndpoint  = "no_ready_endpoint"
	ReasonUnsynchronized   = "endpoint_unsynchronized"
)

// Readiness reports whether the gateway is ready, rule by rule and endpoint by endpoint.
func (g *Gateway) Readiness() Readiness {
	started := g.started.Load()
	g.mu.RLock()
	rts := make([]*ruleRuntime, 0, len(g.runtimes))
	for _, rt := range g.runtimes {
		rts = append(rts, rt)
	}
	g.mu.RUnlock()
	sort.Slice(rts, func(i, j int) bool { return rts[i].rule.Name < rts[j].rule.Name })
	rd := Readiness{Ready: true, Rules: []RuleReadiness{}}
	switch {
	case !started:
		rd.Ready, rd.Reason = false, "not_started"
	case len(rts) == 0:
		rd.Ready, rd.Reason = false, "no_rules"
	}
	for _, rt := range rts {
		rr := rt.readiness()
		rd.Ready = rd.Ready && rr.Ready
		rd.Rules = append(rd.Rules, rr)
	}
	return rd
}

func (rt *ruleRuntime) readiness() RuleReadiness {
	rr := RuleReadiness{Name: rt.rule.Name, Endpoints: make([]EndpointReadiness, 0, len(rt.eps))}
	some, unsynced := false, false
	for _, e := range rt.eps {
		why := e.Health.Ready()
		er := EndpointReadiness{Name: e.Name, Ready: why == health.NotExcluded, Reason: string(why)}
		er.Unsynchronized = e.Health.Excluded() == health.NotExcluded && !e.Health.EverSynced()
		rr.Endpoints = append(rr.Endpoints, er)
		some = some || er.Ready
		unsynced = unsynced || er.Unsynchronized
	}
	if why := rt.tokenizerMissing(); why != "" {
		rr.Reasons, rr.Tokenizer = append(rr.Reasons, ReasonTokenizerMissing), why
	}
	if !some {
		rr.Reasons = append(rr.Reasons, ReasonNoReadyEndpoint)
	}
	if unsynced {
		rr.Reasons = append(rr.Reasons, ReasonUnsynchronized)
	}
	rr.Ready = len(rr.Reasons) == 0
	return rr
}

// tokenizerMissing is why the rule's tokenizer could not be loaded ("" when it was, or when the
// rule never needed it): the one place readiness reads the rule's tokenizer state.
func (rt *ruleRuntime) tokenizerMissing() string {
	if rt.exact.Code == "tokenizer" {
		return rt.exact.Reason
	}
	return ""
}

// healthCollector exports the readiness and each endpoint's health at scrape time, read from the
// same state as Readiness (no series to keep in step, none left behind by a removed rule).
type healthCollector struct {
	g                                 *Gateway
	ready, ruleReady, epReady, epExcl *prometheus.Desc
	breaker                           *prometheus.Desc
}

func newHealthCollector(g *Gateway) *healthCollector {
	return &healthCollector{g: g,
		ready:     prometheus.NewDesc("kvexact_ready", "1 while the gateway is ready (/readyz answers 200), else 0.", nil, nil),
		ruleReady: prometheus.NewDesc("kvexact_rule_ready", "1 while the rule is ready (tokenizer present, at least one ready endpoint), else 0.", []string{"rule"}, nil),
		epReady:   prometheus.NewDesc("kvexact_endpoint_ready", "1 while the endpoint is routable with every event stream connected, else 0.", []string{"rule", "endpoint"}, nil),
		epExcl: prometheus.NewDesc("kvexact_endpoint_unready_reason", "1 for the reason the endpoint is not ready (a closed set: admin_down, draining, unhealthy, breaker_open, events_unsynced, events_syncing), else 0.",
			[]string{"rule", "endpoint", "reason"}, nil),
		breaker: prometheus.NewDesc("kvexact_endpoint_breaker_state", "1 for the endpoint's circuit breaker state (closed, open, half-open), else 0.", []string{"rule", "endpoint", "state"}, nil),
	}
}

func (c *healthCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.ready, c.ruleReady, c.epReady, c.epExcl, c.breaker} {
		ch <- d
	}
}

var breakerStates = []health.State{health.Closed, health.Open, health.HalfOpen}

func (c *healthCollector) Collect(ch chan<- prometheus.Metric) {
	rd := c.g.Readiness()
	ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, b2f(rd.Ready))
	for _, rr := range rd.Rules {
		ch <- prometheus.MustNewConstMetric(c.ruleReady, prometheus.GaugeValue, b2f(rr.Ready), rr.Name)
		for _, e := range rr.Endpoints {
			ch <- prometheus.MustNewConstMetric(c.epReady, prometheus.GaugeValue, b2f(e.Ready), rr.Name, e.Name)
			for _, r := range health.Reasons {
				ch <- prometheus.MustNewConstMetric(c.epExcl, prometheus.GaugeValue, b2f(string(r) == e.Reason), rr.Name, e.Name, string(r))
			}
		}
	}
	c.g.mu.RLock()
	defer c.g.mu.RUnlock()
	for name, rt := range c.g.runtimes {
		for _, e := range rt.eps {
			st := e.Health.Breaker.State()
			for _, s := range breakerStates {
				ch <- prometheus.MustNewConstMetric(c.breaker, prometheus.GaugeValue, b2f(s == st), name, e.Name, s.String())
			}
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// probes answers /healthz and /readyz on a client listener before next (the proxy) sees the
// request: the gateway answers them itself, nothing is forwarded to an engine.
//
//	/healthz  200 while the process serves (liveness)
//	/readyz   200 when Readiness is ready, else 503; the body is the Readiness as JSON either way
func (g *Gateway) probes(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz", "/readyz":
		default:
			next.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, r.Method+" is not allowed on "+r.URL.Path, http.StatusMethodNotAllowed)
			return
		}
		var body any = map[string]string{"status": "ok"}
		code := http.StatusOK
		if r.URL.Path == "/readyz" {
			rd := g.Readiness()
			if body = rd; !rd.Ready {
				code = http.StatusServiceUnavailable
			}
		}
		b, _ := json.Marshal(body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		w.Write(append(b, '\n'))
	})
}
