package vllm

import (
	"testing"

	"github.com/kvexact/kvexact/contracts"
)

// The contract's wireSchema and this package's release → layout map say the same thing twice (the
// contract for certification and ctk, LayoutForRelease for the encoder the simulator and the
// vectors use): a new release's contract that names one wire while layout.go gives it the other
// fails here, so adding a release cannot leave the two apart.
func TestLayoutMatchesContractWireSchema(t *testing.T) {
	schema := func(l Layout) string {
		if l == LayoutMap {
			return "vllm-kv-tagged-map-v2"
		}
		return "vllm-kv-tagged-array-v1"
	}
	n := 0
	for _, c := range contracts.All() {
		if c.Family != Family.Name() {
			continue
		}
		n++
		l, err := LayoutForRelease(c.Pin.Release)
		if err != nil {
			t.Errorf("contract %s: pin %s: %v", c.ID, c.Pin.Release, err)
			continue
		}
		if got := schema(l); got != c.WireSchema {
			t.Errorf("contract %s: wireSchema %s, but LayoutForRelease(%s) = %s (%s)", c.ID, c.WireSchema, c.Pin.Release, l, got)
		}
	}
	if n == 0 {
		t.Fatal("no vllm contract")
	}
}
