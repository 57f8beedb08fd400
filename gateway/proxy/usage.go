package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"

	"github.com/kvexact/kvexact/gateway/route"
)

// UsageReport is one relayed response's cached-token account: what the routing decision predicted
// the serving endpoint would reuse, beside what the engine reports it reused
// (usage.prompt_tokens_details.cached_tokens). The gateway compares the two to see drift that the
// event stream cannot show (a tokenizer or chat template that changed on the engine).
type UsageReport struct {
	Rule, Endpoint string
	// Tier is the tier that decided; KVExact says the serving endpoint is the one KV-exact chose.
	Tier    string
	KVExact bool
	// PredictedTokens is the serving endpoint's contiguous cached prefix in the decision, in tokens.
	PredictedTokens int
	// RealizedTokens and PromptTokens are the engine's own usage figures.
	RealizedTokens int
	PromptTokens   int
	BlockSize      int
}

// usageTail is how much of a response's end the tap keeps: a non-streaming body ends with its
// usage object, a stream's final usage chunk comes just before [DONE].
const usageTail = 8 << 10

// usageTap wraps an upstream body and keeps its last usageTail bytes while the relay reads it; it
// never changes what is read.
type usageTap struct {
	io.ReadCloser
	tail []byte
}

func (t *usageTap) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if n > 0 {
		if n >= usageTail {
			t.tail = append(t.tail[:0], p[n-usageTail:n]...)
		} else {
			if over := len(t.tail) + n - usageTail; over > 0 {
				t.tail = append(t.tail[:0], t.tail[over:]...)
			}
			t.tail = append(t.tail, p[:n]...)
		}
	}
	return n, err
}

// tapUsage wraps resp's body when the proxy reports usage and the answer can carry it (a 200 of a
// parsed completion or chat request). It returns nil otherwise.
func (c *call) tapUsage(resp *http.Response) *usageTap {
	if c.p.cfg.Usage == nil || c.body == nil || resp.StatusCode != http.StatusOK || header(resp.Header, "Content-Encoding") != "" {
		return nil
	}
	t := &usageTap{ReadCloser: resp.Body, tail: make([]byte, 0, usageTail)}
	resp.Body = t
	return t
}

// reportUsage hands the tapped response's usage to Config.Usage (nothing when the engine sent none).
func (c *call) reportUsage(t *usageTap) {
	if t == nil || c.server == nil || c.d == nil {
		return
	}
	prompt, cached, ok := parseUsage(t.tail)
	if !ok {
		return
	}
	rep := UsageReport{Rule: c.rule, Endpoint: c.server.Name, Tier: c.d.Tier, RealizedTokens: cached, PromptTokens: prompt}
	rep.KVExact = c.d.Tier == route.TierKVExact && c.d.Target == c.server
	if r := c.rt.Rule(); r != nil {
		rep.BlockSize = r.BlockSize
	}
	for _, ev := range c.d.Endpoints {
		if ev.Name == c.server.Name {
			rep.PredictedTokens = ev.Prefix * rep.BlockSize
		}
	}
	c.p.cfg.Usage(rep)
}

var usageKey = []byte(`"usage"`)

// parseUsage finds the last usage object with cached tokens in the tail of a response (a JSON body
// or an SSE stream) and returns prompt_tokens and prompt_tokens_details.cached_tokens.
func parseUsage(tail []byte) (prompt, cached int, ok bool) {
	end := len(tail)
	for range 4 {
		i := bytes.LastIndex(tail[:end], usageKey)
		if i < 0 {
			return 0, 0, false
		}
		end = i
		rest := bytes.TrimLeft(tail[i+len(usageKey):], " \t\r\n")
		if len(rest) == 0 || rest[0] != ':' {
			continue
		}
		var u struct {
			PromptTokens        *int `json:"prompt_tokens"`
			PromptTokensDetails *struct {
				CachedTokens *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		}
		if json.NewDecoder(bytes.NewReader(rest[1:])).Decode(&u) != nil || u.PromptTokens == nil ||
			u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens == nil {
			continue
		}
		if *u.PromptTokens < 0 || *u.PromptTokensDetails.CachedTokens < 0 {
			return 0, 0, false
		}
		return *u.PromptTokens, *u.PromptTokensDetails.CachedTokens, true
	}
	return 0, 0, false
}
