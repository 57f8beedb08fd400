//go:build cgo

package hashcore

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/zeebo/xxh3"
)

// Tests of the C core's own pieces: its SHA-256 paths and XXH3 against Go's, its error paths, and
// its pickle framing against CPython itself where a python3 is installed.

func TestCDigestsMatchGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var buf []byte
	var ends []uint64
	for n := 0; n <= 1100; n++ { // every length across many 64-byte block boundaries
		for range n {
			buf = append(buf, byte(rng.Uint32()))
		}
		ends = append(ends, uint64(len(buf)))
	}
	bothPaths(t, func(t *testing.T) {
		for _, a := range []Algorithm{VLLMSHA256, VLLMXXHash, RouterXXH3V1, SGLangSHA256} {
			dl := a.DigestLen()
			out := make([]byte, len(ends)*dl)
			if err := cDigestMany(a, buf, ends, out, -1); err != nil {
				t.Fatal(err)
			}
			start := uint64(0)
			for i, e := range ends {
				p := buf[start:e]
				start = e
				var want []byte
				switch a {
				case VLLMSHA256, SGLangSHA256:
					d := sha256.Sum256(p)
					want = d[:]
				case VLLMXXHash:
					d := xxh3.Hash128(p).Bytes()
					want = d[:]
				default:
					want = binary.LittleEndian.AppendUint64(nil, xxh3.Hash(p))
				}
				if got := out[i*dl : (i+1)*dl]; !bytes.Equal(got, want) {
					t.Fatalf("%s over %d bytes: %x, want %x", a, len(p), got, want)
				}
			}
		}
	})
}

// TestCFloorChained checks the benchmark floor's chained mode: over a real chain's pre-images it
// must give the chain's own digests (it splices each parent from the previous digest).
func TestCFloorChained(t *testing.T) {
	toks := make([]uint32, 1000)
	for i := range toks {
		toks[i] = uint32(i * 2654435761)
	}
	seed := "0"
	bothPaths(t, func(t *testing.T) {
		for _, a := range Algorithms {
			b := Binding{Algorithm: a, BlockSize: 16}
			if a.IsVLLM() {
				b.Seed = &seed
			}
			h, err := New(b, ImplGo)
			if err != nil {
				t.Fatal(err)
			}
			want, _, err := h.Digests(toks, nil)
			if err != nil {
				t.Fatal(err)
			}
			buf, ends := preimages(t, h, toks)
			for _, off := range []int{-1, parentOffset(a)} {
				out := make([]byte, len(ends)*a.DigestLen())
				if err := cDigestMany(a, buf, ends, out, off); err != nil {
					t.Fatal(err)
				}
				if got := splitDigests(out, a.DigestLen()); !equalStrings(hexes(got), hexes(want)) {
					t.Fatalf("%s chain offset %d: floor digests differ from the chain's", a, off)
				}
			}
		}
	})
}

