package hashcore

import "fmt"

// ChainFrom hashes the full blocks of tokens chaining on parent (a full digest: Root, RootFor, or a
// digest this binding computed earlier), with explicit per-block extra keys as vLLM's BlockStored
// events carry them (nil entries, or a nil slice, for none). It is how the gateway re-derives an
// engine's published keys from an event's token ids (the live parity watch): the engine chains on
// full digests while events publish 64-bit keys, so a block can only be recomputed from its own
// parent's digest.
func (h *Hasher) ChainFrom(parent []byte, tokens []uint32, extras [][]any) (digests [][]byte, keys []uint64, err error) {
	if h.b.Bigram {
		return nil, nil, fmt.Errorf("hashcore: ChainFrom does not chain bigram pages")
	}
	if len(parent) != 0 && len(parent) != h.b.Algorithm.DigestLen() {
		return nil, nil, fmt.Errorf("hashcore: parent digest of %d bytes, %s chains on %d", len(parent), h.b.Algorithm, h.b.Algorithm.DigestLen())
	}
	if len(extras) > 0 && !h.b.Algorithm.IsVLLM() && h.b.Algorithm != RouterXXH3V1 {
		return nil, nil, fmt.Errorf("hashcore: %s takes no per-block extra keys", h.b.Algorithm)
	}
	n := len(tokens) / h.b.BlockSize
	flat, keys, err := h.chain(parent, tokens, n, extras, nil, nil)
	if err != nil {
		return nil, nil, err
	}
	return splitDigests(flat, h.b.Algorithm.DigestLen()), keys, nil
}
