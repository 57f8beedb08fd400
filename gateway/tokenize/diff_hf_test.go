package tokenize

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestDifferentialHFTokenizers: fresh random texts (the seed is logged; KVEXACT_DIFF_SEED replays,
// KVEXACT_DIFF_N sizes) encoded here and by HuggingFace tokenizers itself (npm tokenizers 0.23.2
// through scripts/encode-oracle.js), for every model with files, both add_special_tokens values.
// With add_special_tokens the expected ids follow transformers: where tokenizer_config.json sets
// add_bos_token/add_eos_token, [bos] + ids + [eos] replaces tokenizer.json's post-processor.
func TestDifferentialHFTokenizers(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..", "..")
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("the tokenizer oracle needs node (apt-get install nodejs npm)")
	}
	if _, err := os.Stat(filepath.Join(repo, ".cache/node/node_modules/tokenizers")); err != nil && os.Getenv("KVEXACT_NODE_TOKENIZERS") == "" {
		t.Skip("the tokenizer oracle needs npm tokenizers: npm install --prefix .cache/node tokenizers@0.23.2")
	}
	seed, n := diffSeed(t)
	models := 0
	for _, model := range []string{"llama3", "qwen3", "deepseek_v3", "mistral7b", "gptoss", "gemma3"} {
		tok := loadModel(t, model)
		if tok == nil {
			continue
		}
		models++
		r := rand.New(rand.NewPCG(seed, uint64(models)))
		texts := make([]string, n)
		for i := range texts {
			texts[i] = tokenizerText(r)
		}
		in, _ := json.Marshal(map[string]any{"tokenizer": filepath.Join(tok.Dir(), "tokenizer.json"), "texts": texts})
		cmd := exec.Command("node", filepath.Join(repo, "scripts", "encode-oracle.js"))
		cmd.Stdin, cmd.Stderr = strings.NewReader(string(in)), os.Stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: oracle: %v", model, err)
		}
		var want [][2][]uint32
		if err := json.Unmarshal(out, &want); err != nil || len(want) != len(texts) {
			t.Fatalf("%s: oracle answer: %v", model, err)
		}
		before, after, source := tok.PostProcessorSummary()
		transformers := strings.Contains(source, "transformers")
		bad := 0
		for i, s := range texts {
			for j, special := range []bool{false, true} {
				exp := want[i][j]
				if special && transformers {
					exp = slices.Concat(before, want[i][0], after)
				}
				got, err := tok.Encode(s, special)
				if err != nil || !slices.Equal(got, exp) {
					bad++
					t.Errorf("%s special=%v text %+q:\n ours %v (%v)\n   HF %v", model, special, s, got, err, exp)
				}
			}
			if bad >= 10 {
				t.Fatalf("%s: stopping after %d mismatches", model, bad)
			}
		}
		t.Logf("%s: %d texts × 2, %d mismatches", model, len(texts), bad)
	}
	if models == 0 {
		t.Skip("no tokenizer files found (KVEXACT_TOKENIZERS)")
	}
}

var tokWords = []string{"the", " The", "hello", "HELLO", "world", "don't", "I'M", "we'll", "you'VE", "it's", "straße", "naïve",
	"café", "日本語", "中文字符", "한국어", "😀", "👍🏽", "🇺🇸", "ﬁle", "İ", "Σας", "привет", "مرحبا", "שלום", "नमस्ते", "ไทย",
	"123", "4567", "3.14159", "1,000,000", "0x1F", "#", "$", "%", "&&", "->", "::", "...", "``", "'''", "\"\"\"",
	"<tag>", "</tag>", "{\"a\": 1}", "snake_case", "camelCase", "e\u0301", "a\u0308\u0301", "x\u0323\u0302", "\u1100\u1161\u11a8",
	"Å", "Å", "\u00a0", "\u3000", "\u200b", "\ufeff", "\t", "\n", "\r\n", "  ", "\n\n", "   \n ", "\u2028"}

// tokSpecials are added tokens of the models here (text for the others).
var tokSpecials = []string{"<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|im_start|>", "<|im_end|>",
	"<think>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<s>", "</s>", "[INST]", "<|endoftext|>", "<|start|>", "<|message|>"}

// tokenizerText is a random text, sometimes carrying one of the models' added tokens or a long run
// of combining marks (HF's NFC without the stream-safe joiner).
func tokenizerText(r *rand.Rand) string {
	var b strings.Builder
	for range r.IntN(24) {
		switch k := r.IntN(20); {
		case k == 0:
			b.WriteString(tokSpecials[r.IntN(len(tokSpecials))])
		case k == 1:
			b.WriteString("a")
			for range 25 + r.IntN(20) {
				b.WriteRune([]rune("\u0300\u0301\u0316\u0323\u0345\u05b0")[r.IntN(6)])
			}
		case k == 2:
			fmt.Fprintf(&b, "%d", r.Int64N(1e12))
		default:
			b.WriteString(tokWords[r.IntN(len(tokWords))])
		}
		if r.IntN(3) == 0 {
			b.WriteByte(' ')
		}
	}
	return b.String()
}
