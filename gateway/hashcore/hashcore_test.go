package hashcore

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/zeebo/xxh3"
)

func seed(s string) *string { return &s }

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func impls(t *testing.T) []Impl {
	out := []Impl{ImplGo}
	if ImplC.Available() {
		out = append(out, ImplC)
	} else {
		t.Log("C core not built: checking the Go reference only")
	}
	return out
}

func TestBindingErrors(t *testing.T) {
	cases := []struct {
		name string
		b    Binding
		want string
	}{
		{"block size 0", Binding{Algorithm: VLLMSHA256CBOR, BlockSize: 0, Seed: seed("0")}, "block size 0 out of range"},
		{"block size 4097", Binding{Algorithm: VLLMSHA256CBOR, BlockSize: 4097, Seed: seed("0")}, "block size 4097 out of range"},
		{"negative block size", Binding{Algorithm: SGLangSHA256, BlockSize: -16}, "block size -16"},
		{"unknown algorithm", Binding{Algorithm: "md5", BlockSize: 16}, `unknown algorithm "md5"`},
		{"missing vLLM seed", Binding{Algorithm: VLLMSHA256, BlockSize: 16}, "without PYTHONHASHSEED"},
		{"seed on SGLang", Binding{Algorithm: SGLangSHA256, BlockSize: 16, Seed: seed("0")}, `takes no seed (got "0")`},
		{"seed on router", Binding{Algorithm: RouterXXH3V1, BlockSize: 16, Seed: seed("")}, "takes no seed"},
		{"bigram on vLLM", Binding{Algorithm: VLLMXXHash, BlockSize: 16, Seed: seed("0"), Bigram: true}, "bigram"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.b, ImplGo)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New(%+v) error = %v, want one containing %q", c.b, err, c.want)
			}
		})
	}
	if _, err := New(Binding{Algorithm: VLLMSHA256, BlockSize: 16}, ImplGo); !errors.Is(err, ErrNoSeed) {
		t.Errorf("missing seed: %v is not ErrNoSeed", err)
	}
	// The limits themselves are valid.
	for _, bs := range []int{1, 4096} {
		if _, err := New(Binding{Algorithm: VLLMSHA256CBOR, BlockSize: bs, Seed: seed("")}, ImplGo); err != nil {
			t.Errorf("block size %d: %v", bs, err)
		}
	}
	if _, err := New(Binding{Algorithm: SGLangSHA256, BlockSize: 4}, Impl(9)); err == nil {
		t.Error("unknown implementation accepted")
	}
	if !ImplC.Available() {
		if _, err := New(Binding{Algorithm: SGLangSHA256, BlockSize: 4}, ImplC); !errors.Is(err, ErrNoC) {
			t.Errorf("ImplC without cgo: %v, want ErrNoC", err)
		}
	}
}

func TestTokenIDs(t *testing.T) {
	got, err := TokenIDs([]int64{0, 1, 4294967295})
	if err != nil || !reflect.DeepEqual(got, []uint32{0, 1, 4294967295}) {
		t.Fatalf("TokenIDs = %v, %v", got, err)
	}
	for _, c := range []struct {
		in   []int64
		want string
	}{
		{[]int64{5, 4294967296}, "[1] = 4294967296"},
		{[]int64{-1}, "[0] = -1"},
	} {
		if _, err := TokenIDs(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("TokenIDs(%v) error = %v, want %q", c.in, err, c.want)
		}
	}
}

// Roots for PYTHONHASHSEED=0 (engine-contracts-vllm.md §1.4).
func TestNoneHash(t *testing.T) {
	want := map[Algorithm]string{
		VLLMSHA256CBOR: "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e",
		VLLMSHA256:     "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c",
		VLLMXXHashCBOR: "1ebe36576dcb573f26b99533a20aaeca",
		VLLMXXHash:     "6fb31cc38bba6066183f7f2104b9c051",
	}
	for _, impl := range impls(t) {
		for a, w := range want {
			h, err := New(Binding{Algorithm: a, BlockSize: 16, Seed: seed("0")}, impl)
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(h.Root()); got != w {
				t.Errorf("%s/%s root = %s, want %s", impl, a, got, w)
			}
		}
	}
}

