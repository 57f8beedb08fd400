package gateway

import (
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/route"
)

// holdKind names one reason the gateway stopped KV-exact on an endpoint while it runs. It is the
// `reason` label of kvexact_endpoint_exact_ineligible_reason, so the set is small and fixed.
type holdKind string

const (
	// holdReprobe: the periodic re-probe found another version, model or tokenizer.
	holdReprobe holdKind = "reprobe_failed"
	// holdRestart: the engine restarted, cleared its cache or changed identity; KV-exact waits for
	// the live parity watch to see enough matching blocks (or a re-certification).
	holdRestart holdKind = "unverified_since_restart"
	// holdParity: a block the engine published does not hash to its key with the rule's binding.
	holdParity holdKind = "parity_mismatch"
	// holdShortfall: the engine reports no cached tokens where the gateway predicted them.
	holdShortfall holdKind = "realized_shortfall"
	// holdTokenDrift: on the router binding, the engine's published blocks do not reproduce the
	// gateway's tokenization of prompts routed to it (tokencheck.go).
	holdTokenDrift holdKind = "token_drift"
)

// uncertified is the reason label of an endpoint no certificate covers.
const uncertified = "uncertified"

// holdKinds lists every kind in a stable order (metrics, status).
var holdKinds = []holdKind{holdReprobe, holdRestart, holdParity, holdShortfall, holdTokenDrift}

// endpointExact is one endpoint's runtime exactness: whether a certificate covers it, what has
// stopped KV-exact on it since (each hold with its reason), and the evidence the gateway gathers
// while it runs. The router sees the result through the endpoint's fence, the one mechanism that
// keeps KV-exact off an endpoint while the other tiers still use it.
type endpointExact struct {
	rule, name, addr string // the endpoint's name and address never change
	now              func() time.Time
	m                *statusMetrics

	mu sync.Mutex
	// ep is the router's endpoint the fence goes to; a membership change hands the state to the
	// new router's endpoint (rebind).
	ep        *route.Endpoint
	certified bool
	certWhy   string // "certified (engine)" or why not
	holds     map[holdKind]string
	since     time.Time // when eligibility last changed
	parity    ParityStatus
	// verifiedAfterRestart counts matching blocks since the restart hold was set.
	verifiedAfterRestart int
	restarts             uint64
	// predicted and realized cached tokens, and the current run of KV-exact hits that predicted at
	// least a block and realized none.
	predicted, realized uint64
	shortRun            int
	// tokens is the router binding's token-side check; tokenRun its current run of prompts not
	// reproduced, tokenPending the checks waiting out their grace.
	tokens       TokenCheckStatus
	tokenRun     int
	tokenPending int
}

func newEndpointExact(rule string, ep *route.Endpoint, certified bool, certWhy string, now func() time.Time, m *statusMetrics) *endpointExact {
	x := &endpointExact{rule: rule, name: ep.Name, addr: ep.Address, ep: ep, now: now, m: m, certified: certified, certWhy: certWhy, holds: map[holdKind]string{}, since: now()}
	x.mu.Lock()
	x.publish()
	x.mu.Unlock()
	return x
}

// hold stops KV-exact on the endpoint for kind (replacing that kind's reason). It reports whether
// the hold is new.
func (x *endpointExact) hold(kind holdKind, reason string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	_, had := x.holds[kind]
	x.holds[kind] = reason
	if kind == holdRestart {
		x.verifiedAfterRestart = 0
	}
	x.publish()
	return !had
}

// release lifts a hold; it reports whether there was one.
func (x *endpointExact) release(kind holdKind) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.holds[kind]; !ok {
		return false
	}
	delete(x.holds, kind)
	x.publish()
	return true
}

// recertified lifts every hold and restarts the runs that lead to one (a re-certification).
func (x *endpointExact) recertified() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.shortRun, x.tokenRun, x.verifiedAfterRestart = 0, 0, 0
	if len(x.holds) == 0 {
		return
	}
	clear(x.holds)
	x.publish()
}

func (x *endpointExact) held(kind holdKind) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	_, ok := x.holds[kind]
	return ok
}

func (x *endpointExact) eligible() bool { return x.certified && len(x.holds) == 0 }

// publish pushes the state to the router (fence) and the metrics. Callers hold x.mu.
func (x *endpointExact) publish() {
	was := x.ep.Fenced() == ""
	if len(x.holds) == 0 {
		x.ep.Unfence()
	} else {
		x.ep.Fence(x.reasonsLocked())
	}
	if now := x.ep.Fenced() == ""; now != was || x.since.IsZero() {
		x.since = x.now()
	}
	if x.m != nil {
		x.m.endpoint(x.rule, x.name, x.eligible(), x.certified, x.holds)
	}
}

// reasonsLocked joins the holds' reasons in the fixed kind order.
func (x *endpointExact) reasonsLocked() string {
	var out []string
	for _, k := range holdKinds {
		if r, ok := x.holds[k]; ok {
			out = append(out, r)
		}
	}
	return strings.Join(out, "; ")
}

