package route

import "github.com/kvexact/kvexact/gateway/rules"

// adapt maps a request for one of the rule's LoRA adapters (declared, else discovered) to what the
// keyer needs: the base model (whose tokenizer and template render the prompt) and the LoRA name the
// engine hashes. Requests for other models come back unchanged; the caller's Request is never
// modified.
func (rt *Router) adapt(req *Request) *Request {
	if a := rt.adapter(req.Model); a != nil {
		r := *req
		r.Model, r.LoRAName = a.Base, a.LoRAName
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
		for i := range *d {
			if (*d)[i].Name == model {
				return &(*d)[i]
			}
		}
	}
	return nil
}

// SetDiscoveredAdapters replaces the adapters discovered from the endpoints (the caller's slice is
// not kept). A name the rule declares keeps its declared mapping.
func (rt *Router) SetDiscoveredAdapters(as []rules.Adapter) {
	c := append([]rules.Adapter(nil), as...)
	rt.discovered.Store(&c)
}

// DiscoveredAdapters returns the adapters last discovered (nil when none).
func (rt *Router) DiscoveredAdapters() []rules.Adapter {
	if d := rt.discovered.Load(); d != nil {
		return *d
	}
	return nil
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
