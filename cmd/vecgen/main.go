// Command vecgen writes additional block-hash vector cases computed by the hash core's Go reference,
// in the shared vector schema, one file per binding, under vectors/generated/. Every file is labelled
// origin "kvexact-vecgen (Go reference)": these cases are NOT engine truth. They pin agreement
// between the C core and the Go reference (and guard against regressions) on inputs the engine
// vectors do not cover: odd block sizes, LONG1-sized token ids, one-character strings that pickle
// memoizes, prompt embeds beyond the prompt, bigram salted pages, router keys.
//
// Output is a pure function of -seed: the same seed writes the same bytes.
//
//	vecgen [-seed N] [-out DIR]
package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/vectors"
)

func main() {
	seed := flag.Uint64("seed", 1, "random seed; the output is a pure function of it")
	out := flag.String("out", "", "output folder (default: the repository's vectors/generated)")
	flag.Parse()
	dir := *out
	if dir == "" {
		root, err := vectors.Dir()
		if err != nil {
			fmt.Fprintln(os.Stderr, "vecgen:", err)
			os.Exit(2)
		}
		dir = filepath.Join(root, vectors.GeneratedDir)
	}
	files, err := Generate(*seed)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vecgen:", err)
		os.Exit(1)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "vecgen:", err)
		os.Exit(1)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "vecgen:", err)
			os.Exit(1)
		}
		fmt.Println(filepath.Join(dir, name))
	}
}

// FileNames maps each binding to its output file.
var FileNames = map[hashcore.Algorithm]string{
	hashcore.VLLMSHA256:        "vllm-sha256.json",
	hashcore.VLLMSHA256CBOR:    "vllm-sha256_cbor.json",
	hashcore.VLLMXXHash:        "vllm-xxhash.json",
	hashcore.VLLMXXHashCBOR:    "vllm-xxhash_cbor.json",
	hashcore.VLLMSHA256MsgPack: "vllm-sha256_msgpack.json",
	hashcore.VLLMXXHashMsgPack: "vllm-xxhash_msgpack.json",
	hashcore.SGLangSHA256:      "sglang-sha256.json",
	hashcore.RouterXXH3V1:      "router-kvexact-xxh3-v1.json",
}

// input is one generated case's inputs.
type input struct {
	name           string
	blockSize      int
	seed           *string
	bigram         bool
	tokens         []uint32
	promptLen      int
	groupBlockSize int
	ex             *hashcore.Extras
}

// Generate returns file name → JSON bytes for every binding.
func Generate(seed uint64) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, a := range hashcore.Algorithms {
		r := rand.New(rand.NewPCG(seed, uint64(len(a))*0x9e3779b97f4a7c15^hashString(string(a))))
		data, err := generateFile(a, seed, r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", a, err)
		}
		out[FileNames[a]] = data
	}
	return out, nil
}

func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}

func str(s string) *string { return &s }

func randTokens(r *rand.Rand, n int, max uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = r.Uint32N(max)
	}
	return t
}

