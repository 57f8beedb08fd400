package engines

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// A Prober asks one engine server, over its own HTTP API, what certification and the gateway's
// re-probes need to know: which release it runs, which models it serves, how it tokenizes text and
// chat conversations, and how to clear its cache and send a probe completion. Each family package
// (engines/vllm, engines/sglang, engines/trtllm, engines/llamacpp) implements it with the family's
// own endpoints; an operation the family does not offer returns a *NotSupportedError saying why.
type Prober interface {
	// Address is the server's base URL.
	Address() string
	// Health reports whether the server answers its health endpoint with 200.
	Health(ctx context.Context) error
	// Version is the release the server reports (vLLM "0.25.1", SGLang "0.5.18", llama.cpp "b10573-…").
	Version(ctx context.Context) (string, error)
	// Models lists the served model ids (/v1/models).
	Models(ctx context.Context) ([]string, error)
	// Tokenize returns the engine's token ids for text with add_special_tokens = addSpecial.
	Tokenize(ctx context.Context, model, text string, addSpecial bool) ([]uint32, error)
	// TokenizeChat returns the engine's token ids for an OpenAI chat request body (its messages
	// rendered with the engine's own chat template, then tokenized).
	TokenizeChat(ctx context.Context, body []byte) ([]uint32, error)
	// RenderChat returns the prompt text the engine's chat template renders for a chat request body
	// (llama.cpp /apply-template; the others do not expose it).
	RenderChat(ctx context.Context, body []byte) (string, error)
	// Config reports the cache geometry the engine states about itself (zero fields where it says
	// nothing). The engine's own events remain the proof; this only sharpens failure hints.
	Config(ctx context.Context) (EngineConfig, error)
	// Clear empties the engine's prefix cache.
	Clear(ctx context.Context) error
	// Complete sends a non-streaming completion and returns its usage.
	Complete(ctx context.Context, req CompletionRequest) (*Completion, error)
	// Chat sends a non-streaming chat completion (body as the client would send it, "max_tokens"
	// and "stream" are overridden) and returns its usage.
	Chat(ctx context.Context, body []byte, maxTokens int) (*Completion, error)
}

// EngineConfig is what an engine states about its cache configuration.
type EngineConfig struct {
	BlockSize int // tokens per block (0 when not stated)
	// HashBlockSize is the granularity the engine chains its block hashes at (vLLM hash_block_size:
	// differs from BlockSize when KV-cache groups of several block sizes share one chain; 0 when
	// not stated).
	HashBlockSize int
	Algorithm     string // vLLM prefix_caching_hash_algo ("" when not stated)
	Source        string // where the values came from, for messages
}

// CompletionRequest is a probe completion: a text prompt or token ids.
type CompletionRequest struct {
	Model      string
	Prompt     string
	PromptIDs  []uint32 // used instead of Prompt when non-nil
	MaxTokens  int      // default 1
	AddSpecial *bool    // nil leaves the engine's default
}

// Completion is what a probe needs from a completion response.
type Completion struct {
	ID           string
	PromptTokens int
	CachedTokens int
	Text         string
}

// NotSupportedError says that a family does not offer an operation, and why.
type NotSupportedError struct {
	Family, Op, Reason string
}

func (e *NotSupportedError) Error() string {
	return fmt.Sprintf("%s: %s is not available: %s", e.Family, e.Op, e.Reason)
}

// IsNotSupported reports whether err is (or wraps) a *NotSupportedError.
func IsNotSupported(err error) bool {
	var ns *NotSupportedError
	return errors.As(err, &ns)
}

// HTTPError is a non-2xx answer: which call, the status and the start of the body.
type HTTPError struct {
	Op     string
	URL    string
	Status int
	Body   string
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("%s %s: HTTP %d: %s", e.Op, e.URL, e.Status, e.Body)
}

// Client is the HTTP plumbing every family prober shares: a base URL, an http.Client and JSON
// helpers with bounded bodies and errors that name the call.
type Client struct {
	Base string
	HTTP *http.Client
}

// NewClient returns a client for base with a 30s per-request timeout (hc nil) or hc.
func NewClient(base string, hc *http.Client) Client {
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	return Client{Base: strings.TrimRight(base, "/"), HTTP: hc}
}

// maxProbeBody bounds every response body a prober reads.
const maxProbeBody = 16 << 20

// Do sends method path with a JSON body (nil for none) and returns the status and body.
func (c Client) Do(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		var b []byte
		switch v := body.(type) {
		case []byte:
			b = v
		default:
			var err error
			if b, err = json.Marshal(v); err != nil {
				return 0, nil, fmt.Errorf("%s %s: encode body: %w", method, path, err)
			}
		}
		rd = bytes.NewReader(b)
	}
	url := c.URL(path)
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxProbeBody))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("%s %s: read body: %w", method, url, err)
	}
	return resp.StatusCode, b, nil
}

// JSON sends method path and decodes a 2xx JSON answer into out (nil to ignore the body). Other
// statuses are an *HTTPError.
func (c Client) JSON(ctx context.Context, method, path string, body, out any) error {
	status, b, err := c.Do(ctx, method, path, body)
	if err != nil {
		return err
	}
	if status < 200 || status > 299 {
		return &HTTPError{Op: method + " " + path, URL: c.Base + path, Status: status, Body: clip(string(b), 300)}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: response is not the expected JSON: %w (body %q)", method, path, err, clip(string(b), 200))
	}
	return nil
}

// Health GETs path and wants a 2xx.
func (c Client) Health(ctx context.Context, path string) error {
	return c.JSON(ctx, http.MethodGet, path, nil, nil)
}

