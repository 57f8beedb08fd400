package sim

// TensorRT-LLM 1.2's own block key (the V1 BlockKeyHasher, reference §2.4), written from its
// description. The gateway never uses it as a routing key (it rehashes event tokens), but the
// simulator must publish the same opaque ids a real engine would, so parents and removals resolve
// the way they do against a real TensorRT-LLM.

const (
	trtMulA    = 0x45d9f3b
	trtGolden  = 0x9e3779b9
	trtSplitM1 = 0xbf58476d1ce4e5b9
	trtSplitM2 = 0x94d049bb133111eb
)

// trtMix32 folds one 32-bit value into seed. The golden-ratio add wraps in 32 bits before it is
// widened, as the C++ does.
func trtMix32(seed uint64, a uint32) uint64 {
	a = ((a >> 16) ^ a) * trtMulA
	a = ((a >> 16) ^ a) * trtMulA
	a = (a >> 16) ^ a
	return seed ^ (uint64(a+trtGolden) + (seed << 6) + (seed >> 2))
}

// trtMix64 folds one 64-bit value into seed (splitmix64 finalizer, then the same combine).
func trtMix64(seed, c uint64) uint64 {
	c = (c ^ (c >> 30)) * trtSplitM1
	c = (c ^ (c >> 27)) * trtSplitM2
	c ^= c >> 31
	return seed ^ (c + trtGolden + (seed << 6) + (seed >> 2))
}

// trtBlockKey is the V1 hash of one block (full or partial) of plain-text tokens without salt,
// LoRA, multimodal keys or extra token ids, chained on the parent block's 64-bit hash (0 at the root).
func trtBlockKey(parent uint64, tokens []uint32) uint64 {
	seed := uint64(len(tokens)) ^ (parent * trtSplitM1)
	for _, t := range tokens {
		seed = trtMix32(seed, t)
	}
	return seed
}

// trtBlockKeyLoRA is trtBlockKey for a request with a LoRA task id, mixed in after the tokens.
func trtBlockKeyLoRA(parent uint64, tokens []uint32, loraTaskID uint64) uint64 {
	return trtMix64(trtBlockKey(parent, tokens), loraTaskID)
}
