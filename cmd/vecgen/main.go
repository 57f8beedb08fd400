// Command vecgen writes additional block-hash vector cases computed by the hash core's Go reference,
// in the project's vector schema (vectors/schema/kvexact_vectors_v1.schema.json), one file per
// binding, under vectors/generated/. Every file is labelled
// origin "kvexact-vecgen (Go reference)": these cases are NOT engine truth. They pin agreement
// between the C core and the Go reference (and guard against regressions) on inputs the engine
// vectors do not cover: odd block sizes, LONG1-sized token ids, one-character strings that pickle
// memoizes, prompt embeds beyond the prompt, bigram salted pages, router keys.
//
// Output is a pure function of -seed: the same seed writes the same bytes.
//
// With -convert it instead rewrites each FILE, a file the project made by running an engine's own
// hashing code but laid out in that engine's original case schema, into the project's schema in
// place: the cases and the header's provenance are kept, and the header records the conversion.
//
//	vecgen [-seed N] [-out DIR]
//	vecgen -convert FILE...
package main

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/internal/buildinfo"
	"github.com/kvexact/kvexact/vectors"
)

func main() {
	if buildinfo.Flag("vecgen", os.Args[1:], os.Stdout) {
		return
	}
	seed := flag.Uint64("seed", 1, "random seed; the output is a pure function of it")
	out := flag.String("out", "", "output folder (default: the repository's vectors/generated)")
	conv := flag.Bool("convert", false, "rewrite each FILE argument from its engine's original case schema into the project's schema, in place")
	flag.Parse()
	if *conv {
		for _, path := range flag.Args() {
			if err := Convert(path); err != nil {
				fmt.Fprintln(os.Stderr, "vecgen:", err)
				os.Exit(1)
			}
			fmt.Println(path)
		}
		return
	}
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

// Convert rewrites the file at path into the project's schema. Only engine-produced files are
// converted (generated ones are regenerated), and a file already in the project's schema is refused.
func Convert(path string) error {
	f, err := vectors.Load(path)
	if err != nil {
		return err
	}
	if f.Header.Schema == vectors.SchemaName {
		return fmt.Errorf("%s is already in %s", path, vectors.SchemaName)
	}
	if f.Header.Generated() {
		return fmt.Errorf("%s is generated: run vecgen to regenerate it instead", path)
	}
	if f.Header.KeyType == "" || f.Header.Algo == "" {
		info, err := vectors.Algorithm(f.Cases[0].Algo)
		if err != nil {
			return err
		}
		f.Header.KeyType, f.Header.Algo = info.KeyType, f.Cases[0].Algo
	}
	f.Header.Notes = append(f.Header.Notes, "Converted by cmd/vecgen -convert from "+f.Header.Schema+" into vectors/schema/"+vectors.SchemaName+": the same cases and values, in the project's field names (docs/vectors.md).")
	data, err := vectors.Encode(f)
	if err != nil {
		return err
	}
	if _, err := vectors.Parse(path, data); err != nil {
		return fmt.Errorf("the converted file does not load: %w", err)
	}
	return os.WriteFile(path, data, 0o644)
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
		info, _ := vectors.Algorithm(string(a)) // generateFile has checked it
		out[info.GeneratedFile] = data
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

// inputs draws the cases of one binding: seeds where the algorithm has them; salt, bigram and
// decode cases where it hashes no extra keys; LoRA, multimodal, prompt-embedding, decode and group
// cases where it does.
func inputs(a hashcore.Algorithm, info vectors.AlgorithmInfo, r *rand.Rand) []input {
	var in []input
	sd := func() *string {
		if !info.Seeded {
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
	if !info.ExtraKeys {
		in = append(in, input{name: "salted_bs4", blockSize: 4, tokens: randTokens(r, 13, 150000), ex: &hashcore.Extras{CacheSalt: "gen-tenant"}})
		if info.Bigram {
			in = append(in,
				input{name: "bigram_salted_bs3", blockSize: 3, bigram: true, tokens: randTokens(r, 11, 150000), ex: &hashcore.Extras{CacheSalt: "é"}},
				input{name: "bigram_decode_bs2", blockSize: 2, bigram: true, tokens: randTokens(r, 9, 1000), promptLen: 4},
			)
		}
		in = append(in, input{name: "decode_bs4", blockSize: 4, tokens: randTokens(r, 19, 1000), promptLen: 6})
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

func generateFile(a hashcore.Algorithm, seed uint64, r *rand.Rand) ([]byte, error) {
	info, err := vectors.Algorithm(string(a))
	if err != nil {
		return nil, err
	}
	f := &vectors.File{Header: vectors.Header{
		Engine: info.Engine, Tag: "generated", Commit: "", Algo: string(a), KeyType: info.KeyType,
		Source: vectors.SourceGenerated, Origin: vectors.GeneratedOrigin,
		Generator: []string{fmt.Sprintf("kvexact cmd/vecgen -seed %d: gateway/hashcore Go reference (hashcore.ImplGo)", seed)},
		Notes: []string{
			"GENERATED by kvexact's own Go reference, NOT by the engine: these cases pin C/Go agreement and guard regressions; they are never engine truth.",
			"Schema: vectors/schema/" + vectors.SchemaName + " (docs/vectors.md).",
		},
	}}
	if a == hashcore.RouterXXH3V1 {
		f.Header.Notes = append(f.Header.Notes, "Router keys kvexact-xxh3-v1: key_i = XXH3-64(le64(key_{i-1}) || le32 tokens || canonical CBOR(extra keys) when any), key_{-1} = 0; digests are le64(key); root is le64(0). Extra keys are the one-shot values (those BlockStored events carry), also on the decode path.")
	}
	for _, in := range inputs(a, info, r) {
		c, err := compute(a, info, in)
		if err != nil {
			return nil, fmt.Errorf("case %s: %w", in.name, err)
		}
		f.Cases = append(f.Cases, *c)
	}
	return vectors.Encode(f)
}

// compute runs one input through the Go reference and records the case.
func compute(a hashcore.Algorithm, info vectors.AlgorithmInfo, in input) (*vectors.Case, error) {
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
	c := &vectors.Case{
		Name: in.name, Algo: string(a), BlockSize: in.blockSize, Seed: in.seed, Reproducible: true, Bigram: in.bigram,
		Tokens: in.tokens, PromptLen: in.promptLen, GroupBlockSize: in.groupBlockSize, Request: request(in.ex),
	}
	if c.Tokens == nil {
		c.Tokens = []uint32{}
	}
	e := &c.Expected
	e.NumFullBlocks, e.Digests, e.Keys = len(keys), digests, keys
	if e.Root, err = h.RootFor(in.ex); err != nil {
		return nil, err
	}
	if len(keys) > 0 {
		if e.FirstPreimage, err = h.FirstPreimage(in.tokens, in.ex); err != nil {
			return nil, err
		}
	}
	if info.SaltInRoot && in.ex != nil && in.ex.CacheSalt != "" {
		if e.UnsaltedDigests, _, err = h.Digests(in.tokens, nil); err != nil {
			return nil, err
		}
	}
	if info.ExtraKeys {
		oneShot, err := hashcore.ExtraKeys(in.ex, len(in.tokens), in.blockSize)
		if err != nil {
			return nil, err
		}
		if in.promptLen == 0 {
			used = oneShot
		}
		c.ExtraKeys, c.HasExtraKeys = used, true
		if in.promptLen > 0 && fmt.Sprint(used) != fmt.Sprint(oneShot) {
			c.ExtraKeysOneShot = oneShot
		}
	}
	if in.groupBlockSize > 0 {
		if e.GroupDigests, err = hashcore.GroupDigests(digests, in.groupBlockSize, in.blockSize); err != nil {
			return nil, err
		}
		e.GroupKeys, _ = hashcore.GroupKeys(keys, in.groupBlockSize, in.blockSize)
	}
	c.Flags = vectors.Flags(c)
	return c, nil
}

// request records the request fields the extras came from.
func request(ex *hashcore.Extras) vectors.Request {
	var r vectors.Request
	if ex == nil {
		return r
	}
	r.LoRAName, r.CacheSalt, r.PromptEmbedsRows = ex.LoRAName, ex.CacheSalt, ex.PromptEmbeds
	for _, f := range ex.MM {
		r.MM = append(r.MM, vectors.MMFeature{Identifier: f.Identifier, Offset: f.Offset, Length: f.Length})
	}
	return r
}
