package gateway

import (
	"bytes"
	"encoding/json"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/exactness"
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
)

// applyMembership applies a rule change that only adds, removes or takes down endpoints (what
// Kubernetes discovery does on every pod change) without rebuilding the runtime: the inventory,
// the kept endpoints' event subscriptions, their health and their exactness state (holds, parity
// evidence, predicted/realized account) and the adapters they listed carry over; a new endpoint is added to the inventory and
// subscribed; a removed one is unsubscribed and forgotten. A new router over the new endpoint list
// is swapped in, as any rule change does. done is false when the change is more than membership
// (any other field, an endpoint's configuration, the ingest binding or KV-exact's verdict for the
// rule changed): the caller rebuilds.
func (g *Gateway) applyMembership(old *ruleRuntime, r *rules.Rule) (done bool, err error) {
	if !sameBesideEndpoints(old.rule, r) {
		return false, nil
	}
	prev := map[string]int{} // endpoint name → position in old
	for i, e := range old.rule.Endpoints {
		prev[e.Name] = i
	}
	for _, e := range r.Endpoints {
		if i, ok := prev[e.Name]; ok && !sameEndpoint(old.rule.Endpoints[i], e) {
			return false, nil // same name, another endpoint: rebuild
		}
	}
	rt := &ruleRuntime{rule: r, contract: old.contract, index: old.index, groups: old.groups, ranks: old.ranks, keyer: old.keyer, sources: map[string]*source{}}
	var added []inventory.EndpointID
	undo := func() {
		for _, id := range added {
			_ = old.index.RemoveEndpoint(id) // ids just added: cannot be unknown
			old.ranks.Remove(id)
		}
	}
	for j, e := range r.Endpoints {
		var id inventory.EndpointID
		var h *health.Endpoint
		if i, ok := prev[e.Name]; ok {
			id, h = old.eps[i].ID, old.eps[i].Health
		} else {
			if id, err = old.index.AddEndpoint(e.Name); err != nil {
				undo()
				return true, err
			}
			added = append(added, id)
			h = g.newHealth(r, e)
		}
		h.SetAdminDown(e.AdminDown)
		ep := &route.Endpoint{ID: id, Index: j, Name: e.Name, Address: e.Address, Role: route.Role(e.Role), Weight: e.Weight, Capacity: max(e.CapacityBlocks, 1), MaxRunning: e.MaxRunning, Health: h}
		if i, ok := prev[e.Name]; ok {
			ep.RankHeader, ep.DPRanks = old.eps[i].RankHeader, old.eps[i].DPRanks
		} else if err = rt.addRanks(e, ep); err != nil {
			undo()
			return true, err
		}
		rt.eps = append(rt.eps, ep)
	}
	certified, binding := g.certify(rt)
	rt.binding = binding
	if binding != old.binding || rt.exact.Enabled != old.exact.Enabled || rt.exact.Binding != old.exact.Binding {
		undo()
		return false, nil // the sources or the keyer would change: rebuild
	}
	if err := g.newRouter(rt, certified); err != nil {
		undo()
		return true, err
	}
	for _, e := range rt.eps {
		ok := rt.exact.Enabled && certified.Has(e.ID)
		if i, kept := prev[e.Name]; kept {
			x := old.epExact[i]
			x.rebind(e, g.verifyConfig(rt, e.Index), ok, rt.exact.certWhy(e.Name))
			rt.epExact = append(rt.epExact, x)
			if s := old.sources[e.Name]; s != nil {
				rt.sources[e.Name] = s
			}
			if ew := old.watches[e.Name]; ew != nil {
				if rt.watches == nil {
					rt.watches = map[string]*endpointWatch{}
				}
				rt.watches[e.Name] = ew
			}
			if v, ok := old.errs.Load(e.Name); ok {
				rt.errs.Store(e.Name, v)
			}
			continue
		}
		rt.epExact = append(rt.epExact, newEndpointExact(r.Name, e, g.verifyConfig(rt, e.Index), ok, rt.exact.certWhy(e.Name), g.now, g.statusM, g.log))
	}
	if err := g.startSources(rt, binding); err != nil {
		for name, s := range rt.sources {
			if old.sources[name] != s {
				s.cancel()
				<-s.done
			}
		}
		undo()
		return true, err
	}
	g.carryAdapters(old, rt)
	g.mu.Lock()
	g.runtimes[r.Name] = rt
	g.routes.Set(g.listenerOf(r), rt.router)
	g.mu.Unlock()
	// What left: its subscription, its keys and its series.
	for i, e := range old.rule.Endpoints {
		if containsEndpoint(r.Endpoints, e.Name) {
			continue
		}
		if s := old.sources[e.Name]; s != nil {
			s.cancel()
			<-s.done
		}
		_ = old.index.RemoveEndpoint(old.eps[i].ID) // registered by the old runtime: cannot be unknown
		old.groups.RemoveEndpoint(old.eps[i].ID)
		old.ranks.Remove(old.eps[i].ID)
		g.ingestM.Forget(r.Name, e.Name)
		g.statusM.forgetEndpoint(r.Name, e.Name)
	}
	g.statusM.set(rt)
	g.noteTokenizer(old, rt)
	g.log.Info("gateway: endpoints changed, inventory kept", "rule", r.Name, "endpoints", len(r.Endpoints), "added", len(added))
	return true, nil
}

// rebind hands the endpoint's exactness state to the new router's endpoint, with the verdict the
// certificates give it now.
func (x *endpointExact) rebind(ep *route.Endpoint, cfg exactness.Config, certified bool, certWhy string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.ep = ep
	x.sm.SetConfig(cfg, x.now())
	switch {
	case certified && !x.sm.Certified():
		x.applyLocked(exactness.Evidence{Type: exactness.Certified, Detail: certWhy})
	case !certified:
		x.applyLocked(exactness.Evidence{Type: exactness.NotCertified, Detail: certWhy})
	}
	x.publish()
}

// sameBesideEndpoints reports whether two versions of a rule differ at most in their endpoints.
func sameBesideEndpoints(a, b *rules.Rule) bool {
	ca, cb := *a, *b
	ca.Endpoints, cb.Endpoints = nil, nil
	return sameJSON(ca, cb)
}

// sameEndpoint: the same endpoint configuration, its operator state (admin down) aside, which the
// health state takes without a rebuild.
func sameEndpoint(a, b rules.Endpoint) bool {
	a.AdminDown, b.AdminDown = false, false
	return sameJSON(a, b)
}

func sameJSON(a, b any) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

func containsEndpoint(eps []rules.Endpoint, name string) bool {
	for _, e := range eps {
		if e.Name == name {
			return true
		}
	}
	return false
}

// forgetEndpoint drops a removed endpoint's usage counters (its exactness series go with the
// rule's republish in set).
func (m *statusMetrics) forgetEndpoint(rule, endpoint string) {
	l := prometheus.Labels{"rule": rule, "endpoint": endpoint}
	m.usage.predicted.DeletePartialMatch(l)
	m.usage.realized.DeletePartialMatch(l)
}
