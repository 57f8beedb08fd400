package sglang

import "github.com/kvexact/kvexact/engines"

// HitLimit is SGLang's hit cap (engines.Hits): Req.adjust_max_prefix_ids hands match_prefix the
// first len(input_ids) − 1 tokens, which the radix cache truncates to whole pages.
func (family) HitLimit(promptTokens, blockSize int) int {
	return engines.LastTokenComputed(promptTokens, blockSize)
}

// DPRankHeader: none. SGLang pins a rank with a body field (routed_dp_rank, data_parallel_rank
// before it), which the gateway does not rewrite; KV-exact counts the blocks every rank holds.
func (family) DPRankHeader() string { return "" }
