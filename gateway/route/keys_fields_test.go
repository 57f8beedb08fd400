package route

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/rules"
)

func i64(n int64) *int64 { return &n }

// truncate_prompt_tokens: honoured where vLLM's result is known, a miss where it is not.
func TestTruncatePromptTokens(t *testing.T) {
	ids := []uint32{1, 2, 3, 4, 5}
	for _, tc := range []struct {
		n    *int64
		side string
		want []uint32
		miss Miss
	}{
		{nil, "", ids, MissNone},
		{i64(5), "", ids, MissNone},
		{i64(9), "right", ids, MissNone},
		{i64(2), "left", []uint32{4, 5}, MissNone},
		{i64(2), "right", []uint32{1, 2}, MissNone},
		{i64(0), "right", []uint32{}, MissNone},
		{i64(2), "", nil, MissTruncation},
		{i64(-1), "left", nil, MissTruncation},
	} {
		got, m, reason := (&PromptKeyer{}).truncate(ids, &Request{TruncatePromptTokens: tc.n, TruncationSide: tc.side})
		if m != tc.miss || (m == MissNone && !slices.Equal(got, tc.want)) || (m != MissNone && reason == "") {
			t.Errorf("n=%v side=%q: %v %v %q, want %v %v", tc.n, tc.side, got, m, reason, tc.want, tc.miss)
		}
	}
	// A family whose tokenizer truncates from the left (vLLM): no truncation_side keeps the last n.
	left := &PromptKeyer{TruncationSide: "left"}
	if got, m, _ := left.truncate(ids, &Request{TruncatePromptTokens: i64(2)}); m != MissNone || !slices.Equal(got, []uint32{4, 5}) {
		t.Errorf("left-truncating family, n=2: %v %v, want [4 5]", got, m)
	}
}

// TestTruncateAroundSpecial: the tokenizer's left truncation of a text keeps its special tokens
// (a BOS here) and the text's last n − 1 tokens; too small an n, or special tokens that do not
// surround the text's tokens, is a miss.
func TestTruncateAroundSpecial(t *testing.T) {
	with, bare := []uint32{100, 1, 2, 3, 4, 5}, []uint32{1, 2, 3, 4, 5}
	if got, m, _ := truncateAroundSpecial(with, bare, 3); m != MissNone || !slices.Equal(got, []uint32{100, 4, 5}) {
		t.Errorf("BOS + last 2: got %v %v", got, m)
	}
	if got, m, _ := truncateAroundSpecial([]uint32{100, 1, 2, 3, 101}, []uint32{1, 2, 3}, 4); m != MissNone || !slices.Equal(got, []uint32{100, 2, 3, 101}) {
		t.Errorf("BOS + last 2 + EOS: got %v %v", got, m)
	}
	if got, m, _ := truncateAroundSpecial(with, bare, 1); m != MissNone || !slices.Equal(got, []uint32{100}) {
		t.Errorf("n = special tokens: got %v %v, want the BOS alone", got, m)
	}
	if _, m, r := truncateAroundSpecial(with, bare, 0); m != MissTruncation || r == "" {
		t.Errorf("n below the special tokens: %v %q, want a truncation miss", m, r)
	}
	if _, m, r := truncateAroundSpecial([]uint32{100, 9, 2, 3}, []uint32{1, 2, 3}, 2); m != MissTruncation || r == "" {
		t.Errorf("special tokens not around the text: %v %q, want a truncation miss", m, r)
	}
}

