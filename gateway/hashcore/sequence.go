package hashcore

// A Sequence hashes a growing token sequence block by block, as an engine does during decode: vLLM's
// Request.update_block_hashes, including its decode-time multimodal quirk (blocks completed by a
// later Append consider only the LAST multimodal item), SGLang's chained pages, and router keys
// (which follow the one-shot extra keys that vLLM's BlockStored events carry). A Sequence is not safe
// for concurrent use.
type Sequence struct {
	h       *Hasher
	ex      *Extras
	tokens  []uint32
	digests [][]byte
	keys    []uint64
	extras  [][]any // the extra keys each block was hashed with
}

// NewSequence starts an empty sequence for a request with the given extras (nil = none).
func (h *Hasher) NewSequence(ex *Extras) *Sequence {
	return &Sequence{h: h, ex: ex}
}

// Append adds tokens and returns the keys of the blocks they completed (possibly none). On error the
// sequence is unchanged.
func (s *Sequence) Append(tokens ...uint32) (newKeys []uint64, err error) {
	h := s.h
	if err := h.checkExtras(s.ex); err != nil {
		return nil, err
	}
	if err := s.ex.validate(); err != nil {
		return nil, err
	}
	// Appending past len(s.tokens) never changes the tokens the sequence already holds, so a
	// failed Append leaves it unchanged without copying.
	all := append(s.tokens, tokens...)
	first, last := len(s.keys), h.b.numBlocks(len(all))
	if last <= first {
		s.tokens = all
		return nil, nil
	}
	var parent []byte
	if first == 0 {
		if parent, err = h.RootFor(s.ex); err != nil {
			return nil, err
		}
	} else {
		parent = s.digests[first-1]
	}
	var extras [][]any
	switch {
	case h.b.Algorithm.IsVLLM():
		extras = s.ex.blockRange(first, last, h.b.BlockSize, h.b.TaggedExtraKeys)
	case h.b.Algorithm == RouterXXH3V1:
		extras = s.ex.blockRange(0, last, h.b.BlockSize, h.b.TaggedExtraKeys)[first:]
	}
	flat, keys, err := h.chain(parent, all[first*h.b.BlockSize:], last-first, extras, nil, nil)
	if err != nil {
		return nil, err
	}
	s.tokens = all
	s.digests = append(s.digests, splitDigests(flat, h.b.Algorithm.DigestLen())...)
	s.keys = append(s.keys, keys...)
	for b := range last - first {
		var e []any
		if b < len(extras) {
			e = extras[b]
		}
		s.extras = append(s.extras, e)
	}
	return keys, nil
}

// Keys returns the keys of all full blocks so far. The caller must not modify the slice.
func (s *Sequence) Keys() []uint64 { return s.keys }

// Digests returns the full digests of all full blocks so far. The caller must not modify them.
func (s *Sequence) Digests() [][]byte { return s.digests }

// ExtraKeys returns the extra keys each block was hashed with (nil entries = none): for vLLM the
// decode-path values, which can differ from ExtraKeys' one-shot values (the mm quirk).
func (s *Sequence) ExtraKeys() [][]any { return s.extras }

// Len is the number of tokens appended so far.
func (s *Sequence) Len() int { return len(s.tokens) }
