package proxy

import (
	"net/http"
	"path"

	"github.com/kvexact/kvexact/gateway/apierror"
	"github.com/kvexact/kvexact/gateway/route"
)

// forwardable reports whether rt's rule may send r's path to its endpoints: a path of the API
// surface its engine family serves (the contract's api list; /v1/completions, /v1/chat/completions
// and /v1/models are the proxy's own and never come here), else a passthrough path. Anything else
// is OpenAI's 404: engine admin routes (vLLM /reset_prefix_cache, SGLang /flush_cache, the
// TensorRT-LLM event drain, …) never reach an engine. A passthrough path
// must be in clean form, sent as it reads: no dot segments, no doubled slashes, no escapes that
// decode to something else (%2F), so that no engine can resolve it to a route the rule did not list.
func forwardable(rt *route.Router, r *http.Request) bool {
	p := r.URL.Path
	if rt.Rule().Serves(p) {
		return true
	}
	return r.URL.RawPath == "" && path.Clean(p) == p && rt.Rule().Passes(p)
}

// anyForwards reports whether some rule of the listener forwards path (its family serves it or it
// lists it under passthrough), before the body is read: an unknown path is refused without reading it.
func (c *call) anyForwards(path string) bool {
	for _, rt := range c.p.cfg.Routes.Routers(c.listener) {
		if rt.Rule().Forwards(path) {
			return true
		}
	}
	return false
}

// unknownPath is OpenAI's answer to a path it does not serve.
func unknownPath(r *http.Request) *apierror.Error {
	return &apierror.Error{Status: http.StatusNotFound, Type: apierror.TypeInvalid, Code: "unknown_url",
		Message: "Invalid URL (" + r.Method + " " + r.URL.Path + "): the gateway serves the OpenAI API surface; other paths must be listed under a rule's passthrough"}
}
