package hashcore

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

// TestMsgPackPreimageForms pins the MessagePack forms of a block pre-image at every length and
// width boundary, byte for byte from the MessagePack specification (as msgspec writes them:
// shortest ints, fixstr up to 31 bytes then str8, bin8 for the parent, fixarray up to 15 then
// array16), in both implementations. The vectors cover the forms real requests produce; this covers
// the boundaries they happen to miss.
func TestMsgPackPreimageForms(t *testing.T) {
	tokens := []uint32{0, 127, 128, 255, 256, 65535, 65536, 4294967295}
	wantTokens := "98" + "00" + "7f" + "cc80" + "ccff" + "cd0100" + "cdffff" + "ce00010000" + "ceffffffff"
	sixteen := make([]uint32, 16)
	for _, tc := range []struct {
		name   string
		algo   Algorithm
		tokens []uint32
		ex     *Extras
		tail   string // hex after the parent
	}{
		{"ints, no extras", VLLMSHA256MsgPack, tokens, nil, wantTokens + "c0"},
		{"fixstr 31", VLLMSHA256MsgPack, tokens, &Extras{LoRAName: strings.Repeat("a", 31)}, wantTokens + "91bf" + strings.Repeat("61", 31)},
		{"str8 32", VLLMXXHashMsgPack, tokens, &Extras{LoRAName: strings.Repeat("b", 32)}, wantTokens + "91d920" + strings.Repeat("62", 32)},
		{"str16 256", VLLMSHA256MsgPack, tokens, &Extras{CacheSalt: strings.Repeat("c", 256)}, wantTokens + "91da0100" + strings.Repeat("63", 256)},
		{"array16 of 16 tokens", VLLMXXHashMsgPack, sixteen, nil, "dc0010" + strings.Repeat("00", 16) + "c0"},
		{"lora, mm pair, salt", VLLMSHA256MsgPack, tokens, &Extras{LoRAName: "l", CacheSalt: "s", MM: []MMFeature{{Identifier: "m", Offset: 2, Length: 1}}},
			wantTokens + "93" + "a16c" + "92a16d02" + "a173"},
	} {
		for _, impl := range []Impl{ImplGo, ImplC} {
			if !impl.Available() {
				continue
			}
			h, err := New(Binding{Algorithm: tc.algo, BlockSize: len(tc.tokens), Seed: seed("0")}, impl)
			if err != nil {
				t.Fatal(err)
			}
			pre, err := h.FirstPreimage(tc.tokens, tc.ex)
			if err != nil {
				t.Fatalf("%s %s: %v", tc.name, impl, err)
			}
			dl := tc.algo.DigestLen()
			head := []byte{0x93, 0xc4, byte(dl)}
			if !bytes.HasPrefix(pre, head) || !bytes.Equal(pre[3:3+dl], h.Root()) {
				t.Errorf("%s %s: pre-image does not start with fixarray(3), bin8(%d) root: %x", tc.name, impl, dl, pre)
				continue
			}
			if got := hex.EncodeToString(pre[3+dl:]); got != tc.tail {
				t.Errorf("%s %s:\n got %s\nwant %s", tc.name, impl, got, tc.tail)
			}
		}
	}
}

// TestMsgPackRoot: NONE_HASH for a msgpack algorithm is the digest of the seed as a MessagePack str.
func TestMsgPackRoot(t *testing.T) {
	for _, impl := range []Impl{ImplGo, ImplC} {
		if !impl.Available() {
			continue
		}
		h, err := New(Binding{Algorithm: VLLMSHA256MsgPack, BlockSize: 1, Seed: seed("0")}, impl)
		if err != nil {
			t.Fatal(err)
		}
		want := digest(VLLMSHA256MsgPack, []byte{0xa1, '0'})
		if !bytes.Equal(h.Root(), want) {
			t.Errorf("%s: root %x, want sha256(a1 30) %x", impl, h.Root(), want)
		}
	}
}
