package vllm

import "github.com/kvexact/kvexact/engines"

// HitLimit is vLLM's hit cap (engines.Hits): KVCacheManager.get_computed_blocks looks up at most
// num_tokens − 1 tokens and the coordinator's hit is whole blocks (for a hybrid model, whole
// scheduler blocks: gateway/kvgroups trims further).
func (family) HitLimit(promptTokens, blockSize int) int {
	return engines.LastTokenComputed(promptTokens, blockSize)
}

// DPRankHeader: vLLM's OpenAI server reads X-data-parallel-rank (entrypoints/generate/base/
// serving.py, an integer; anything else is ignored) into the request's data_parallel_rank, and the
// data-parallel client sends a request that has one to that engine core instead of the least
// loaded one (v1/engine/core_client.py, DPLBAsyncMPClient.get_core_engine_for_request).
func (family) DPRankHeader() string { return "X-data-parallel-rank" }