// The sha256_cbor worked example of engine-contracts-vllm.md §1.5.
func TestCBORWorkedExample(t *testing.T) {
	tokens := make([]uint32, 17)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	root := mustHex(t, "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e")
	want := append(append(append([]byte{0x83, 0x58, 0x20}, root...), 0x90, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 0xf6)
	for _, impl := range impls(t) {
		h, err := New(Binding{Algorithm: VLLMSHA256CBOR, BlockSize: 16, Seed: seed("0")}, impl)
		if err != nil {
			t.Fatal(err)
		}
		pre, err := h.FirstPreimage(tokens, nil)
		if err != nil || !bytes.Equal(pre, want) {
			t.Fatalf("%s pre-image = %x, %v; want %x", impl, pre, err, want)
		}
		keys, err := h.Keys(tokens, nil, nil)
		if err != nil || len(keys) != 1 || keys[0] != 12687895063098490012 {
			t.Fatalf("%s keys = %v, %v", impl, keys, err)
		}
	}
}

// Known answers of the reference gateway's C hash core (routing-semantics.md §12.2), which uses a
// zero parent the engine never does; Preimage takes the parent explicitly.
func TestReferenceKnownAnswers(t *testing.T) {
	tok := func(from, step, n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(from + i*step)
		}
		return out
	}
	zero := make([]byte, 32)
	blocks := append(tok(101, 101, 16), tok(1717, 101, 16)...)
	p0, err := Preimage(VLLMSHA256CBOR, 16, false, zero, blocks, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(p0, append(append([]byte{0x83, 0x58, 0x20}, zero...), 0x90, 0x18, 0x65, 0x18, 0xca, 0x19, 0x01, 0x2f)) {
		t.Fatalf("pre-image head %x", p0[:44])
	}
	d0 := digest(VLLMSHA256CBOR, p0)
	if k := VLLMSHA256CBOR.KeyOf(d0); k != 14515664427994421226 {
		t.Errorf("zero-parent block 0 key %d", k)
	}
	p1, _ := Preimage(VLLMSHA256CBOR, 16, false, d0, blocks, 1, nil)
	if k := VLLMSHA256CBOR.KeyOf(digest(VLLMSHA256CBOR, p1)); k != 10510627572844902094 {
		t.Errorf("zero-parent block 1 key %d", k)
	}
	h, _ := New(Binding{Algorithm: VLLMSHA256CBOR, BlockSize: 16, Seed: seed("0")}, ImplGo)
	if keys, _ := h.Keys(blocks[:16], nil, nil); keys[0] != 7876691182959014722 {
		t.Errorf("seed 0 block 0 key %d", keys[0])
	}
	for _, impl := range impls(t) {
		s, _ := New(Binding{Algorithm: SGLangSHA256, BlockSize: 32}, impl)
		keys, err := s.Keys(tok(100000, 1, 64), nil, nil)
		if err != nil || len(keys) != 2 || keys[0] != 0x069e60c00e7daa33 || keys[1] != 0xb9e5c32b50351992 {
			t.Errorf("%s SGLang keys %x, %v", impl, keys, err)
		}
	}
}

// SGLang's router fixture values (engine-contracts-sglang-trtllm-llamacpp.md §1.6).
func TestSGLangFixture(t *testing.T) {
	cases := []struct {
		tokens []uint32
		bs     int
		salt   string
		bigram bool
		want   []int64
	}{
		{[]uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4, "", false, []int64{-3488128144981237669, 5674439469042975057}},
		{[]uint32{10, 20, 30, 40, 50, 60, 70, 80}, 2, "", false, []int64{978178666101069530, -895308556211281782, -8033692805846017938, 835415944263129316}},
		{[]uint32{7, 8, 9}, 1, "", false, []int64{-1702009526849766914, 903318264012984157, -8265893088400908305}},
		{[]uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4, "tenant-a", false, []int64{3718046898735569995, 3308615664605479373}},
		{[]uint32{10, 20, 30, 40}, 4, "", true, nil}, // 3 bigram units < page: nothing published
	}
	for _, impl := range impls(t) {
		for _, c := range cases {
			h, err := New(Binding{Algorithm: SGLangSHA256, BlockSize: c.bs, Bigram: c.bigram}, impl)
			if err != nil {
				t.Fatal(err)
			}
			keys, err := h.Keys(c.tokens, &Extras{CacheSalt: c.salt, LoRAName: "ignored-by-sglang"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]int64, len(keys))
			for i, k := range keys {
				got[i] = SGLangInt64(k)
				if KeyFromInt64(got[i]) != k {
					t.Fatal("int64 round trip")
				}
			}
			if len(c.want) == 0 && len(got) == 0 {
				continue
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("%s %v bs %d salt %q: %v, want %v", impl, c.tokens, c.bs, c.salt, got, c.want)
			}
		}
	}
	h, _ := New(Binding{Algorithm: SGLangSHA256, BlockSize: 4}, ImplGo)
	if _, err := h.Keys([]uint32{1, 2, 3, 4}, &Extras{MM: []MMFeature{{"x", 0, 1}}}, nil); err == nil {
		t.Error("SGLang accepted multimodal extras")
	}
}

// Router keys are XXH3-64 over le64(parent) ‖ le32 tokens ‖ canonical CBOR(extras), written out here
// byte by byte independently of the implementation.
func TestRouterKeys(t *testing.T) {
	tokens := []uint32{1, 2, 300, 4}
	b0 := []byte{0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0}
	b0 = append(b0, 0x82, 0x64, 'l', 'o', 'r', 'a', 0x82, 0x61, 'm', 0x21) // ["lora", ["m", -2]]
	k0 := xxh3.Hash(b0)
	b1 := binary.LittleEndian.AppendUint64(nil, k0)
	b1 = append(b1, 0x2c, 0x01, 0, 0, 4, 0, 0, 0)
	k1 := xxh3.Hash(b1)
	extras := [][]any{{"lora", []any{"m", -2}}, nil}
	for _, impl := range impls(t) {
		keys, err := RouterKeysWith(impl, 0, tokens, 2, extras, nil)
		if err != nil || !reflect.DeepEqual(keys, []uint64{k0, k1}) {
			t.Errorf("%s router keys %v, %v; want %v", impl, keys, err, []uint64{k0, k1})
		}
		// Chaining from a known parent continues the same chain.
		tail, err := RouterKeysWith(impl, k0, tokens[2:], 2, nil, nil)
		if err != nil || !reflect.DeepEqual(tail, []uint64{k1}) {
			t.Errorf("%s continued chain %v, %v", impl, tail, err)
		}
		// An empty extra-key array means none.
		plain, _ := RouterKeysWith(impl, 0, tokens, 2, [][]any{{}, {}}, nil)
		none, _ := RouterKeysWith(impl, 0, tokens, 2, nil, nil)
		if !reflect.DeepEqual(plain, none) {
			t.Errorf("%s empty extras differ from none", impl)
		}
	}
	if _, err := RouterKeys(0, tokens, 0, nil, nil); err == nil {
		t.Error("block size 0 accepted")
	}
	if _, err := RouterKeys(0, tokens, 2, [][]any{{3.5}}, nil); err == nil || !strings.Contains(err.Error(), "float64") {
		t.Errorf("float extra key: %v", err)
	}
	if _, err := RouterKeys(0, tokens, 2, [][]any{nil, nil, nil}, nil); err == nil {
		t.Error("more extra-key entries than blocks accepted")
	}
}

func TestExtraKeysMM(t *testing.T) {
	ex := &Extras{MM: []MMFeature{{"hashA", 3, 20}, {"hashB", 30, 70}}}
	got, err := ExtraKeys(ex, 160, 32)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]any{
		{[]any{"hashA", int64(3)}, []any{"hashB", int64(30)}},
		{[]any{"hashB", int64(-2)}},
		{[]any{"hashB", int64(-34)}},
		{[]any{"hashB", int64(-66)}},
		nil,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ExtraKeys = %v, want %v", got, want)
	}
	salted, _ := ExtraKeys(&Extras{LoRAName: "chat-lora", CacheSalt: "tenant-b"}, 40, 16)
	if !reflect.DeepEqual(salted, [][]any{{"chat-lora", "tenant-b"}, {"chat-lora"}}) {
		t.Errorf("lora+salt = %v", salted)
	}
	if _, err := ExtraKeys(&Extras{MM: []MMFeature{{"b", 30, 1}, {"a", 3, 1}}}, 64, 16); err == nil || !strings.Contains(err.Error(), "sorted") {
		t.Errorf("unsorted mm items: %v", err)
	}
	if _, err := ExtraKeys(nil, 10, 0); err == nil {
		t.Error("block size 0 accepted")
	}
}

