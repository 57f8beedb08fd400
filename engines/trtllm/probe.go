package trtllm

import (
	"context"
	"net/http"

	"github.com/kvexact/kvexact/engines"
)

// Prober asks a trtllm-serve server (1.2 line, reference §2.6) what certification needs: GET
// /version, GET /v1/models and probe completions. trtllm-serve has no tokenize endpoint, so token
// parity is checked by counting (usage.prompt_tokens) and through the token ids its own events
// carry; it has no cache reset either. Its /metrics and /kv_cache_events drain destructively, so the
// prober never touches them.
type Prober struct {
	c engines.Client
}

var _ engines.Prober = (*Prober)(nil)

// NewProber returns a prober for the server at base; hc nil uses a client with a 30s timeout.
func NewProber(base string, hc *http.Client) *Prober { return &Prober{c: engines.NewClient(base, hc)} }

// Address is the server's base URL.
func (p *Prober) Address() string { return p.c.Base }

// Health GETs /health.
func (p *Prober) Health(ctx context.Context) error { return p.c.Health(ctx, "/health") }

// Version returns /version's "version" (the tensorrt_llm package version).
func (p *Prober) Version(ctx context.Context) (string, error) {
	return p.c.VersionField(ctx, "/version", "version")
}

// Models lists /v1/models ids (the basename of a local model folder).
func (p *Prober) Models(ctx context.Context) ([]string, error) { return p.c.Models(ctx, "/v1/models") }

const noTokenize = "trtllm-serve has no tokenize endpoint; token parity is checked by usage.prompt_tokens counts and by the token ids in its own KV events"

// Tokenize is not offered by trtllm-serve.
func (p *Prober) Tokenize(ctx context.Context, model, text string, addSpecial bool) ([]uint32, error) {
	return nil, &engines.NotSupportedError{Family: "trtllm", Op: "tokenize", Reason: noTokenize}
}

// TokenizeChat is not offered by trtllm-serve.
func (p *Prober) TokenizeChat(ctx context.Context, body []byte) ([]uint32, error) {
	return nil, &engines.NotSupportedError{Family: "trtllm", Op: "chat tokenize", Reason: noTokenize}
}

// RenderChat is not offered by trtllm-serve.
func (p *Prober) RenderChat(ctx context.Context, body []byte) (string, error) {
	return "", &engines.NotSupportedError{Family: "trtllm", Op: "chat rendering", Reason: "trtllm-serve does not return rendered prompts"}
}

// Config reads tokens_per_block from /server_info, which newer builds serve; 1.2 builds answer 404
// (then the events are the only source).
func (p *Prober) Config(ctx context.Context) (engines.EngineConfig, error) {
	var r struct {
		TokensPerBlock int `json:"tokens_per_block"`
	}
	if err := p.c.JSON(ctx, http.MethodGet, "/server_info", nil, &r); err != nil {
		return engines.EngineConfig{}, err
	}
	return engines.EngineConfig{BlockSize: r.TokensPerBlock, Source: "/server_info tokens_per_block"}, nil
}

// Clear is not offered: trtllm-serve has no prefix-cache reset.
func (p *Prober) Clear(ctx context.Context) error {
	return &engines.NotSupportedError{Family: "trtllm", Op: "cache clear", Reason: "trtllm-serve 1.2 has no cache-reset endpoint"}
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
