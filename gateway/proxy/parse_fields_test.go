package proxy

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

// The key-shaping fields reach route.Request as the body gave them, and bad values are the same
// 400 the engine gives, naming the field.
func TestParseKeyFields(t *testing.T) {
	p, e := parseBody([]byte(`{"model":"m","prompt":[5,6,7],"cache_salt":"tenant","add_special_tokens":false,"truncate_prompt_tokens":2,"truncation_side":"left","n":3,"best_of":4}`), false)
	if e != nil {
		t.Fatal(e)
	}
	rr := p.routeRequest(newTestRequest())
	if rr.CacheSalt != "tenant" || rr.AddSpecialTokens == nil || *rr.AddSpecialTokens || rr.TruncatePromptTokens == nil ||
		*rr.TruncatePromptTokens != 2 || rr.TruncationSide != "left" || len(rr.PromptTokens) != 3 || rr.Batch != 1 || rr.PromptEmbeds {
		t.Fatalf("route request %+v", rr)
	}
	p, e = parseBody([]byte(`{"model":"m","prompt_embeds":"AAAA"}`), false)
	if e != nil || !p.routeRequest(newTestRequest()).PromptEmbeds {
		t.Fatalf("prompt_embeds alone: %v %+v", e, p)
	}
	p, e = parseBody([]byte(`{"model":"m","prompt":["a","b"]}`), false)
	if e != nil || p.routeRequest(newTestRequest()).Batch != 2 {
		t.Fatalf("batch: %v", e)
	}
	for _, tc := range []struct {
		body, param string
		chat        bool
	}{
		{`{"model":"m","prompt":"x","cache_salt":""}`, "cache_salt", false},
		{`{"model":"m","prompt":"x","cache_salt":7}`, "cache_salt", false},
		{`{"model":"m","prompt":"x","add_special_tokens":"yes"}`, "add_special_tokens", false},
		{`{"model":"m","prompt":"x","truncate_prompt_tokens":-2}`, "truncate_prompt_tokens", false},
		{`{"model":"m","prompt":"x","truncate_prompt_tokens":1.5}`, "truncate_prompt_tokens", false},
		{`{"model":"m","prompt":"x","truncate_prompt_tokens":9223372036854775808}`, "truncate_prompt_tokens", false},
		{`{"model":"m","prompt":"x","truncation_side":"middle"}`, "truncation_side", false},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"cache_salt":""}`, "cache_salt", true},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"truncate_prompt_tokens":"3"}`, "truncate_prompt_tokens", true},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}`, "stream", true},
		{`{"model":"m","messages":{}}`, "messages", true},
		{`{"messages":[{"role":"user","content":"x"}]}`, "model", true},
	} {
		_, e := parseBody([]byte(tc.body), tc.chat)
		if e == nil || e.Status != 400 || e.Param != tc.param {
			t.Errorf("%s: got %+v, want 400 naming %s", tc.body, e, tc.param)
		}
	}
}

// A chat body is parsed once: the proxy's tree is what the keyer renders, and a body the engine
// would refuse (tools: []) is forwarded with the reason kept for the miss.
func TestParseChatOnce(t *testing.T) {
	p, e := parseBody([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"add_generation_prompt":false,"cache_salt":"s"}`), true)
	if e != nil {
		t.Fatal(e)
	}
	rr := p.routeRequest(newTestRequest())
	if rr.ChatRequest == nil || rr.ChatRequest.AddGenerationPrompt || rr.CacheSalt != "s" || rr.AffinityText != "hi\n" {
		t.Fatalf("chat route request %+v", rr)
	}
	p, e = parseBody([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[]}`), true)
	if e != nil {
		t.Fatal(e)
	}
	if rr := p.routeRequest(newTestRequest()); rr.ChatRequest != nil || !errors.Is(rr.ChatError, tokenize.ErrBadChatRequest) {
		t.Fatalf("tools: [] gave %+v", rr)
	}
}

func newTestRequest() *http.Request {
	return httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
}
