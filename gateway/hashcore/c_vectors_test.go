//go:build cgo

package hashcore

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// The C core against the engine-produced vectors, read straight from the JSON files with local
// structs (the full parity suite in ./parity runs every implementation; this keeps the C core's own
// package honest on its own).

const vectorsRoot = "../../vectors"

type cVLLMFile struct {
	HashAlgo string      `json:"hash_algo"`
	Cases    []cVLLMCase `json:"cases"`
}

type cVLLMCase struct {
	Name           string   `json:"name"`
	BlockSize      int      `json:"block_size"`
	HashSeed       *string  `json:"hash_seed"`
	Reproducible   bool     `json:"reproducible"`
	TokenIDs       []uint32 `json:"token_ids"`
	PromptLen      *int     `json:"prompt_len"`
	GroupBlockSize *int     `json:"group_block_size"`
	Request        struct {
		LoRAName   string `json:"lora_name"`
		CacheSalt  string `json:"cache_salt"`
		MMFeatures []struct {
			Identifier string `json:"identifier"`
			Offset     int    `json:"offset"`
			Length     int    `json:"length"`
		} `json:"mm_features"`
		PromptEmbedsRowsHex []string `json:"prompt_embeds_rows_hex"`
	} `json:"request"`
	Expected struct {
		NoneHashHex         string        `json:"none_hash_hex"`
		NumFullBlocks       int           `json:"num_full_blocks"`
		BlockHashesHex      []string      `json:"block_hashes_hex"`
		BlockHashesU64      []json.Number `json:"block_hashes_u64"`
		FirstBlockPreimage  string        `json:"first_block_preimage_hex"`
		GroupBlockHashesHex []string      `json:"group_block_hashes_hex"`
		GroupBlockHashesU64 []json.Number `json:"group_block_hashes_u64"`
	} `json:"expected"`
}

type cSGLangFile struct {
	Cases []struct {
		Name      string   `json:"name"`
		PageSize  int      `json:"page_size"`
		Bigram    bool     `json:"bigram"`
		TokenIDs  []uint32 `json:"token_ids"`
		CacheSalt string   `json:"cache_salt"`
		Expected  struct {
			PageHashesHex []string      `json:"page_hashes_hex"`
			PageHashesI64 []json.Number `json:"page_hashes_i64"`
			NumFullPages  int           `json:"num_full_pages"`
			SaltRootHex   string        `json:"salt_root_hex"`
		} `json:"expected"`
	} `json:"cases"`
}

// cProjectFile is a file in the project's vector schema (vectors/schema/kvexact_vectors_v1.schema.json):
// the same quantities in test groups, under the project's names.
type cProjectFile struct {
	Schema     string `json:"schema"`
	Algorithm  string `json:"algorithm"`
	TestGroups []struct {
		BlockSize int     `json:"blockSize"`
		Seed      *string `json:"seed"`
		Tests     []struct {
			Name           string   `json:"name"`
			Result         string   `json:"result"`
			Tokens         []uint32 `json:"tokens"`
			PromptLength   *int     `json:"promptLength"`
			GroupBlockSize *int     `json:"groupBlockSize"`
			Request        struct {
				LoRAName   string `json:"loraName"`
				CacheSalt  string `json:"cacheSalt"`
				MMFeatures []struct {
					Identifier string `json:"identifier"`
					Offset     int    `json:"offset"`
					Length     int    `json:"length"`
				} `json:"mmFeatures"`
				PromptEmbedsRows []string `json:"promptEmbedsRows"`
			} `json:"request"`
			Expected struct {
				Root               string        `json:"root"`
				NumFullBlocks      int           `json:"numFullBlocks"`
				Digests            []string      `json:"digests"`
				Keys               []json.Number `json:"keys"`
				FirstBlockPreimage string        `json:"firstBlockPreimage"`
				GroupDigests       []string      `json:"groupDigests"`
				GroupKeys          []json.Number `json:"groupKeys"`
			} `json:"expected"`
		} `json:"tests"`
	} `json:"testGroups"`
}

