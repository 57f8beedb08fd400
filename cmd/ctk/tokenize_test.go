package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const tokRoot = "../../../shared/tokenizers"

// smallRef writes a reference file holding the first few text and chat cases of qwen3.json, with
// mutate applied to its decoded form.
func smallRef(t *testing.T, mutate func(map[string]any)) string {
	t.Helper()
	data, err := os.ReadFile("../../../shared/tokenizer-ref/qwen3.json")
	if err != nil {
		t.Skipf("reference data not available: %v", err)
	}
	if _, err := os.Stat(filepath.Join(tokRoot, "qwen3", "tokenizer.json")); err != nil {
		t.Skipf("qwen3 tokenizer folder not available: %v", err)
	}
	var ref map[string]any
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	ref["cases"] = ref["cases"].([]any)[:6]
	ref["chat_cases"] = ref["chat_cases"].([]any)[:4]
	if mutate != nil {
		mutate(ref)
	}
	out, _ := json.Marshal(ref)
	p := filepath.Join(t.TempDir(), "qwen3.json")
	if err := os.WriteFile(p, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func runCheck(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := runTokenize(args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

func TestTokenizeCheckPasses(t *testing.T) {
	p := smallRef(t, nil)
	// Flags after the file, as well as before.
	code, out, errs := runCheck("--check", p, "--tokenizers", tokRoot)
	if code != 0 || !strings.HasSuffix(out, "10 passed, 0 failed\n") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestTokenizeCheckFailsOnChangedID(t *testing.T) {
	p := smallRef(t, func(ref map[string]any) {
		c := ref["cases"].([]any)[2].(map[string]any)
		ids := c["ids"].([]any)
		ids[1] = ids[1].(float64) + 1
	})
	code, out, _ := runCheck("--tokenizers="+tokRoot, "--check", p)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 1 || lines[len(lines)-1] != "9 passed, 1 failed" {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
	if !strings.Contains(out, "ids differ at index 1") || !strings.Contains(out, "prose-003 [add_special_tokens=true]") {
		t.Errorf("failing line does not name the case and index: %q", out)
	}
}

func TestTokenizeCheckWrongTokenizerFailsEveryCase(t *testing.T) {
	p := smallRef(t, func(ref map[string]any) {
		ref["files"].(map[string]any)["tokenizer.json"].(map[string]any)["sha256"] = strings.Repeat("0", 64)
	})
	code, out, _ := runCheck("--check", p, "--tokenizers", tokRoot)
	if code != 1 || !strings.HasSuffix(out, "0 passed, 10 failed\n") || !strings.Contains(out, "sha256") {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
}

func TestTokenizeCheckMissingFolderIsSkipped(t *testing.T) {
	p := smallRef(t, func(ref map[string]any) { ref["model"] = "no-such-model" })
	code, out, _ := runCheck("--check", p, "--tokenizers", tokRoot)
	if code != 0 || !strings.Contains(out, "skipped") || !strings.HasSuffix(out, "0 passed, 0 failed\n") {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
}

func TestTokenizeCheckMalformed(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(p, []byte(`{"model": "qwen3", "cases": [`), 0o644)
	for _, args := range [][]string{{"--check", p}, {"--check", filepath.Join(t.TempDir(), "missing.json")}, {"--check"}, {"--bogus"}, {"--check", p, "--chat"}} {
		if code, out, errs := runCheck(args...); code != 2 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
}

func TestTokenizeStdin(t *testing.T) {
	dir := filepath.Join(tokRoot, "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("qwen3 tokenizer folder not available: %v", err)
	}
	for _, c := range []struct {
		args  []string
		input string
		want  string
	}{
		{[]string{"--tokenizer", dir}, "Hello world", "[9707,1879]"},
		{[]string{"--tokenizer", dir, "--chat"}, `{"messages":[{"role":"user","content":"Hello!"}]}`,
			fmt.Sprint("[151644,872,198,9707,0,151645,198,151644,77091,198]")},
	} {
		var out, errb bytes.Buffer
		code := runTokenize(c.args, strings.NewReader(c.input), &out, &errb)
		if code != 0 || strings.TrimSpace(out.String()) != c.want {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %s", c.args, code, out.String(), errb.String(), c.want)
		}
	}
}
