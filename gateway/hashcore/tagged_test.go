package hashcore

import (
	"reflect"
	"testing"
)

// TestTaggedExtraKeys: the released v0.31.0 layout leads each extra key with its kind (the salt in
// block 0 as ("cache_salt", salt), a multimodal item as ("mm", id, offset)); the keys differ from
// the bare layout's from block 0 on; a LoRA name is refused (the layout hashes the adapter's
// path, which a request does not carry). gateway/vllme2e's TestPublishedKeysEqualGatewayKeys
// holds the salted keys to a real engine's.
func TestTaggedExtraKeys(t *testing.T) {
	seed := "0"
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	for _, algo := range []Algorithm{VLLMSHA256, VLLMSHA256CBOR} {
		bare, err := New(Binding{Algorithm: algo, BlockSize: 32, Seed: &seed}, ImplGo)
		if err != nil {
			t.Fatal(err)
		}
		tagged, err := New(Binding{Algorithm: algo, BlockSize: 32, Seed: &seed, TaggedExtraKeys: true}, ImplGo)
		if err != nil {
			t.Fatal(err)
		}
		ex := &Extras{CacheSalt: "tenant-a", MM: []MMFeature{{Identifier: "img", Offset: 40, Length: 8}}}
		got, err := tagged.blockExtras(ex, len(tokens))
		if err != nil {
			t.Fatal(err)
		}
		want := [][]any{{[]any{"cache_salt", "tenant-a"}}, {[]any{"mm", "img", int64(8)}}}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: tagged extra keys %#v, want %#v", algo, got, want)
		}
		kb, err := bare.Keys(tokens, ex, nil)
		if err != nil {
			t.Fatal(err)
		}
		kt, err := tagged.Keys(tokens, ex, nil)
		if err != nil {
			t.Fatal(err)
		}
		if kb[0] == kt[0] || kb[1] == kt[1] {
			t.Fatalf("%s: tagged keys %v equal the bare layout's %v", algo, kt, kb)
		}
		// Without extras the layouts agree.
		pb, _ := bare.Keys(tokens, nil, nil)
		pt, _ := tagged.Keys(tokens, nil, nil)
		if !reflect.DeepEqual(pb, pt) {
			t.Fatalf("%s: plain keys differ between layouts: %v, %v", algo, pb, pt)
		}
		if _, err := tagged.Keys(tokens, &Extras{LoRAName: "adapter"}, nil); err == nil {
			t.Fatalf("%s: a LoRA name was hashed under the tagged layout", algo)
		}
	}
}
