package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/vectors"
)

// testImpls is both implementations when the C core is built, else the Go reference alone (the
// command itself refuses to run then; TestVectorsVerifyRefusesWithoutC covers that).
func testImpls(t *testing.T) []hashcore.Impl {
	if hashcore.ImplC.Available() {
		return []hashcore.Impl{hashcore.ImplGo, hashcore.ImplC}
	}
	t.Log("C core not built: running the command logic with the Go reference only")
	return []hashcore.Impl{hashcore.ImplGo}
}

func vectorFile(t *testing.T, rel string) string {
	t.Helper()
	dir, err := vectors.Dir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, rel)
}

func run(t *testing.T, files ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := vectorsVerify(files, &out, &errb, testImpls(t))
	return code, out.String(), errb.String()
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

func TestVectorsVerifyGoodFiles(t *testing.T) {
	code, out, errs := run(t, vectorFile(t, "vllm/v0.25.1/sha256.json"), vectorFile(t, "sglang/v0.5.18/page_hash.json"))
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s", code, errs, out)
	}
	if got := lastLine(out); got != "132 passed, 0 failed" { // 71 vLLM + 61 SGLang
		t.Errorf("last line %q", got)
	}
	if n := strings.Count(out, "skipped: not reproducible"); n != 1 {
		t.Errorf("%d skipped lines, want 1 (the unseeded case):\n%s", n, out)
	}
}

func TestVectorsVerifyCorruptedHash(t *testing.T) {
	data, err := os.ReadFile(vectorFile(t, "vllm/v0.25.1/sha256_cbor.json"))
	if err != nil {
		t.Fatal(err)
	}
	const good, bad = "12687895063098490012", "12687895063098490013"
	if !bytes.Contains(data, []byte(good)) {
		t.Fatal("fixture value not found")
	}
	bad1 := bytes.Replace(data, []byte(good), []byte(bad), 1)
	path := filepath.Join(t.TempDir(), "sha256_cbor.json")
	if err := os.WriteFile(path, bad1, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ := run(t, path)
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	var fails []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "expected ") {
			fails = append(fails, l)
		}
	}
	if len(fails) != 1 {
		t.Fatalf("%d failure lines, want 1:\n%s", len(fails), out)
	}
	want := regexp.MustCompile(`^` + regexp.QuoteMeta(path) + `: exact_one_block_bs16: block_hashes_u64\[0\]: impl go: expected ` + bad + `, got ` + good)
	if !want.MatchString(fails[0]) {
		t.Errorf("failure line %q", fails[0])
	}
	if got := lastLine(out); got != "70 passed, 1 failed" {
		t.Errorf("last line %q", got)
	}
}

func TestVectorsVerifyMalformed(t *testing.T) {
	dir := t.TempDir()
	badToken := filepath.Join(dir, "bad-token.json")
	os.WriteFile(badToken, []byte(`{"engine":"sglang","cases":[{"name":"x","page_size":4,"token_ids":[1,4294967296],"expected":{"page_hashes_hex":[],"page_hashes_i64":[],"num_full_pages":0}}]}`), 0o644)
	notJSON := filepath.Join(dir, "truncated.json")
	os.WriteFile(notJSON, []byte(`{"engine":"vllm","cases":[`), 0o644)
	notVectors := filepath.Join(dir, "other.json")
	os.WriteFile(notVectors, []byte(`{"engine":"trtllm","samples":[]}`), 0o644)
	missing := filepath.Join(dir, "missing.json")
	good := vectorFile(t, "vllm/v0.25.1/xxhash.json")

	code, out, errs := run(t, badToken, notJSON, good, notVectors, missing)
	if code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	for _, want := range []string{
		badToken + ": not checked: " + badToken + ": $.cases[0].token_ids[1]: token id 4294967296 outside 0..4294967295",
		notJSON + ": not checked: " + notJSON + ": $: invalid JSON",
		notVectors + ": not checked: " + notVectors + `: $.engine: not a block-hash vector file: engine "trtllm"`,
		missing + ": not checked:",
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
	// Every file is processed: the good one still counts.
	if got := lastLine(out); got != "71 passed, 0 failed" {
		t.Errorf("last line %q", got)
	}
}

func TestVectorsVerifyRefusesWithoutC(t *testing.T) {
	if hashcore.ImplC.Available() {
		t.Skip("the C core is built; the refusal path cannot be reached")
	}
	var out, errb bytes.Buffer
	code := vectorsVerify([]string{vectorFile(t, "vllm/v0.25.1/sha256.json")}, &out, &errb, []hashcore.Impl{hashcore.ImplGo, hashcore.ImplC})
	if code != 2 || !strings.Contains(errb.String(), "without cgo") || out.Len() != 0 {
		t.Errorf("exit %d, stderr %q, stdout %q", code, errb.String(), out.String())
	}
}

func TestVectorsVerifyNoArgs(t *testing.T) {
	var out, errb bytes.Buffer
	if code := vectorsVerify(nil, &out, &errb, nil); code != 2 || !strings.Contains(errb.String(), "usage") {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
}

// TestVectorsVerifyBothSchemas: the command reads a project-schema file and an engine-produced
// original in one run, and refuses a project file that breaks the JSON Schema (naming the path).
func TestVectorsVerifyBothSchemas(t *testing.T) {
	code, out, errs := run(t, vectorFile(t, "vllm/v0.29.0/sha256.json"), vectorFile(t, "sglang/v0.5.18/page_hash.json"))
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s", code, errs, out)
	}
	if got := lastLine(out); got != "135 passed, 0 failed" { // 74 vLLM v0.29.0 (seed-unset roots resolved) + 61 SGLang
		t.Errorf("last line %q", got)
	}
	broken := vectorFile(t, "testdata/broken-token.json")
	code, out, errs = run(t, broken)
	want := broken + ": not checked: " + broken + ": $.testGroups[0].tests[0].tokens[0]: does not match " + vectors.SchemaName
	if code != 2 || !strings.Contains(errs, want) || lastLine(out) != "0 passed, 0 failed" {
		t.Errorf("exit %d, stderr %q (want %q), stdout %q", code, errs, want, out)
	}
}

// TestVectorsVerifySampleFiles: event-payload sample files, the project's (against the JSON
// Schema) and an engine-produced original, are read by the sample loader and reported; one that
// breaks the JSON Schema is refused with its path.
func TestVectorsVerifySampleFiles(t *testing.T) {
	own, orig := vectorFile(t, "vllm/v0.28.0/events-samples.json"), vectorFile(t, "trtllm/v1.2/kv-cache-events-samples.json")
	code, out, errs := run(t, own, orig)
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s", code, errs, out)
	}
	for _, want := range []string{own + ": 5 event-payload samples read (" + vectors.SchemaName + ")", orig + ": 6 event-payload samples read"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	raw, err := os.ReadFile(own)
	if err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(t.TempDir(), "events-samples.json")
	os.WriteFile(broken, bytes.Replace(raw, []byte(`"seqFrame": "0000000000000001"`), []byte(`"seqFrame": "01"`), 1), 0o644)
	code, _, errs = run(t, broken)
	want := broken + ": not checked: " + broken + ": $.testGroups[0].tests[1].frames.seqFrame: does not match " + vectors.SchemaName
	if code != 2 || !strings.Contains(errs, want) {
		t.Errorf("exit %d, stderr %q (want %q)", code, errs, want)
	}
}
