package proxy

import (
	"net/http"
	"net/url"
	"path"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
)

// FuzzForwardable: whatever request target a client sends, a path the proxy would forward is the
// API surface or a clean path a passthrough entry lists, never one an engine could resolve to an
// admin route.
func FuzzForwardable(f *testing.F) {
	for _, s := range []string{"/v1/completions", "/v1/responses/abc", "/v1/responses/../reset_prefix_cache", "/tokenize", "/v1/responses/%2e%2e/sleep", "//sleep", "/v1/models/x"} {
		f.Add(s)
	}
	r := &rules.Rule{Name: "r", Engine: rules.EngineRef{Family: "vllm", Release: "v0.25.1"}, Passthrough: []string{"/v1/responses/*", "/tokenize"},
		Endpoints: []rules.Endpoint{{Address: "http://127.0.0.1:1"}}}
	if err := r.Normalize(); err != nil {
		f.Fatal(err)
	}
	rt, err := route.New(route.Config{Rule: r, Endpoints: []*route.Endpoint{{Name: "a", Address: "http://127.0.0.1:1", Capacity: 1}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, target string) {
		u, err := url.ParseRequestURI(target)
		if err != nil {
			return
		}
		req := &http.Request{Method: "POST", URL: u}
		if !forwardable(rt, req) {
			return
		}
		p := u.Path
		if rt.Rule().Serves(p) {
			return
		}
		if u.RawPath != "" || path.Clean(p) != p || !(p == "/tokenize" || strings.HasPrefix(p, "/v1/responses/")) {
			t.Fatalf("forwarded %q (path %q, raw %q)", target, p, u.RawPath)
		}
	})
}
