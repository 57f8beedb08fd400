package trtllm

import "github.com/kvexact/kvexact/engines"

// HitLimit is TensorRT-LLM's hit cap in full blocks (engines.Hits): addSequence splits only the
// first inputLength − 1 tokens into block keys ("Ignore last token because it can't be
// recovered"). With partial reuse on, the last, shortened key may also reuse part of a cached
// block; the gateway does not score partial blocks.
func (family) HitLimit(promptTokens, blockSize int) int {
	return engines.LastTokenComputed(promptTokens, blockSize)
}

// DPRankHeader: none known; KV-exact counts the blocks every attention-DP rank holds.
func (family) DPRankHeader() string { return "" }
