package proxy

import (
	"net/http"
	"path"
	"strings"

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

// SurfaceCheck is nil when the standalone proxy would send a request for r's path to one of rt's
// endpoints — the generation paths and the models listing (the proxy's own), the rest of the
// family's API surface, or a passthrough path in clean form — else its 404 unknown_url. The
// Endpoint Picker asks it so that both front ends give a destination to the same paths and no
// others, with the same answer (a second list would drift from this one). A nil rt is no rule:
// the 404.
func SurfaceCheck(rt *route.Router, r *http.Request) *apierror.Error {
	if rt == nil {
		return unknownPath(r)
	}
	switch p := r.URL.Path; {
	case p == "/v1/completions" || p == "/v1/chat/completions" || p == "/v1/models" || strings.HasPrefix(p, "/v1/models/"):
		return nil
	}
	if forwardable(rt, r) {
		return nil
	}
	return unknownPath(r)
}
