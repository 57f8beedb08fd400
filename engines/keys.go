package engines

// Keys is how a family's engine builds the block keys it publishes, as far as the gateway must know
// to compute them from a request (gateway/route's PromptKeyer) and to recompute them from the
// engine's own events (gateway/watch). The hash algorithms themselves live in gateway/hashcore;
// these are the family's rules around them.
type Keys interface {
	KeyRules() KeyRules
}

// KeyRules are one family's key rules.
type KeyRules struct {
	// Reproducible: the gateway can recompute the engine's own keys from the token ids its events
	// carry (an engine binding exists and events publish full token lists), so the live parity
	// watch can check them.
	Reproducible bool
	// BlockExtras: each block's hash takes the request's extra keys (LoRA adapter name, cache_salt,
	// multimodal hashes) and the events carry them per block, so adapter and salted requests keep
	// exact keys (and ctk's LoRA spec applies).
	BlockExtras bool
	// SaltedRoot: a salted request's chain is rooted at its cache_salt instead of the plain root.
	SaltedRoot bool
	// AlgorithmSuspects are the algorithms (as contracts spell them) the watch tries when the first
	// block from the root mismatches, to name the one the engine was started with.
	AlgorithmSuspects []string
	// TruncationSide is the side the engine's tokenizer truncates from when a request sets
	// truncate_prompt_tokens without truncation_side: vLLM sets "left" for generative models
	// (vllm/tokenizers/registry.py), keeping the last n tokens with the tokenizer's special tokens
	// re-added around them. "": not known, such a request is a KV-exact miss.
	TruncationSide string
}