// The decode-time quirk: a block completed after the prompt sees only the last mm item.
func TestSequenceMMQuirk(t *testing.T) {
	ex := &Extras{MM: []MMFeature{{"imgA", 20, 16}, {"imgB", 36, 2}}}
	h, _ := New(Binding{Algorithm: VLLMSHA256CBOR, BlockSize: 16, Seed: seed("0")}, ImplGo)
	tokens := make([]uint32, 64)
	seq := h.NewSequence(ex)
	if _, err := seq.Append(tokens[:40]...); err != nil {
		t.Fatal(err)
	}
	for _, tk := range tokens[40:] {
		if _, err := seq.Append(tk); err != nil {
			t.Fatal(err)
		}
	}
	want := [][]any{nil, {[]any{"imgA", int64(4)}}, {[]any{"imgB", int64(4)}}, nil}
	if !reflect.DeepEqual(seq.ExtraKeys(), want) {
		t.Errorf("decode extras %v, want %v", seq.ExtraKeys(), want)
	}
	oneShot, _ := h.Keys(tokens, ex, nil)
	if reflect.DeepEqual(oneShot, seq.Keys()) || !reflect.DeepEqual(oneShot[:2], seq.Keys()[:2]) {
		t.Errorf("one-shot %v vs decode %v: want equal prompt blocks and a different block 2", oneShot, seq.Keys())
	}
}

