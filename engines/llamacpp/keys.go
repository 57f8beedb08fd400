package llamacpp

import "github.com/kvexact/kvexact/engines"

// KeyRules: llama.cpp publishes no block keys.
func (family) KeyRules() engines.KeyRules { return engines.KeyRules{} }
