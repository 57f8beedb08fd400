package vectors

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/gateway/hashcore"
)

func mustDir(t testing.TB) string {
	t.Helper()
	d, err := Dir()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestLoadEngineFiles(t *testing.T) {
	dir := mustDir(t)
	f, err := Load(filepath.Join(dir, "vllm/v0.25.1/sha256_cbor.json"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Header.Engine != "vllm" || f.Header.Tag != "v0.25.1" || f.Header.Algo != "sha256_cbor" || f.Header.Generated() || len(f.Cases) != 72 {
		t.Fatalf("header %+v, %d cases", f.Header, len(f.Cases))
	}
	byName := map[string]*Case{}
	for i := range f.Cases {
		byName[f.Cases[i].Name] = &f.Cases[i]
	}
	c := byName["exact_one_block_bs16"]
	if c.Expected.Keys[0] != 12687895063098490012 || *c.Seed != "0" || len(c.Tokens) != 16 {
		t.Errorf("exact_one_block_bs16 = %+v", c)
	}
	if c := byName["seed_empty_bs16"]; c.Seed == nil || *c.Seed != "" {
		t.Error("empty seed lost")
	}
	if c := byName["unseeded_pythonhashseed_unset"]; c.Seed != nil || c.Reproducible || c.Expected.Keys != nil {
		t.Errorf("unseeded case %+v", c)
	}
	if c := byName["prompt_embeds_bs16"]; len(c.Request.PromptEmbedsRows) != 40 || len(c.ExtraKeys[0][0].([]byte)) != 32 {
		t.Error("prompt embeds not decoded")
	}
	if c := byName["mm_two_images_bs32"]; c.ExtraKeys[1][0].([]any)[1].(int64) != -2 {
		t.Errorf("mm extra keys %v", c.ExtraKeys)
	}
	if c := byName["incremental_decode_mm_quirk_bs16"]; c.PromptLen != 40 || c.ExtraKeysOneShot == nil {
		t.Error("decode fields lost")
	}
	s, err := Load(filepath.Join(dir, "sglang/v0.5.18/page_hash.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range s.Cases {
		if c.Name == "salt_tenant_a_ps4" && (int64(c.Expected.Keys[0]) != 3718046898735569995 || c.Expected.Root == nil || c.Request.CacheSalt != "tenant-a") {
			t.Errorf("salted SGLang case %+v", c)
		}
	}
}

// TestLoadProjectFile: a file the project made from vLLM's code, in the project's schema, reads into
// the same cases as the original it was converted from would, with tcIds, flags and its provenance.
func TestLoadProjectFile(t *testing.T) {
	f, err := Load(filepath.Join(mustDir(t), "vllm/v0.29.0/sha256.json"))
	if err != nil {
		t.Fatal(err)
	}
	h := f.Header
	if h.Schema != SchemaName || h.Engine != "vllm" || h.Tag != "v0.29.0" || h.Algo != "sha256" || h.Source != SourceEngine ||
		h.Generated() || h.KeyType != KeyUint64 || len(h.Generator) == 0 || len(f.Cases) != 74 {
		t.Fatalf("header %+v, %d cases", h, len(f.Cases))
	}
	for i, c := range f.Cases {
		if c.ID != i+1 || c.Index != i || c.Algo != "sha256" {
			t.Fatalf("case %d: tcId %d, index %d, algorithm %q", i, c.ID, c.Index, c.Algo)
		}
	}
	byName := map[string]*Case{}
	for i := range f.Cases {
		byName[f.Cases[i].Name] = &f.Cases[i]
	}
	if c := byName["seed_unset_bs16"]; c == nil || c.Seed != nil || c.RootSeed == nil || *c.RootSeed != "vllm-none-hash" || !c.Reproducible || !slices.Contains(c.Flags, "EngineRootSeed") {
		t.Errorf("seed_unset_bs16 = %+v", c)
	}
	if c := byName["incremental_decode_mm_quirk_bs16"]; c.PromptLen != 40 || c.ExtraKeysOneShot == nil || c.Comment == "" || !slices.Contains(c.Flags, "ExtraKeysDiffer") {
		t.Error("decode fields lost")
	}
	if f.Field(qKeys) != "keys" || f.Field(qRoot) != "root" {
		t.Errorf("field names %s, %s", f.Field(qKeys), f.Field(qRoot))
	}
}

func TestParseErrors(t *testing.T) {
	const vcase = `{"name":"c","hash_algo":"sha256","block_size":16,"hash_seed":"0","reproducible":true,"token_ids":%s,"request":{},"extra_keys":[],"expected":{"none_hash_hex":"00","num_full_blocks":0,"block_hashes_hex":[],"block_hashes_u64":%s}}`
	vfile := func(tokens, keys string) string {
		return `{"engine":"vllm","hash_algo":"sha256","cases":[` + strings.Replace(strings.Replace(vcase, "%s", tokens, 1), "%s", keys, 1) + `]}`
	}
	cases := []struct {
		name, data, want string
	}{
		{"token too big", vfile("[1,4294967296]", "[]"), "$.cases[0].token_ids[1]: token id 4294967296 outside"},
		{"negative token", vfile("[-1]", "[]"), "$.cases[0].token_ids[0]: token id -1"},
		{"float token", vfile("[1.5]", "[]"), "$.cases[0].token_ids[0]: token id 1.5"},
		{"u64 overflow", vfile("[]", `[18446744073709551616]`), "$.cases[0].expected.block_hashes_u64[0]"},
		{"keys without digests", vfile("[]", `[1]`), "1 keys for 0 digests"},
		{"truncated", `{"engine":"vllm","cases":[`, "$: invalid JSON"},
		{"syntax", `{"engine": vllm}`, "byte offset"},
		{"trailing", `{"engine":"vllm","cases":[]} {}`, "trailing data"},
		{"not an object", `[1,2]`, "not a block-hash vector file"},
		{"other engine", `{"engine":"trtllm"}`, `$.engine: not a block-hash vector file: engine "trtllm"`},
		{"no cases", `{"engine":"sglang"}`, "$.cases: not a block-hash vector file"},
		{"bad hex", `{"engine":"sglang","cases":[{"name":"x","page_size":4,"token_ids":[],"expected":{"page_hashes_hex":["zz"],"page_hashes_i64":[1],"num_full_pages":1}}]}`, "$.cases[0].expected.page_hashes_hex[0]: bad hex"},
		{"page size 0", `{"engine":"sglang","cases":[{"name":"x","page_size":0,"token_ids":[],"expected":{}}]}`, "$.cases[0].page_size: value 0 out of range"},
		{"algo mismatch", `{"engine":"vllm","hash_algo":"xxhash","cases":[` + strings.Replace(strings.Replace(vcase, "%s", "[]", 1), "%s", "[]", 1) + `]}`, `$.cases[0].hash_algo: case algorithm "sha256" differs`},
		{"generated outside generated/", `{"engine":"sglang","origin":"kvexact-vecgen (Go reference)","cases":[]}`, "$.origin"},
		{"unknown origin", `{"engine":"sglang","origin":"someone","cases":[]}`, `unknown origin "someone"`},
		{"router engine not generated", `{"engine":"kvexact","cases":[]}`, "only valid in generated files"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("x.json", []byte(c.data))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			var pe *PathError
			if !errors.As(err, &pe) || pe.File != "x.json" {
				t.Errorf("error %T does not name the file", err)
			}
		})
	}
	// A generated folder demands the label.
	if _, err := Parse(filepath.Join("vectors", GeneratedDir, "x.json"), []byte(`{"engine":"sglang","cases":[]}`)); err == nil || !strings.Contains(err.Error(), "no origin label") {
		t.Errorf("unlabelled generated file: %v", err)
	}
}

func TestDirAndFiles(t *testing.T) {
	dir := mustDir(t)
	files, err := BlockHashFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		rel, _ := filepath.Rel(dir, f)
		names = append(names, filepath.ToSlash(rel))
	}
	joined := strings.Join(names, " ")
	for _, want := range []string{"vllm/v0.25.1/sha256.json", "vllm/v0.25.1/xxhash_cbor.json", "sglang/v0.5.18/page_hash.json", "generated/router-kvexact-xxh3-v1.json"} {
		if !strings.Contains(joined, want) {
			t.Errorf("BlockHashFiles lacks %s: %v", want, names)
		}
	}
	if strings.Contains(joined, "sample") {
		t.Errorf("event samples listed: %v", names)
	}
	if _, err := BlockHashFiles(t.TempDir()); err == nil {
		t.Error("empty folder accepted")
	}
}

// FuzzParse feeds the parser mutations of real vector files: it must return a file or an error,
// never panic, and a parsed file's token ids are always in range by construction.
func FuzzParse(f *testing.F) {
	dir := mustDir(f)
	for _, rel := range []string{"vllm/v0.25.1/sha256.json", "sglang/v0.5.18/page_hash.json", "generated/vllm-sha256.json"} {
		data, err := os.ReadFile(filepath.Join(dir, rel))
		if err != nil {
			f.Fatal(err)
		}
		// Seeds: the header and first case of each real file (whole files are too large to mutate).
		if i := strings.Index(string(data), `"expected"`); i > 0 {
			if j := strings.Index(string(data[i:]), "}}"); j > 0 {
				f.Add(append(append([]byte{}, data[:i+j+2]...), "]}"...))
			}
		}
	}
	if data, err := os.ReadFile(filepath.Join(dir, "testdata", "valid-project.json")); err == nil {
		f.Add(data) // the project's schema, whole
	}
	f.Add([]byte(`{"engine":"sglang","cases":[{"name":"x","page_size":1,"token_ids":[4294967295],"expected":{"page_hashes_hex":[],"page_hashes_i64":[],"num_full_pages":0}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse("fuzz.json", data)
		if err != nil {
			return
		}
		for _, c := range file.Cases {
			if len(c.Expected.Keys) != len(c.Expected.Digests) {
				t.Fatalf("case %s: %d keys for %d digests", c.Name, len(c.Expected.Keys), len(c.Expected.Digests))
			}
		}
	})
}

// TestEnginesAreContractFamilies ties schema/engines.json to the contracts: every engine it names
// (bar the router's own keys) is a contract family, and every algorithm a contract's engine binding
// offers is listed under that contract's family, so a family or algorithm added on one side only fails.
func TestEnginesAreContractFamilies(t *testing.T) {
	families := map[string]bool{}
	for _, ct := range contracts.All() {
		families[ct.Family] = true
		if !ct.SupportsBinding("engine") {
			continue
		}
		for _, a := range ct.Hash.Algorithms {
			info, err := Algorithm(a)
			if err != nil || info.Engine != ct.Family {
				t.Errorf("%s: algorithm %s: engines.json says %+v (%v), want engine %s", ct.ID, a, info, err, ct.Family)
			}
		}
	}
	for name := range engines.Originals {
		if !families[name] {
			t.Errorf("engines.json: original layout for %q, which no contract names", name)
		}
	}
	for a, info := range engines.Algorithms {
		if info.Engine != EngineKVExact && !families[info.Engine] {
			t.Errorf("engines.json: algorithm %s belongs to %q, which no contract names", a, info.Engine)
		}
	}
	for _, a := range hashcore.Algorithms {
		if _, err := Algorithm(string(a)); err != nil {
			t.Errorf("hash core algorithm %s: %v", a, err)
		}
	}
}
