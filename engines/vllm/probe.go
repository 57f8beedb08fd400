package vllm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"

	"github.com/kvexact/kvexact/engines"
)

// Prober asks a vLLM OpenAI-compatible server (pin v0.25.1, reference §6) what certification needs:
// GET /version, GET /v1/models, POST /tokenize (prompt or messages), the vllm:cache_config_info
// gauge of GET /metrics, and POST /reset_prefix_cache (mounted only with VLLM_SERVER_DEV_MODE=1).
type Prober struct {
	c engines.Client
}

var _ engines.Prober = (*Prober)(nil)

// NewProber returns a prober for the server at base (e.g. http://127.0.0.1:8000); hc nil uses a
// client with a 30s timeout.
func NewProber(base string, hc *http.Client) *Prober { return &Prober{c: engines.NewClient(base, hc)} }

// Address is the server's base URL.
func (p *Prober) Address() string { return p.c.Base }

// Health GETs /health.
func (p *Prober) Health(ctx context.Context) error { return p.c.Health(ctx, "/health") }

// Version returns /version's "version" (the vLLM package version).
func (p *Prober) Version(ctx context.Context) (string, error) {
	return p.c.VersionField(ctx, "/version", "version")
}

// Models lists /v1/models ids (LoRA adapters included).
func (p *Prober) Models(ctx context.Context) ([]string, error) { return p.c.Models(ctx, "/v1/models") }

type tokenizeResp struct {
	Tokens []int64 `json:"tokens"`
	Count  int     `json:"count"`
}

// Tokenize POSTs /tokenize in its completion form.
func (p *Prober) Tokenize(ctx context.Context, model, text string, addSpecial bool) ([]uint32, error) {
	var r tokenizeResp
	body := map[string]any{"model": model, "prompt": text, "add_special_tokens": addSpecial}
	if err := p.c.JSON(ctx, http.MethodPost, "/tokenize", body, &r); err != nil {
		return nil, err
	}
	return engines.Tokens(r.Tokens, "POST /tokenize")
}

// TokenizeChat POSTs /tokenize in its chat form: the server renders messages with its own template
// (add_special_tokens defaults to false there, as in chat completions).
func (p *Prober) TokenizeChat(ctx context.Context, body []byte) ([]uint32, error) {
	var r tokenizeResp
	if err := p.c.JSON(ctx, http.MethodPost, "/tokenize", body, &r); err != nil {
		return nil, err
	}
	return engines.Tokens(r.Tokens, "POST /tokenize (messages)")
}

// RenderChat is not offered: vLLM tokenizes chats but does not return the rendered text.
func (p *Prober) RenderChat(ctx context.Context, body []byte) (string, error) {
	return "", &engines.NotSupportedError{Family: "vllm", Op: "chat rendering", Reason: "vLLM has no endpoint returning the rendered prompt; /tokenize with messages is the parity probe"}
}

var cacheConfigRe = regexp.MustCompile(`(?m)^vllm:cache_config_info\{([^}]*)\}`)
var labelRe = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// Config reads block_size, hash_block_size and prefix_caching_hash_algo from vllm:cache_config_info
// on /metrics.
func (p *Prober) Config(ctx context.Context) (engines.EngineConfig, error) {
	status, b, err := p.c.Do(ctx, http.MethodGet, "/metrics", nil)
	if err != nil {
		return engines.EngineConfig{}, err
	}
	if status != http.StatusOK {
		return engines.EngineConfig{}, &engines.HTTPError{Op: "GET /metrics", URL: p.c.Base + "/metrics", Status: status}
	}
	m := cacheConfigRe.FindSubmatch(b)
	if m == nil {
		return engines.EngineConfig{}, errors.New("GET /metrics: no vllm:cache_config_info gauge")
	}
	cfg := engines.EngineConfig{Source: "/metrics vllm:cache_config_info"}
	for _, l := range labelRe.FindAllSubmatch(m[1], -1) {
		switch string(l[1]) {
		case "block_size":
			if n, err := strconv.Atoi(string(l[2])); err == nil {
				cfg.BlockSize = n
			}
		case "hash_block_size":
			if n, err := strconv.Atoi(string(l[2])); err == nil {
				cfg.HashBlockSize = n
			}
		case "prefix_caching_hash_algo":
			cfg.Algorithm = string(l[2])
		}
	}
	return cfg, nil
}

// Clear POSTs /reset_prefix_cache, which vLLM mounts only in dev mode; a reset refused while the
// engine is busy (200 {"success": false}) is a *engines.ClearRefusedError.
func (p *Prober) Clear(ctx context.Context) error {
	err := p.c.PostClear(ctx, "/reset_prefix_cache")
	var he *engines.HTTPError
	if errors.As(err, &he) && (he.Status == http.StatusNotFound || he.Status == http.StatusMethodNotAllowed) {
		return &engines.NotSupportedError{Family: "vllm", Op: "cache clear", Reason: fmt.Sprintf("POST /reset_prefix_cache answered %d: vLLM mounts it only with VLLM_SERVER_DEV_MODE=1", he.Status)}
	}
	return err
}

// Complete posts /v1/completions.
func (p *Prober) Complete(ctx context.Context, req engines.CompletionRequest) (*engines.Completion, error) {
	return p.c.Complete(ctx, req)
}

// Chat posts /v1/chat/completions.
func (p *Prober) Chat(ctx context.Context, body []byte, maxTokens int) (*engines.Completion, error) {
	return p.c.Chat(ctx, body, maxTokens)
}

// NewProber is the family's prober facet (engines.Probes).
func (family) NewProber(address string, hc *http.Client) engines.Prober {
	return NewProber(address, hc)
}
