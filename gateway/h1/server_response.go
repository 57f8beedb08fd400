package h1

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// exchange is one request/response on a connection. It is the
// http.ResponseWriter and holds the request body, so a request costs one
// allocation for both. It is never reused: a handler that keeps it after
// returning gets errors, not the next request's connection state.
type exchange struct {
	c         *conn
	req       *http.Request
	info      reqInfo
	body      reqBody
	ctx       requestContext
	cancelCtx context.CancelFunc
	done      atomic.Bool // the handler returned

	// The upstream exchange to interrupt on cancellation (see watchUpstream).
	upMu     sync.Mutex
	upstream *clientConn
	canceled bool

	header http.Header // allocated on first Header()

	// Set when the status is chosen (WriteHeader or the first Write/Flush).
	status      int
	bodyAllowed bool  // false for 1xx, 204, 304
	declaredCL  int64 // the handler's Content-Length, -1 if none
	hasType     bool  // Content-Type present (even empty: no sniffing)
	hasEncoding bool  // Content-Encoding present: no sniffing either
	hasDate     bool
	// buf holds the header fields serialized when the status was chosen
	// (buf[:hdrEnd]), then the body written before the commit.
	buf    []byte
	hdrEnd int

	committed    bool // headers handed to the bufio.Writer
	chunked      bool
	noBody       bool  // HEAD or a status without body: writes are dropped
	written      int64 // body bytes accepted from the handler
	closeAfter   bool  // close the connection after this response
	continueSent bool
	warned       bool // superfluous WriteHeader logged
	bodyEOF      bool // guarded by c.mu: the request body was read to its end
}

// statusLines are the pre-rendered status lines of the registered codes.
var statusLines = func() (t [600]string) {
	for code := range t {
		if text := http.StatusText(code); text != "" {
			t[code] = "HTTP/1.1 " + strconv.Itoa(code) + " " + text + "\r\n"
		}
	}
	return t
}()

func appendStatusLine(b []byte, code int) []byte {
	if code < len(statusLines) && statusLines[code] != "" {
		return append(b, statusLines[code]...)
	}
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	b = append(b, statusText(code)...)
	return append(b, "\r\n"...)
}

func statusText(code int) string {
	if t := http.StatusText(code); t != "" {
		return t
	}
	return "status code " + itoa(code)
}

func itoa(n int) string { return strconv.Itoa(n) }

func appendInt(b []byte, n int64) []byte { return strconv.AppendInt(b, n, 10) }

// dateEntry caches the Date header value of one second.
type dateEntry struct {
	sec int64
	val []byte
}

var dateCache atomic.Pointer[dateEntry]

// appendDate appends the current time in http.TimeFormat, formatting at most
// once per second.
func appendDate(b []byte) []byte {
	now := time.Now()
	d := dateCache.Load()
	if d == nil || d.sec != now.Unix() {
		d = &dateEntry{now.Unix(), now.UTC().AppendFormat(nil, http.TimeFormat)}
		dateCache.Store(d)
	}
	return append(b, d.val...)
}

func bodyAllowedForStatus(code int) bool {
	return code >= 200 && code != http.StatusNoContent && code != http.StatusNotModified
}

// Header implements http.ResponseWriter.
func (ex *exchange) Header() http.Header {
	if ex.header == nil {
		// One group of eight: a proxied answer (the upstream's fields plus the gateway's
		// receipts) usually fits without growing the map, and a larger hint costs a table.
		ex.header = make(http.Header, 8)
	}
	return ex.header
}

// WriteHeader implements http.ResponseWriter. The first final status wins;
// 1xx statuses other than 101 are sent at once as interim responses.
func (ex *exchange) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("h1: invalid WriteHeader code %d", code))
	}
	if ex.done.Load() {
		return
	}
	if ex.status != 0 {
		if !ex.warned {
			ex.warned = true
			ex.debug("h1: superfluous WriteHeader call ignored", "status", ex.status, "ignored", code)
		}
		return
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		ex.writeInterim(code)
		return
	}
	ex.setStatus(code)
}

// writeInterim sends a 1xx response with the current header fields (RFC 9110
// §15.2); HTTP/1.0 clients get none.
func (ex *exchange) writeInterim(code int) {
	if ex.info.http10 {
		return
	}
	bw := ex.c.bw
	b := appendStatusLine(bw.AvailableBuffer(), code)
	for k, vv := range ex.header {
		b = appendFieldLines(b, k, vv)
	}
	bw.Write(append(b, "\r\n"...))
	bw.Flush()
	if code == http.StatusContinue {
		ex.continueSent = true
	}
}

