package kvbench

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

// BenchmarkDecision times one KV-exact decision (tokenize + hash + score + load law, via
// Router.Explain) for 1k- and 8k-token prompts resident in a warm inventory of 4 endpoints.
func BenchmarkDecision(b *testing.B) {
	toks := tokenize.NewPool("")
	if _, err := toks.Get("llama3"); err != nil {
		b.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	for _, n := range []int{1024, 8192} {
		b.Run(fmt.Sprintf("prompt=%d", n), func(b *testing.B) {
			f, stop, err := DecisionBenchmark(context.Background(), toks, "llama3", n)
			if err != nil {
				b.Fatal(err)
			}
			defer stop()
			b.ResetTimer()
			f(b)
		})
	}
}
