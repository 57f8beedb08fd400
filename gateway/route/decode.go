package route

import (
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
)

// pairDecode gives a prefill winner its decode endpoint: the session's pinned one while it is
// healthy, else the least-loaded. Route (not Explain) then pins the pair and teaches the trie.
func (rt *Router) pairDecode(c *choice) error {
	d := c.d
	decodes := rt.candidates(c.retry, RoleDecode)
	if c.pinned {
		d.Decode = byIndex(decodes, c.pin.decode)
	}
	if d.Decode == nil {
		d.Decode = minLoad(decodes, &rt.tieDecode)
	}
	if d.Decode == nil {
		return ErrNoEndpoint
	}
	if d.dry {
		return nil
	}
	rt.sessions.put(c.req.sessionKey(), d.Target.Index, d.Decode.Index)
	if rt.trie != nil && c.req.AffinityText != "" {
		rt.trie.insert(c.req.AffinityText, d.Target.Index)
	}
	return nil
}

// ReselectDecode re-validates the decode endpoint after a long prefill: if it became excluded, the
// least-loaded healthy decode endpoint takes over and the load unit moves with it.
func (rt *Router) ReselectDecode(d *Decision) *Endpoint {
	if d.Decode == nil || d.Decode.excluded(inventory.Mask{}) == health.NotExcluded {
		return d.Decode
	}
	next := minLoad(rt.candidates(inventory.Mask{}, RoleDecode), &rt.tieDecode)
	if next == nil {
		return nil
	}
	d.Decode.active.Add(-1)
	next.active.Add(1)
	d.Decode, d.DecodeN = next, next.Name
	return next
}
