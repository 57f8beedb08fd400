package llamacpp

import (
	"context"
	"net/http"

	"github.com/kvexact/kvexact/engines"
)

// Prober asks a llama.cpp server (pin b10573, reference §3) what content-affinity certification
// needs: GET /props (build_info), GET /v1/models, POST /tokenize (content, add_special,
// parse_special) and POST /apply-template (the rendered chat prompt).
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

// Version returns /props build_info ("b10573-<commit>").
func (p *Prober) Version(ctx context.Context) (string, error) {
	return p.c.VersionField(ctx, "/props", "build_info")
}

// Models lists /v1/models ids.
func (p *Prober) Models(ctx context.Context) ([]string, error) { return p.c.Models(ctx, "/v1/models") }

type tokenizeResp struct {
	Tokens []int64 `json:"tokens"`
}

// Tokenize POSTs /tokenize (special-token text is parsed as special tokens, as in prompts).
func (p *Prober) Tokenize(ctx context.Context, model, text string, addSpecial bool) ([]uint32, error) {
	var r tokenizeResp
	body := map[string]any{"content": text, "add_special": addSpecial, "parse_special": true}
	if err := p.c.JSON(ctx, http.MethodPost, "/tokenize", body, &r); err != nil {
		return nil, err
	}
	return engines.Tokens(r.Tokens, "POST /tokenize")
}

// RenderChat POSTs /apply-template and returns the rendered prompt.
func (p *Prober) RenderChat(ctx context.Context, body []byte) (string, error) {
	var r struct {
		Prompt *string `json:"prompt"`
	}
	if err := p.c.JSON(ctx, http.MethodPost, "/apply-template", body, &r); err != nil {
		return "", err
	}
	if r.Prompt == nil {
		return "", &engines.HTTPError{Op: "POST /apply-template", URL: p.c.Base + "/apply-template", Status: 200, Body: "no prompt field"}
	}
	return *r.Prompt, nil
}

// TokenizeChat renders with /apply-template and tokenizes the text without added specials (the
// template writes BOS itself).
func (p *Prober) TokenizeChat(ctx context.Context, body []byte) ([]uint32, error) {
	text, err := p.RenderChat(ctx, body)
	if err != nil {
		return nil, err
	}
	return p.Tokenize(ctx, "", text, false)
}

// Config is not offered: llama.cpp has no block geometry at the HTTP layer.
func (p *Prober) Config(ctx context.Context) (engines.EngineConfig, error) {
	return engines.EngineConfig{}, &engines.NotSupportedError{Family: "llamacpp", Op: "cache geometry", Reason: ErrNoEvents.Error()}
}

// Clear is not offered: llama.cpp has no prefix-cache reset (slots are erased one at a time).
func (p *Prober) Clear(ctx context.Context) error {
	return &engines.NotSupportedError{Family: "llamacpp", Op: "cache clear", Reason: "llama.cpp has no prefix-cache reset endpoint (slots are erased one at a time)"}
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
