package hashcore

import (
	"slices"
	"testing"
)

// TestChainFromContinuesAChain: hashing a prompt in two pieces, the second chained on the first's
// last digest, gives the one-shot keys; extra keys passed per block equal the Extras path.
func TestChainFromContinuesAChain(t *testing.T) {
	seed := "0"
	for _, impl := range []Impl{ImplGo, ImplC} {
		if !impl.Available() {
			continue
		}
		h, err := New(Binding{Algorithm: VLLMSHA256CBOR, BlockSize: 4, Seed: &seed}, impl)
		if err != nil {
			t.Fatal(err)
		}
		toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
		ex := &Extras{LoRAName: "adapter", CacheSalt: "s"}
		want, err := h.Keys(toks, ex, nil)
		if err != nil {
			t.Fatal(err)
		}
		extras, _ := ExtraKeys(ex, len(toks), 4)
		d1, k1, err := h.ChainFrom(h.Root(), toks[:4], extras[:1])
		if err != nil {
			t.Fatal(err)
		}
		_, k2, err := h.ChainFrom(d1[0], toks[4:], extras[1:])
		if err != nil {
			t.Fatal(err)
		}
		if got := append(k1, k2...); !slices.Equal(got, want) {
			t.Fatalf("%s: chained %x, one shot %x", impl, got, want)
		}
		if _, k, _ := h.ChainFrom(h.Root(), toks, nil); slices.Equal(k, want) {
			t.Fatalf("%s: extra keys ignored", impl)
		}
		if _, _, err := h.ChainFrom([]byte{1, 2}, toks, nil); err == nil {
			t.Fatalf("%s: short parent accepted", impl)
		}
	}
}

// TestKeysFromMatchesKeys: for every algorithm and implementation, with and without extras (LoRA,
// cache_salt, a multimodal item; SGLang salt root and bigram pages), KeysFrom at every first block,
// chained on Digests' digest of the block before it, gives Keys' keys of the remaining blocks and
// Digests' digests; Keys asks the core for no digest and still returns the same keys.
func TestKeysFromMatchesKeys(t *testing.T) {
	toks := make([]uint32, 45)
	for i := range toks {
		toks[i] = uint32(i*7919 + 3)
	}
	type tc struct {
		b  Binding
		ex *Extras
	}
	var cases []tc
	for _, a := range Algorithms {
		b := Binding{Algorithm: a, BlockSize: 4}
		if a.IsVLLM() {
			b.Seed = seed("0")
		}
		cases = append(cases, tc{b, nil})
		switch {
		case a.IsVLLM() || a == RouterXXH3V1:
			cases = append(cases, tc{b, &Extras{LoRAName: "adapter", CacheSalt: "tenant", MM: []MMFeature{{Identifier: "img", Offset: 9, Length: 6}}}})
		case a == SGLangSHA256:
			cases = append(cases, tc{b, &Extras{CacheSalt: "tenant"}}, tc{Binding{Algorithm: a, BlockSize: 4, Bigram: true}, nil})
		}
	}
	for _, impl := range impls(t) {
		for _, c := range cases {
			h, err := New(c.b, impl)
			if err != nil {
				t.Fatal(err)
			}
			digests, want, err := h.Digests(toks, c.ex)
			if err != nil {
				t.Fatal(err)
			}
			if keys, err := h.Keys(toks, c.ex, nil); err != nil || !slices.Equal(keys, want) {
				t.Fatalf("%s %s: Keys %x (%v), Digests' keys %x", impl, c.b.Algorithm, keys, err, want)
			}
			dl := c.b.Algorithm.DigestLen()
			for from := 0; from <= len(want); from++ {
				var parent []byte
				if from > 0 {
					parent = digests[from-1]
				}
				buf := make([]byte, (len(want)-from)*dl)
				got, err := h.KeysFrom(toks, c.ex, from, parent, nil, buf)
				if err != nil {
					t.Fatalf("%s %s from %d: %v", impl, c.b.Algorithm, from, err)
				}
				if !slices.Equal(got, want[from:]) {
					t.Fatalf("%s %s (bigram %v, extras %v) from %d: %x, want %x", impl, c.b.Algorithm, c.b.Bigram, c.ex != nil, from, got, want[from:])
				}
				for i := range got {
					if !slices.Equal(buf[i*dl:(i+1)*dl], digests[from+i]) {
						t.Fatalf("%s %s from %d: digest of block %d differs", impl, c.b.Algorithm, from, from+i)
					}
				}
			}
			if _, err := h.KeysFrom(toks, c.ex, len(want)+1, digests[0], nil, nil); err == nil {
				t.Fatalf("%s %s: first block past the prompt accepted", impl, c.b.Algorithm)
			}
			if _, err := h.KeysFrom(toks, c.ex, 1, []byte{1}, nil, nil); err == nil {
				t.Fatalf("%s %s: short parent accepted", impl, c.b.Algorithm)
			}
		}
	}
}
