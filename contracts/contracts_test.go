package contracts

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEmbeddedContractsValidate(t *testing.T) {
	cs, err := registry()
	if err != nil {
		t.Fatalf("embedded contracts: %v", err)
	}
	families := map[string]bool{}
	for _, c := range cs {
		families[c.Family] = true
		if c.Vectors != "" {
			// The vector folder must exist in the repository's vectors/.
			if _, err := os.Stat(filepath.Join("..", "vectors", c.Vectors)); err != nil {
				t.Errorf("%s: vectors folder %q: %v", c.ID, c.Vectors, err)
			}
		}
	}
	for _, f := range Families {
		if !families[f] {
			t.Errorf("no contract for family %s", f)
		}
	}
}

func TestLookup(t *testing.T) {
	for _, tc := range []struct {
		family, version, id string
	}{
		{"vllm", "v0.25.1", "vllm-kv-map-v2"},
		{"vllm", "0.25.1", "vllm-kv-map-v2"},
		{"vllm", "0.24.0", "vllm-kv-map-v2"},
		{"vllm", "0.25.3rc1", "vllm-kv-map-v2"},
		{"vllm", "0.25.1+cu128", "vllm-kv-map-v2"},
		{"vllm", "v0.23.2", "vllm-kv-array-v1"},
		{"vllm", "v0.26.0", "vllm-v0.26"},
		{"vllm", "0.27.1", "vllm-v0.27"},
		{"vllm", "0.28.0", "vllm-v0.28"},
		{"vllm", "0.29.2", "vllm-v0.29"},
		{"vllm", "0.30.1rc1", "vllm-v0.30"},
		{"vllm", "0.19.0", "vllm-kv-array-v1"},
		{"sglang", "0.5.18", "sglang-kv-rank-v1"},
		{"sglang", "v0.5.21", "sglang-v0.5.21"},
		{"sglang", "0.5.21.post1", "sglang-v0.5.21"},
		{"trtllm", "1.2", "trtllm-kv-http-v1"},
		{"trtllm", "1.2.1", "trtllm-kv-http-v1"},
		{"llamacpp", "b10573", "llamacpp-nokv-v1"},
		{"llamacpp", "b10573-d775b89", "llamacpp-nokv-v1"},
	} {
		c, err := Lookup(tc.family, tc.version)
		if err != nil {
			t.Errorf("Lookup(%s, %s): %v", tc.family, tc.version, err)
			continue
		}
		if c.ID != tc.id {
			t.Errorf("Lookup(%s, %s) = %s, want %s", tc.family, tc.version, c.ID, tc.id)
		}
	}
}

// newestVLLM is the contract of the newest pinned vLLM releases, and next a release above every
// contract: the "unknown newer release" cases are derived from the data, so adding a release's
// contract (contracts/data and vectors only) leaves these tests as they are.
func newestVLLM(t *testing.T) (newest *Contract, nextMinor func(patch int) string, nextMajor string) {
	t.Helper()
	for _, c := range All() {
		if c.Family == "vllm" {
			newest = c
		}
	}
	if newest == nil {
		t.Fatal("no vllm contract")
	}
	v, err := ParseVersion(newest.Pin.Release)
	if err != nil || len(v.Nums) < 2 {
		t.Fatalf("pin %q of %s: %v", newest.Pin.Release, newest.ID, err)
	}
	nextMinor = func(patch int) string { return fmt.Sprintf("%d.%d.%d", v.Nums[0], v.Nums[1]+1, patch) }
	return newest, nextMinor, fmt.Sprintf("%d.0.0", v.Nums[0]+1)
}

