//go:build cgo

package hashcore

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkPrompt8k hashes one 8192-token prompt at block size 16 (512 blocks) per op, for every
// binding: the C core through the public API ("c": Hasher.Keys, including the Go wrapper's
// per-call work and allocations), the C core alone ("c-core": one cgo call with preallocated
// outputs, digests included), the Go reference ("go"), and two floors: the C digest function alone
// over the very same pre-image bytes, pre-built, in one cgo call, either independently ("floor":
// the CPU may overlap consecutive digests) or chained ("floor-chained": each digest waits for the
// previous one, whose bytes it contains, as any chained hash must). c/floor is the cost of
// serialization and chaining on top of the hashing itself. The "-portable" variants force the C
// core's portable code (SHA-256 without SHA-NI, token encoders without AVX2). Figures: docs/benchmarks/hashcore.md.
func BenchmarkPrompt8k(b *testing.B) {
	const n, bs = 8192, 16
	rng := rand.New(rand.NewPCG(42, 8192))
	toks := make([]uint32, n+1)
	for i := range toks {
		toks[i] = rng.Uint32N(128256) // Llama 3 vocabulary
	}
	seed := "0"
	for _, algo := range Algorithms {
		bind := Binding{Algorithm: algo, BlockSize: bs}
		if algo.IsVLLM() {
			bind.Seed = &seed
		}
		prompt := toks[:n]
		hc, err := New(bind, ImplC)
		if err != nil {
			b.Fatal(err)
		}
		hg, err := New(bind, ImplGo)
		if err != nil {
			b.Fatal(err)
		}
		buf, ends := preimages(b, hg, prompt)
		dst := make([]uint64, 0, n/bs)
		out := make([]byte, len(ends)*algo.DigestLen())
		sha := algo.DigestLen() == 32
		for _, portable := range []bool{false, true} {
			if portable && !sha {
				continue
			}
			suffix := ""
			if portable {
				suffix = "-portable"
			}
			b.Run(string(algo)+"/c-core"+suffix, func(b *testing.B) {
				forcePortable(portable)
				defer forcePortable(false)
				req := &chainRequest{Algo: algo, BlockSize: bs, Parent: hc.Root(), Tokens: prompt,
					NumBlocks: len(ends), Digests: make([]byte, len(ends)*algo.DigestLen()), Keys: make([]uint64, len(ends))}
				b.SetBytes(int64(len(buf) - 64))
				for b.Loop() {
					if err := cgoChain(req); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(string(algo)+"/c"+suffix, func(b *testing.B) {
				forcePortable(portable)
				defer forcePortable(false)
				b.SetBytes(int64(len(buf) - 64))
				for b.Loop() {
					if dst, err = hc.Keys(prompt, nil, dst); err != nil {
						b.Fatal(err)
					}
				}
			})
			for _, chained := range []bool{false, true} {
				name, off := "/floor", -1
				if chained {
					name, off = "/floor-chained", parentOffset(algo)
				}
				b.Run(string(algo)+name+suffix, func(b *testing.B) {
					forcePortable(portable)
					defer forcePortable(false)
					b.SetBytes(int64(len(buf) - 64))
					for b.Loop() {
						if err := cDigestMany(algo, buf, ends, out, off); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
		b.Run(string(algo)+"/go", func(b *testing.B) {
			b.SetBytes(int64(len(buf) - 64))
			for b.Loop() {
				if dst, err = hg.Keys(prompt, nil, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// preimages returns every block's pre-image of the prompt (made by the Go reference), concatenated
// and followed by 64 bytes of slack (see kvx_digest_many), with their end offsets.
func preimages(tb testing.TB, h *Hasher, toks []uint32) ([]byte, []uint64) {
	tb.Helper()
	digests, _, err := h.Digests(toks, nil)
	if err != nil {
		tb.Fatal(err)
	}
	bind := h.Binding()
	var buf []byte
	var ends []uint64
	parent := h.Root()
	for i := range digests {
		pre, err := Preimage(bind.Algorithm, bind.BlockSize, bind.Bigram, parent, toks, i, nil)
		if err != nil {
			tb.Fatal(err)
		}
		buf = append(buf, pre...)
		ends = append(ends, uint64(len(buf)))
		parent = digests[i]
	}
	return append(buf, make([]byte, 64)...), ends
}

// parentOffset is where a block's parent digest starts in its pre-image (blocks after the first).
func parentOffset(a Algorithm) int {
	switch a {
	case VLLMSHA256, VLLMXXHash:
		return 13 // PROTO 5, FRAME + u64, SHORT_BINBYTES + len
	case VLLMSHA256CBOR:
		return 3 // array(3), bytes(32) head 0x58 0x20
	case VLLMXXHashCBOR:
		return 2 // array(3), bytes(16) head 0x50
	case VLLMSHA256MsgPack, VLLMXXHashMsgPack:
		return 3 // fixarray(3) 0x93, bin8 0xc4 + length
	}
	return 0 // SGLang, router: the parent comes first
}