// TestCConcurrentChains hashes with the C core from several goroutines at once, every algorithm,
// with extras, while another goroutine flips the portable switch: results never change (run it
// under -race and -asan, see docs/sanitizers.md).
func TestCConcurrentChains(t *testing.T) {
	toks := make([]uint32, 700)
	for i := range toks {
		toks[i] = uint32(i*40503) ^ 0xFFFF0000
	}
	seed := ""
	type job struct {
		h  *Hasher
		ex *Extras
		d  [][]byte
	}
	var jobs []job
	for _, a := range Algorithms {
		b := Binding{Algorithm: a, BlockSize: 7}
		var ex *Extras
		if a.IsVLLM() {
			b.Seed = &seed
			ex = &Extras{LoRAName: "é", CacheSalt: "s", MM: []MMFeature{{Identifier: "img", Offset: 3, Length: 30}}}
		} else if a == SGLangSHA256 {
			ex = &Extras{CacheSalt: "tenant"}
		}
		h, err := New(b, ImplC)
		if err != nil {
			t.Fatal(err)
		}
		d, _, err := h.Digests(toks, ex)
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, job{h, ex, d})
	}
	stop := make(chan struct{})
	var flip sync.WaitGroup
	flip.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				forcePortable(false)
				return
			default:
				forcePortable(i%2 == 0)
			}
		}
	})
	var wg sync.WaitGroup
	errs := make(chan error, 4*len(jobs))
	for g := range 4 {
		wg.Go(func() {
			for r := range 20 {
				j := jobs[(g+r)%len(jobs)]
				d, _, err := j.h.Digests(toks, j.ex)
				if err != nil {
					errs <- err
					return
				}
				if !equalStrings(hexes(d), hexes(j.d)) {
					errs <- fmt.Errorf("%s: digests changed under concurrency", j.h.Binding().Algorithm)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	flip.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestCDigestManyRejectsBadInput(t *testing.T) {
	out := make([]byte, 32)
	if err := cDigestMany(VLLMSHA256, []byte("abc"), []uint64{4}, out, -1); err == nil {
		t.Error("end past the buffer accepted")
	}
	if err := cDigestMany(VLLMSHA256, []byte("abc"), []uint64{1, 2}, out, -1); err == nil {
		t.Error("output for 1 digest accepted 2")
	}
	if err := cDigestMany("nope", []byte("abc"), []uint64{1}, out, -1); err == nil {
		t.Error("unknown algorithm accepted")
	}
	if err := cDigestMany(VLLMSHA256, []byte("abcdef"), []uint64{1, 2}, make([]byte, 64), 3); err == nil {
		t.Error("chain offset past a pre-image accepted")
	}
}

func packedU32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

func TestCChainErrors(t *testing.T) {
	root := make([]byte, 32)
	toks := make([]uint32, 32)
	base := func(a Algorithm) *chainRequest {
		p := root
		switch a {
		case RouterXXH3V1:
			p = root[:8]
		case VLLMXXHash, VLLMXXHashCBOR, VLLMXXHashMsgPack:
			p = root[:16]
		}
		return &chainRequest{Algo: a, BlockSize: 16, Parent: p, Tokens: toks, NumBlocks: 2,
			Digests: make([]byte, 2*a.DigestLen()), Keys: make([]uint64, 2)}
	}
	str := func(s string) []byte {
		return append(append([]byte{tagStr}, packedU32(uint32(len(s)))...), s...)
	}
	block := func(items ...[]byte) []byte {
		out := packedU32(uint32(len(items)))
		for _, it := range items {
			out = append(out, it...)
		}
		return out
	}
	deep := packedU32(1) // one item nested one tuple deeper than the C core accepts
	for range kvxMaxDepth + 1 {
		deep = append(deep, tagTuple)
		deep = append(deep, packedU32(1)...)
	}
	deep = append(deep, tagInt, 0, 0, 0, 0, 0, 0, 0, 0)
	cases := []struct {
		name string
		algo Algorithm
		mod  func(r *chainRequest)
		want string
	}{
		{"block size 0", VLLMSHA256CBOR, func(r *chainRequest) { r.BlockSize = 0 }, "block size 0"},
		{"block size 4097", VLLMSHA256CBOR, func(r *chainRequest) { r.BlockSize = 4097 }, "block size 4097"},
		{"too few tokens", VLLMSHA256CBOR, func(r *chainRequest) { r.NumBlocks = 3 }, "need 48 tokens, have 32"},
		{"bigram too few", SGLangSHA256, func(r *chainRequest) { r.Bigram = true }, "need 33 tokens"},
		{"short keys", VLLMSHA256, func(r *chainRequest) { r.Keys = r.Keys[:1] }, "too small"},
		{"short digests", VLLMXXHash, func(r *chainRequest) { r.Digests = r.Digests[:17] }, "too small"},
		{"router parent 7 bytes", RouterXXH3V1, func(r *chainRequest) { r.Parent = root[:7] }, "parent is 7 bytes"},
		{"sglang parent 16 bytes", SGLangSHA256, func(r *chainRequest) { r.Parent = root[:16] }, "parent is 16 bytes"},
		{"vllm parent empty", VLLMSHA256, func(r *chainRequest) { r.Parent = nil }, "parent is 0 bytes"},
		{"vllm parent 65 bytes", VLLMSHA256CBOR, func(r *chainRequest) { r.Parent = make([]byte, 65) }, "parent is 65 bytes"},
		{"bigram with vllm", VLLMSHA256CBOR, func(r *chainRequest) { r.Bigram = true; r.Tokens = append(toks, 1) }, "SGLang mode only"},
		{"truncated extras", VLLMSHA256CBOR, func(r *chainRequest) { r.Extras = block(str("abc"))[:7] }, "malformed (block 0"},
		{"missing block", VLLMSHA256, func(r *chainRequest) { r.Extras = block(str("abc")) }, "malformed (block 1"},
		{"trailing bytes", RouterXXH3V1, func(r *chainRequest) { r.Extras = append(append(block(), block()...), 0) }, "malformed (block 2"},
		{"bad tag", VLLMXXHashCBOR, func(r *chainRequest) { r.Extras = append(block([]byte{9}), block()...) }, "malformed (block 0"},
		{"too deep", VLLMSHA256, func(r *chainRequest) { r.Extras = append(deep, block()...) }, "malformed (block 0"},
		{"too deep cbor", VLLMSHA256CBOR, func(r *chainRequest) { r.Extras = append(deep, block()...) }, "malformed (block 0"},
		{"str past end", VLLMSHA256CBOR, func(r *chainRequest) {
			r.Extras = append(block(), append([]byte{1, 0, 0, 0, tagStr}, packedU32(1000)...)...)
		}, "malformed (block 1"},
		{"huge str length", VLLMSHA256, func(r *chainRequest) {
			r.Extras = append([]byte{1, 0, 0, 0, tagStr}, packedU32(math.MaxUint32)...)
		}, "size too large (block 0"},
		{"invalid utf-8 pickle", VLLMXXHash, func(r *chainRequest) { r.Extras = append(block(str("a\xffb")), block()...) }, "not valid UTF-8 (block 0"},
		{"surrogate pickle", VLLMSHA256, func(r *chainRequest) { r.Extras = append(block(), block(str("\xed\xa0\x80"))...) }, "not valid UTF-8 (block 1"},
		{"sglang extras", SGLangSHA256, func(r *chainRequest) { r.Parent = nil; r.Extras = append(block(str("x")), block()...) }, "malformed (block 0"},
	}
	for _, c := range cases {
		r := base(c.algo)
		c.mod(r)
		err := cgoChain(r)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
	// The same inputs well-formed are accepted (the cases above fail for the stated reason only).
	for _, a := range Algorithms {
		r := base(a)
		if a == SGLangSHA256 {
			r.Parent = nil
		} else {
			tuple := append(append([]byte{tagTuple}, packedU32(2)...), str("")...)
			tuple = append(tuple, tagInt, 1, 2, 3, 4, 5, 6, 7, 0x80)
			r.Extras = append(block(str("é"), str("é"), tuple), block()...)
		}
		if err := cgoChain(r); err != nil {
			t.Errorf("%s: well-formed request: %v", a, err)
		}
	}
	// Keys only: no digest buffer at all gives the same keys.
	for _, a := range Algorithms {
		r := base(a)
		if a == SGLangSHA256 {
			r.Parent = nil
		}
		if err := cgoChain(r); err != nil {
			t.Fatal(err)
		}
		want := append([]uint64(nil), r.Keys...)
		r.Digests, r.Keys = nil, make([]uint64, 2)
		if err := cgoChain(r); err != nil || !equalU64(r.Keys, want) {
			t.Errorf("%s keys only: %v %v, want %v", a, r.Keys, err, want)
		}
	}
	if _, err := cgoRoot(RouterXXH3V1, "0"); err == nil {
		t.Error("router root accepted")
	}
	if _, err := cgoRoot(VLLMSHA256, "\xff"); err == nil || !strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("pickled root of invalid UTF-8: %v", err)
	}
}

// cpythonScript reads JSON cases and prints pickle.dumps((parent, tokens, extras), 5) of each as hex.
// JSON items: {"s": str} {"b": hex} {"i": int} {"t": [items]}; extras null = None.
const cpythonScript = `
import json, pickle, sys
def conv(v):
    if "s" in v: return v["s"]
    if "b" in v: return bytes.fromhex(v["b"])
    if "i" in v: return v["i"]
    return tuple(conv(x) for x in v["t"])
for line in sys.stdin:
    c = json.loads(line)
    ex = None if c["x"] is None else tuple(conv(x) for x in c["x"])
    obj = (bytes.fromhex(c["p"]), tuple(c["k"]), ex)
    print(pickle.dumps(obj, protocol=5).hex())
`

func jsonItem(v any) any {
	switch x := v.(type) {
	case string:
		return map[string]any{"s": x}
	case []byte:
		return map[string]any{"b": hex.EncodeToString(x)}
	case int64:
		return map[string]any{"i": x}
	case []any:
		items := make([]any, len(x))
		for i, e := range x {
			items[i] = jsonItem(e)
		}
		return map[string]any{"t": items}
	}
	panic("unreachable")
}

// TestCPickleMatchesCPython compares the C core's pickle pre-images with CPython's own
// pickle.dumps, including the layouts no vector pins: frames split past 64 KiB, strings of 64 KiB
// or more written outside frames, memo references to singleton strings past index 255.
func TestCPickleMatchesCPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed: CPython pickle comparison skipped")
	}
	rng := rand.New(rand.NewPCG(7, 11))
	type pcase struct {
		parent []byte
		tokens []uint32
		extras []any
	}
	var cases []pcase
	for i := range 60 {
		bs := []int{1, 2, 3, 4, 16, 300, 4096}[i%7]
		c := pcase{parent: make([]byte, []int{16, 32}[i%2]), tokens: make([]uint32, bs)}
		for j := range c.parent {
			c.parent[j] = byte(rng.Uint32())
		}
		for j := range c.tokens {
			c.tokens[j] = []uint32{0, 255, 256, 65535, 65536, 1<<31 - 1, 1 << 31, math.MaxUint32, rng.Uint32()}[rng.IntN(9)]
		}
		if rng.IntN(2) == 0 {
			c.extras = append(c.extras, strings.Repeat("L", []int{1, 255, 256, 65535, 65536, 70000}[rng.IntN(6)]))
		}
		for k := range []int{0, 1, 3, 300, 5000}[rng.IntN(5)] {
			id := strings.Repeat("id"+string(rune('a'+k%26)), 1+rng.IntN(3))
			off := -int64(k)
			if rng.IntN(10) == 0 {
				off = rng.Int64N(1<<41) - 1<<40
			}
			c.extras = append(c.extras, []any{id, off})
		}
		if rng.IntN(3) == 0 {
			c.extras = append(c.extras, "a", "", "é", "a", "é", "", []any{}, []any{"a", int64(math.MinInt64)})
		}
		if rng.IntN(3) == 0 {
			c.extras = append(c.extras, strings.Repeat("S", []int{3, 65536}[rng.IntN(2)]))
		}
		if rng.IntN(3) == 0 {
			big := make([]byte, []int{32, 65536}[rng.IntN(2)])
			c.extras = append(c.extras, big)
		}
		cases = append(cases, c)
	}
	var in bytes.Buffer
	for _, c := range cases {
		var x any
		if len(c.extras) > 0 {
			items := make([]any, len(c.extras))
			for i, e := range c.extras {
				items[i] = jsonItem(e)
			}
			x = items
		}
		line, err := json.Marshal(map[string]any{"p": hex.EncodeToString(c.parent), "k": c.tokens, "x": x})
		if err != nil {
			t.Fatal(err)
		}
		in.Write(append(line, '\n'))
	}
	cmd := exec.Command(py, "-c", cpythonScript)
	cmd.Stdin = &in
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("python3 pickle run failed (%v): comparison skipped", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(cases) {
		t.Fatalf("python3 printed %d pickles for %d cases", len(lines), len(cases))
	}
	large := 0
	for i, c := range cases {
		want, err := hex.DecodeString(lines[i])
		if err != nil {
			t.Fatal(err)
		}
		if len(want) > 64*1024 {
			large++
		}
		packed, err := packExtras([][]any{c.extras}, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, portable := range []bool{false, true} {
			forcePortable(portable)
			var pre []byte
			req := &chainRequest{Algo: VLLMSHA256, BlockSize: len(c.tokens), Parent: c.parent, Tokens: c.tokens,
				NumBlocks: 1, Extras: packed, Digests: make([]byte, 32), Keys: make([]uint64, 1), Preimage0: &pre}
			err := cgoChain(req)
			forcePortable(false)
			if err != nil {
				t.Fatalf("case %d: %v", i, err)
			}
			if !bytes.Equal(pre, want) {
				at := 0
				for at < len(pre) && at < len(want) && pre[at] == want[at] {
					at++
				}
				t.Fatalf("case %d (%d tokens, %d extras, portable %v): pre-image differs from CPython at byte %d of %d/%d",
					i, len(c.tokens), len(c.extras), portable, at, len(pre), len(want))
			}
			if d := sha256.Sum256(want); !bytes.Equal(req.Digests, d[:]) {
				t.Fatalf("case %d: digest %x, want %x", i, req.Digests, d)
			}
		}
		// The Go reference writes the same bytes, large frames included.
		var extra any
		if c.extras != nil {
			extra = c.extras
		}
		goPre, err := pickleBlock(c.parent, c.tokens, extra)
		if err != nil {
			t.Fatalf("case %d: Go reference: %v", i, err)
		}
		if !bytes.Equal(goPre, want) {
			at := 0
			for at < len(goPre) && at < len(want) && goPre[at] == want[at] {
				at++
			}
			t.Fatalf("case %d: Go reference pre-image differs from CPython at byte %d of %d/%d", i, at, len(goPre), len(want))
		}
	}
	if large < 10 {
		t.Errorf("only %d pickles past 64 KiB: the framing rules were not exercised", large)
	}
	t.Logf("%d pickles equal to CPython's (%d past 64 KiB)", len(cases), large)
}