func TestLookupUnknownListsKnown(t *testing.T) {
	n, next, _ := newestVLLM(t)
	for _, tc := range []struct{ family, version, want string }{
		{"vllm", "0.18.0", "vllm v0.19.0 – v0.23.x"},
		{"vllm", next(0), fmt.Sprintf("nearest pinned: %s (pin %s); to pin %s, verify: %s", n.ID, n.Pin.Release, next(0), n.RecheckList()[0])},
		{"vllm", "0.18.0", "nearest pinned: vllm-kv-array-v1"},
		{"sglang", "0.5.17", "sglang v0.5.18"},
		{"trtllm", "1.3.0rc24", "trtllm 1.2 – 1.2.x"},
		{"trtllm", "1.2.0rc3", "trtllm 1.2"},
		{"ollama", "0.1", "vllm, sglang, trtllm, llamacpp"},
	} {
		_, err := Lookup(tc.family, tc.version)
		var ue *UnknownError
		if !errors.As(err, &ue) {
			t.Errorf("Lookup(%s, %s): want *UnknownError, got %v", tc.family, tc.version, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Lookup(%s, %s) error %q does not list %q", tc.family, tc.version, err, tc.want)
		}
	}
	if _, err := Lookup("vllm", "latest"); err == nil || !strings.Contains(err.Error(), `"latest"`) {
		t.Errorf("bad version: %v", err)
	}
}

func TestUnknownNamesNearest(t *testing.T) {
	n, next, major := newestVLLM(t)
	for _, tc := range []struct{ family, version, nearest string }{
		{"vllm", next(2), n.ID},
		{"vllm", major, n.ID},
		{"vllm", "0.9.2", "vllm-kv-array-v1"},
		{"sglang", "0.5.19", "sglang-kv-rank-v1"},
		{"sglang", "0.5.20", "sglang-kv-rank-v1"},
		{"sglang", "0.5.24", "sglang-v0.5.23"},
	} {
		_, err := Lookup(tc.family, tc.version)
		var ue *UnknownError
		if !errors.As(err, &ue) || ue.Nearest == nil || ue.Nearest.ID != tc.nearest {
			t.Errorf("Lookup(%s, %s): want nearest %s, got %v", tc.family, tc.version, tc.nearest, err)
		}
	}
	if _, err := Lookup("ollama", "1"); err == nil || errors.As(err, new(*UnknownError)) && err.(*UnknownError).Nearest != nil {
		t.Errorf("unknown family names a nearest contract: %v", err)
	}
}

func TestEngineSeed(t *testing.T) {
	s0 := "0"
	for _, tc := range []struct {
		release, algo string
		staged        *string
		want          string // "" = error
	}{
		{"v0.25.1", "sha256", &s0, "0"},
		{"v0.25.1", "sha256", nil, ""},
		{"v0.27.1", "sha256_cbor", nil, ""},
		{"v0.29.0", "sha256", nil, "vllm-none-hash"},
		{"v0.29.0", "sha256_cbor", nil, "vllm-none-hash"},
		{"v0.29.0", "xxhash", nil, ""},
		{"v0.30.0", "xxhash_cbor", nil, ""},
		{"v0.30.0", "xxhash_cbor", &s0, "0"},
	} {
		c, err := Lookup("vllm", tc.release)
		if err != nil {
			t.Fatal(err)
		}
		seed, err := c.EngineSeed(tc.algo, tc.staged)
		switch {
		case tc.want == "" && !errors.Is(err, ErrRandomRoot):
			t.Errorf("%s %s staged %v: want ErrRandomRoot, got %v %v", tc.release, tc.algo, tc.staged, seed, err)
		case tc.want != "" && (err != nil || seed == nil || *seed != tc.want):
			t.Errorf("%s %s staged %v: want %q, got %v %v", tc.release, tc.algo, tc.staged, tc.want, seed, err)
		}
	}
	s, _ := Lookup("sglang", "0.5.18")
	if seed, err := s.EngineSeed("sglang_sha256", nil); seed != nil || err != nil {
		t.Errorf("sglang takes no seed: %v %v", seed, err)
	}
	x, _ := Lookup("vllm", "0.29.0")
	if _, err := x.EngineSeed("xxhash", nil); err == nil || !strings.Contains(err.Error(), "random root for xxhash") {
		t.Errorf("the refusal must name the algorithm: %v", err)
	}
}

func TestContractFacts(t *testing.T) {
	v, _ := Lookup("vllm", "0.25.1")
	if v.Hash.DefaultAlgorithm != "sha256" || !v.SupportsAlgorithm("xxhash_cbor") || v.BlockSize.Default != 16 || v.Hash.Seed != "pythonhashseed" {
		t.Errorf("vllm contract facts wrong: %+v", v.Hash)
	}
	if v.Events.ResidencyRule() != ResidencyCopies {
		t.Errorf("vllm v0.25.1 residency %q, want copies", v.Events.ResidencyRule())
	}
	if n, _ := Lookup("vllm", "0.30.0"); n.Events.ResidencyRule() != ResidencyPresence || n.Hash.DefaultSeed == nil {
		t.Errorf("vllm v0.30 facts wrong: %+v %+v", n.Events, n.Hash)
	}
	s, _ := Lookup("sglang", "0.5.18")
	if s.Hash.Truncation != "first8-be-signed" || s.BlockSize.Default != 1 || s.Events.Int64Keys != "signed" {
		t.Errorf("sglang contract facts wrong: %+v", s)
	}
	tr, _ := Lookup("trtllm", "1.2")
	if tr.SupportsBinding("engine") || tr.Hash.DefaultBinding != "router" || tr.BlockSize.Default != 32 || tr.Pin.CommitVerified {
		t.Errorf("trtllm contract facts wrong: %+v", tr)
	}
	l, _ := Lookup("llamacpp", "b10573")
	if l.HasEvents() || len(l.Hash.Bindings) != 0 || !strings.Contains(l.Hash.NoneReason, "no KV-cache events") {
		t.Errorf("llamacpp contract facts wrong: %+v", l)
	}
}

// TestAPISurfaceFacts: the OpenAI routes each family mounts, as read from its serving code
// (docs/proxy.md): trtllm-serve has no embeddings, vLLM and llama.cpp serve audio transcriptions.
func TestAPISurfaceFacts(t *testing.T) {
	for _, tc := range []struct {
		family, release, path string
		want                  bool
	}{
		{"vllm", "v0.25.1", "/v1/embeddings", true},
		{"vllm", "v0.30.0", "/v1/audio/transcriptions", true},
		{"vllm", "v0.25.1", "/v1/load_lora_adapter", false},
		{"sglang", "v0.5.18", "/v1/embeddings", true},
		{"sglang", "v0.5.18", "/v1/audio/transcriptions", false},
		{"sglang", "v0.5.18", "/v1/tokenize", false},
		{"trtllm", "1.2", "/v1/responses", true},
		{"trtllm", "1.2", "/v1/embeddings", false},
		{"trtllm", "1.2", "/v1/kv_cache_hints", false},
		{"llamacpp", "b10573", "/v1/audio/transcriptions", true},
		{"llamacpp", "b10573", "/v1/messages", false},
	} {
		c, err := Lookup(tc.family, tc.release)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.ServesAPI(tc.path); got != tc.want {
			t.Errorf("%s %s serves %s: %v, want %v", tc.family, tc.release, tc.path, got, tc.want)
		}
	}
	for _, c := range All() {
		for _, p := range requiredAPI {
			if !c.ServesAPI(p) {
				t.Errorf("%s lacks %s", c.ID, p)
			}
		}
	}
}

func TestParseRejects(t *testing.T) {
	good, err := dataFS.ReadFile("data/vllm-kv-map-v2.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		edit func(string) string
		want string
	}{
		{func(s string) string { return strings.Replace(s, "family: vllm", "family: vllmx", 1) }, `family: "vllmx" is not one of`},
		{func(s string) string {
			return strings.Replace(s, "defaultAlgorithm: sha256", "defaultAlgorithm: md5", 1)
		}, `hash.defaultAlgorithm: "md5"`},
		{func(s string) string { return strings.Replace(s, "algorithms: [sha256,", "algorithms: [sha1,", 1) }, `hash.algorithms[0]: "sha1"`},
		{func(s string) string { return strings.Replace(s, "default: 16", "default: 0", 1) }, "blockSize.default: 0"},
		{func(s string) string { return strings.Replace(s, "release: v0.25.1", "release: v0.26.0", 1) }, "pin.release: v0.26.0 is outside"},
		{func(s string) string { return strings.Replace(s, "transport:", "transprot:", 1) }, "transprot"},
		{func(s string) string { return strings.Replace(s, "min: v0.24.0", "min: v0.x", 1) }, "versions.min"},
		{func(s string) string { return strings.Replace(s, "  version: /version\n", "", 1) }, "probes.version"},
		{func(s string) string { return "" }, "empty file"},
		{func(s string) string { return strings.Replace(s, "  - /v1/chat/completions\n", "", 1) }, "api: /v1/chat/completions is missing"},
		{func(s string) string { return strings.Replace(s, "  - /v1/embeddings\n", "  - /v1/responses/*\n", 1) }, `api[3]: "/v1/responses/*" is not an exact OpenAI path`},
		{func(s string) string { return strings.Replace(s, "  - /v1/embeddings\n", "  - /tokenize\n", 1) }, `api[3]: "/tokenize"`},
		{func(s string) string { return strings.Replace(s, "  - /v1/embeddings\n", "  - /v1/models\n", 1) }, `api[3]: "/v1/models" listed twice`},
		{func(s string) string {
			return strings.Replace(s, "  int64Keys: unsigned\n", "  int64Keys: unsigned\n  residency: once\n", 1)
		}, `events.residency: "once"`},
		{func(s string) string {
			return strings.Replace(s, "commit: 752a3a504485790a2e8491cacbb35c137339ad34", "commit: 752a3a5", 1)
		}, "a verified commit is 40 hex digits"},
		{func(s string) string {
			return strings.Replace(s, "  truncation: last8-be-unsigned\n", "  truncation: last8-be-unsigned\n  defaultSeed: {value: x, algorithms: [md5], source: y}\n", 1)
		}, `hash.defaultSeed.algorithms[0]: "md5"`},
		{func(s string) string {
			return strings.Replace(s, "  truncation: last8-be-unsigned\n", "  truncation: last8-be-unsigned\n  defaultSeed: {value: x, algorithms: [sha256]}\n", 1)
		}, "hash.defaultSeed: algorithms and source are required"},
	} {
		edited := tc.edit(string(good))
		if edited == string(good) {
			t.Fatalf("edit for %q changed nothing", tc.want)
		}
		_, err := Parse("x.yaml", []byte(edited))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want error containing %q, got %v", tc.want, err)
		}
	}
}

