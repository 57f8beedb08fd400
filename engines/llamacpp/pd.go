package llamacpp

import "github.com/kvexact/kvexact/engines"

// PDDialect: llama.cpp has no prefill/decode disaggregation (its contract says pd: none; rules
// refuse prefill/decode roles for it).
func (family) PDDialect() engines.PDDialect { return nil }
