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
		if u.RawPath != "" || path.Clean(p) != p {
			t.Fatalf("forwarded %q in another spelling than its path %q", target, p)
		}
		if rt.Rule().Serves(p) {
			return
		}
		if path.Clean(p) != p || !(p == "/tokenize" || strings.HasPrefix(p, "/v1/responses/")) {
			t.Fatalf("forwarded %q (path %q, raw %q)", target, p, u.RawPath)
		}
	})
}

// FuzzCheckQuery: a query the proxy lets through reads the same to Go (url.ParseQuery, without
// error) and to the engines' Python servers (urllib.parse.parse_qsl with keep_blank_values: split
// on "&" only, the first "=" separates, "+" is a space, escapes decoded).
func FuzzCheckQuery(f *testing.F) {
	for _, s := range []string{"a=1&b=2", "a=1;b=2", "a=%zz", "a=%41+b", "&&a", "a==b", "=x", "a=%2", "a=\"x\""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		r := &http.Request{URL: &url.URL{Path: "/v1/completions", RawQuery: q}}
		if checkQuery(r) != nil {
			return
		}
		goPairs, err := url.ParseQuery(q)
		if err != nil {
			t.Fatalf("accepted %q, which Go refuses: %v", q, err)
		}
		py := map[string][]string{}
		for _, piece := range strings.Split(q, "&") {
			if piece == "" {
				continue
			}
			k, v, _ := strings.Cut(piece, "=")
			k, err1 := url.QueryUnescape(k)
			v, err2 := url.QueryUnescape(v)
			if err1 != nil || err2 != nil {
				t.Fatalf("accepted %q with an escape Python would keep as it is", q)
			}
			py[k] = append(py[k], v)
		}
		if len(py) != len(goPairs) {
			t.Fatalf("%q: Go reads %v, Python %v", q, goPairs, py)
		}
		for k, vs := range py {
			if strings.Join(vs, "\x00") != strings.Join(goPairs[k], "\x00") {
				t.Fatalf("%q: Go reads %v, Python %v", q, goPairs, py)
			}
		}
	})
}
