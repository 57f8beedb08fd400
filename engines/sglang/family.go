package sglang

import "github.com/kvexact/kvexact/engines"

// Family is SGLang behind the engines.Family interface; engines/registry lists it. Each facet's
// methods live in the file named after the facet.
var Family engines.Family = family{}

type family struct{}

func (family) Name() string    { return "sglang" }
func (family) Display() string { return "SGLang" }
