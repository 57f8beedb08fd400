package llamacpp

import "github.com/kvexact/kvexact/engines"

// HitLimit is llama.cpp's hit cap (engines.Hits): the server re-evaluates at least one prompt
// token of a slot's cached prefix to produce logits. llama.cpp has no event contract, so nothing
// scores against it; the fact is kept for the interface.
func (family) HitLimit(promptTokens, blockSize int) int {
	return engines.LastTokenComputed(promptTokens, blockSize)
}

// DPRankHeader: none (no data-parallel ranks).
func (family) DPRankHeader() string { return "" }
