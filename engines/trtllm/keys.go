package trtllm

import "github.com/kvexact/kvexact/engines"

// KeyRules: TensorRT-LLM's own block hash is never a key (the gateway rehashes the event tokens
// into router keys), so there is nothing of the engine's to reproduce.
func (family) KeyRules() engines.KeyRules { return engines.KeyRules{} }
