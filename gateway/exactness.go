package gateway

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/exactness"
	"github.com/kvexact/kvexact/gateway/route"
)

// endpointExact is one endpoint's runtime exactness: its state machine (package exactness), which
// every check feeds with evidence, and the counters /admin/status shows beside it. The router,
// the metrics and the log lines are derived from the machine on every change: the router sees it
// through the endpoint's fence, the one mechanism that keeps KV-exact off an endpoint while the
// other tiers still use it.
type endpointExact struct {
	rule, name, addr string // the endpoint's name and address never change
	now              func() time.Time
	m                *statusMetrics
	log              *slog.Logger

	mu sync.Mutex
	// ep is the router's endpoint the fence goes to; a membership change hands the state to the
	// new router's endpoint (rebind).
	ep       *route.Endpoint
	sm       *exactness.Machine
	since    time.Time // when eligibility last changed
	eligible bool      // as of since
	parity   ParityStatus
	// restarts counts the restarts and cache clears detected.
	restarts uint64
	// predicted and realized cached tokens, and the current run of KV-exact hits that predicted at
	// least a block and realized none.
	predicted, realized uint64
	shortRun            int
	// tokens is the router binding's token-side check; tokenRun its current run of prompts not
	// reproduced, tokenPending the checks waiting out their grace.
	tokens       TokenCheckStatus
	tokenRun     int
	tokenPending int
	// probes is the verification probes' account; probing is set while a round runs.
	probes  ProbeStatus
	probing bool
}

func newEndpointExact(rule string, ep *route.Endpoint, cfg exactness.Config, certified bool, certWhy string, now func() time.Time, m *statusMetrics, log *slog.Logger) *endpointExact {
	x := &endpointExact{rule: rule, name: ep.Name, addr: ep.Address, ep: ep, now: now, m: m, since: now(),
		sm: exactness.New(cfg, certified, certWhy)}
	if log != nil {
		x.log = log.With("rule", rule, "endpoint", ep.Name)
	}
	x.mu.Lock()
	x.publish()
	x.mu.Unlock()
	return x
}

// apply moves the endpoint's machine on one piece of evidence, then publishes and logs what
// changed.
func (x *endpointExact) apply(ev exactness.Evidence) exactness.Transition {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.applyLocked(ev)
}

func (x *endpointExact) applyLocked(ev exactness.Evidence) exactness.Transition {
	if ev.At.IsZero() {
		ev.At = x.now()
	}
	if ev.Type == exactness.Certified {
		x.shortRun, x.tokenRun = 0, 0
	}
	t := x.sm.Apply(ev)
	if t.Changed() {
		x.publish()
		x.logTransition(t)
	}
	return t
}

// logTransition writes one line per raised or lifted hold, with the machine's reason.
func (x *endpointExact) logTransition(t exactness.Transition) {
	if x.log == nil {
		return
	}
	reasons := map[exactness.Cause]string{}
	for _, h := range x.sm.Holds() {
		reasons[h.Cause] = h.Reason
	}
	for _, c := range t.Raised {
		lvl := slog.LevelError
		if c == exactness.Restart || c == exactness.Unsynced {
			lvl = slog.LevelWarn // the gateway's own bookkeeping (a restart, a stream replaying), not a failed check
		}
		x.log.Log(context.Background(), lvl, "KV-exact suspended", "hold", string(c), "state", string(t.To), "reason", reasons[c], "lifts", exactness.Lifts(c))
	}
	for _, c := range t.Lifted {
		x.log.Info("KV-exact hold lifted", "hold", string(c), "state", string(t.To))
	}
}

func (x *endpointExact) held(c exactness.Cause) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.sm.Held(c)
}

// endpoint is the router's endpoint the state belongs to now (a membership change rebinds it).
func (x *endpointExact) endpoint() *route.Endpoint {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.ep
}

func (x *endpointExact) certified() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.sm.Certified()
}

// publish pushes the machine's state to the router (fence) and the metrics. Callers hold x.mu.
func (x *endpointExact) publish() {
	if f := x.sm.FenceReason(); f == "" {
		x.ep.Unfence()
	} else {
		x.ep.Fence(f)
	}
	// Eligibility, not the fence: a certificate or an admission that comes or goes changes it
	// without a hold.
	if el := x.sm.Eligible(exactness.Completion); el != x.eligible || x.since.IsZero() {
		x.since, x.eligible = x.now(), el
	}
	if x.m != nil {
		x.m.endpoint(x.rule, x.name, x.sm)
	}
}

// EndpointExact is one endpoint's exactness in /admin/status, read from its state machine.
type EndpointExact struct {
	// State is "eligible", "verifying" (restarted; only the new process's verification is
	// outstanding), "suspended" (certified, but a check failed while running) or "uncertified".
	State string `json:"state"`
	// Since is when the endpoint last became eligible or stopped being so.
	Since time.Time `json:"since"`
	// Reasons are why KV-exact is off on it, Holds their stable codes (the metrics' reason
	// label), Lifts what lifts each (parallel to Holds).
	Reasons []string `json:"reasons,omitempty"`
	Holds   []string `json:"holds,omitempty"`
	Lifts   []string `json:"lifts,omitempty"`
	// Verification is a restart's verification under way.
	Verification *exactness.Verification `json:"verification,omitempty"`
	// Parity is the live parity watch's account.
	Parity ParityStatus `json:"parity"`
	// Probes is the verification probes' account.
	Probes ProbeStatus `json:"probes"`
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
	st := EndpointExact{State: string(x.sm.State()), Since: x.since, Parity: x.parity, Probes: x.probes, Restarts: x.restarts,
		PredictedCachedTokens: x.predicted, RealizedCachedTokens: x.realized}
	if x.predicted > 0 {
		r := float64(x.realized) / float64(x.predicted)
		st.RealizedRatio = &r
	}
	if x.tokens.Checked > 0 || x.tokenPending > 0 {
		tc := x.tokens
		st.TokenCheck = &tc
	}
	if v, ok := x.sm.Verification(); ok {
		st.Verification = &v
	}
	for _, h := range x.sm.Holds() {
		st.Reasons = append(st.Reasons, h.Reason)
		st.Holds = append(st.Holds, string(h.Cause))
		st.Lifts = append(st.Lifts, exactness.Lifts(h.Cause))
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
			Help: "1 for each cause KV-exact is off on the endpoint (a closed set: the causes of package gateway/exactness).",
		}, []string{"rule", "endpoint", "reason"}),
	}
	reg.MustRegister(m.eligible, m.reason)
	return m
}

// endpoint writes an endpoint's exactness gauges from its machine: eligibility, each cause, and
// the re-probe's fence.
func (m *statusMetrics) endpoint(rule, endpoint string, sm *exactness.Machine) {
	v := 0.0
	if sm.Eligible(exactness.Completion) {
		v = 1
	}
	m.ep.eligible.WithLabelValues(rule, endpoint).Set(v)
	fenced := 0.0
	if sm.Held(exactness.Reprobe) {
		fenced = 1
	}
	m.fenced.WithLabelValues(rule, endpoint).Set(fenced)
	for _, c := range exactness.Causes {
		on := 0.0
		if sm.Held(c) {
			on = 1
		}
		m.ep.reason.WithLabelValues(rule, endpoint, string(c)).Set(on)
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
