package epp

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Usage is what an OpenAI response's usage object says about the prompt.
type Usage struct {
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens: the engine's own receipt of the
	// prompt tokens its prefix cache served.
	CachedTokens int
	// Found says a usage object was there; HasCached that it carried cached_tokens. Only a receipt
	// with cached_tokens is accounted: an engine that does not report them (vLLM without
	// --enable-prompt-tokens-details) must not read as zero hits.
	Found, HasCached bool
}

// ParseUsage finds the last usage object in a response body's tail: the whole JSON body of a
// non-streamed response, or the final "data:" event of a stream sent with include_usage. A body
// without one is not an error (Found false); a usage object that does not decode is, with its byte
// offset in tail.
func ParseUsage(tail []byte) (Usage, error) {
	key := []byte(`"usage"`)
	for end := len(tail); end > 0; {
		i := bytes.LastIndex(tail[:end], key)
		if i < 0 {
			return Usage{}, nil
		}
		end = i
		rest := bytes.TrimLeft(tail[i+len(key):], " \t\r\n")
		if len(rest) == 0 || rest[0] != ':' {
			continue // the word inside a string, not a key
		}
		rest = bytes.TrimLeft(rest[1:], " \t\r\n")
		if len(rest) > 0 && rest[0] == 'n' {
			continue // "usage": null on a stream's intermediate chunks
		}
		var v struct {
			PromptTokens  int `json:"prompt_tokens"`
			PromptDetails *struct {
				CachedTokens *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		}
		if err := json.NewDecoder(bytes.NewReader(rest)).Decode(&v); err != nil {
			return Usage{}, fmt.Errorf("usage object at byte %d of the response tail: %w", i, err)
		}
		u := Usage{PromptTokens: v.PromptTokens, Found: true}
		if v.PromptDetails != nil && v.PromptDetails.CachedTokens != nil {
			u.CachedTokens, u.HasCached = *v.PromptDetails.CachedTokens, true
		}
		return u, nil
	}
	return Usage{}, nil
}
