package proxy

import (
	"net/http"
	"path"
	"strings"

	"github.com/kvexact/kvexact/gateway/route"
)

// apiSurface are the OpenAI paths every engine family serves and the proxy forwards by default,
// each routed by the rule serving the body's model. /v1/completions, /v1/chat/completions and
// /v1/models are the proxy's own (parsed, routed by prefix, fanned out); the others are forwarded
// as they are. Anything else reaches an engine only when the rule lists it under passthrough:
// engine admin routes (vLLM /reset_prefix_cache, SGLang /flush_cache, the TensorRT-LLM event
// drain, …) never do.
func inAPISurface(path string) bool {
	switch path {
	case "/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/embeddings", "/v1/responses":
		return true
	}
	return strings.HasPrefix(path, "/v1/models/")
}

// forwardable reports whether rt's rule may send r's path to its endpoints. A passthrough path
// must be in clean form, sent as it reads: no dot segments, no doubled slashes, no escapes that
// decode to something else (%2F), so that no engine can resolve it to a route the rule did not list.
func forwardable(rt *route.Router, r *http.Request) bool {
	p := r.URL.Path
	if inAPISurface(p) {
		return true
	}
	return r.URL.RawPath == "" && path.Clean(p) == p && rt.Rule().Passes(p)
}

// anyPasses reports whether some rule of the listener lists path under passthrough (before the
// body is read: an unknown path is refused without reading it).
func (c *call) anyPasses(path string) bool {
	if c.p.cfg.Routers != nil {
		for _, rt := range c.p.cfg.Routers(c.listener) {
			if rt.Rule().Passes(path) {
				return true
			}
		}
		return false
	}
	rt, err := c.p.cfg.Resolve(c.listener, "")
	return err == nil && rt != nil && rt.Rule().Passes(path)
}

// unknownPath is OpenAI's answer to a path it does not serve.
func unknownPath(r *http.Request) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: typeInvalid, Code: "unknown_url",
		Message: "Invalid URL (" + r.Method + " " + r.URL.Path + "): the gateway serves the OpenAI API surface; other paths must be listed under a rule's passthrough"}
}
