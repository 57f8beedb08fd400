package kvbench

import (
	"strings"
	"testing"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

// TestSmallPoolWorkload: the small-pool workload is the real-vLLM benchmark's situation — six
// shared prefixes of about 38 blocks of 16 tokens on 3 engines of 96 blocks, so two fit an engine
// and three do not.
func TestSmallPoolWorkload(t *testing.T) {
	toks := tokenize.NewPool("")
	tok, err := toks.Get("llama3")
	if err != nil {
		t.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	sh := DefaultShape()
	w, err := BuildWorkload(WorkloadSmallPool, 1, 300, 50, sh, "llama3", tok)
	if err != nil {
		t.Fatal(err)
	}
	prefixes := map[string]bool{}
	for _, q := range w.Requests {
		p, _, _ := strings.Cut(string(q.Body), "\\n\\nUser:")
		prefixes[p] = true
		if blocks := len(q.Tokens) / 16; blocks < 38 || blocks > 48 {
			t.Fatalf("a prompt of %d blocks, want a 38-block prefix and a short question", blocks)
		}
	}
	if len(prefixes) != sh.SmallPoolPrefixes {
		t.Fatalf("%d distinct prefixes in 300 requests, want %d", len(prefixes), sh.SmallPoolPrefixes)
	}
	ps := DefaultPoolShape().ShapeFor(WorkloadSmallPool)
	if ps.Endpoints != 3 || ps.CapacityBlocks != 96 || 2*38 > ps.CapacityBlocks || 3*38 <= ps.CapacityBlocks {
		t.Fatalf("pool %d engines × %d blocks, want 3 × 96", ps.Endpoints, ps.CapacityBlocks)
	}
}
