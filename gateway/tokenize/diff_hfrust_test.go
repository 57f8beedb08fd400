//go:build hftokenizers

package tokenize

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	hf "github.com/daulet/tokenizers"
)

// TestDifferentialHFRust: fresh random texts (the seed is logged; KVEXACT_DIFF_SEED replays,
// KVEXACT_DIFF_N sizes) encoded here and by HuggingFace's Rust tokenizers crate itself
// (github.com/daulet/tokenizers, its library built by scripts/hf-tokenizers.sh; build tag
// hftokenizers, which make test sets when the library exists), for every model with files, both
// add_special_tokens values. As in TestDifferentialHFTokenizers, where tokenizer_config.json sets
// add_bos_token/add_eos_token, transformers' [bos] + ids + [eos] replaces the post-processor.
func TestDifferentialHFRust(t *testing.T) {
	seed, n := diffSeed(t)
	models := 0
	for _, model := range []string{"llama3", "qwen3", "deepseek_v3", "mistral7b", "gptoss", "gemma3"} {
		tok := loadModel(t, model)
		if tok == nil {
			continue
		}
		models++
		ref, err := hf.FromFile(tok.Dir() + "/tokenizer.json")
		if err != nil {
			t.Fatalf("%s: HF Rust tokenizer: %v", model, err)
		}
		r := rand.New(rand.NewPCG(seed, uint64(100+models)))
		before, after, source := tok.PostProcessorSummary()
		transformers := strings.Contains(source, "transformers")
		bad := 0
		for i := 0; i < n; i++ {
			s := tokenizerText(r)
			plain, _ := ref.Encode(s, false)
			for _, special := range []bool{false, true} {
				exp := plain
				if special {
					if transformers {
						exp = slices.Concat(before, plain, after)
					} else {
						exp, _ = ref.Encode(s, true)
					}
				}
				got, err := tok.Encode(s, special)
				if err != nil || !slices.Equal(got, exp) {
					bad++
					t.Errorf("%s special=%v text %+q:\n ours %v (%v)\n   HF %v", model, special, s, got, err, exp)
				}
			}
			if bad >= 10 {
				ref.Close()
				t.Fatalf("%s: stopping after %d mismatches", model, bad)
			}
		}
		ref.Close()
		t.Logf("%s: %d texts × 2, %d mismatches (HF Rust tokenizers)", model, n, bad)
	}
	if models == 0 {
		t.Skip("no tokenizer files found (KVEXACT_TOKENIZERS)")
	}
}
