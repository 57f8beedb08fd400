package tokenize

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const refDir = "../../../shared/tokenizer-ref"

// testRoots are the tokenizer folders the tests look in, in DefaultRoots' order.
func testRoots() []string {
	var roots []string
	if r := os.Getenv("KVEXACT_TOKENIZERS"); r != "" {
		roots = append(roots, r)
	}
	return append(roots, "../../../shared/tokenizers", "../../.cache/tokenizers")
}

func findTokenizerDir(t *testing.T, model string) string {
	t.Helper()
	for _, r := range testRoots() {
		d := filepath.Join(r, model)
		if _, err := os.Stat(filepath.Join(d, "tokenizer_config.json")); err == nil {
			return d
		}
	}
	t.Skipf("tokenizer folder for %s not found under %v (gemma3: run the fetch script)", model, testRoots())
	return ""
}

func loadConfig(t *testing.T, model string) *Config {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(findTokenizerDir(t, model), "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

type refChatFile struct {
	ContentFormat *string       `json:"content_format"`
	ChatCases     []refChatCase `json:"chat_cases"`
}

func readChatCases(t *testing.T, model string) refChatFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(refDir, model+".json"))
	if err != nil {
		t.Skipf("reference data not available: %v", err)
	}
	var f refChatFile
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestRenderReferenceChats renders every chat case of the reference data (Python jinja2 after vLLM's
// preprocessing) and requires byte-identical text, or the same template error.
func TestRenderReferenceChats(t *testing.T) {
	for _, model := range []string{"llama3", "qwen3", "deepseek_v3", "gemma3"} {
		t.Run(model, func(t *testing.T) {
			ref := readChatCases(t, model)
			cfg := loadConfig(t, model)
			ct, err := NewChatTemplate(cfg, ChatOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(ref.ChatCases) == 0 {
				t.Fatal("no chat cases")
			}
			for _, c := range ref.ChatCases {
				req, err := ParseChatRequest([]byte(*c.RequestJSON))
				if err != nil {
					t.Fatalf("%s: %v", c.ID, err)
				}
				if ref.ContentFormat != nil {
					f, err := ct.ContentFormat(req)
					if err != nil || string(f) != *ref.ContentFormat {
						t.Errorf("%s: content format %q, %v; want %q", c.ID, f, err, *ref.ContentFormat)
					}
				}
				got, err := ct.Render(req)
				if c.Error != nil {
					want := (*c.Error)[strings.Index(*c.Error, ": ")+2:]
					if !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), want) {
						t.Errorf("%s: want template error %q, got %q, %v", c.ID, *c.Error, got, err)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", c.ID, err)
					continue
				}
				if got != *c.Rendered {
					t.Errorf("%s: rendered text %s", c.ID, diffText(*c.Rendered, got))
				}
			}
		})
	}
}
