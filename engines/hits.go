package engines

// Hits is how deep the family's engine may serve a prompt from its prefix cache, whatever it holds.
// Every engine computes at least the prompt's last token (its logits give the first output
// token), so a prompt that ends on a block boundary can hit all its full blocks but the last. The
// gateway scores and predicts no deeper (gateway/route), so its predicted cached tokens equal the
// engine's cached_tokens. The rules, with the engines' source: docs/reference/routing-semantics.md.
type Hits interface {
	// HitLimit is the most leading full blocks (blockSize tokens each) of a promptTokens-long
	// prompt that the engine's prefix-cache lookup returns.
	HitLimit(promptTokens, blockSize int) int
	// DPRankHeader is the request header that sends a data-parallel engine's request to one rank
	// (its value the rank's index), or "" when the gateway cannot pin the rank: KV-exact then
	// counts only the blocks every rank holds, since the engine picks the rank itself.
	DPRankHeader() string
}

// LastTokenComputed is the rule the engines share: the hit stops at promptTokens − 1 tokens,
// rounded down to whole blocks (vLLM's block alignment, SGLang's page alignment).
func LastTokenComputed(promptTokens, blockSize int) int {
	if promptTokens <= 1 || blockSize <= 0 {
		return 0
	}
	return (promptTokens - 1) / blockSize
}