// inputs draws the cases of one binding.
func inputs(a hashcore.Algorithm, r *rand.Rand) []input {
	var in []input
	vllm := a.IsVLLM()
	sd := func() *string {
		if !vllm {
			return nil
		}
		return str([]string{"0", "42", "", "7", "random"}[r.IntN(5)])
	}
	// Plain prompts of odd block sizes and id ranges, incl. ids ≥ 2^31 (pickle LONG1, CBOR 0x1a).
	for i, bs := range []int{1, 3, 5, 16, 37} {
		max := []uint32{300, 70000, 1 << 31, 0xFFFFFFFF, 200000}[i]
		n := bs*(1+r.IntN(4)) + r.IntN(bs)
		in = append(in, input{name: fmt.Sprintf("random_%d_bs%d_n%d", i, bs, n), blockSize: bs, seed: sd(), tokens: randTokens(r, n, max)})
	}
	in = append(in, input{name: "top_ids_bs4", blockSize: 4, seed: sd(), tokens: []uint32{0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 0x10000, 0xFFFF, 0x100, 0xFF, 0}})
	if a == hashcore.SGLangSHA256 {
		in = append(in,
			input{name: "salted_bs4", blockSize: 4, tokens: randTokens(r, 13, 150000), ex: &hashcore.Extras{CacheSalt: "gen-tenant"}},
			input{name: "bigram_salted_bs3", blockSize: 3, bigram: true, tokens: randTokens(r, 11, 150000), ex: &hashcore.Extras{CacheSalt: "é"}},
			input{name: "bigram_decode_bs2", blockSize: 2, bigram: true, tokens: randTokens(r, 9, 1000), promptLen: 4},
			input{name: "decode_bs4", blockSize: 4, tokens: randTokens(r, 19, 1000), promptLen: 6},
		)
		return in
	}
	embeds := make([][]byte, 20)
	for i := range embeds {
		embeds[i] = randBytes(r, 8)
	}
	in = append(in,
		input{name: "lora_salt_bs8", blockSize: 8, seed: sd(), tokens: randTokens(r, 27, 150000), ex: &hashcore.Extras{LoRAName: "gen-lora-ü", CacheSalt: "gen-salt"}},
		// One-character strings are CPython singletons: pickle memoizes the repeat (BINGET).
		input{name: "singleton_strings_bs4", blockSize: 4, seed: sd(), tokens: randTokens(r, 9, 100),
			ex: &hashcore.Extras{LoRAName: "a", CacheSalt: "a", MM: []hashcore.MMFeature{{Identifier: "a", Offset: 1, Length: 2}}}},
		input{name: "mm_three_items_bs8", blockSize: 8, seed: sd(), tokens: randTokens(r, 40, 50000),
			ex: &hashcore.Extras{MM: []hashcore.MMFeature{{Identifier: "img-1", Offset: 2, Length: 3}, {Identifier: "img-2", Offset: 5, Length: 11}, {Identifier: "img-3", Offset: 16, Length: 0}, {Identifier: "img-4", Offset: 30, Length: 9}}}},
		input{name: "mm_decode_quirk_bs4", blockSize: 4, seed: sd(), tokens: randTokens(r, 24, 5000), promptLen: 10,
			ex: &hashcore.Extras{MM: []hashcore.MMFeature{{Identifier: "A", Offset: 5, Length: 3}, {Identifier: "B", Offset: 8, Length: 2}}}},
		input{name: "prompt_embeds_decode_bs4", blockSize: 4, seed: sd(), tokens: make([]uint32, 30), promptLen: 20, ex: &hashcore.Extras{PromptEmbeds: embeds}},
		input{name: "group_bs4_k3", blockSize: 4, seed: sd(), tokens: randTokens(r, 50, 90000), groupBlockSize: 12},
		input{name: "long_extras_bs2", blockSize: 2, seed: sd(), tokens: randTokens(r, 4, 10),
			ex: &hashcore.Extras{LoRAName: string(bytes.Repeat([]byte("L"), 300)), CacheSalt: string(bytes.Repeat([]byte("s"), 70))}},
	)
	return in
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// header is the file header, in the shared schema plus origin.
type header struct {
	Engine    string          `json:"engine"`
	Tag       string          `json:"tag"`
	Commit    string          `json:"commit"`
	HashAlgo  string          `json:"hash_algo,omitempty"`
	Origin    string          `json:"origin"`
	Generator string          `json:"generator"`
	Notes     []string        `json:"notes"`
	Cases     json.RawMessage `json:"cases"`
}

type vllmCase struct {
	Name             string         `json:"name"`
	HashAlgo         string         `json:"hash_algo"`
	BlockSize        int            `json:"block_size"`
	HashSeed         *string        `json:"hash_seed"`
	Reproducible     bool           `json:"reproducible"`
	TokenIDs         []uint32       `json:"token_ids"`
	PromptLen        int            `json:"prompt_len,omitempty"`
	GroupBlockSize   int            `json:"group_block_size,omitempty"`
	Request          map[string]any `json:"request"`
	ExtraKeys        []any          `json:"extra_keys"`
	ExtraKeysOneShot []any          `json:"extra_keys_one_shot,omitempty"`
	Expected         vllmExpected   `json:"expected"`
}

type vllmExpected struct {
	NoneHashHex         string   `json:"none_hash_hex"`
	NumFullBlocks       int      `json:"num_full_blocks"`
	BlockHashesHex      []string `json:"block_hashes_hex"`
	BlockHashesU64      []uint64 `json:"block_hashes_u64"`
	FirstBlockPreimage  string   `json:"first_block_preimage_hex,omitempty"`
	GroupBlockHashesHex []string `json:"group_block_hashes_hex,omitempty"`
	GroupBlockHashesU64 []uint64 `json:"group_block_hashes_u64,omitempty"`
}

type sglangCase struct {
	Name      string         `json:"name"`
	PageSize  int            `json:"page_size"`
	Bigram    bool           `json:"bigram,omitempty"`
	TokenIDs  []uint32       `json:"token_ids"`
	CacheSalt string         `json:"cache_salt,omitempty"`
	Expected  sglangExpected `json:"expected"`
}

type sglangExpected struct {
	PageHashesHex    []string `json:"page_hashes_hex"`
	PageHashesI64    []int64  `json:"page_hashes_i64"`
	NumFullPages     int      `json:"num_full_pages"`
	SaltRootHex      string   `json:"salt_root_hex,omitempty"`
	UnsaltedPagesHex []string `json:"unsalted_page_hashes_hex,omitempty"`
}

func hexes(ds [][]byte) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = hex.EncodeToString(d)
	}
	return out
}

