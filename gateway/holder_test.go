package gateway

import (
	"testing"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/route"
)

// TestHolderAcceptsALowerTier: the verification probe's and the token check's key lookup finds a
// key the engine offloaded (its host copy is a block it published under that key), names the
// nearest tier holding it, and finds nothing for another endpoint's key.
func TestHolderAcceptsALowerTier(t *testing.T) {
	rt := &ruleRuntime{index: inventory.New(inventory.Config{})}
	for _, tier := range engines.LowerTiers {
		rt.lower = append(rt.lower, route.LowerIndex{Tier: tier, Index: inventory.New(inventory.Config{})})
	}
	var ids []inventory.EndpointID
	for _, n := range []string{"a", "b"} {
		id, _ := rt.index.AddEndpoint(n)
		for _, l := range rt.lower {
			_, _ = l.Index.AddEndpoint(n)
		}
		ids = append(ids, id)
	}
	a, b := ids[0], ids[1]
	_ = rt.index.Store(a, []uint64{1})
	_ = rt.lower[0].Index.Store(a, []uint64{2}) // host memory
	_ = rt.lower[1].Index.Store(a, []uint64{2, 3})
	_ = rt.lower[2].Index.Store(b, []uint64{4})
	for _, c := range []struct {
		ep   inventory.EndpointID
		key  uint64
		want string
	}{{a, 1, "gpu"}, {a, 2, "cpu"}, {a, 3, "disk"}, {b, 4, "shared"}, {a, 4, ""}, {b, 1, ""}} {
		if got := rt.holder(c.ep, c.key); got != c.want {
			t.Errorf("endpoint %d key %d: %q, want %q", c.ep, c.key, got, c.want)
		}
	}
}
