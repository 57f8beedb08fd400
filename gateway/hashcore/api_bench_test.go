package hashcore

import (
	"math/rand/v2"
	"testing"
)

func benchImpls() []Impl {
	if ImplC.Available() {
		return []Impl{ImplGo, ImplC}
	}
	return []Impl{ImplGo}
}

// BenchmarkKeysWithExtras hashes one 8192-token prompt (block size 16) that carries a LoRA name, a
// cache_salt and two multimodal items, so every block has extra keys: the wrapper builds and packs
// them per call. Baseline: the same prompt without extras, in the same run.
func BenchmarkKeysWithExtras(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 7))
	toks := make([]uint32, 8192)
	for i := range toks {
		toks[i] = rng.Uint32N(151000)
	}
	ex := &Extras{LoRAName: "sql-adapter", CacheSalt: "tenant-a", MM: []MMFeature{{"img-a", 100, 576}, {"img-b", 2000, 576}}}
	s := "0"
	for _, a := range []Algorithm{VLLMSHA256CBOR, VLLMSHA256, RouterXXH3V1} {
		bind := Binding{Algorithm: a, BlockSize: 16}
		if a.IsVLLM() {
			bind.Seed = &s
		}
		for _, impl := range benchImpls() {
			h, err := New(bind, impl)
			if err != nil {
				b.Fatal(err)
			}
			dst := make([]uint64, 0, 512)
			for _, withExtras := range []bool{false, true} {
				e, name := (*Extras)(nil), "/none"
				if withExtras {
					e, name = ex, "/extras"
				}
				b.Run(string(a)+"/"+impl.String()+name, func(b *testing.B) {
					for b.Loop() {
						if dst, err = h.Keys(toks, e, dst); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// BenchmarkSequenceDecode appends 2048 tokens one at a time after a 2048-token prompt (block size
// 16): the decode path, one chain call per completed block. Baseline: one-shot Keys over the same
// 4096 tokens.
func BenchmarkSequenceDecode(b *testing.B) {
	rng := rand.New(rand.NewPCG(9, 9))
	toks := make([]uint32, 4096)
	for i := range toks {
		toks[i] = rng.Uint32N(128256)
	}
	s := "0"
	bind := Binding{Algorithm: VLLMSHA256CBOR, BlockSize: 16, Seed: &s}
	for _, impl := range benchImpls() {
		h, err := New(bind, impl)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(impl.String()+"/decode", func(b *testing.B) {
			for b.Loop() {
				seq := h.NewSequence(nil)
				if _, err := seq.Append(toks[:2048]...); err != nil {
					b.Fatal(err)
				}
				for _, t := range toks[2048:] {
					if _, err := seq.Append(t); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run(impl.String()+"/oneshot", func(b *testing.B) {
			for b.Loop() {
				if _, err := h.Keys(toks, nil, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
