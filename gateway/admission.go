package gateway

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/gateway/exactness"
	"github.com/kvexact/kvexact/gateway/rules"
)

// An admission covers an endpoint that a certificate does not list — a pod that joined, moved or
// restarted, an endpoint added through the admin API or a configuration reload — when that
// certificate's policy says admit: probe. The gateway runs ctk's own specs (ctk.Admit) against
// the endpoint with the rule's staged profile; only when they pass for the certified profile is
// the endpoint covered, with the bindings the probe proved, until the policy's window or the
// certificate expires. The verdict reaches the endpoint's exactness machine as the evidence of a
// certificate (Certified / NotCertified): admission is a way of being certified, not another
// hold. A certificate's own endpoints keep their identity binding: a listed name is never
// admitted. A refused probe names the failed legs and is retried with backoff.

// Admission defaults (Options override them).
const (
	DefaultAdmissionBackoff    = time.Second
	DefaultAdmissionMaxBackoff = 5 * time.Minute
	// AdmissionUserAgent tags every admission probe request, so an engine's access log tells it
	// from client traffic.
	AdmissionUserAgent = "kvexact-admission-probe/1"
)

// AdmissionStatus is an endpoint's admission in /admin/status.
type AdmissionStatus struct {
	// State is "admitted" or "pending" (not yet probed, probing, or refused and retrying).
	State    string    `json:"state"`
	Admitted time.Time `json:"admitted_at,omitzero"`
	Expires  time.Time `json:"expires_at,omitzero"`
	Attempts int       `json:"attempts"`
	// FailedLegs and Reason are the last refusal's (kept while a later probe is awaited).
	FailedLegs  []string  `json:"failed_legs,omitempty"`
	Reason      string    `json:"reason,omitempty"`
	NextAttempt time.Time `json:"next_attempt,omitzero"`
	// Requests is how many HTTP requests the admission probes sent the engine so far.
	Requests uint64 `json:"probe_requests"`
}

// admission is one endpoint's admission record, for one identity under one profile.
type admission struct {
	id      certificate.Identity
	profile string
	cert    *certificate.Certificate

	admitted bool
	at       time.Time // when the last successful probe finished
	expires  time.Time
	coverage []certificate.Coverage
	// adapters are the LoRA names the probe proved, as a listed endpoint's certificate entry
	// records them (nil: the probe's certificate entry recorded none).
	adapters *[]string

	attempts int
	next     time.Time
	running  bool
	legs     []string
	reason   string
	requests atomic.Uint64
}

// admissions are the gateway's admission records, by rule and endpoint name.
type admissions struct {
	mu   sync.Mutex
	recs map[string]map[string]*admission
	kick chan struct{}
	m    *admissionMetrics
}

func newAdmissions(reg prometheus.Registerer) *admissions {
	return &admissions{recs: map[string]map[string]*admission{}, kick: make(chan struct{}, 1), m: newAdmissionMetrics(reg)}
}

type admissionMetrics struct {
	probes   *prometheus.CounterVec
	requests *prometheus.CounterVec
	admitted *prometheus.GaugeVec
}

func newAdmissionMetrics(reg prometheus.Registerer) *admissionMetrics {
	m := &admissionMetrics{
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvexact_admission_probes_total",
			Help: "Admission probes run on endpoints a certificate with admit: probe does not list, by result: admitted, refused (a spec failed; the log and /admin/status name the leg) or error (the probe could not run).",
		}, []string{"rule", "result"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvexact_admission_probe_requests_total",
			Help: "HTTP requests the admission probes sent to engines (tagged User-Agent " + AdmissionUserAgent + ").",
		}, []string{"rule"}),
		admitted: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvexact_endpoint_admitted",
			Help: "1 while an admission probe's verdict covers the endpoint, else 0 (only endpoints a certificate admits by probe have the series).",
		}, []string{"rule", "endpoint"}),
	}
	reg.MustRegister(m.probes, m.requests, m.admitted)
	return m
}

func (a *admissions) poke() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// admitter is the certificate under which an endpoint may be admitted by probe: in force, for the
// rule's profile, admitting by probe and not listing the endpoint (nil when none).
func admitter(certs []*certificate.Certificate, digest, name string, now time.Time) *certificate.Certificate {
	for _, c := range certs {
		if ok, _ := c.Valid(now); ok && c.ProfileDigest == digest && c.AdmitsByProbe() && !c.Lists(name) {
			return c
		}
	}
	return nil
}

