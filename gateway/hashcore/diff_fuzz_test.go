//go:build cgo

package hashcore

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"
)

// FuzzCoreVsReference drives the C core and the Go reference with the same random prompt and
// requires byte-for-byte equal digests and keys (or both to refuse it). Two shapes of input:
// requests through the public API (LoRA, multimodal items, cache_salt, prompt embeds, bigram, seeds),
// and arbitrary extra-key trees straight into the chain (strings incl. CPython singletons, bytes,
// int64 extremes, nested and empty tuples), which is what the C serializers must get right.
func FuzzCoreVsReference(f *testing.F) {
	f.Add([]byte{0, 16, 0, 0, 40, 0})
	f.Add([]byte{1, 0, 1, 1, 0xff, 0xff, 3, 'a', 'b', 'c', 9, 1, 2, 3})
	f.Add([]byte{2, 31, 0, 2, 0x80, 1, 0xfe, 0xff, 0xff, 0xff, 0x01, 0x02})
	f.Add([]byte{3, 3, 0, 3, 10, 0, 1, 'x', 2, 0, 5, 0, 7})
	f.Add([]byte{4, 15, 1, 0, 200, 0, 0x81, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{5, 3, 0, 0, 9, 1, 1, 0xc3, 0xa9, 0, 0})
	f.Add([]byte{0x86, 7, 0, 4, 90, 0, 3, 1, 'a', 1, 0, 1, 0xc3, 0xa9, 3, 0x80})
	f.Add([]byte{0x80, 0, 1, 0, 100, 0, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{0x42, 16, 0, 0, 40, 0, 1})
	f.Add([]byte{0xc1, 3, 0, 0, 60, 0, 3, 1, 'b', 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &fuzzInput{b: data}
		first := in.u8()
		// Bit 6 runs the C core's portable code (no SHA-NI, no AVX2) instead of the accelerated one.
		forcePortable(first&0x40 != 0)
		defer forcePortable(false)
		if first&0x80 != 0 {
			fuzzChainTrees(t, in)
		} else {
			in.b = data
			fuzzPublicAPI(t, in)
		}
	})
}

// fuzzInput hands out the fuzzer's bytes; past the end every read is zero.
type fuzzInput struct{ b []byte }

func (in *fuzzInput) u8() byte {
	if len(in.b) == 0 {
		return 0
	}
	v := in.b[0]
	in.b = in.b[1:]
	return v
}

func (in *fuzzInput) u16() int { return int(in.u8()) | int(in.u8())<<8 }

func (in *fuzzInput) u32() uint32 {
	var b [4]byte
	for i := range b {
		b[i] = in.u8()
	}
	return binary.LittleEndian.Uint32(b[:])
}

func (in *fuzzInput) u64() uint64 { return uint64(in.u32()) | uint64(in.u32())<<32 }

// str returns a string: a CPython singleton, a length-class boundary, or raw fuzz bytes (which may
// be invalid UTF-8: both implementations must then refuse a pickle).
func (in *fuzzInput) str() string {
	switch k := in.u8(); k % 8 {
	case 0:
		return ""
	case 1:
		return string(rune(in.u8())) // one code point < 256: a CPython singleton
	case 2:
		return strings.Repeat("s", []int{23, 24, 255, 256, 1000}[int(in.u8())%5])
	case 3:
		return "日本-ü"
	default:
		n := int(in.u8()) % 40
		if n > len(in.b) {
			n = len(in.b)
		}
		s := string(in.b[:n])
		in.b = in.b[n:]
		return s
	}
}

var interestingIDs = []uint32{0, 1, 23, 24, 255, 256, 65535, 65536, 1<<31 - 1, 1 << 31, math.MaxUint32 - 1, math.MaxUint32, 128000, 151643, 199999}

func (in *fuzzInput) tokens(max int) []uint32 {
	n := in.u16() % (max + 1)
	toks := make([]uint32, n)
	mode := in.u8()
	for i := range toks {
		switch {
		case mode%4 == 0:
			toks[i] = uint32(i) * 7919
		case mode%4 == 1:
			toks[i] = interestingIDs[int(in.u8())%len(interestingIDs)]
		default:
			toks[i] = in.u32()
		}
	}
	return toks
}

func fuzzPublicAPI(t *testing.T, in *fuzzInput) {
	algo := Algorithms[int(in.u8()&0x3f)%len(Algorithms)]
	b := Binding{Algorithm: algo, BlockSize: 1 + in.u16()%512}
	flags := in.u8()
	if algo.IsVLLM() {
		seeds := []string{"0", "", "42", "042", "random", "4294967295", "abc"}
		s := seeds[int(flags>>4)%len(seeds)]
		if flags&0x08 != 0 {
			s = in.str()
		}
		b.Seed = &s
	}
	if algo == SGLangSHA256 && flags&1 != 0 {
		b.Bigram = true
	}
	toks := in.tokens(4 * 512)
	var ex *Extras
	if flags&2 != 0 {
		ex = &Extras{CacheSalt: in.str()}
		if algo != SGLangSHA256 {
			ex.LoRAName = in.str()
			off := 0
			for range int(in.u8()) % 6 {
				off += in.u16() % 64
				ex.MM = append(ex.MM, MMFeature{Identifier: in.str(), Offset: off, Length: in.u16() % 80})
			}
			if flags&4 != 0 {
				rowLen := 1 + int(in.u8())%48
				for r := range len(toks) {
					row := make([]byte, rowLen)
					for j := range row {
						row[j] = byte(r*31 + j)
					}
					ex.PromptEmbeds = append(ex.PromptEmbeds, row)
				}
			}
		}
	}
	hg, errG := New(b, ImplGo)
	hc, errC := New(b, ImplC)
	if (errG == nil) != (errC == nil) {
		t.Fatalf("New(%+v): Go err %v, C err %v", b, errG, errC)
	}
	if errG != nil {
		return
	}
	if !bytes.Equal(hg.Root(), hc.Root()) {
		t.Fatalf("root of %+v: Go %x, C %x", b, hg.Root(), hc.Root())
	}
	dg, kg, errG := hg.Digests(toks, ex)
	dc, kc, errC := hc.Digests(toks, ex)
	compareRuns(t, algo, dg, kg, errG, dc, kc, errC)
	if errG == nil && len(kg) > 0 {
		pg, errG := hg.FirstPreimage(toks, ex)
		pc, errC := hc.FirstPreimage(toks, ex)
		if errG != nil || errC != nil || !bytes.Equal(pg, pc) {
			t.Fatalf("%s block 0 pre-image: Go %x (%v), C %x (%v)", algo, pg, errG, pc, errC)
		}
	}
}

// tree returns a random extra-key value: str, bytes, int64 or a tuple of them.
func (in *fuzzInput) tree(depth int) any {
	switch k := in.u8() % 8; {
	case k < 3:
		return in.str()
	case k == 3:
		n := []int{0, 1, 16, 32, 255, 256}[int(in.u8())%6]
		return bytes.Repeat([]byte{in.u8()}, n)
	case k == 4:
		return []int64{0, -1, 255, 256, 65535, 65536, math.MaxInt32, math.MinInt32, math.MaxInt32 + 1,
			math.MinInt32 - 1, math.MaxInt64, math.MinInt64, -129, -128}[int(in.u8())%14]
	case k == 5:
		return int64(in.u64())
	default:
		if depth >= 4 {
			return int64(k)
		}
		n := int(in.u8()) % 6
		items := make([]any, n)
		for i := range items {
			items[i] = in.tree(depth + 1)
		}
		return items
	}
}

func fuzzChainTrees(t *testing.T, in *fuzzInput) {
	algo := Algorithms[int(in.u8())%len(Algorithms)]
	if algo == SGLangSHA256 {
		algo = RouterXXH3V1 // SGLang hashes no extra keys
	}
	b := Binding{Algorithm: algo, BlockSize: 1 + in.u16()%64}
	seed := "0"
	if algo.IsVLLM() {
		b.Seed = &seed
	}
	toks := in.tokens(8 * 64)
	n := len(toks) / b.BlockSize
	extras := make([][]any, n)
	for i := range extras {
		if in.u8()%3 == 0 {
			continue // None for this block
		}
		items := make([]any, int(in.u8())%7)
		for j := range items {
			items[j] = in.tree(1)
		}
		extras[i] = items
	}
	hg, err := New(b, ImplGo)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := New(b, ImplC)
	if err != nil {
		t.Fatal(err)
	}
	fg, kg, errG := hg.chain(hg.Root(), toks, n, extras, nil, nil)
	fc, kc, errC := hc.chain(hc.Root(), toks, n, extras, nil, nil)
	dl := algo.DigestLen()
	compareRuns(t, algo, splitDigests(fg, dl), kg, errG, splitDigests(fc, dl), kc, errC)
}

// compareRuns requires equal results, or both implementations to refuse the input. The one
// accepted difference: the Go reference refuses pickles that CPython would split into several
// frames; the C core writes them (checked against CPython itself in TestCPickleMatchesCPython).
func compareRuns(t *testing.T, algo Algorithm, dg [][]byte, kg []uint64, errG error, dc [][]byte, kc []uint64, errC error) {
	t.Helper()
	if errG != nil || errC != nil {
		if errG != nil && errC != nil {
			return
		}
		t.Fatalf("%s: Go err %v, C err %v", algo, errG, errC)
	}
	if len(kg) != len(kc) || len(dg) != len(dc) {
		t.Fatalf("%s: Go %d keys / %d digests, C %d / %d", algo, len(kg), len(dg), len(kc), len(dc))
	}
	for i := range kg {
		if kg[i] != kc[i] || !bytes.Equal(dg[i], dc[i]) {
			t.Fatalf("%s block %d: Go %x (%d), C %x (%d)", algo, i, dg[i], kg[i], dc[i], kc[i])
		}
	}
}
