package proxy

import (
	"fmt"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/kvexact/kvexact/gateway/apierror"
	"github.com/kvexact/kvexact/gateway/route"
)

// forwardable reports whether rt's rule may send r's path to its endpoints: a path of the API
// surface its engine family serves (the contract's api list; /v1/completions, /v1/chat/completions
// and /v1/models are the proxy's own and never come here), else a passthrough path. Anything else
// is OpenAI's 404: engine admin routes (vLLM /reset_prefix_cache, SGLang /flush_cache, the
// TensorRT-LLM event drain, …) never reach an engine. Every forwarded path must be in canonical
// form (canonicalPath), so that no engine can resolve it to a route the rule did not list.
func forwardable(rt *route.Router, r *http.Request) bool {
	p := r.URL.Path
	return canonicalPath(r) && (rt.Rule().Serves(p) || rt.Rule().Passes(p))
}

// canonicalPath reports whether r's request-target path is sent as it reads: no escape that
// decodes to something else (/%76%31/completions, /v1%2Fembeddings), no dot segments, no doubled
// slashes. The proxy matches the decoded path; a path forwarded in another spelling would make
// the engine parse a different request-target from the one that was checked, so such a path is
// refused (404) on every forwarded route rather than forwarded.
func canonicalPath(r *http.Request) bool {
	p := r.URL.Path
	return r.URL.RawPath == "" && path.Clean(p) == p
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
	if e := checkQuery(r); e != nil {
		return e
	}
	switch p := r.URL.Path; {
	case p == "/v1/completions" || p == "/v1/chat/completions" || p == "/v1/models" || strings.HasPrefix(p, "/v1/models/"):
		if !canonicalPath(r) {
			return nonCanonical(r)
		}
		return nil
	}
	if forwardable(rt, r) {
		return nil
	}
	return unknownPath(r)
}

// checkQuery refuses a query string that engines and the gateway could read differently: the
// engines' servers (Starlette, FastAPI, aiohttp: Python's urllib.parse.parse_qsl) split on "&"
// only, keep a malformed escape as it is and take ";" as data, where Go refuses or splits. So a
// query must be RFC 3986 query characters, "%" only in a valid escape and no ";", and the refusal
// names the byte offset.
func checkQuery(r *http.Request) *apierror.Error {
	q := r.URL.RawQuery
	for i := 0; i < len(q); i++ {
		b := q[i]
		switch {
		case b == '%':
			if i+2 >= len(q) || !isHex(q[i+1]) || !isHex(q[i+2]) {
				return badQuery(q, i, "a %% not followed by two hex digits")
			}
			i += 2
		case b == ';':
			return badQuery(q, i, "\";\" (engines read it as data, Go as a separator)")
		case !queryByte(b):
			return badQuery(q, i, fmt.Sprintf("byte 0x%02x, not a query character", b))
		}
	}
	return nil
}

func badQuery(q string, i int, what string) *apierror.Error {
	return badRequest("", "invalid_query", "the query string has %s at byte %d: %q", what, i, q)
}

func isHex(b byte) bool {
	return '0' <= b && b <= '9' || 'a' <= b && b <= 'f' || 'A' <= b && b <= 'F'
}

// queryByte: RFC 3986 query characters (pchar, "/" and "?") without ";" and "%" (handled above).
func queryByte(b byte) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,=:@/?", b) >= 0
}

// nonCanonical is the 404 of a path sent in another spelling than the one it decodes to.
func nonCanonical(r *http.Request) *apierror.Error {
	return &apierror.Error{Status: http.StatusNotFound, Type: apierror.TypeInvalid, Code: "unknown_url",
		Message: "Invalid URL (" + r.Method + " " + r.URL.EscapedPath() + "): the path must be sent as it reads, without percent-escapes, dot segments or doubled slashes (it decodes to " + strconv.Quote(r.URL.Path) + ")"}
}
