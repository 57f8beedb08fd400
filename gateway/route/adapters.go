package route

import (
	"slices"

	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/rules"
)

// adapt maps a request for one of the rule's LoRA adapters (declared, else discovered) to what the
// keyer needs: the base model (whose tokenizer and template render the prompt) and the LoRA name and
// path the engine hashes. Requests for other models come back unchanged; the caller's Request is never
// modified.
func (rt *Router) adapt(req *Request) *Request {
	if a := rt.adapter(req.Model); a != nil {
		r := *req
		r.Model, r.LoRAName, r.LoRAPath = a.Base, a.LoRAName, a.LoRAPath
		return &r
	}
	return req
}

// adapter returns the adapter a model name selects: a declared one first, then a discovered one.
func (rt *Router) adapter(model string) *rules.Adapter {
	for i := range rt.rule.Adapters {
		if rt.rule.Adapters[i].Name == model {
			return &rt.rule.Adapters[i]
		}
	}
	if d := rt.discovered.Load(); d != nil {
		for i := range d.list {
			if d.list[i].Name == model {
				return &d.list[i]
			}
		}
	}
	return nil
}

// discoveredAdapters are the adapters the endpoints list, and for each the endpoints that do not.
type discoveredAdapters struct {
	list   []rules.Adapter
	absent map[string]inventory.Mask
}

// ExcludedAdapterNotListed is the evidence's exclusion of an endpoint whose /v1/models does not
// list the discovered adapter requested (the engine would answer 404).
const ExcludedAdapterNotListed = "adapter_not_listed"

// SetDiscoveredAdapters replaces the adapters discovered from the endpoints (the caller's slices
// are not kept); listedBy names, per adapter, the endpoints that list it: requests for it go to
// those only (nil: all). A name the rule declares keeps its declared mapping and all endpoints.
func (rt *Router) SetDiscoveredAdapters(as []rules.Adapter, listedBy map[string][]string) {
	d := &discoveredAdapters{list: append([]rules.Adapter(nil), as...)}
	if listedBy != nil {
		d.absent = map[string]inventory.Mask{}
		for _, a := range as {
			if rt.declares(a.Name) {
				continue
			}
			var m inventory.Mask
			for _, e := range rt.eps {
				if !slices.Contains(listedBy[a.Name], e.Name) {
					m.Set(e.ID)
				}
			}
			d.absent[a.Name] = m
		}
	}
	rt.discovered.Store(d)
}

// DiscoveredAdapters returns the adapters last discovered (nil when none).
func (rt *Router) DiscoveredAdapters() []rules.Adapter {
	if d := rt.discovered.Load(); d != nil {
		return d.list
	}
	return nil
}

// adapterAbsent is the set of endpoints that do not list model, a discovered adapter (empty for
// any other model).
func (rt *Router) adapterAbsent(model string) inventory.Mask {
	if d := rt.discovered.Load(); d != nil {
		return d.absent[model]
	}
	return inventory.Mask{}
}

func orMask(a, b inventory.Mask) inventory.Mask {
	for i := range a {
		a[i] |= b[i]
	}
	return a
}

// Adapters returns every adapter the router serves: the declared ones, then the discovered ones the
// rule does not declare.
func (rt *Router) Adapters() []rules.Adapter {
	out := append([]rules.Adapter(nil), rt.rule.Adapters...)
	for _, a := range rt.DiscoveredAdapters() {
		if !rt.declares(a.Name) {
			out = append(out, a)
		}
	}
	return out
}

// ServesAdapter reports whether model names an adapter the router serves.
func (rt *Router) ServesAdapter(model string) bool { return rt.adapter(model) != nil }

func (rt *Router) declares(name string) bool {
	for _, a := range rt.rule.Adapters {
		if a.Name == name {
			return true
		}
	}
	return false
}

// ExcludedAdapterUncertified is the evidence's exclusion of an endpoint whose certificate did not
// prove the requested adapter's LoRA name (KV-exact only: the other tiers still use it).
const ExcludedAdapterUncertified = "adapter_uncertified"

// adapterLift says what makes an adapter count on an endpoint whose certificate did not prove
// it: a declared adapter needs a certificate proving it; a discovered one is probed by the gateway.
func (rt *Router) adapterLift(model string) string {
	if rt.declares(model) {
		return "add the adapter to the ctk pool and re-certify"
	}
	return "a discovered adapter counts once the gateway's adapter probe proves it, shown in /admin/status adapter_probes, or a certificate proving it"
}

// adapterUncertified is, for a request of model, the set of endpoints whose certificate did not
// prove the adapter's LoRA name (empty for a model that is no adapter), and the LoRA name.
func (rt *Router) adapterUncertified(model string) (inventory.Mask, string) {
	var m inventory.Mask
	a := rt.adapter(model)
	if a == nil || rt.cfg.CertifiedAdapters == nil {
		return m, ""
	}
	for _, e := range rt.eps {
		if names, ok := rt.cfg.CertifiedAdapters[e.ID]; ok && !slices.Contains(names, a.LoRAName) {
			m.Set(e.ID)
		}
	}
	return m, a.LoRAName
}
