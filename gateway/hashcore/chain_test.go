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
