package gateway

import (
	"maps"
	"slices"
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/route"
)

// Status is the gateway's state as /admin/status shows it.
type Status struct {
	Rules        []RuleStatus `json:"rules"`
	Certificates []string     `json:"certificates,omitempty"`
	// CertificateStatus describes each loaded certificate (validity, signature verification).
	CertificateStatus []CertificateStatus `json:"certificate_status,omitempty"`
}

// RuleStatus is one rule's state.
type RuleStatus struct {
	Name      string           `json:"name"`
	Listener  string           `json:"listener"`
	Models    []string         `json:"models,omitempty"`
	Engine    string           `json:"engine"`
	Contract  string           `json:"contract"`
	Selector  string           `json:"selector"`
	BlockSize int              `json:"block_size,omitempty"`
	Algorithm string           `json:"algorithm,omitempty"`
	Exact     ExactStatus      `json:"exact"`
	Endpoints []EndpointStatus `json:"endpoints"`
}

// EndpointStatus is one endpoint's state.
type EndpointStatus struct {
	Name      string `json:"name"`
	Address   string `json:"address"`
	Role      string `json:"role"`
	Excluded  string `json:"excluded,omitempty"`
	Breaker   string `json:"breaker"`
	Active    int    `json:"active"`
	Served    uint64 `json:"served"`
	Resident  int    `json:"resident_blocks"`
	Certified string `json:"certified,omitempty"`
	Fenced    string `json:"fenced,omitempty"`
	EventErr  string `json:"event_error,omitempty"`
	// Exact is the endpoint's runtime exactness: eligible, suspended or uncertified, since when,
	// why, and the live checks' evidence.
	Exact *EndpointExact `json:"exact,omitempty"`
	// Admission is the admission probe's account on an endpoint a certificate admits by probe.
	Admission *AdmissionStatus `json:"admission,omitempty"`
	// ProvenAdapters are the LoRA names KV-exact counts on the endpoint: its certificate entry's
	// (or admission probe's) with those the gateway proved itself; absent when the entry records
	// no adapter list, which restricts none.
	ProvenAdapters *[]string `json:"proven_adapters,omitempty"`
	// AdapterProbes are the probes the gateway ran for discovered adapters the endpoint's
	// certificate entry did not prove (adapterproofs.go).
	AdapterProbes []AdapterProbeStatus `json:"adapter_probes,omitempty"`
	// EngineLoad is the engine's own request count as last scraped (absent: not scraped).
	EngineLoad *EngineLoadStatus `json:"engine_load,omitempty"`
}

// Status reports every rule.
func (g *Gateway) Status() Status {
	g.mu.RLock()
	rts := make([]*ruleRuntime, 0, len(g.runtimes))
	for _, rt := range g.runtimes {
		rts = append(rts, rt)
	}
	g.mu.RUnlock()
	sort.Slice(rts, func(i, j int) bool { return rts[i].rule.Name < rts[j].rule.Name })
	st := Status{Certificates: g.opts.CertificatePaths, CertificateStatus: g.certificateStatus()}
	for _, rt := range rts {
		rs := RuleStatus{Name: rt.rule.Name, Listener: g.listenerOf(rt.rule), Models: rt.rule.Models,
			Engine: rt.rule.Engine.Family + " " + rt.rule.Engine.Release, Contract: rt.contract.ID, Selector: rt.rule.Selector,
			BlockSize: rt.rule.BlockSize, Algorithm: rt.rule.HashAlgorithm, Exact: rt.exact}
		for _, e := range rt.eps {
			es := EndpointStatus{Name: e.Name, Address: e.Address, Role: string(e.Role), Excluded: string(e.Health.Excluded()),
				Breaker: e.Health.Breaker.State().String(), Active: e.Active(), Served: e.Served(), Resident: rt.index.Resident(e.ID),
				Certified: rt.exact.Endpoints[e.Name], Fenced: e.Fenced(), EngineLoad: g.engineLoadStatus(e)}
			if v, ok := rt.errs.Load(e.Name); ok {
				es.EventErr = v.(string)
			}
			if x := rt.exactOf(e.Name); x != nil {
				xs := x.status()
				es.Exact = &xs
			}
			es.Admission = g.adm.status(rt.rule.Name, e.Name)
			es.AdapterProbes = g.lproofs.status(rt.rule.Name, e.Name)
			if names, ok := rt.adapters[e.ID]; ok {
				es.ProvenAdapters = &names
			}
			rs.Endpoints = append(rs.Endpoints, es)
		}
		st.Rules = append(st.Rules, rs)
	}
	return st
}

// Inventory returns an endpoint's resident keys with their counts.
func (g *Gateway) Inventory(rule, endpoint string) ([]inventory.KeyCount, bool) {
	rt, ok := g.runtime(rule)
	if !ok {
		return nil, false
	}
	for _, e := range rt.eps {
		if e.Name == endpoint {
			return rt.index.Snapshot(e.ID), true
		}
	}
	return nil, false
}

// TierInventory returns an endpoint's keys in one tier's residency with their counts (the GPU's is
// Inventory's); false for an unknown rule or endpoint, or a lower tier the rule does not index
// (lowerTiers false).
func (g *Gateway) TierInventory(rule, endpoint string, tier engines.Tier) ([]inventory.KeyCount, bool) {
	if tier == engines.TierGPU {
		return g.Inventory(rule, endpoint)
	}
	rt, ok := g.runtime(rule)
	if !ok {
		return nil, false
	}
	for _, e := range rt.eps {
		if e.Name != endpoint {
			continue
		}
		for _, l := range rt.lower {
			if l.Tier == tier {
				return l.Index.Snapshot(e.ID), true
			}
		}
	}
	return nil, false
}

