package registry

import (
	"slices"
	"testing"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
)

// The registry and the contracts name the same families in the same order: a family package
// registered without its contract data, contract data for a family no package implements, or a
// vocabulary entry without a contract fails here.
func TestRegistryMatchesContracts(t *testing.T) {
	if got, want := Names(), contracts.Families; !slices.Equal(got, want) {
		t.Fatalf("registry families %v, contracts' vocabulary families %v", got, want)
	}
	withContract := map[string]bool{}
	for _, c := range contracts.All() {
		if _, err := Lookup(c.Family); err != nil {
			t.Errorf("contract %s: family %v", c.ID, err)
		}
		withContract[c.Family] = true
	}
	for _, n := range Names() {
		if !withContract[n] {
			t.Errorf("family %s has no contract under contracts/data/", n)
		}
	}
}

// Two answers to "how do this family's engines publish events" must agree: every contract's
// transport (what certification and ctk read) and the family's EventTransport (what the gateway's
// event pipeline opens). A contract for a release that moved to a drain, or a family whose facet
// says ZeroMQ while its contracts say none, fails here.
func TestContractTransportMatchesEventTransport(t *testing.T) {
	for _, c := range contracts.All() {
		f, err := Lookup(c.Family)
		if err != nil {
			t.Errorf("contract %s: family %v", c.ID, err)
			continue
		}
		var want engines.Transport
		switch {
		case c.Published():
			want = engines.TransportZMQ
		case c.Drained():
			want = engines.TransportDrain
		case !c.HasEvents():
			want = engines.TransportNone
		default:
			t.Errorf("contract %s: transport %q is neither published, drained nor none", c.ID, c.Transport)
			continue
		}
		if got := f.EventTransport(); got != want {
			t.Errorf("contract %s: transport %q, but the %s family's EventTransport is %d (want %d)", c.ID, c.Transport, f.Name(), got, want)
		}
	}
}
