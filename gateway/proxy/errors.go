package proxy

import (
	"net/http"
	"strconv"

	"github.com/kvexact/kvexact/gateway/apierror"
)

// badRequest is the proxy's most common answer: 400, naming the request field at fault.
func badRequest(param, code, format string, args ...any) *apierror.Error {
	return apierror.Invalid(http.StatusBadRequest, param, code, format, args...)
}

// writeError answers the client with e. Only valid before any response byte was written.
func writeError(w http.ResponseWriter, e *apierror.Error) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	if e.RetryAfter() {
		h.Set("Retry-After", "1")
	}
	b := e.Body()
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(e.Status)
	_, _ = w.Write(b)
}
