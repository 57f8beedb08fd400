package vllm_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

func TestProberAgainstSimulator(t *testing.T) {
	dir, err := tokenize.FindModelDir(tokenize.DefaultRoots(), "llama3")
	if err != nil {
		t.Skipf("the llama3 tokenizer is not available (run make tokenizers): %v", err)
	}
	seed := "0"
	e, err := sim.New(sim.Config{Family: "vllm", Release: "v0.25.1", Model: dir, ServedModelName: "llama3", Seed: &seed,
		PublishAddr: "tcp://*:0", BlockSize: 32, Algorithm: "sha256_cbor", DevMode: true, PrefillPerToken: time.Microsecond, DecodePerToken: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	p := vllm.NewProber(e.URL(), nil)
	if v, err := p.Version(ctx); err != nil || v != "0.25.1" {
		t.Errorf("Version = %q, %v; want 0.25.1", v, err)
	}
	if m, err := p.Models(ctx); err != nil || len(m) != 1 || m[0] != "llama3" {
		t.Errorf("Models = %v, %v; want [llama3]", m, err)
	}
	ids, err := p.Tokenize(ctx, "llama3", "hello world", true)
	if err != nil || len(ids) != 3 || ids[0] != 128000 {
		t.Errorf("Tokenize = %v, %v; want BOS and two tokens", ids, err)
	}
	cfg, err := p.Config(ctx)
	if err != nil || cfg.BlockSize != 32 || cfg.Algorithm != "sha256_cbor" {
		t.Errorf("Config = %+v, %v; want block size 32, sha256_cbor from cache_config_info", cfg, err)
	}
	c, err := p.Complete(ctx, engines.CompletionRequest{Model: "llama3", Prompt: "hello world", MaxTokens: 1})
	if err != nil || c.PromptTokens != 3 {
		t.Errorf("Complete = %+v, %v; want 3 prompt tokens", c, err)
	}
	if err := p.Clear(ctx); err != nil {
		t.Errorf("Clear: %v", err)
	}
}

func TestProberClearWithoutDevModeIsNotSupported(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	err := vllm.NewProber(srv.URL, nil).Clear(context.Background())
	if !engines.IsNotSupported(err) {
		t.Fatalf("Clear against a server without /reset_prefix_cache = %v, want a NotSupportedError", err)
	}
}