// Models GETs /v1/models (or path) and returns the ids.
func (c Client) Models(ctx context.Context, path string) ([]string, error) {
	var r struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := c.JSON(ctx, http.MethodGet, path, nil, &r); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(r.Data))
	for _, d := range r.Data {
		ids = append(ids, d.ID)
	}
	return ids, nil
}

// VersionField GETs path and returns its string field name.
func (c Client) VersionField(ctx context.Context, path, field string) (string, error) {
	var m map[string]json.RawMessage
	if err := c.JSON(ctx, http.MethodGet, path, nil, &m); err != nil {
		return "", err
	}
	raw, ok := m[field]
	if !ok {
		return "", fmt.Errorf("GET %s: no %q field in the answer", path, field)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("GET %s: %q is not a string: %s", path, field, clip(string(raw), 80))
	}
	return s, nil
}

// Tokens decodes a {"tokens": [...]} answer.
func Tokens(raw []int64, op string) ([]uint32, error) {
	out := make([]uint32, len(raw))
	for i, t := range raw {
		if t < 0 || t > 1<<32-1 {
			return nil, fmt.Errorf("%s: tokens[%d] = %d is outside 0..2^32-1", op, i, t)
		}
		out[i] = uint32(t)
	}
	return out, nil
}

// Complete posts an OpenAI completion to /v1/completions.
func (c Client) Complete(ctx context.Context, req CompletionRequest) (*Completion, error) {
	body := map[string]any{"model": req.Model, "max_tokens": max(req.MaxTokens, 1), "stream": false, "temperature": 0}
	if req.PromptIDs != nil {
		body["prompt"] = req.PromptIDs
	} else {
		body["prompt"] = req.Prompt
	}
	if req.AddSpecial != nil {
		body["add_special_tokens"] = *req.AddSpecial
	}
	return c.completion(ctx, "/v1/completions", body)
}

// Chat posts an OpenAI chat completion to /v1/chat/completions, forcing max_tokens and stream.
func (c Client) Chat(ctx context.Context, body []byte, maxTokens int) (*Completion, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("chat body: %w", err)
	}
	m["max_tokens"] = json.RawMessage(fmt.Sprint(max(maxTokens, 1)))
	m["stream"] = json.RawMessage("false")
	return c.completion(ctx, "/v1/chat/completions", m)
}

func (c Client) completion(ctx context.Context, path string, body any) (*Completion, error) {
	var r struct {
		ID      string `json:"id"`
		Choices []struct {
			Text    string `json:"text"`
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := c.JSON(ctx, http.MethodPost, path, body, &r); err != nil {
		return nil, err
	}
	if r.Usage == nil {
		return nil, fmt.Errorf("POST %s: the answer has no usage", path)
	}
	out := &Completion{ID: r.ID, PromptTokens: r.Usage.PromptTokens}
	if r.Usage.Details != nil {
		out.CachedTokens = r.Usage.Details.CachedTokens
	}
	if len(r.Choices) > 0 {
		out.Text = r.Choices[0].Text + r.Choices[0].Message.Content
	}
	return out, nil
}

// PostClear POSTs a cache-clear URL (a full URL or a path) and wants a 2xx that does not refuse.
// vLLM answers a reset it refuses (blocks still held by a running request or a transfer) with
// 200 and {"success": false}: that is a refusal (*ClearRefusedError), not a clear; so is a 409
// Conflict (the simulator's /sim/clear while requests run).
func (c Client) PostClear(ctx context.Context, path string) error {
	status, b, err := c.Do(ctx, http.MethodPost, path, nil)
	if err != nil {
		return err
	}
	url := c.URL(path)
	if status == http.StatusConflict {
		return &ClearRefusedError{URL: url, Status: status, Body: clip(string(b), 300)}
	}
	if status < 200 || status > 299 {
		return &HTTPError{Op: "POST", URL: url, Status: status, Body: clip(string(b), 300)}
	}
	var answer struct {
		Success *bool `json:"success"`
	}
	if json.Unmarshal(b, &answer) == nil && answer.Success != nil && !*answer.Success {
		return &ClearRefusedError{URL: url, Status: status, Body: clip(string(b), 300)}
	}
	return nil
}

// URL is path resolved against the client's base (a full URL is kept).
func (c Client) URL(path string) string {
	if strings.HasPrefix(path, "http://") || strings.HasPrefix(path, "https://") {
		return path
	}
	return c.Base + path
}

// ClearRefusedError is a cache clear the engine refused because it was busy: nothing was cleared.
// vLLM refuses with 200 {"success": false}, SGLang with 400 (its family prober says so), the
// simulator's /sim/clear with 409.
type ClearRefusedError struct {
	URL    string // the full URL posted
	Status int
	Body   string
}

func (e *ClearRefusedError) Error() string {
	return fmt.Sprintf("POST %s: the engine refused the cache reset because it was busy (HTTP %d: %s): running requests or transfers in flight still hold cache blocks; retry when it is idle", e.URL, e.Status, e.Body)
}

// URLClearer is a Prober that clears through another URL (an endpoint's configured clear URL)
// and reads the answer as the family reads its own clear's; a family whose refusal PostClear
// already recognizes need not implement it.
type URLClearer interface {
	ClearURL(ctx context.Context, url string) error
}

func clip(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Probes is the family's prober facet.
type Probes interface {
	// NewProber returns a prober for the server at address (e.g. http://127.0.0.1:8000); hc nil
	// uses a client with a 30s timeout.
	NewProber(address string, hc *http.Client) Prober
}
