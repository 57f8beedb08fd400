package sglang

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/kvexact/kvexact/engines"
)

// Prober asks an SGLang server (pin v0.5.18, reference §1.5, §1.7) what certification needs:
// GET /server_info (version, page_size, the kv_events descriptor), GET /v1/models, POST /v1/tokenize
// (prompt or messages, rendered with the server's own chat template) and POST /flush_cache.
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

// Version returns /server_info's "version".
func (p *Prober) Version(ctx context.Context) (string, error) {
	return p.c.VersionField(ctx, "/server_info", "version")
}

// Models lists /v1/models ids.
func (p *Prober) Models(ctx context.Context) ([]string, error) { return p.c.Models(ctx, "/v1/models") }

type tokenizeResp struct {
	Tokens []int64 `json:"tokens"`
}

// Tokenize POSTs /v1/tokenize with a prompt.
func (p *Prober) Tokenize(ctx context.Context, model, text string, addSpecial bool) ([]uint32, error) {
	var r tokenizeResp
	body := map[string]any{"model": model, "prompt": text, "add_special_tokens": addSpecial}
	if err := p.c.JSON(ctx, http.MethodPost, "/v1/tokenize", body, &r); err != nil {
		return nil, err
	}
	return engines.Tokens(r.Tokens, "POST /v1/tokenize")
}

// TokenizeChat POSTs /v1/tokenize with messages: the server applies its own chat template.
func (p *Prober) TokenizeChat(ctx context.Context, body []byte) ([]uint32, error) {
	var r tokenizeResp
	if err := p.c.JSON(ctx, http.MethodPost, "/v1/tokenize", body, &r); err != nil {
		return nil, err
	}
	return engines.Tokens(r.Tokens, "POST /v1/tokenize (messages)")
}

// RenderChat is not offered by SGLang.
func (p *Prober) RenderChat(ctx context.Context, body []byte) (string, error) {
	return "", &engines.NotSupportedError{Family: "sglang", Op: "chat rendering", Reason: "SGLang has no endpoint returning the rendered prompt; /v1/tokenize with messages is the parity probe"}
}

// Config reads the block size from /server_info: kv_events.block_size (page_size × dcp_size), else
// page_size.
func (p *Prober) Config(ctx context.Context) (engines.EngineConfig, error) {
	var r struct {
		PageSize *int `json:"page_size"`
		KVEvents *struct {
			BlockSize int `json:"block_size"`
		} `json:"kv_events"`
	}
	if err := p.c.JSON(ctx, http.MethodGet, "/server_info", nil, &r); err != nil {
		return engines.EngineConfig{}, err
	}
	switch {
	case r.KVEvents != nil && r.KVEvents.BlockSize > 0:
		return engines.EngineConfig{BlockSize: r.KVEvents.BlockSize, Algorithm: "sglang_sha256", Source: "/server_info kv_events.block_size"}, nil
	case r.PageSize != nil:
		return engines.EngineConfig{BlockSize: *r.PageSize, Algorithm: "sglang_sha256", Source: "/server_info page_size"}, nil
	}
	return engines.EngineConfig{}, fmt.Errorf("GET /server_info: neither kv_events.block_size nor page_size")
}

// Clear POSTs /flush_cache; a refusal is a *engines.ClearRefusedError.
func (p *Prober) Clear(ctx context.Context) error { return p.ClearURL(ctx, "/flush_cache") }

// ClearURL POSTs a flush to url (a full URL or a path) and reads a 400 as SGLang's refusal: its
// http_server.py flush_cache answers 400 whenever the scheduler did not flush (Scheduler.flush_cache
// refuses unless it is fully idle; SchedulerFlushWrapper.handle refuses a second flush in progress
// and a deferred one that timed out waiting for idle), 200 when it did (v0.5.18 to v0.5.23).
func (p *Prober) ClearURL(ctx context.Context, url string) error {
	err := p.c.PostClear(ctx, url)
	var he *engines.HTTPError
	if errors.As(err, &he) && he.Status == http.StatusBadRequest {
		return &engines.ClearRefusedError{URL: he.URL, Status: he.Status, Body: he.Body}
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