// readVLLMFile reads a vLLM block-hash file in either schema: vLLM's own case layout (the
// engine-produced originals) or the project's (files the project made from vLLM's code).
func readVLLMFile(t *testing.T, path string) cVLLMFile {
	t.Helper()
	var p cProjectFile
	readJSON(t, path, &p)
	var f cVLLMFile
	if p.Schema == "" {
		readJSON(t, path, &f)
		return f
	}
	f.HashAlgo = p.Algorithm
	for _, g := range p.TestGroups {
		for _, x := range g.Tests {
			c := cVLLMCase{Name: x.Name, BlockSize: g.BlockSize, HashSeed: g.Seed, Reproducible: x.Result == "valid",
				TokenIDs: x.Tokens, PromptLen: x.PromptLength, GroupBlockSize: x.GroupBlockSize}
			c.Request.LoRAName, c.Request.CacheSalt, c.Request.PromptEmbedsRowsHex = x.Request.LoRAName, x.Request.CacheSalt, x.Request.PromptEmbedsRows
			c.Request.MMFeatures = x.Request.MMFeatures
			e := x.Expected
			c.Expected.NoneHashHex, c.Expected.NumFullBlocks, c.Expected.BlockHashesHex, c.Expected.BlockHashesU64 = e.Root, e.NumFullBlocks, e.Digests, e.Keys
			c.Expected.FirstBlockPreimage, c.Expected.GroupBlockHashesHex, c.Expected.GroupBlockHashesU64 = e.FirstBlockPreimage, e.GroupDigests, e.GroupKeys
			f.Cases = append(f.Cases, c)
		}
	}
	return f
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read vectors: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
}

func u64s(t *testing.T, nums []json.Number) []uint64 {
	t.Helper()
	out := make([]uint64, len(nums))
	for i, n := range nums {
		v, err := strconv.ParseUint(n.String(), 10, 64)
		if err != nil {
			t.Fatalf("u64 [%d] %q: %v", i, n, err)
		}
		out[i] = v
	}
	return out
}