// EndpointExact is one endpoint's exactness in /admin/status.
type EndpointExact struct {
	// State is certified-eligible ("eligible"), "suspended" (certified, but something seen while
	// running stopped KV-exact) or "uncertified".
	State string `json:"state"`
	// Since is when the endpoint last became eligible or stopped being so.
	Since time.Time `json:"since"`
	// Reasons are why KV-exact is off on it ("" entries never appear), Holds their stable codes.
	Reasons []string `json:"reasons,omitempty"`
	Holds   []string `json:"holds,omitempty"`
	// Parity is the live parity watch's account.
	Parity ParityStatus `json:"parity"`
	// Restarts counts the engine restarts and cache clears detected on the event stream.
	Restarts uint64 `json:"restarts_detected"`
	// PredictedCachedTokens and RealizedCachedTokens sum, over responses whose engine reported
	// usage, the decision's predicted cached prefix and the engine's cached_tokens; RealizedRatio
	// is realized/predicted (absent before anything was predicted).
	PredictedCachedTokens uint64   `json:"predicted_cached_tokens"`
	RealizedCachedTokens  uint64   `json:"realized_cached_tokens"`
	RealizedRatio         *float64 `json:"realized_ratio,omitempty"`
	// TokenCheck is the router binding's token-side check (absent on the engine binding, where
	// Parity checks the engine's keys).
	TokenCheck *TokenCheckStatus `json:"token_check,omitempty"`
}

// ParityStatus is what the live parity watch has checked on an endpoint's event stream.
type ParityStatus struct {
	CheckedBlocks  uint64    `json:"checked_blocks"`
	MatchedBlocks  uint64    `json:"matched_blocks"`
	Mismatches     uint64    `json:"mismatches"`
	UncheckedBlock uint64    `json:"unchecked_blocks"`
	LastCheck      time.Time `json:"last_check,omitzero"`
	LastMismatch   string    `json:"last_mismatch,omitempty"`
}

func (x *endpointExact) status() EndpointExact {
	x.mu.Lock()
	defer x.mu.Unlock()
	st := EndpointExact{Since: x.since, Parity: x.parity, Restarts: x.restarts, PredictedCachedTokens: x.predicted, RealizedCachedTokens: x.realized}
	if x.predicted > 0 {
		r := float64(x.realized) / float64(x.predicted)
		st.RealizedRatio = &r
	}
	if x.tokens.Checked > 0 || x.tokenPending > 0 {
		tc := x.tokens
		st.TokenCheck = &tc
	}
	switch {
	case !x.certified:
		st.State = "uncertified"
		st.Reasons = append(st.Reasons, x.certWhy)
		st.Holds = append(st.Holds, uncertified)
	case len(x.holds) > 0:
		st.State = "suspended"
	default:
		st.State = "eligible"
	}
	for _, k := range holdKinds {
		if r, ok := x.holds[k]; ok {
			st.Reasons = append(st.Reasons, r)
			st.Holds = append(st.Holds, string(k))
		}
	}
	return st
}

// endpointMetrics are the per-endpoint exactness gauges.
type endpointMetrics struct {
	eligible *prometheus.GaugeVec
	reason   *prometheus.GaugeVec
}

func newEndpointMetrics(reg prometheus.Registerer) *endpointMetrics {
	m := &endpointMetrics{
		eligible: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvexact_endpoint_exact_eligible",
			Help: "1 while KV-exact may choose the endpoint (a certificate covers it and nothing seen since stopped it), else 0.",
		}, []string{"rule", "endpoint"}),
		reason: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvexact_endpoint_exact_ineligible_reason",
			Help: "1 for each reason KV-exact is off on the endpoint: uncertified, reprobe_failed, unverified_since_restart, parity_mismatch, realized_shortfall, token_drift.",
		}, []string{"rule", "endpoint", "reason"}),
	}
	reg.MustRegister(m.eligible, m.reason)
	return m
}

func (m *statusMetrics) endpoint(rule, endpoint string, eligible, certified bool, holds map[holdKind]string) {
	v := 0.0
	if eligible {
		v = 1
	}
	m.ep.eligible.WithLabelValues(rule, endpoint).Set(v)
	set := func(reason string, on bool) {
		g := m.ep.reason.WithLabelValues(rule, endpoint, reason)
		if on {
			g.Set(1)
		} else {
			g.Set(0)
		}
	}
	set(uncertified, !certified)
	for _, k := range holdKinds {
		_, on := holds[k]
		set(string(k), on)
	}
}

// exactOf returns the runtime's exactness state of endpoint name (nil when unknown).
func (rt *ruleRuntime) exactOf(name string) *endpointExact {
	for _, x := range rt.epExact {
		if x.name == name {
			return x
		}
	}
	return nil
}