// covers is certify's question for an endpoint no certificate covers: the coverage an admission
// gives it and until when, or why none does yet (ok false: no certificate admits it by probe, the
// certificates' own reason stands). An endpoint without a current record gets one, probed next.
func (a *admissions) covers(rule string, certs []*certificate.Certificate, digest string, id certificate.Identity, now time.Time) (cov []certificate.Coverage, adapters *[]string, until time.Time, why string, ok bool) {
	c := admitter(certs, digest, id.Name, now)
	a.mu.Lock()
	defer a.mu.Unlock()
	if c == nil {
		// No certificate in force admits it (any more): an admission it had lapses with them.
		if a.recs[rule][id.Name] != nil {
			delete(a.recs[rule], id.Name)
			a.m.admitted.DeleteLabelValues(rule, id.Name)
		}
		return nil, nil, time.Time{}, "", false
	}
	byName := a.recs[rule]
	if byName == nil {
		byName = map[string]*admission{}
		a.recs[rule] = byName
	}
	rec := byName[id.Name]
	switch {
	case rec == nil || !sameIdentity(rec.id, id) || rec.profile != digest:
		// Joined, or moved (another address, event addresses or release): a new record.
		rec = &admission{id: id, profile: digest, cert: c, next: now}
		byName[id.Name] = rec
		a.m.admitted.WithLabelValues(rule, id.Name).Set(0)
		a.poke()
	case rec.admitted && !now.Before(rec.expires):
		rec.admitted, rec.cert, rec.next = false, c, now
		a.m.admitted.WithLabelValues(rule, id.Name).Set(0)
		a.poke()
	}
	rec.cert = c
	if rec.admitted {
		return rec.coverage, rec.adapters, rec.expires, admittedReason(rec.at), true
	}
	why = "awaiting its admission probe (the certificate admits endpoints by probe; KV-exact starts once ctk's specs pass on it)"
	if rec.reason != "" {
		why = fmt.Sprintf("admission probe refused (attempt %d, next at %s): failed legs %s: %s", rec.attempts, rec.next.UTC().Format(time.RFC3339), strings.Join(rec.legs, ", "), rec.reason)
	}
	return nil, nil, time.Time{}, why, true
}

func admittedReason(at time.Time) string {
	return "admitted by probe at " + at.UTC().Format(time.RFC3339)
}

func sameIdentity(a, b certificate.Identity) bool {
	return a.Name == b.Name && strings.TrimRight(a.Address, "/") == strings.TrimRight(b.Address, "/") &&
		strings.TrimPrefix(a.Release, "v") == strings.TrimPrefix(b.Release, "v") && a.Model == b.Model &&
		slices.Equal(a.Events.ZMQ, b.Events.ZMQ) && slices.Equal(a.Events.Replay, b.Events.Replay) && a.Events.Drain == b.Events.Drain
}

// status is an endpoint's admission for /admin/status (nil when it has no record).
func (a *admissions) status(rule, name string) *AdmissionStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	rec := a.recs[rule][name]
	if rec == nil {
		return nil
	}
	st := &AdmissionStatus{State: "pending", Attempts: rec.attempts, FailedLegs: rec.legs, Reason: rec.reason, Requests: rec.requests.Load()}
	if rec.admitted {
		st.State, st.Admitted, st.Expires = "admitted", rec.at, rec.expires
	} else {
		st.NextAttempt = rec.next
	}
	return st
}

// forget drops the records of endpoints a rule no longer has (a pod that left is probed again
// when it comes back: a restarted process proves itself anew), or all of a removed rule's.
func (a *admissions) forget(rule string, keep func(name string) bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name := range a.recs[rule] {
		if keep == nil || !keep(name) {
			delete(a.recs[rule], name)
			a.m.admitted.DeleteLabelValues(rule, name)
		}
	}
}