func hexes(ds [][]byte) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = hex.EncodeToString(d)
	}
	return out
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func equalU64(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// bothPaths runs f with the C core's accelerated code (SHA-NI, AVX2, where the CPU has them) and
// with its portable C code forced.
func bothPaths(t *testing.T, f func(t *testing.T)) {
	for _, portable := range []bool{false, true} {
		forcePortable(portable)
		if !portable && (!cpuHasSHANI() || !cpuHasAVX2()) {
			t.Logf("CPU lacks SHA-NI or AVX2: the accelerated paths are only partly exercised (%s)", cPaths())
		}
		t.Run(cPaths(), f)
	}
	forcePortable(false)
}

func TestCCoreVLLMVectors(t *testing.T) {
	bothPaths(t, func(t *testing.T) {
		for _, v := range []struct {
			dir  string
			algo Algorithm
		}{{"v0.25.1", VLLMSHA256}, {"v0.25.1", VLLMSHA256CBOR}, {"v0.25.1", VLLMXXHash}, {"v0.25.1", VLLMXXHashCBOR},
			{"main-msgpack", VLLMSHA256MsgPack}, {"main-msgpack", VLLMXXHashMsgPack}} {
			algo := v.algo
			f := readVLLMFile(t, filepath.Join(vectorsRoot, "vllm", v.dir, string(algo)+".json"))
			if f.HashAlgo != string(algo) || len(f.Cases) == 0 {
				t.Fatalf("%s: file says hash_algo %q with %d cases", algo, f.HashAlgo, len(f.Cases))
			}
			checked := 0
			for _, c := range f.Cases {
				if !c.Reproducible {
					continue
				}
				checkVLLMCase(t, algo, c)
				checked++
			}
			if checked < 70 {
				t.Errorf("%s: only %d reproducible cases checked", algo, checked)
			}
		}
	})
}

func checkVLLMCase(t *testing.T, algo Algorithm, c cVLLMCase) {
	t.Helper()
	h, err := New(Binding{Algorithm: algo, BlockSize: c.BlockSize, Seed: c.HashSeed}, ImplC)
	if err != nil {
		t.Fatalf("%s/%s: New: %v", algo, c.Name, err)
	}
	if got := hex.EncodeToString(h.Root()); got != c.Expected.NoneHashHex {
		t.Errorf("%s/%s: NONE_HASH %s, want %s", algo, c.Name, got, c.Expected.NoneHashHex)
	}
	var ex *Extras
	r := c.Request
	if r.LoRAName != "" || r.CacheSalt != "" || len(r.MMFeatures) > 0 || r.PromptEmbedsRowsHex != nil {
		ex = &Extras{LoRAName: r.LoRAName, CacheSalt: r.CacheSalt}
		for _, m := range r.MMFeatures {
			ex.MM = append(ex.MM, MMFeature{Identifier: m.Identifier, Offset: m.Offset, Length: m.Length})
		}
		for i, row := range r.PromptEmbedsRowsHex {
			b, err := hex.DecodeString(row)
			if err != nil {
				t.Fatalf("%s/%s: embeds row %d: %v", algo, c.Name, i, err)
			}
			ex.PromptEmbeds = append(ex.PromptEmbeds, b)
		}
	}

	var digests [][]byte
	var keys []uint64
	if c.PromptLen != nil {
		// Decode-style: the prompt, then one token at a time (vLLM's update_block_hashes).
		seq := h.NewSequence(ex)
		if _, err := seq.Append(c.TokenIDs[:*c.PromptLen]...); err != nil {
			t.Fatalf("%s/%s: append prompt: %v", algo, c.Name, err)
		}
		for _, tok := range c.TokenIDs[*c.PromptLen:] {
			if _, err := seq.Append(tok); err != nil {
				t.Fatalf("%s/%s: append: %v", algo, c.Name, err)
			}
		}
		digests, keys = seq.Digests(), seq.Keys()
	} else {
		digests, keys, err = h.Digests(c.TokenIDs, ex)
		if err != nil {
			t.Fatalf("%s/%s: Digests: %v", algo, c.Name, err)
		}
	}
	if len(keys) != c.Expected.NumFullBlocks {
		t.Errorf("%s/%s: %d blocks, want %d", algo, c.Name, len(keys), c.Expected.NumFullBlocks)
	}
	if got := hexes(digests); !equalStrings(got, c.Expected.BlockHashesHex) {
		t.Errorf("%s/%s: digests\n got %v\nwant %v", algo, c.Name, got, c.Expected.BlockHashesHex)
	}
	if want := u64s(t, c.Expected.BlockHashesU64); !equalU64(keys, want) {
		t.Errorf("%s/%s: keys\n got %v\nwant %v", algo, c.Name, keys, want)
	}
	if c.GroupBlockSize != nil {
		g, err := GroupKeys(keys, *c.GroupBlockSize, c.BlockSize)
		if err != nil {
			t.Fatalf("%s/%s: GroupKeys: %v", algo, c.Name, err)
		}
		if want := u64s(t, c.Expected.GroupBlockHashesU64); !equalU64(g, want) {
			t.Errorf("%s/%s: group keys %v, want %v", algo, c.Name, g, want)
		}
	}
	if c.Expected.FirstBlockPreimage != "" {
		pre, err := h.FirstPreimage(c.TokenIDs, ex)
		if err != nil {
			t.Fatalf("%s/%s: FirstPreimage: %v", algo, c.Name, err)
		}
		if got := hex.EncodeToString(pre); got != c.Expected.FirstBlockPreimage {
			t.Errorf("%s/%s: block 0 pre-image\n got %s\nwant %s", algo, c.Name, got, c.Expected.FirstBlockPreimage)
		}
	}
}

func TestCCoreSGLangVectors(t *testing.T) {
	bothPaths(t, func(t *testing.T) {
		var f cSGLangFile
		readJSON(t, filepath.Join(vectorsRoot, "sglang", "v0.5.18", "page_hash.json"), &f)
		if len(f.Cases) < 60 {
			t.Fatalf("only %d SGLang cases", len(f.Cases))
		}
		for _, c := range f.Cases {
			h, err := New(Binding{Algorithm: SGLangSHA256, BlockSize: c.PageSize, Bigram: c.Bigram}, ImplC)
			if err != nil {
				t.Fatalf("%s: New: %v", c.Name, err)
			}
			var ex *Extras
			if c.CacheSalt != "" {
				ex = &Extras{CacheSalt: c.CacheSalt}
				root, err := h.RootFor(ex)
				if err != nil {
					t.Fatalf("%s: salt root: %v", c.Name, err)
				}
				if got := hex.EncodeToString(root); got != c.Expected.SaltRootHex {
					t.Errorf("%s: salt root %s, want %s", c.Name, got, c.Expected.SaltRootHex)
				}
			} else if c.CacheSalt == "" && c.Expected.SaltRootHex != "" {
				t.Fatalf("%s: salt root without a salt", c.Name)
			}
			digests, keys, err := h.Digests(c.TokenIDs, ex)
			if err != nil {
				t.Fatalf("%s: Digests: %v", c.Name, err)
			}
			if len(keys) != c.Expected.NumFullPages {
				t.Errorf("%s: %d pages, want %d", c.Name, len(keys), c.Expected.NumFullPages)
			}
			if got := hexes(digests); !equalStrings(got, c.Expected.PageHashesHex) {
				t.Errorf("%s: digests\n got %v\nwant %v", c.Name, got, c.Expected.PageHashesHex)
			}
			for i, n := range c.Expected.PageHashesI64 {
				want, err := strconv.ParseInt(n.String(), 10, 64)
				if err != nil {
					t.Fatalf("%s: i64 [%d] %q: %v", c.Name, i, n, err)
				}
				if i >= len(keys) || SGLangInt64(keys[i]) != want {
					t.Errorf("%s: page %d key %v, want %d", c.Name, i, keys, want)
					break
				}
			}
		}
	})
}

// TestCCoreReferenceKnownAnswers checks the known answers of routing-semantics.md §12.2 and the
// SGLang worked example of the engine contract (independent of the vector files).
func TestCCoreReferenceKnownAnswers(t *testing.T) {
	zero := make([]byte, 32)
	blk0 := make([]uint32, 16)
	blk1 := make([]uint32, 16)
	for k := range 16 {
		blk0[k] = uint32(101 * (k + 1))
		blk1[k] = uint32(1717 + 101*k)
	}
	tokens := append(append([]uint32{}, blk0...), blk1...)
	h, err := New(Binding{Algorithm: VLLMSHA256CBOR, BlockSize: 16, Seed: new(string)}, ImplC)
	if err != nil {
		t.Fatal(err)
	}
	_, keys, err := h.chain(zero, tokens, 2, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if keys[0] != 14515664427994421226 || keys[1] != 10510627572844902094 {
		t.Errorf("zero-parent chain keys %v, want [14515664427994421226 10510627572844902094]", keys)
	}
	seed0 := "0"
	h, err = New(Binding{Algorithm: VLLMSHA256CBOR, BlockSize: 16, Seed: &seed0}, ImplC)
	if err != nil {
		t.Fatal(err)
	}
	if keys, err = h.Keys(blk0, nil, nil); err != nil || len(keys) != 1 || keys[0] != 7876691182959014722 {
		t.Errorf("seed \"0\" block 0: %v %v, want [7876691182959014722]", keys, err)
	}

	sg, err := New(Binding{Algorithm: SGLangSHA256, BlockSize: 32}, ImplC)
	if err != nil {
		t.Fatal(err)
	}
	long := make([]uint32, 64)
	for i := range long {
		long[i] = uint32(100000 + i)
	}
	if keys, err = sg.Keys(long, nil, nil); err != nil || len(keys) != 2 ||
		keys[0] != 0x069e60c00e7daa33 || keys[1] != 0xb9e5c32b50351992 {
		t.Errorf("SGLang 100000..100063 / 32: %x %v", keys, err)
	}
	sg4, err := New(Binding{Algorithm: SGLangSHA256, BlockSize: 4}, ImplC)
	if err != nil {
		t.Fatal(err)
	}
	if keys, err = sg4.Keys([]uint32{1, 2, 3, 4, 5, 6, 7, 8}, &Extras{CacheSalt: "tenant-a"}, nil); err != nil ||
		len(keys) != 2 || int64(keys[0]) != 3718046898735569995 || int64(keys[1]) != 3308615664605479373 {
		t.Errorf("SGLang salted worked example: %v %v", keys, err)
	}
}