// setStatus fixes the status and snapshots the header fields: like net/http,
// changes to the header map after this point have no effect.
func (ex *exchange) setStatus(code int) {
	ex.status = code
	ex.bodyAllowed = bodyAllowedForStatus(code)
	ex.noBody = !ex.bodyAllowed || ex.req.Method == methodHead
	ex.declaredCL = -1
	b := ex.c.bufs.wbuf[:0]
	for k, vv := range ex.header {
		switch k {
		case "Content-Length":
			if len(vv) > 0 {
				n, err := strconv.ParseInt(vv[0], 10, 64)
				if err != nil || n < 0 {
					ex.debug("h1: handler set an invalid Content-Length; dropped", "value", vv[0])
				} else {
					ex.declaredCL = n
				}
			}
			continue // written by commit
		case "Transfer-Encoding":
			continue // the server frames the body itself
		case "Connection":
			if headerValuesContainToken(vv, "close") {
				ex.closeAfter = true
			}
			continue // written by commit
		case "Content-Type":
			ex.hasType = true
		case "Content-Encoding":
			ex.hasEncoding = len(vv) > 0
		case "Date":
			ex.hasDate = true
		}
		b = appendFieldLines(b, k, vv)
	}
	ex.buf, ex.hdrEnd = b, len(b)
}

