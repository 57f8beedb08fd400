package gateway

import (
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/rules"
)

// Discovered adapters are probed before they count. Under a certificate whose entry records the
// adapters it proved, an adapter an endpoint lists in /v1/models that the entry does not prove is
// not KV-exact on that endpoint (adapter_uncertified) until the gateway has run ctk's own adapter
// spec on it (ctk.ProveAdapters) under that certificate's profile. A proven LoRA name joins the
// endpoint's proven adapters for as long as the endpoint keeps its identity, its engine process
// (a restart seen on the event stream forgets it: the new process is probed again) and the rule
// its profile; a refused one is retried with the admission backoff. A certificate entry without an
// adapter list restricts no adapter, so nothing is probed under it.

// maxAdapterProbesPerRound bounds the adapter probes one endpoint gets per discovery round (each
// is a ctk run of the binding specs and the adapter spec).
const maxAdapterProbesPerRound = 4

// adapterProof is what the gateway proved itself on one endpoint identity under one profile.
type adapterProof struct {
	id      certificate.Identity
	profile string
	proved  []string // LoRA names
	refused map[string]adapterRefusal
}

type adapterRefusal struct {
	reason   string
	attempts int
	next     time.Time
}

// adapterProofs are the gateway's adapter proofs, by rule and endpoint name.
type adapterProofs struct {
	mu     sync.Mutex
	recs   map[string]map[string]*adapterProof
	probes *prometheus.CounterVec // rule, result
}

func newAdapterProofs(reg prometheus.Registerer) *adapterProofs {
	a := &adapterProofs{probes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvexact_adapter_probes_total",
		Help: "Probes the gateway ran for discovered LoRA adapters an endpoint's certificate entry did not prove, by result: proved (KV-exact counts the adapter there) or refused (/admin/status adapter_probes and the log name why).",
	}, []string{"rule", "result"})}
	reg.MustRegister(a.probes)
	return a
}

// AdapterProbeStatus is one adapter probe's account in /admin/status.
type AdapterProbeStatus struct {
	LoRAName string `json:"lora_name"`
	// State is "proved" (KV-exact counts the adapter here) or "refused" (retried at NextAttempt).
	State       string    `json:"state"`
	Attempts    int       `json:"attempts,omitempty"`
	Reason      string    `json:"reason,omitempty"`
	NextAttempt time.Time `json:"next_attempt,omitzero"`
}

// record returns the endpoint's current proof (nil when the identity or profile changed: what was
// proved was another process's or another profile's).
func (a *adapterProofs) record(rule string, id certificate.Identity, profile string, create bool) *adapterProof {
	if a.recs == nil {
		a.recs = map[string]map[string]*adapterProof{}
	}
	byName := a.recs[rule]
	if byName == nil {
		byName = map[string]*adapterProof{}
		a.recs[rule] = byName
	}
	rec := byName[id.Name]
	if rec != nil && (!sameIdentity(rec.id, id) || rec.profile != profile) {
		delete(byName, id.Name)
		rec = nil
	}
	if rec == nil && create {
		rec = &adapterProof{id: id, profile: profile, refused: map[string]adapterRefusal{}}
		byName[id.Name] = rec
	}
	return rec
}

// provedOn is the LoRA names proven on the endpoint under the profile (certify adds them to the
// certificate entry's).
func (a *adapterProofs) provedOn(rule string, id certificate.Identity, profile string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rec := a.record(rule, id, profile, false); rec != nil {
		return slices.Clone(rec.proved)
	}
	return nil
}

func (a *adapterProofs) status(rule, name string) []AdapterProbeStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	rec := a.recs[rule][name]
	if rec == nil {
		return nil
	}
	var out []AdapterProbeStatus
	for _, n := range rec.proved {
		out = append(out, AdapterProbeStatus{LoRAName: n, State: "proved"})
	}
	for n, f := range rec.refused {
		out = append(out, AdapterProbeStatus{LoRAName: n, State: "refused", Attempts: f.attempts, Reason: f.reason, NextAttempt: f.next})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LoRAName < out[j].LoRAName })
	return out
}

// restarted forgets what the gateway proved on an endpoint whose engine restarted: the proofs were
// the old process's, so its adapters are probed again before they count, as the restart's
// verification proves the rest anew. It reports whether an adapter proven there stops counting.
func (a *adapterProofs) restarted(rule, name string) bool {
	if a == nil {
		return false // a gateway assembled without adapter proofs (unit tests of the event watch)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	rec := a.recs[rule][name]
	if rec == nil {
		return false
	}
	delete(a.recs[rule], name)
	return len(rec.proved) > 0
}

func (a *adapterProofs) forget(rule string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.recs, rule)
}

