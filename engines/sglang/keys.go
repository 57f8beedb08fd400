package sglang

import "github.com/kvexact/kvexact/engines"

// KeyRules: SGLang hashes no extra keys; a salted request's chain is rooted at its cache_salt.
func (family) KeyRules() engines.KeyRules {
	return engines.KeyRules{Reproducible: true, SaltedRoot: true}
}