// Without multimodal items, feeding tokens in any chunking gives the one-shot keys.
func TestSequenceMatchesOneShot(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	tokens := make([]uint32, 203)
	for i := range tokens {
		tokens[i] = r.Uint32()
	}
	ex := &Extras{LoRAName: "l", CacheSalt: "s"}
	for _, impl := range impls(t) {
		for _, a := range Algorithms {
			b := Binding{Algorithm: a, BlockSize: 7}
			if a.IsVLLM() {
				b.Seed = seed("42")
			}
			for _, bigram := range []bool{false, true} {
				if bigram && a != SGLangSHA256 {
					continue
				}
				b.Bigram = bigram
				h, err := New(b, impl)
				if err != nil {
					t.Fatal(err)
				}
				want, err := h.Keys(tokens, ex, nil)
				if err != nil {
					t.Fatal(err)
				}
				seq := h.NewSequence(ex)
				for i := 0; i < len(tokens); {
					n := min(1+r.IntN(20), len(tokens)-i)
					if _, err := seq.Append(tokens[i : i+n]...); err != nil {
						t.Fatal(err)
					}
					i += n
				}
				if !reflect.DeepEqual(seq.Keys(), want) || len(want) != h.NumBlocks(len(tokens)) {
					t.Errorf("%s %s bigram=%v: sequence %v, one-shot %v", impl, a, bigram, seq.Keys(), want)
				}
			}
		}
	}
}

func TestGroupKeys(t *testing.T) {
	got, err := GroupKeys([]uint64{1, 2, 3, 4, 5, 6, 7}, 48, 16)
	if err != nil || !reflect.DeepEqual(got, []uint64{3, 6}) {
		t.Errorf("GroupKeys = %v, %v", got, err)
	}
	for _, c := range [][2]int{{40, 16}, {8, 16}, {32, 0}} {
		if _, err := GroupKeys([]uint64{1}, c[0], c[1]); err == nil {
			t.Errorf("GroupKeys(%d, %d) accepted", c[0], c[1])
		}
	}
}