// restarted re-probes an admitted endpoint whose engine restarted: the admission was the old
// process's. It stays in force until the new probe refuses it (the Restart hold fences KV-exact
// meanwhile); a passing probe re-certifies the endpoint.
func (a *admissions) restarted(rule, name string, now time.Time) bool {
	if a == nil {
		return false // a gateway assembled without admissions (unit tests of the event watch)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	rec := a.recs[rule][name]
	if rec == nil || !rec.admitted {
		return false
	}
	rec.next, rec.attempts = now, 0
	a.poke()
	return true
}

// due returns a record to probe now and the wait until the next one is due (0: none pending).
func (a *admissions) due(now time.Time) (rule string, rec *admission, wait time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for r, byName := range a.recs {
		for _, x := range byName {
			if x.running || x.next.IsZero() {
				continue
			}
			if !now.Before(x.next) {
				x.running = true
				return r, x, 0
			}
			if d := x.next.Sub(now); wait == 0 || d < wait {
				wait = d
			}
		}
	}
	return "", nil, wait
}

// runAdmissions probes due endpoints one at a time (an admission is a full ctk run: bounded to
// one engine at a time per gateway) until ctx ends.
func (g *Gateway) runAdmissions(ctx context.Context) {
	for {
		rule, rec, wait := g.adm.due(g.now())
		if rec != nil {
			g.admit(ctx, rule, rec)
			continue
		}
		var timer <-chan time.Time
		if wait > 0 {
			timer = time.After(wait)
		}
		select {
		case <-ctx.Done():
			return
		case <-g.adm.kick:
		case <-timer:
		}
	}
}

// countingTransport tags each request as an admission probe and counts it.
type countingTransport struct {
	next http.RoundTripper
	n    func()
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("User-Agent", AdmissionUserAgent)
	t.n()
	return t.next.RoundTrip(r)
}

// admit runs one admission probe and applies its verdict.
func (g *Gateway) admit(ctx context.Context, rule string, rec *admission) {
	admitted := false
	done := func(ok bool, cov []certificate.Coverage, adapters *[]string, legs []string, reason string, at time.Time) {
		admitted = ok
		g.adm.mu.Lock()
		rec.running = false
		rec.attempts++
		if ok {
			rec.admitted, rec.at, rec.expires, rec.coverage, rec.adapters = true, at, rec.cert.AdmissionExpiry(at), cov, adapters
			rec.legs, rec.reason, rec.next, rec.attempts = nil, "", time.Time{}, 0
		} else {
			back := g.opts.AdmissionBackoff
			if back <= 0 {
				back = DefaultAdmissionBackoff
			}
			for i := 1; i < rec.attempts && back < DefaultAdmissionMaxBackoff; i++ {
				back *= 2
			}
			rec.admitted, rec.legs, rec.reason, rec.next = false, legs, reason, g.now().Add(min(back, DefaultAdmissionMaxBackoff))
		}
		g.adm.mu.Unlock()
	}
	r, ok := g.store.Get(rule)
	i := -1
	if ok {
		i = slices.IndexFunc(r.Endpoints, func(e rules.Endpoint) bool { return e.Name == rec.id.Name })
	}
	if i < 0 || !sameIdentity(IdentityOf(r, i), rec.id) {
		g.adm.forget(rule, func(name string) bool { return name != rec.id.Name })
		return // left or moved since: the next certify makes a new record
	}
	log := g.log.With("rule", rule, "endpoint", rec.id.Name, "address", rec.id.Address)
	// covers may replace the record's certificate (a reload) while the probe runs: probe under the
	// one read now.
	g.adm.mu.Lock()
	cert := rec.cert
	g.adm.mu.Unlock()
	res, err := g.admissionProbe(ctx, r, r.Endpoints[i], rec, cert)
	if ctx.Err() != nil {
		return
	}
	switch {
	case err != nil:
		done(false, nil, nil, nil, err.Error(), g.now())
		g.adm.m.probes.WithLabelValues(rule, "error").Inc()
		log.Error("admission probe could not run", "audit", "admission", "err", err)
	case !res.Endpoints[0].OK:
		er := res.Endpoints[0]
		done(false, nil, nil, er.FailedLegs, er.Reason, res.Finished)
		g.adm.m.probes.WithLabelValues(rule, "refused").Inc()
		log.Warn("admission refused: the endpoint differs from the certified profile", "audit", "admission", "failed_legs", strings.Join(er.FailedLegs, ","), "reason", er.Reason, "profile", rec.profile)
	default:
		var adapters *[]string
		if ce := res.Certificate.Entry(rec.id.Name); ce != nil && ce.Adapters != nil {
			adapters = &[]string{}
			*adapters = append(*adapters, *ce.Adapters...)
		}
		done(true, res.Endpoints[0].Certified, adapters, nil, "", res.Finished)
		g.adm.m.probes.WithLabelValues(rule, "admitted").Inc()
		g.adm.m.admitted.WithLabelValues(rule, rec.id.Name).Set(1)
		log.Info("endpoint admitted by probe", "audit", "admission", "profile", rec.profile, "release", res.Endpoints[0].Release,
			"coverage", fmt.Sprint(res.Endpoints[0].Certified), "expires", rec.expires, "requests", rec.requests.Load())
	}
	// Re-evaluate the rule with the verdict, then hand it to the endpoint's machine: a passing
	// probe is a re-certification (every hold lifts, as on a certificate reload), a refusal
	// leaves it uncertified with the failed legs.
	if err := g.reevaluate(rule); err != nil {
		log.Error("gateway: rule could not be re-evaluated after an admission probe", "err", err)
	}
	if rt, ok := g.runtime(rule); ok {
		if x := rt.exactOf(rec.id.Name); x != nil && admitted && isCertified(rt.exact.Endpoints[rec.id.Name]) {
			x.apply(exactness.Evidence{Type: exactness.Certified, Detail: rt.exact.Endpoints[rec.id.Name]})
		}
	}
}

// admissionProbe runs ctk's specs on the endpoint with the rule's staged profile.
func (g *Gateway) admissionProbe(ctx context.Context, r *rules.Rule, e rules.Endpoint, rec *admission, cert *certificate.Certificate) (*ctk.Result, error) {
	reqs := g.adm.m.requests.WithLabelValues(r.Name)
	p, opts, err := g.probePool(r, e, func() { rec.requests.Add(1); reqs.Inc() })
	if err != nil {
		return nil, err
	}
	for _, a := range r.Adapters {
		p.Adapters = append(p.Adapters, ctk.Adapter{Name: a.Name, LoRAName: a.LoRAName, LoRAPath: a.LoRAPath})
	}
	if err := p.Normalize(); err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return ctk.Admit(pctx, p, cert, opts)
}

// probePool is the one-endpoint pool (not normalized yet) and the options with which the gateway
// runs ctk's specs on e under the rule's staged profile; count is called for every request sent.
func (g *Gateway) probePool(r *rules.Rule, e rules.Endpoint, count func()) (*ctk.Pool, ctk.Options, error) {
	if len(r.Models) != 1 {
		return nil, ctk.Options{}, fmt.Errorf("the rule lists %d models; a probe binds one", len(r.Models))
	}
	if ct := r.Contract(); ct != nil && ct.Transport == "http-drain-v1" {
		// A drained event endpoint has one consumer, and here it is the gateway's own ingest:
		// ctk's event specs would take the events from it (and it from them).
		return nil, ctk.Options{}, fmt.Errorf("%s events are drained over HTTP by one consumer, the gateway itself: the gateway cannot probe them; certify the endpoint with ctk certify", r.Engine.Family)
	}
	tok, err := g.pool.Get(r.Models[0])
	if err != nil {
		return nil, ctk.Options{}, fmt.Errorf("tokenizer: %w", err)
	}
	p := &ctk.Pool{Model: r.Models[0], Engine: ctk.EngineRef{Family: r.Engine.Family, Release: r.Engine.Release}, BlockSize: r.BlockSize,
		HashAlgorithm: r.HashAlgorithm, Binding: r.Binding, Seed: r.Seed, DiscoverAdapters: r.DiscoverAdapters,
		Endpoints: []ctk.Endpoint{{Name: e.Name, Address: e.Address, Role: e.Role,
			Events: ctk.Events{ZMQ: e.Events.ZMQ, Replay: e.Events.Replay, Topic: e.Events.Topic, Drain: e.Events.Drain}}}}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: countingTransport{next: g.transport(), n: count}}
	opts := ctk.Options{Tokenizer: tok, HTTPClient: hc, Parallel: 1, Issuer: "kvexact gateway admission",
		EventTimeout: g.opts.AdmissionEventTimeout, SubscribeTimeout: g.opts.AdmissionEventTimeout}
	return p, opts, nil
}
