package vllm

import "github.com/kvexact/kvexact/engines"

// KeyRules: vLLM hashes a block's extra keys (LoRA adapter name, cache_salt, multimodal hashes)
// into the block and publishes them per block; its chains root at H(PYTHONHASHSEED), so the watch
// tells a wrong algorithm from a wrong seed by trying the other pickle and CBOR algorithms. Its
// generative models' tokenizers truncate from the left.
func (family) KeyRules() engines.KeyRules {
	return engines.KeyRules{Reproducible: true, BlockExtras: true,
		AlgorithmSuspects: []string{"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"}, TruncationSide: "left"}
}