func TestPickleDetails(t *testing.T) {
	for _, c := range []struct {
		v    int64
		want string
	}{
		{0, "4b00"}, {255, "4bff"}, {256, "4d0001"}, {65535, "4dffff"}, {65536, "4a00000100"},
		{-1, "4affffffff"}, {2147483647, "4affffff7f"}, {2147483648, "8a050000008000"},
		{4294967295, "8a05ffffffff00"}, {-2147483649, "8a05ffffff7fff"}, {-1 << 39, "8a050000000080"}, {-2147483648, "4a00000080"},
	} {
		p := newPickler()
		p.int(c.v)
		if got := hex.EncodeToString(p.out[2+frameHeaderSize:]); got != c.want {
			t.Errorf("int %d: %s, want %s", c.v, got, c.want)
		}
	}
	// One-character strings are CPython singletons: a repeat is a memo reference (BINGET).
	pre, err := pickleBlock(make([]byte, 16), []uint32{7}, []any{"x", []any{"x", int64(0)}})
	if err != nil {
		t.Fatal(err)
	}
	// memo: 0 parent, 1 token tuple, 2 "x"; then BINGET 2.
	if !bytes.Contains(pre, mustHex(t, "8c017894 6802 4b00 86")) {
		t.Errorf("singleton repeat not memoized: %x", pre)
	}
	// Longer strings are distinct objects in vLLM: written in full each time.
	pre, _ = pickleBlock(make([]byte, 16), []uint32{7}, []any{"xy", "xy"})
	if bytes.Count(pre, []byte{0x8c, 2, 'x', 'y', 0x94}) != 2 {
		t.Errorf("equal multi-character strings memoized: %x", pre)
	}
	// Empty seed: a 4-byte body still gets a frame.
	root, _ := serializeRoot(VLLMSHA256, "")
	if want := "80059504000000000000008c00942e"; hex.EncodeToString(root) != want {
		t.Errorf("pickled empty seed %x, want %s", root, want)
	}
	// A string of 64 KiB or more is written outside frames, its header included: the frame before
	// it is closed (parent, token tuple: 4 bytes of its own or more) and a new one follows.
	big := strings.Repeat("a", 70000)
	pre, err = pickleBlock(make([]byte, 16), []uint32{7}, []any{big})
	if err != nil {
		t.Fatal(err)
	}
	hdr := append([]byte{0x58}, binary.LittleEndian.AppendUint32(nil, 70000)...)
	at := bytes.Index(pre, hdr)
	if at < 0 || pre[at-1] == 0x95 || !bytes.Equal(pre[:3], []byte{0x80, 5, 0x95}) {
		t.Fatalf("large string not written outside the frame: header at %d", at)
	}
	if tail := pre[at+len(hdr)+70000:]; tail[0] != 0x95 {
		t.Errorf("no new frame after the large string: %x", tail[:min(len(tail), 12)])
	}
}

// Bigram pages feed (t[j], t[j+1]) per unit.
func TestBigramPreimage(t *testing.T) {
	pre, err := Preimage(SGLangSHA256, 2, true, nil, []uint32{1, 2, 3}, 0, nil)
	if err != nil || !bytes.Equal(pre, mustHex(t, "01000000 02000000 02000000 03000000")) {
		t.Errorf("bigram pre-image %x, %v", pre, err)
	}
	sum := sha256.Sum256(pre)
	h, _ := New(Binding{Algorithm: SGLangSHA256, BlockSize: 2, Bigram: true}, ImplGo)
	d, _, _ := h.Digests([]uint32{1, 2, 3}, nil)
	if len(d) != 1 || !bytes.Equal(d[0], sum[:]) {
		t.Errorf("bigram digest %x", d)
	}
}

func TestConcurrentUse(t *testing.T) {
	for _, impl := range impls(t) {
		h, _ := New(Binding{Algorithm: VLLMXXHashCBOR, BlockSize: 4, Seed: seed("1")}, impl)
		tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}
		want, _ := h.Keys(tokens, &Extras{LoRAName: "a"}, nil)
		var wg sync.WaitGroup
		errs := make(chan string, 8)
		for range 8 {
			wg.Go(func() {
				for range 50 {
					got, err := h.Keys(tokens, &Extras{LoRAName: "a"}, nil)
					if err != nil || !reflect.DeepEqual(got, want) {
						errs <- "concurrent Keys differ"
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(impl, e)
		}
	}
}
