package vllm

import "github.com/kvexact/kvexact/engines"

// Family is vLLM behind the engines.Family interface; engines/registry lists it. Each facet's
// methods live in the file named after the facet.
var Family engines.Family = family{}

type family struct{}

func (family) Name() string    { return "vllm" }
func (family) Display() string { return "vLLM" }