func TestOverlappingRangesRejected(t *testing.T) {
	a, _ := ByID("vllm-kv-map-v2")
	b := *a
	b.ID, b.file = "dup", "dup.yaml"
	if err := checkSet([]*Contract{a, &b}); err == nil || !strings.Contains(err.Error(), "overlap") {
		t.Errorf("overlap not rejected: %v", err)
	}
}

func TestVersionOrder(t *testing.T) {
	order := []string{"1.2.0rc1", "1.2", "1.2.0.post1", "1.2.1", "1.3.0rc24", "1.3.0"}
	for i := 1; i < len(order); i++ {
		a, _ := ParseVersion(order[i-1])
		b, _ := ParseVersion(order[i])
		if a.Compare(b) >= 0 {
			t.Errorf("%s should sort before %s", order[i-1], order[i])
		}
	}
	for _, bad := range []string{"", "v", "1.x", "1.2foo"} {
		if _, err := ParseVersion(bad); err == nil {
			t.Errorf("ParseVersion(%q) accepted", bad)
		}
	}
}

// TestUnverifiedPinsCarryArtifact: a pin whose tag commit was not verified names the released package
// its facts were read from (file, version, sha256), for every family the package index serves.
// TensorRT-LLM (the index holds only a stub) and llama.cpp (no Python package) have none to name.
func TestUnverifiedPinsCarryArtifact(t *testing.T) {
	for _, c := range All() {
		if c.Family == "trtllm" || c.Family == "llamacpp" {
			continue
		}
		if !c.Pin.CommitVerified && c.Pin.Artifact == nil {
			t.Errorf("%s: commitVerified false and no pin.artifact", c.ID)
		}
	}
}

func TestArtifactValidation(t *testing.T) {
	base, err := dataFS.ReadFile("data/vllm-v0.33.yaml")
	if err != nil {
		t.Fatal(err)
	}
	good := "sha256: 4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
	for _, tc := range []struct{ old, new, want string }{
		{good, "sha256: 4b6bdec4", "pin.artifact.sha256"},
		{`version: "0.33.0"`, `version: "0.32.0"`, "is not the pinned release"},
		{"file: vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl", "file: a/b.whl", "pin.artifact.file"},
	} {
		data := strings.Replace(string(base), tc.old, tc.new, 1)
		if data == string(base) {
			t.Fatalf("%q not in the contract", tc.old)
		}
		if _, err := Parse("x.yaml", []byte(data)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s → %s: %v, want %q", tc.old, tc.new, err, tc.want)
		}
	}
	if _, err := Parse("x.yaml", base); err != nil {
		t.Fatal(err)
	}
	data := strings.Replace(string(base), "  scheme: tagged", "  scheme: nested", 1)
	if _, err := Parse("x.yaml", []byte(data)); err == nil || !strings.Contains(err.Error(), "extraKeys.scheme") {
		t.Errorf("bad scheme: %v", err)
	}
}
