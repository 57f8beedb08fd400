package containers

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Receipt headers: the gateway names the endpoint that served, the simulator names itself.
const (
	HeaderEndpoint = "X-Kvexact-Endpoint"
	HeaderServedBy = "X-Kvexact-Served-By"
)

// CompletionRequest is the OpenAI /v1/completions body the scenarios send.
type CompletionRequest struct {
	Model     string `json:"model"`
	Prompt    string `json:"prompt"`
	MaxTokens int    `json:"max_tokens"`
	Stream    bool   `json:"stream,omitempty"`
}

// Completion is what came back: status, receipts and the usage the backend reported.
type Completion struct {
	Status       int
	Endpoint     string // gateway receipt (X-Kvexact-Endpoint)
	ServedBy     string // backend receipt (X-Kvexact-Served-By)
	PromptTokens int
	CachedTokens int
	Text         string
	Body         string
}

// Complete sends a non-streaming completion to base (a gateway or an engine) and returns the answer,
// also for non-2xx statuses (err is only for transport failures).
func Complete(ctx context.Context, c *http.Client, base string, r CompletionRequest) (*Completion, error) {
	b, _ := json.Marshal(r)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := &Completion{Status: resp.StatusCode, Endpoint: resp.Header.Get(HeaderEndpoint), ServedBy: resp.Header.Get(HeaderServedBy), Body: string(body)}
	if resp.StatusCode/100 == 2 {
		var v struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
				Details      *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(body, &v); err != nil {
			return out, fmt.Errorf("completion body: %w", err)
		}
		if len(v.Choices) > 0 {
			out.Text = v.Choices[0].Text
		}
		out.PromptTokens = v.Usage.PromptTokens
		if v.Usage.Details != nil {
			out.CachedTokens = v.Usage.Details.CachedTokens
		}
	}
	return out, nil
}

// Stream is an open streaming completion.
type Stream struct {
	Status   int
	Endpoint string
	resp     *http.Response
	sc       *bufio.Scanner
}

// OpenStream starts a streaming completion and returns once the response headers arrived.
func OpenStream(ctx context.Context, c *http.Client, base string, r CompletionRequest) (*Stream, error) {
	r.Stream = true
	b, _ := json.Marshal(r)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	return &Stream{Status: resp.StatusCode, Endpoint: resp.Header.Get(HeaderEndpoint), resp: resp, sc: sc}, nil
}

// ErrStreamDone is returned by Next after the [DONE] event.
var ErrStreamDone = errors.New("stream done")

// Next returns the next SSE data payload. After "data: [DONE]" it returns ErrStreamDone; a stream
// that ends without it returns io.ErrUnexpectedEOF (or the transport's error).
func (s *Stream) Next() (string, error) {
	for s.sc.Scan() {
		line := s.sc.Text()
		data, ok := strings.CutPrefix(line, "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			return "", ErrStreamDone
		}
		return data, nil
	}
	if err := s.sc.Err(); err != nil {
		return "", err
	}
	return "", io.ErrUnexpectedEOF
}

// Close releases the connection.
func (s *Stream) Close() error { return s.resp.Body.Close() }
