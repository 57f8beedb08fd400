package llamacpp

import "github.com/kvexact/kvexact/engines"

// Family is llama.cpp behind the engines.Family interface; engines/registry lists it. Each facet's
// methods live in the file named after the facet.
var Family engines.Family = family{}

type family struct{}

func (family) Name() string    { return "llamacpp" }
func (family) Display() string { return "llama.cpp" }
