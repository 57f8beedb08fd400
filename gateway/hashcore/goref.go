package hashcore

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/fxamacker/cbor/v2"
	"github.com/zeebo/xxh3"
)

// The Go reference implementation: clear rather than fast. It is the oracle the C core is checked
// against, and it must reproduce every engine-produced vector on its own.

// canonical is a canonical-CBOR (RFC 8949 preferred serialization) encoder. Pre-images hold only
// arrays, integers, byte strings, text strings and null, so no map-ordering rule ever applies.
var canonical = func() cbor.EncMode {
	m, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		panic(err) // static options; cannot fail
	}
	return m
}()

// cborTokens is a token block as a CBOR array of uints (a []uint8 would become a byte string).
type cborTokens []uint32

// goRoot is the reference for cRoot (see the seam comment in hashcore.go).
func goRoot(a Algorithm, s string) ([]byte, error) {
	switch {
	case a == SGLangSHA256:
		d := sha256.Sum256(append([]byte("sglang-cache-salt-v1\x00"), s...))
		return d[:], nil
	case a.IsVLLM():
		pre, err := serializeRoot(a, s)
		if err != nil {
			return nil, err
		}
		return digest(a, pre), nil
	}
	return nil, fmt.Errorf("hashcore: %s has no root digest", a)
}

// serializeRoot is the pre-image of NONE_HASH: the seed string as a CBOR text string or a pickled str.
func serializeRoot(a Algorithm, s string) ([]byte, error) {
	if a.pickle() {
		p := newPickler()
		if err := p.str(s); err != nil {
			return nil, err
		}
		return p.finish()
	}
	if a.msgpack() {
		return msgpackAppend(nil, s)
	}
	return canonical.Marshal(s)
}

// digest hashes a pre-image with a's digest function.
func digest(a Algorithm, pre []byte) []byte {
	switch a {
	case VLLMSHA256, VLLMSHA256CBOR, VLLMSHA256MsgPack, SGLangSHA256:
		d := sha256.Sum256(pre)
		return d[:]
	case VLLMXXHash, VLLMXXHashCBOR, VLLMXXHashMsgPack:
		d := xxh3.Hash128(pre).Bytes() // canonical big-endian hi64‖lo64, as Python's xxh3_128_digest
		return d[:]
	case RouterXXH3V1:
		return binary.LittleEndian.AppendUint64(nil, xxh3.Hash(pre))
	}
	return nil
}

// goChain is the reference for cChain: it hashes req.NumBlocks blocks with the extra-key values.
func goChain(req *chainRequest, extras [][]any) error {
	parent := req.Parent
	dl := req.Algo.DigestLen()
	for b := 0; b < req.NumBlocks; b++ {
		var ek []any
		if b < len(extras) {
			ek = extras[b]
		}
		pre, err := Preimage(req.Algo, req.BlockSize, req.Bigram, parent, req.Tokens, b, ek)
		if err != nil {
			return fmt.Errorf("hashcore: block %d: %w", b, err)
		}
		if b == 0 && req.Preimage0 != nil {
			*req.Preimage0 = pre
		}
		d := digest(req.Algo, pre)
		if req.Digests != nil {
			copy(req.Digests[b*dl:], d)
		}
		req.Keys[b] = req.Algo.KeyOf(d)
		parent = d
	}
	return nil
}

// Preimage returns the exact bytes the reference hashes for block b of tokens, given the digest the
// block chains on and its extra-key values (nil = none). It is exported for debugging and fuzzing.
func Preimage(a Algorithm, blockSize int, bigram bool, parent []byte, tokens []uint32, b int, extra []any) ([]byte, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	start, end := b*blockSize, (b+1)*blockSize
	if bigram {
		end++ // units j..j+blockSize-1 read tokens j..j+blockSize
	}
	if b < 0 || end > len(tokens) {
		return nil, fmt.Errorf("hashcore: block %d needs tokens [%d:%d], have %d", b, start, end, len(tokens))
	}
	block := tokens[start:end]
	switch {
	case a == SGLangSHA256:
		out := append([]byte(nil), parent...)
		for j := 0; j < blockSize; j++ {
			out = binary.LittleEndian.AppendUint32(out, block[j])
			if bigram {
				out = binary.LittleEndian.AppendUint32(out, block[j+1])
			}
		}
		return out, nil
	case a == RouterXXH3V1:
		if len(parent) != 8 {
			return nil, fmt.Errorf("router parent must be 8 bytes, got %d", len(parent))
		}
		out := append([]byte(nil), parent...)
		for _, t := range block {
			out = binary.LittleEndian.AppendUint32(out, t)
		}
		if len(extra) > 0 {
			norm, err := normalizeTree(extra)
			if err != nil {
				return nil, err
			}
			e, err := canonical.Marshal(norm)
			if err != nil {
				return nil, err
			}
			out = append(out, e...)
		}
		return out, nil
	}
	var ek any // None / null
	if len(extra) > 0 {
		norm, err := normalizeTree(extra)
		if err != nil {
			return nil, err
		}
		ek = norm
	}
	if a.pickle() {
		return pickleBlock(parent, block, ek)
	}
	if a.msgpack() {
		return msgpackAppend(nil, []any{parent, block, ek})
	}
	return canonical.Marshal([]any{parent, cborTokens(block), ek})
}

// normalizeTree applies normalizeExtra to every value of an extra-key array.
func normalizeTree(v []any) ([]any, error) {
	out := make([]any, len(v))
	for i, e := range v {
		n, err := normalizeExtra(e)
		if err != nil {
			return nil, fmt.Errorf("extra key [%d]: %w", i, err)
		}
		if t, ok := n.([]any); ok {
			if n, err = normalizeTree(t); err != nil {
				return nil, fmt.Errorf("extra key [%d]%w", i, err)
			}
		}
		out[i] = n
	}
	return out, nil
}

// pickleBlock is pickle.dumps((parent, tuple(tokens), extra), protocol=5) as CPython's C pickler
// writes it.
func pickleBlock(parent []byte, tokens []uint32, extra any) ([]byte, error) {
	p := newPickler()
	p.boundary() // the outer tuple's save
	if err := p.bytes(parent); err != nil {
		return nil, err
	}
	if len(tokens) > 3 {
		p.mark()
	} else {
		p.boundary()
	}
	for _, t := range tokens {
		p.int(int64(t))
	}
	p.tupleEnd(len(tokens))
	if extra == nil {
		p.none()
	} else if err := p.value(extra); err != nil {
		return nil, err
	}
	p.tupleEnd(3)
	return p.finish()
}
