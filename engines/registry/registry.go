// Package registry maps a family name, as rules, pool files and contracts spell it, to the engine
// family that implements it, and builds a family's HTTP prober (NewProber). It is the one place
// that lists the families: adding one means adding its package here, and its name to
// contracts/vocabulary.yaml (TestRegistryMatchesContracts). Code outside engines/ names no family
// (TestNoFamilyNamesOutsideEngines); docs/families.md says what each facet covers.
package registry

import (
	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/llamacpp"
	"github.com/kvexact/kvexact/engines/sglang"
	"github.com/kvexact/kvexact/engines/trtllm"
	"github.com/kvexact/kvexact/engines/vllm"
)

// families in the order messages list them.
var families = []engines.Family{vllm.Family, sglang.Family, trtllm.Family, llamacpp.Family}

// Lookup returns the family registered under name. An unregistered name is the same condition as
// a family no contract covers: a *contracts.UnknownError (empty Version) listing the families.
func Lookup(name string) (engines.Family, error) {
	for _, f := range families {
		if f.Name() == name {
			return f, nil
		}
	}
	return nil, &contracts.UnknownError{Family: name, Known: Names()}
}

// Names lists the registered family names.
func Names() []string {
	out := make([]string, len(families))
	for i, f := range families {
		out[i] = f.Name()
	}
	return out
}

// All returns every registered family.
func All() []engines.Family { return append([]engines.Family(nil), families...) }