// Write implements http.ResponseWriter. Up to bufSize bytes are held before
// the headers are committed, so a small answer goes out with Content-Length.
func (ex *exchange) Write(p []byte) (int, error) {
	if ex.done.Load() {
		return 0, errWriterAfterHandler
	}
	if ex.status == 0 {
		ex.setStatus(http.StatusOK)
	}
	if !ex.bodyAllowed {
		return 0, http.ErrBodyNotAllowed
	}
	if ex.declaredCL >= 0 && ex.written+int64(len(p)) > ex.declaredCL {
		return 0, http.ErrContentLength
	}
	ex.written += int64(len(p))
	if !ex.committed {
		if len(ex.buf)-ex.hdrEnd+len(p) <= bufSize {
			ex.buf = append(ex.buf, p...)
			return len(p), nil
		}
		if err := ex.commit(false); err != nil {
			return 0, err
		}
	}
	if err := ex.writeBody(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeBody writes p to the connection with the committed framing.
func (ex *exchange) writeBody(p []byte) error {
	if ex.noBody || len(p) == 0 {
		return nil
	}
	bw := ex.c.bw
	if ex.chunked {
		// RFC 9112 §7.1: chunk-size in hex, CRLF, data, CRLF. The size line
		// is appended in the writer's own buffer: no allocation.
		if bw.Available() < 20 {
			if err := bw.Flush(); err != nil {
				return err
			}
		}
		b := strconv.AppendUint(bw.AvailableBuffer(), uint64(len(p)), 16)
		bw.Write(append(b, "\r\n"...))
		bw.Write(p)
		_, err := bw.WriteString("\r\n")
		return err
	}
	_, err := bw.Write(p)
	return err
}

// Flush implements http.Flusher.
func (ex *exchange) Flush() { ex.FlushError() }

// FlushError commits the headers and pushes everything written so far to the
// client; http.ResponseController.Flush uses it.
func (ex *exchange) FlushError() error {
	if ex.done.Load() {
		return errWriterAfterHandler
	}
	if ex.status == 0 {
		ex.setStatus(http.StatusOK)
	}
	if !ex.committed {
		if err := ex.commit(false); err != nil {
			return err
		}
	}
	return ex.c.bw.Flush()
}

// commit writes the status line and header fields, choosing the framing
// (RFC 9112 §6.3), then the body held so far. final means the handler has
// returned, so the held body is the whole body.
func (ex *exchange) commit(final bool) error {
	ex.committed = true
	c := ex.c
	held := ex.buf[ex.hdrEnd:]
	cl := int64(-1)
	switch {
	case !ex.bodyAllowed:
		if ex.status == http.StatusNotModified {
			cl = ex.declaredCL // a 304 may carry the would-be length
		}
	case ex.declaredCL >= 0:
		cl = ex.declaredCL
	case final && (len(held) > 0 || ex.req.Method != methodHead):
		cl = int64(len(held))
	case ex.noBody: // HEAD with a body of unknown length: no framing needed
	case ex.info.http10:
		ex.closeAfter = true // no chunking in HTTP/1.0: the close ends the body
	default:
		ex.chunked = true
	}
	if ex.req.Close || c.srv.closing.Load() {
		ex.closeAfter = true
	}

	b := appendStatusLine(c.bw.AvailableBuffer(), ex.status)
	b = append(b, ex.buf[:ex.hdrEnd]...)
	if !ex.hasType && !ex.hasEncoding && ex.bodyAllowed && len(held) > 0 {
		b = append(b, "Content-Type: "...)
		b = append(b, http.DetectContentType(held)...)
		b = append(b, "\r\n"...)
	}
	if !ex.hasDate {
		b = append(b, "Date: "...)
		b = appendDate(b)
		b = append(b, "\r\n"...)
	}
	switch {
	case cl >= 0:
		b = append(b, "Content-Length: "...)
		b = appendInt(b, cl)
		b = append(b, "\r\n"...)
	case ex.chunked:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	switch {
	case ex.closeAfter:
		b = append(b, "Connection: close\r\n"...)
	case ex.info.http10:
		b = append(b, "Connection: keep-alive\r\n"...)
	}
	b = append(b, "\r\n"...)
	if _, err := c.bw.Write(b); err != nil {
		return err
	}
	ex.buf = ex.buf[:0]
	c.bufs.wbuf = ex.buf // keep a grown buffer for the next request
	return ex.writeBody(held)
}

// finish completes the response after the handler returned normally and
// reports whether the connection can serve another request.
func (ex *exchange) finish() bool {
	c := ex.c
	if ex.status == 0 {
		ex.setStatus(http.StatusOK)
	}
	// Decide about the unread request body before committing, so that the
	// Connection header tells the truth when we already know.
	discard := false
	if b := &ex.body; ex.info.bodyKind != bodyNone && b.err != io.EOF {
		switch {
		case ex.info.expectContinue && !ex.continueSent:
			ex.closeAfter = true // the client may or may not send the body now
			c.linger = true
		case b.err != nil, b.chunked == nil && b.remaining > maxDiscard:
			ex.closeAfter = true
			c.linger = true
		default:
			discard = true
		}
	}
	var err error
	if !ex.committed {
		err = ex.commit(true)
	} else if ex.chunked && !ex.noBody {
		_, err = c.bw.WriteString("0\r\n\r\n") // RFC 9112 §7.1: last-chunk, no trailer
	}
	if ex.bodyAllowed && !ex.noBody && ex.declaredCL >= 0 && ex.written < ex.declaredCL {
		ex.closeAfter = true // the declared framing is broken: only a close ends it
	}
	if err == nil && !discard && !ex.closeAfter && !c.peerGone.Load() {
		// The connection stays for the next request: awaitRequest flushes, so that it can wait
		// for that request without a read that fails first (see flushThenAwait).
		c.pendingFlush = true
		return true
	}
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil || ex.closeAfter || c.peerGone.Load() {
		return false
	}
	if discard && (ex.body.chunked != nil || int64(c.br.Buffered()) < ex.body.remaining) {
		// The rest may still be on its way; do not wait for it forever.
		c.setReadDeadline(time.Now().Add(c.srv.idleTimeout()))
	}
	if discard && !ex.body.discard(maxDiscard) {
		c.linger = true
		return false
	}
	return true
}

// abort ends a request whose handler panicked with v.
func (ex *exchange) abort(v any) {
	c := ex.c
	if v != http.ErrAbortHandler {
		c.srv.logger().Error("h1: handler panic", "remote", c.remoteAddr,
			"method", ex.req.Method, "uri", ex.req.RequestURI, "panic", v, "stack", string(debug.Stack()))
		if !ex.committed {
			c.bw.Write(appendErrorResponse(c.bw.AvailableBuffer(), c.srv.ErrorBody, http.StatusInternalServerError, "the handler failed"))
			c.linger = ex.info.bodyKind != bodyNone && ex.body.err != io.EOF
		}
	}
	// What was committed goes out, without a last chunk: the client sees the
	// body break off.
	c.bw.Flush()
}

// sendContinue answers "Expect: 100-continue" on the first body read, unless
// the handler already chose its status.
func (ex *exchange) sendContinue() {
	if ex.continueSent || ex.status != 0 {
		return
	}
	ex.continueSent = true
	ex.c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
	ex.c.bw.Flush()
}

func (ex *exchange) debug(msg string, args ...any) {
	log := ex.c.srv.logger()
	if log.Enabled(context.Background(), slog.LevelDebug) {
		log.Debug(msg, append(args, "remote", ex.c.remoteAddr, "uri", ex.req.RequestURI)...)
	}
}