// Extra keys per engine family: vLLM hashes LoRA and salt; SGLang hashes the salt (engine binding:
// the chain root; router binding: block 0's extras, as ingest) and not LoRA; TensorRT-LLM's events
// carry neither.
func TestKeyerExtrasPerFamily(t *testing.T) {
	pool, tok := llama3(t)
	prompt := "The quick brown fox jumps over the lazy dog, again and again and again, until the blocks fill up."
	ids, _ := tok.Encode(prompt, true)
	sg, err := hashcore.New(hashcore.Binding{Algorithm: hashcore.SGLangSHA256, BlockSize: 4}, hashcore.Default())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sglang := &PromptKeyer{Pool: pool, Hasher: sg}
	salted, _, m, _ := sglang.Keys(ctx, &Request{Model: "llama3", Prompt: prompt, CacheSalt: "tenant"})
	want, _ := sg.Keys(ids, &hashcore.Extras{CacheSalt: "tenant"}, nil)
	if m != MissNone || !slices.Equal(salted, want) {
		t.Fatalf("sglang salted keys: %v", m)
	}
	if _, _, m, _ := sglang.Keys(ctx, &Request{Model: "llama3", Prompt: prompt, LoRAName: "a"}); m != MissLoRA {
		t.Fatalf("sglang lora: %v, want %v", m, MissLoRA)
	}
	sgRouter := &PromptKeyer{Pool: pool, RouterBlockSize: 4, SaltedRoot: true}
	got, _, m, _ := sgRouter.Keys(ctx, &Request{Model: "llama3", Prompt: prompt, CacheSalt: "tenant"})
	wantR, _ := hashcore.RouterKeys(0, ids, 4, [][]any{{"tenant"}}, nil)
	if m != MissNone || !slices.Equal(got, wantR) {
		t.Fatalf("sglang router salted keys: %v", m)
	}
	trt := &PromptKeyer{Pool: pool, RouterBlockSize: 4}
	if _, _, m, _ := trt.Keys(ctx, &Request{Model: "llama3", Prompt: prompt, CacheSalt: "tenant"}); m != MissCacheSalt {
		t.Fatalf("trtllm salt: %v", m)
	}
	vr := &PromptKeyer{Pool: pool, RouterBlockSize: 4, BlockExtras: true}
	got, _, m, _ = vr.Keys(ctx, &Request{Model: "llama3", Prompt: prompt, LoRAName: "a", CacheSalt: "s"})
	ex, _ := hashcore.ExtraKeys(&hashcore.Extras{LoRAName: "a", CacheSalt: "s"}, len(ids), 4)
	wantV, _ := hashcore.RouterKeys(0, ids, 4, ex, nil)
	if m != MissNone || !slices.Equal(got, wantV) {
		t.Fatalf("vllm router lora+salt keys: %v", m)
	}
}

// vLLM v0.31.0+ (tagged extra keys, engine binding): a LoRA request is keyed with the tagged
// ("lora", name, path) key; without the adapter's path it is a named lora miss.
func TestKeyerTaggedLoRAPath(t *testing.T) {
	pool, tok := llama3(t)
	prompt := "The quick brown fox jumps over the lazy dog, again and again and again, until the blocks fill up."
	ids, _ := tok.Encode(prompt, true)
	seed := "0"
	h, err := hashcore.New(hashcore.Binding{Algorithm: hashcore.VLLMSHA256, BlockSize: 4, Seed: &seed}, hashcore.Default())
	if err != nil {
		t.Fatal(err)
	}
	k := &PromptKeyer{Pool: pool, Hasher: h, BlockExtras: true, TaggedExtras: true}
	ctx := context.Background()
	got, _, m, _ := k.Keys(ctx, &Request{Model: "llama3", Prompt: prompt, LoRAName: "a", LoRAPath: "/adapters/a"})
	want, _ := h.Keys(ids, &hashcore.Extras{LoRAName: "a", LoRAPath: "/adapters/a", Tagged: true}, nil)
	other, _ := h.Keys(ids, &hashcore.Extras{LoRAName: "a", LoRAPath: "/adapters/b", Tagged: true}, nil)
	if m != MissNone || !slices.Equal(got, want) || slices.Equal(got, other) {
		t.Fatalf("tagged lora keys: miss %v, equal to the path's keys %v, to another path's %v", m, slices.Equal(got, want), slices.Equal(got, other))
	}
	if _, _, m, reason := k.Keys(ctx, &Request{Model: "llama3", Prompt: prompt, LoRAName: "a"}); m != MissLoRA || !strings.Contains(reason, "loraPath") {
		t.Fatalf("tagged lora without a path: %v %q, want %v naming loraPath", m, reason, MissLoRA)
	}
}

// A request for a rule's adapter is keyed as its base model with its LoRA name; the caller's
// request is left alone.
func TestRouterAdapt(t *testing.T) {
	rt := &Router{rule: ruleWithAdapter()}
	in := &Request{Model: "sql-lora"}
	out := rt.adapt(in)
	if out.Model != "llama3" || out.LoRAName != "sql-lora-v2" || out.LoRAPath != "/adapters/sql" || in.Model != "sql-lora" || in.LoRAName != "" {
		t.Fatalf("adapt: %+v from %+v", out, in)
	}
	if rt.adapt(&Request{Model: "llama3"}).LoRAName != "" {
		t.Fatal("base model got a LoRA name")
	}
}

func ruleWithAdapter() *rules.Rule {
	return &rules.Rule{Name: "r", Models: []string{"llama3"}, Adapters: []rules.Adapter{{Name: "sql-lora", Base: "llama3", LoRAName: "sql-lora-v2", LoRAPath: "/adapters/sql"}}}
}
