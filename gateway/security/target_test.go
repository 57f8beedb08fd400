package security

import (
	"strings"
	"testing"
	"time"
)

// The request-target the engine parses is the one the gateway checked: a path spelled another way
// than it decodes to (escapes, dot segments, doubled slashes) is refused on every forwarded route
// instead of forwarded, and a query engines and Go would split differently is refused naming the
// byte. Each row: the request-target, the status, and what the engine must receive (nothing when "").
func TestRequestTargets(t *testing.T) {
	g := start(t, nil)
	for _, tc := range []struct {
		target, want, engineGets string
	}{
		{"/v1/completions", "200", "/v1/completions"},
		{"/v1/completions?user=a&x=%41", "200", "/v1/completions?user=a&x=%41"},
		{"http://evil.example/v1/completions", "200", "/v1/completions"}, // absolute form: the engine gets origin form
		{"/%76%31/completions", "404", ""},                               // decodes to /v1/completions
		{"/v1%2Fcompletions", "404", ""},
		{"/v1/%63ompletions", "404", ""},
		{"/v1/./completions", "404", ""},
		{"/v1//completions", "404", ""},
		{"/v1/x/../completions", "404", ""},
		{"/v1/completions/", "404", ""},
		{"/V1/completions", "404", ""},
		{"/v1/embeddings%2F..%2F..%2Freset_prefix_cache", "404", ""},
		{"/reset_prefix_cache", "404", ""},
		{"/v1/%65mbeddings", "404", ""}, // a family path (vLLM serves /v1/embeddings), escaped
		{"/v1/completions?a=1;b=2", "400", ""},
		{"/v1/completions?a=%zz", "400", ""},
		{"/v1/completions?a=%4", "400", ""},
		{"/v1/completions?a=\"x\"", "400", ""},
	} {
		t.Run(tc.target, func(t *testing.T) {
			before := g.engine.hits.Load()
			out, held := exchange(t, g.client, post(tc.target, completionBody(""), "Connection: close\r\n"), 10*time.Second)
			if held || status(out) != tc.want {
				t.Fatalf("held %v, status %q, want %s:\n%s", held, status(out), tc.want, out)
			}
			if tc.want == "400" && !strings.Contains(out, "at byte") {
				t.Fatalf("the refusal names no byte:\n%s", out)
			}
			hit := g.engine.hits.Load() != before
			if tc.engineGets == "" {
				if hit {
					t.Fatalf("the engine received %s", *g.engine.target.Load())
				}
				return
			}
			if !hit || *g.engine.target.Load() != tc.engineGets {
				t.Fatalf("the engine received %v, want %s", g.engine.target.Load(), tc.engineGets)
			}
		})
	}
}
