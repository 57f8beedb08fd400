package main

import (
	"strings"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
)

// Usage texts list the engines a flag applies to from the registry and the contracts, so adding a
// family updates them without naming it here.

// families lists, in registry order, name(f) of each family with a contract for which keep holds.
func families(keep func(*contracts.Contract) bool, name func(engines.Family) string) []string {
	var out []string
	for _, f := range registry.All() {
		for _, c := range contracts.All() {
			if c.Family == f.Name() && keep(c) {
				out = append(out, name(f))
				break
			}
		}
	}
	return out
}

func configName(f engines.Family) string  { return f.Name() }
func displayName(f engines.Family) string { return f.Display() }

var (
	// eventFamilies publish KV events at all; publishedFamilies over ZeroMQ, drainedFamilies over
	// an HTTP drain.
	eventFamilies     = strings.Join(families((*contracts.Contract).HasEvents, configName), ", ")
	publishedFamilies = strings.Join(families((*contracts.Contract).Published, configName), ", ")
	drainedFamilies   = strings.Join(families((*contracts.Contract).Drained, configName), "|")
	drainedEngines    = strings.Join(families((*contracts.Contract).Drained, displayName), " or ")
)
