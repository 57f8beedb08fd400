package registry

import (
	"slices"
	"testing"

	"github.com/kvexact/kvexact/contracts"
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