// Router returns a rule's router.
func (g *Gateway) Router(rule string) (*route.Router, bool) {
	rt, ok := g.runtime(rule)
	if !ok {
		return nil, false
	}
	return rt.router, true
}

// SetEndpointState sets an endpoint's operator state: "down", "up" or "drain".
func (g *Gateway) SetEndpointState(rule, endpoint, state string) bool {
	rt, ok := g.runtime(rule)
	if !ok {
		return false
	}
	for _, e := range rt.eps {
		if e.Name != endpoint {
			continue
		}
		switch state {
		case "down":
			e.Health.SetAdminDown(true)
		case "up":
			e.Health.SetAdminDown(false)
			e.Health.SetDraining(false)
		case "drain":
			e.Health.SetDraining(true)
		default:
			return false
		}
		return true
	}
	return false
}

// exactOffCodes are the codes of ExactStatus.Code: why KV-exact does not run for a rule.
var exactOffCodes = []string{"mode_off", "no_events", "models", "tokenizer", "no_certificate", "no_endpoint_certified", "hash_binding"}

// statusMetrics exports whether KV-exact runs per rule, with the reason's code as a label when it
// does not.
type statusMetrics struct {
	exact  *prometheus.GaugeVec
	fenced *prometheus.GaugeVec
	ep     *endpointMetrics
	usage  *usageMetrics

	mu sync.Mutex
	// published is each rule's series set last published (set), so a republish overwrites them in
	// place and deletes only what no longer exists: a scrape never sees a rule's gauges missing.
	published map[string]publishedSeries
}

// publishedSeries is what set last exported for one rule.
type publishedSeries struct {
	exact     prometheus.Labels
	endpoints []string
}

func newStatusMetrics(reg prometheus.Registerer) *statusMetrics {
	m := &statusMetrics{exact: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvexact_rule_exact_enabled",
		Help: "1 when KV-exact runs for the rule (a valid certificate covers its profile), else 0 with the reason's code: mode_off, no_events, models, tokenizer, no_certificate, no_endpoint_certified, hash_binding (/admin/status has the text).",
	}, []string{"rule", "binding", "reason"}),
		fenced: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvexact_endpoint_exact_fenced",
			Help: "1 while a failed re-probe (version, model or tokenizer changed) keeps KV-exact off for the endpoint.",
		}, []string{"rule", "endpoint"})}
	reg.MustRegister(m.exact, m.fenced)
	m.ep = newEndpointMetrics(reg)
	m.usage = newUsageMetrics(reg)
	return m
}

// set publishes the rule's exactness gauges: written over the previous values, then the series of
// a previous reason label or of a removed endpoint deleted. A republish that deleted first and
// wrote after would leave a window in which a scrape finds an endpoint's gauges absent.
func (m *statusMetrics) set(rt *ruleRuntime) {
	m.mu.Lock()
	defer m.mu.Unlock()
	name := rt.rule.Name
	prev := m.published[name]
	v := 0.0
	if rt.exact.Enabled {
		v = 1
	}
	// The label is the reason's code, never its text (a closed set; /admin/status has the text).
	code := rt.exact.Code
	if code != "" && !slices.Contains(exactOffCodes, code) {
		code = "other" // a code added without its entry here still cannot open the label set
	}
	exact := prometheus.Labels{"rule": name, "binding": rt.exact.Binding, "reason": code}
	m.exact.With(exact).Set(v)
	if prev.exact != nil && !maps.Equal(prev.exact, exact) {
		m.exact.Delete(prev.exact)
	}
	cur := make([]string, 0, len(rt.epExact))
	for _, x := range rt.epExact {
		x.mu.Lock()
		x.publish()
		x.mu.Unlock()
		cur = append(cur, x.name)
	}
	for _, ep := range prev.endpoints {
		if !slices.Contains(cur, ep) {
			l := prometheus.Labels{"rule": name, "endpoint": ep}
			m.ep.eligible.DeletePartialMatch(l)
			m.ep.reason.DeletePartialMatch(l)
			m.fenced.DeletePartialMatch(l)
		}
	}
	if m.published == nil {
		m.published = map[string]publishedSeries{}
	}
	m.published[name] = publishedSeries{exact: exact, endpoints: cur}
}

// forget deletes a removed rule's exactness series.
func (m *statusMetrics) forget(rule string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.published, rule)
	m.exact.DeletePartialMatch(prometheus.Labels{"rule": rule})
	m.fenced.DeletePartialMatch(prometheus.Labels{"rule": rule})
	m.ep.eligible.DeletePartialMatch(prometheus.Labels{"rule": rule})
	m.ep.reason.DeletePartialMatch(prometheus.Labels{"rule": rule})
}

// forgetUsage drops a removed rule's usage counters (a rebuilt rule keeps counting).
func (m *statusMetrics) forgetUsage(rule string) {
	m.usage.predicted.DeletePartialMatch(prometheus.Labels{"rule": rule})
	m.usage.realized.DeletePartialMatch(prometheus.Labels{"rule": rule})
}
