package proxy

import (
	"net/http"
	"strconv"
	"time"

	"github.com/kvexact/kvexact/gateway/apierror"
)

// limit applies the per-request limits the HTTP server does not: the number of header field lines
// (net/http bounds their bytes only) and the body deadline, armed here and cleared once the body
// has been read (readBody), so that a slow response stream is never cut by it.
func (c *call) limit() *apierror.Error {
	fields := 0
	for _, vv := range c.r.Header {
		fields += len(vv)
	}
	if fields > c.p.cfg.MaxHeaderFields {
		c.w.Header().Set("Connection", "close")
		c.p.cfg.Metrics.clientError(c.rule.name, clientHeaderFields)
		return &apierror.Error{Status: http.StatusRequestHeaderFieldsTooLarge, Type: apierror.TypeInvalid, Code: "request_header_fields_too_large",
			Message: "the request has " + strconv.Itoa(fields) + " header fields; at most " + strconv.Itoa(c.p.cfg.MaxHeaderFields) + " are accepted"}
	}
	if c.r.ProtoMajor == 1 && len(c.r.TransferEncoding) > 0 {
		// A chunked body may have come with a Content-Length that net/http dropped (Transfer-
		// Encoding wins): RFC 9112 §6.1 asks to close the connection after responding to such a
		// request, so that nothing after the body is read as another request. Clients of the
		// OpenAI API send Content-Length; closing after their rare chunked request costs little.
		c.w.Header().Set("Connection", "close")
	}
	if c.r.ContentLength != 0 && c.r.Body != nil && c.r.Body != http.NoBody {
		// Not armed for a bodyless request: net/http starts watching the connection for a
		// disconnect at once then, and a deadline would read as one.
		if err := http.NewResponseController(c.w).SetReadDeadline(time.Now().Add(c.p.cfg.BodyTimeout)); err == nil {
			c.bodyDeadline = true
		}
	}
	return nil
}

// endBodyDeadline clears the body deadline (net/http's disconnect watch reads the connection after
// the body; a deadline left armed would cancel the request as if the client had left).
func (c *call) endBodyDeadline() {
	if c.bodyDeadline {
		c.bodyDeadline = false
		_ = http.NewResponseController(c.w).SetReadDeadline(time.Time{})
	}
}

// progress renews the write deadline: the next write to the client must make progress within
// WriteTimeout (http.ResponseController's deadline, without a controller per request). A write
// past it fails, and the relay cuts the response as for a client that left.
func (c *call) progress() {
	w := c.w
	for {
		switch t := w.(type) {
		case interface{ SetWriteDeadline(time.Time) error }:
			_ = t.SetWriteDeadline(time.Now().Add(c.p.cfg.WriteTimeout))
			return
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return
		}
	}
}
