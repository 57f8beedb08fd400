package vllm

import "github.com/kvexact/kvexact/engines"

// HitLimit is vLLM's hit cap (engines.Hits): KVCacheManager.get_computed_blocks looks up at most
// num_tokens − 1 tokens and the coordinator's hit is whole blocks (for a hybrid model, whole
// scheduler blocks: gateway/kvgroups trims further).
func (family) HitLimit(promptTokens, blockSize int) int {
	return engines.LastTokenComputed(promptTokens, blockSize)
}
