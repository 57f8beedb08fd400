package gateway

import (
	"context"
	"net/http"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/inventory"
)

// TierAged is an endpoint's keys in one tier's inventory, oldest first (nil for a tier the rule
// does not index).
func (g *Gateway) TierAged(rule, endpoint string, tier engines.Tier) []inventory.KeyCount {
	rt, ok := g.runtime(rule)
	if !ok {
		return nil
	}
	for _, e := range rt.eps {
		if e.Name != endpoint {
			continue
		}
		if tier == engines.TierGPU {
			return rt.index.Aged(e.ID)
		}
		for _, l := range rt.lower {
			if l.Tier == tier {
				return l.Index.Aged(e.ID)
			}
		}
	}
	return nil
}

// Reprobe runs one periodic re-probe now (the identity, the version and the model, then a
// verification round), as the ReprobeInterval ticker does.
func (g *Gateway) Reprobe(ctx context.Context) {
	g.reprobe(ctx, &http.Client{Transport: g.transport()})
}