// proveAdapters probes, on every endpoint whose certificate entry records its adapters, the
// adapters it lists that are not proven yet; a rule with a newly proven adapter is re-evaluated so
// its router counts it.
func (g *Gateway) proveAdapters(ctx context.Context, rt *ruleRuntime) {
	r := rt.rule
	if !rt.exact.Enabled || rt.exact.ProfileDigest == "" {
		return
	}
	g.mu.RLock()
	certs := g.certs
	g.mu.RUnlock()
	changed := false
	for i, e := range rt.eps {
		names, recorded := rt.adapters[e.ID]
		if !recorded {
			continue // no certificate entry records adapters here: none is restricted
		}
		id := IdentityOf(r, i)
		cert := g.adapterCertificate(certs, rt.exact.ProfileDigest, e.Name)
		if cert == nil {
			continue
		}
		rt.lora.mu.Lock()
		listed := slices.Clone(rt.lora.byEnd[e.Name])
		rt.lora.mu.Unlock()
		n := 0
		for _, a := range listed {
			if slices.Contains(names, a.LoRAName) || slices.ContainsFunc(r.Adapters, func(d rules.Adapter) bool { return d.Name == a.Name }) || n == maxAdapterProbesPerRound || ctx.Err() != nil {
				continue
			}
			g.lproofs.mu.Lock()
			rec := g.lproofs.record(r.Name, id, rt.exact.ProfileDigest, true)
			f, refused := rec.refused[a.LoRAName]
			due := !slices.Contains(rec.proved, a.LoRAName) && (!refused || !g.now().Before(f.next))
			g.lproofs.mu.Unlock()
			if !due {
				continue
			}
			n++
			proved, reason, err := g.adapterProbe(ctx, r, r.Endpoints[i], a, cert)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				reason = "the probe could not run: " + err.Error()
			}
			log := g.log.With("rule", r.Name, "endpoint", e.Name, "adapter", a.Name, "lora_name", a.LoRAName)
			g.lproofs.mu.Lock()
			rec = g.lproofs.record(r.Name, id, rt.exact.ProfileDigest, true)
			if slices.Contains(proved, a.LoRAName) {
				rec.proved = append(rec.proved, a.LoRAName)
				delete(rec.refused, a.LoRAName)
				changed = true
				g.lproofs.mu.Unlock()
				g.lproofs.probes.WithLabelValues(r.Name, "proved").Inc()
				log.Info("discovered adapter proven by probe: KV-exact counts it on the endpoint", "audit", "adapter_probe")
				continue
			}
			if reason == "" {
				reason = "the probe did not prove LoRA name " + a.LoRAName
			}
			f.attempts++
			back := g.opts.AdmissionBackoff
			if back <= 0 {
				back = DefaultAdmissionBackoff
			}
			for k := 1; k < f.attempts && back < DefaultAdmissionMaxBackoff; k++ {
				back *= 2
			}
			f.reason, f.next = reason, g.now().Add(min(back, DefaultAdmissionMaxBackoff))
			rec.refused[a.LoRAName] = f
			g.lproofs.mu.Unlock()
			g.lproofs.probes.WithLabelValues(r.Name, "refused").Inc()
			log.Warn("discovered adapter refused by its probe: not KV-exact on the endpoint", "audit", "adapter_probe", "reason", reason, "next_attempt", f.next)
		}
	}
	if changed {
		if err := g.reevaluate(r.Name); err != nil {
			g.log.Error("gateway: rule could not be re-evaluated after an adapter probe", "rule", r.Name, "err", err)
		}
	}
}

// adapterCertificate is the certificate in force for the profile that covers the endpoint: the one
// listing it, else one admitting it by probe.
func (g *Gateway) adapterCertificate(certs []*certificate.Certificate, digest, name string) *certificate.Certificate {
	now := g.now()
	for _, c := range certs {
		if ok, _ := c.Valid(now); ok && c.ProfileDigest == digest && c.Lists(name) {
			return c
		}
	}
	return admitter(certs, digest, name, now)
}

// adapterProbe runs ctk's adapter spec for one adapter on the endpoint with the rule's staged
// profile.
func (g *Gateway) adapterProbe(ctx context.Context, r *rules.Rule, e rules.Endpoint, a rules.Adapter, cert *certificate.Certificate) ([]string, string, error) {
	p, opts, err := g.probePool(r, e, func() {})
	if err != nil {
		return nil, "", err
	}
	p.DiscoverAdapters = false
	p.Adapters = []ctk.Adapter{{Name: a.Name, LoRAName: a.LoRAName}}
	if err := p.Normalize(); err != nil {
		return nil, "", err
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return ctk.ProveAdapters(pctx, p, cert, opts)
}

// setProvenAdapters records the LoRA names proven on an endpoint: its certificate entry's (or
// admission's) list with the gateway's own proofs added; a nil list restricts no adapter, and the
// gateway's proofs do not turn it into one.
func (rt *ruleRuntime) setProvenAdapters(id inventory.EndpointID, listed *[]string, probed []string) {
	if listed == nil {
		return
	}
	if rt.adapters == nil {
		rt.adapters = map[inventory.EndpointID][]string{}
	}
	names := append([]string{}, *listed...)
	for _, n := range probed {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	rt.adapters[id] = names
}
