package gateway_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// An n = 2 request routes normally (n is not in the keys): warmed, it is a KV-exact hit on the
// endpoint holding its blocks, and the client gets both choices, streamed or not.
func TestE2EChoicesN(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true, blockSize: 16})
	doc := docs(1)[0]
	for _, tc := range []struct {
		path string
		body func(string) map[string]any
	}{
		{"/v1/completions", func(s string) map[string]any {
			return map[string]any{"model": "llama3", "prompt": s, "max_tokens": 2, "n": 2}
		}},
		{"/v1/chat/completions", func(s string) map[string]any {
			return map[string]any{"model": "llama3", "messages": []any{map[string]any{"role": "user", "content": s}}, "max_tokens": 2, "n": 2}
		}},
	} {
		ep := warmHit(t, p, tc.path, tc.body(doc), tc.body(doc+" Another question?"))
		c := p.send(tc.path, tc.body(doc+" A third question?"))
		var v struct {
			Choices []struct {
				Index int `json:"index"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(c.body), &v); err != nil || len(v.Choices) != 2 || v.Choices[1].Index != 1 {
			t.Fatalf("%s n=2: %d choices (%v): %s", tc.path, len(v.Choices), err, c.body)
		}
		if c.endpoint != ep || !strings.Contains(c.decision, "kv-exact") {
			t.Fatalf("%s n=2 went to %s (warm on %s), decision %s", tc.path, c.endpoint, ep, c.decision)
		}
		// Streamed: both choices' finish_reason reach the client.
		b := tc.body(doc + " A streamed question?")
		b["stream"] = true
		raw, _ := json.Marshal(b)
		resp, err := http.Post(p.base+tc.path, "application/json", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || strings.Count(string(out), `"finish_reason":"length"`) != 2 || !strings.Contains(string(out), `"index":1`) {
			t.Fatalf("%s stream n=2: %d %s", tc.path, resp.StatusCode, out)
		}
	}
}