func generateFile(a hashcore.Algorithm, seed uint64, r *rand.Rand) ([]byte, error) {
	var cases []any
	for _, in := range inputs(a, r) {
		c, err := compute(a, in)
		if err != nil {
			return nil, fmt.Errorf("case %s: %w", in.name, err)
		}
		cases = append(cases, c)
	}
	raw, err := json.Marshal(cases)
	if err != nil {
		return nil, err
	}
	h := header{
		Engine: vectors.EngineVLLM, Tag: "generated", Commit: "", HashAlgo: string(a),
		Origin:    vectors.GeneratedOrigin,
		Generator: fmt.Sprintf("kvexact cmd/vecgen -seed %d: gateway/hashcore Go reference (hashcore.ImplGo)", seed),
		Notes: []string{
			"GENERATED by kvexact's own Go reference, NOT by the engine: these cases pin C/Go agreement and guard regressions; they are never engine truth.",
			"Schema: the engine vector schema of the same family (vllm/*/README.md, sglang/*/README.md).",
		},
		Cases: raw,
	}
	switch a {
	case hashcore.SGLangSHA256:
		h.Engine, h.HashAlgo = vectors.EngineSGLang, ""
	case hashcore.RouterXXH3V1:
		h.Engine = vectors.EngineKVExact
		h.Notes = append(h.Notes, "Router keys kvexact-xxh3-v1: key_i = XXH3-64(le64(key_{i-1}) || le32 tokens || canonical CBOR(extra keys) when any), key_{-1} = 0; digests are le64(key); none_hash_hex is le64(0). Extra keys follow vLLM's one-shot (BlockStored) values, also on the decode path.")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(h); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// compute runs one input through the Go reference and renders the case.
func compute(a hashcore.Algorithm, in input) (any, error) {
	h, err := hashcore.New(hashcore.Binding{Algorithm: a, BlockSize: in.blockSize, Seed: in.seed, Bigram: in.bigram}, hashcore.ImplGo)
	if err != nil {
		return nil, err
	}
	var digests [][]byte
	var keys []uint64
	var used [][]any
	if in.promptLen > 0 {
		seq := h.NewSequence(in.ex)
		if _, err := seq.Append(in.tokens[:in.promptLen]...); err != nil {
			return nil, err
		}
		for _, t := range in.tokens[in.promptLen:] {
			if _, err := seq.Append(t); err != nil {
				return nil, err
			}
		}
		digests, keys, used = seq.Digests(), seq.Keys(), seq.ExtraKeys()
	} else if digests, keys, err = h.Digests(in.tokens, in.ex); err != nil {
		return nil, err
	}
	var pre []byte
	if len(keys) > 0 {
		if pre, err = h.FirstPreimage(in.tokens, in.ex); err != nil {
			return nil, err
		}
	}
	if a == hashcore.SGLangSHA256 {
		c := sglangCase{Name: in.name, PageSize: in.blockSize, Bigram: in.bigram, TokenIDs: in.tokens}
		c.Expected = sglangExpected{PageHashesHex: hexes(digests), NumFullPages: len(keys), PageHashesI64: make([]int64, len(keys))}
		for i, k := range keys {
			c.Expected.PageHashesI64[i] = hashcore.SGLangInt64(k)
		}
		if in.ex != nil && in.ex.CacheSalt != "" {
			c.CacheSalt = in.ex.CacheSalt
			root, err := h.RootFor(in.ex)
			if err != nil {
				return nil, err
			}
			c.Expected.SaltRootHex = hex.EncodeToString(root)
			ud, _, err := h.Digests(in.tokens, nil)
			if err != nil {
				return nil, err
			}
			c.Expected.UnsaltedPagesHex = hexes(ud)
		}
		return c, nil
	}
	oneShot, err := hashcore.ExtraKeys(in.ex, len(in.tokens), in.blockSize)
	if err != nil {
		return nil, err
	}
	if in.promptLen == 0 {
		used = oneShot
	}
	c := vllmCase{
		Name: in.name, HashAlgo: string(a), BlockSize: in.blockSize, HashSeed: in.seed, Reproducible: true,
		TokenIDs: in.tokens, PromptLen: in.promptLen, GroupBlockSize: in.groupBlockSize,
		Request: request(in.ex), ExtraKeys: jsonExtras(used),
		Expected: vllmExpected{
			NoneHashHex: hex.EncodeToString(h.Root()), NumFullBlocks: len(keys),
			BlockHashesHex: hexes(digests), BlockHashesU64: keys, FirstBlockPreimage: hex.EncodeToString(pre),
		},
	}
	if c.TokenIDs == nil {
		c.TokenIDs = []uint32{}
	}
	if in.promptLen > 0 && fmt.Sprint(used) != fmt.Sprint(oneShot) {
		c.ExtraKeysOneShot = jsonExtras(oneShot)
	}
	if in.groupBlockSize > 0 {
		gd, err := hashcore.GroupDigests(digests, in.groupBlockSize, in.blockSize)
		if err != nil {
			return nil, err
		}
		gk, _ := hashcore.GroupKeys(keys, in.groupBlockSize, in.blockSize)
		c.Expected.GroupBlockHashesHex, c.Expected.GroupBlockHashesU64 = hexes(gd), gk
	}
	return c, nil
}

func request(ex *hashcore.Extras) map[string]any {
	m := map[string]any{}
	if ex == nil {
		return m
	}
	if ex.LoRAName != "" {
		m["lora_name"] = ex.LoRAName
	}
	if ex.CacheSalt != "" {
		m["cache_salt"] = ex.CacheSalt
	}
	if len(ex.MM) > 0 {
		var mm []map[string]any
		for _, f := range ex.MM {
			mm = append(mm, map[string]any{"identifier": f.Identifier, "offset": f.Offset, "length": f.Length})
		}
		m["mm_features"] = mm
	}
	if ex.PromptEmbeds != nil {
		m["prompt_embeds_rows_hex"] = hexes(ex.PromptEmbeds)
	}
	return m
}

// jsonExtras renders per-block extra keys in the vectors' notation ({"$bytes": hex} for bytes).
func jsonExtras(blocks [][]any) []any {
	out := make([]any, len(blocks))
	for i, b := range blocks {
		if b != nil {
			out[i] = jsonValue(b)
		}
	}
	return out
}

func jsonValue(v any) any {
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonValue(e)
		}
		return out
	case []byte:
		return map[string]string{"$bytes": hex.EncodeToString(x)}
	}
	return v
}
