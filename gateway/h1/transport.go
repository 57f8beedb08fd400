package h1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Transport is an HTTP/1.1 client for plain-http upstreams (the inference engines). It is an
// http.RoundTripper whose whole exchange runs on the caller's goroutine: take a pooled connection,
// write the request, read the response head in place, hand back a body that returns the connection
// to the pool at its end. net/http.Transport instead passes every request through two goroutines
// per connection (a write loop and a read loop); on a proxy's small requests those hand-offs cost
// as much as the proxying itself.
//
// What it does not do is left to Fallback: TLS (https), CONNECT and protocol upgrades,
// Expect: 100-continue, HTTP/2. There is no transparent compression (the gateway relays bytes) and
// no environment proxy.
type Transport struct {
	// DialContext opens upstream connections. Nil: a net.Dialer with a 5 s connect timeout and 30 s
	// TCP keep-alive.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxIdleConnsPerHost bounds the idle keep-alive connections kept per upstream address; a
	// connection released beyond it is closed. 0 means 1024: an engine serves hundreds of
	// concurrent streams, and re-dialling under load costs more than an idle socket.
	MaxIdleConnsPerHost int
	// IdleConnTimeout closes connections idle longer than this. 0 means 90 s. An upstream that
	// closes idle connections sooner (uvicorn: 5 s) is handled by the stale-connection retry below.
	IdleConnTimeout time.Duration
	// MaxResponseHeaderBytes bounds a response's status line and header fields. 0 means 1 MiB.
	MaxResponseHeaderBytes int
	// Fallback serves the requests this transport does not (see the type comment). Nil: such a
	// request fails with an error that names what is unsupported.
	Fallback http.RoundTripper

	mu   sync.Mutex
	idle map[string][]*clientConn // per address, most recently used last
}

// ErrBodyLength: a request's body was shorter or longer than its declared ContentLength.
var ErrBodyLength = errors.New("h1: request body length differs from ContentLength")

// aLongTimeAgo is a deadline in the past: setting it interrupts a blocked read or write at once.
var aLongTimeAgo = time.Unix(1, 0)

func (t *Transport) maxIdle() int {
	if t.MaxIdleConnsPerHost > 0 {
		return t.MaxIdleConnsPerHost
	}
	return 1024
}

func (t *Transport) idleTimeout() time.Duration {
	if t.IdleConnTimeout > 0 {
		return t.IdleConnTimeout
	}
	return 90 * time.Second
}

func (t *Transport) headerBudget() int {
	if t.MaxResponseHeaderBytes > 0 {
		return t.MaxResponseHeaderBytes
	}
	return 1 << 20
}

var defaultDialer = &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}

func (t *Transport) dial(ctx context.Context, addr string) (*clientConn, error) {
	dial := t.DialContext
	if dial == nil {
		dial = defaultDialer.DialContext
	}
	nc, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	cc := &clientConn{t: t, addr: addr, nc: nc, bw: bufio.NewWriterSize(nc, 4<<10)}
	cc.br = bufio.NewReaderSize(cc, 4<<10)
	cc.recent, cc.interruptFn = true, cc.interrupt
	if sc, ok := nc.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			cc.rc, cc.flushFn = rc, cc.flushInRead
		}
	}
	return cc, nil
}

// unsupported says why a request must go to Fallback ("" when this transport serves it).
func unsupported(req *http.Request) string {
	switch {
	case req.URL == nil:
		return "a request without a URL"
	case req.URL.Scheme != "http":
		return "scheme " + strconv.Quote(req.URL.Scheme)
	case req.Method == http.MethodConnect:
		return "CONNECT"
	case len(req.Header["Upgrade"]) > 0: // canonical keys: no Get, which canonicalizes per call
		return "protocol upgrades"
	case len(req.Header["Expect"]) > 0:
		return "Expect"
	case req.URL.Host == "" && req.Host == "":
		return "a request without a host"
	}
	return ""
}

// RoundTrip sends req and returns the response head; the body streams from the connection.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if why := unsupported(req); why != "" {
		if t.Fallback != nil {
			return t.Fallback.RoundTrip(req)
		}
		closeBody(req)
		return nil, fmt.Errorf("h1: %s is not supported by this transport and no fallback is set", why)
	}
	ctx := req.Context()
	addr := hostPort(req.URL)
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			closeBody(req)
			return nil, err
		}
		cc, err := t.getConn(ctx, addr, attempt > 0)
		if err != nil {
			closeBody(req)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		resp, err := cc.roundTrip(req)
		if err == nil {
			return resp, nil
		}
		// A pooled connection the upstream had already closed (uvicorn drops idle ones after 5 s)
		// fails before any byte of the answer: the request is sent again once, on a fresh
		// connection. net/http learns of such closes from its per-connection read loop, which
		// this transport does not run. The same failure from an upstream that took the request
		// and died before answering also retries once: at worst an engine computes it twice.
		var se *staleConnError
		if errors.As(err, &se) && attempt == 0 && replayable(req) {
			if req.GetBody != nil {
				b, gerr := req.GetBody()
				if gerr != nil {
					return nil, se.err
				}
				req = shallowWithBody(req, b)
			}
			continue
		}
		if se != nil {
			err = se.err
		}
		return nil, err
	}
}

// CloseIdleConnections closes every pooled connection, the Fallback's too.
func (t *Transport) CloseIdleConnections() {
	if f, ok := t.Fallback.(interface{ CloseIdleConnections() }); ok {
		f.CloseIdleConnections()
	}
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	t.mu.Unlock()
	for _, list := range idle {
		for _, cc := range list {
			cc.nc.Close()
		}
	}
}

// getConn returns the most recently released idle connection to addr, or dials one. fresh skips
// the pool (the retry after a stale connection).
func (t *Transport) getConn(ctx context.Context, addr string, fresh bool) (*clientConn, error) {
	if !fresh {
		now := time.Now()
		t.mu.Lock()
		list := t.idle[addr]
		for len(list) > 0 {
			cc := list[len(list)-1]
			list[len(list)-1] = nil
			list = list[:len(list)-1]
			if now.Sub(cc.idleAt) > t.idleTimeout() {
				// The newest is too old, so all are: drop the lot.
				for _, old := range list {
					old.nc.Close()
				}
				clear(list)
				list = list[:0]
				cc.nc.Close()
				break
			}
			t.idle[addr] = list
			t.mu.Unlock()
			cc.reused = true
			cc.recent = now.Sub(cc.idleAt) < waitFirstIdle
			return cc, nil
		}
		if t.idle != nil {
			t.idle[addr] = list
		}
		t.mu.Unlock()
	}
	return t.dial(ctx, addr)
}

// putConn returns a connection whose exchange ended cleanly to the pool.
func (t *Transport) putConn(cc *clientConn) {
	cc.idleAt = time.Now()
	t.mu.Lock()
	if t.idle == nil {
		t.idle = map[string][]*clientConn{}
	}
	list := t.idle[cc.addr]
	// The oldest idle connection is first; close it when it expired or the pool is full.
	if len(list) > 0 && (len(list) >= t.maxIdle() || cc.idleAt.Sub(list[0].idleAt) > t.idleTimeout()) {
		list[0].nc.Close()
		copy(list, list[1:])
		list[len(list)-1] = nil
		list = list[:len(list)-1]
	}
	t.idle[cc.addr] = append(list, cc)
	t.mu.Unlock()
}

// clientConn is one keep-alive connection to an upstream; at most one exchange at a time.
type clientConn struct {
	t      *Transport
	addr   string
	nc     net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	idleAt time.Time
	reused bool  // it served an exchange before this one
	recent bool  // reused after less than waitFirstIdle idle (or fresh): see flush
	nread  int64 // bytes read in the current exchange (0: the upstream sent nothing yet)

	interruptFn func() // cc.interrupt, made once: a method value costs an allocation

	// rc, flushFn and the two fields after them serve flush's wait-first path; rc is nil when the
	// connection has no file descriptor to wait on.
	rc       syscall.RawConn
	flushFn  func(uintptr) bool // cc.flushInRead
	flushed  bool
	flushErr error

	// interrupted is set by the request context's AfterFunc, which also poisons the deadline.
	interrupted atomic.Bool
}

// Read counts what the connection delivers, so a failure can tell "nothing arrived" apart.
func (cc *clientConn) Read(p []byte) (int, error) {
	n, err := cc.nc.Read(p)
	cc.nread += int64(n)
	return n, err
}

// staleConnError is a reused connection that failed before any byte of the response arrived.
type staleConnError struct{ err error }

func (e *staleConnError) Error() string { return e.err.Error() }
func (e *staleConnError) Unwrap() error { return e.err }

// roundTrip performs one exchange on cc. On success the connection belongs to the response body.
func (cc *clientConn) roundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	cc.nread = 0
	// A cancellation interrupts the exchange. Under an h1.Server request's own context the server
	// does that itself (watchUpstream); otherwise a context.AfterFunc does.
	var ex *exchange
	var stop func() bool
	if rc, ok := ctx.(*requestContext); ok && rc.ex.watchUpstream(cc) {
		ex = rc.ex
	} else if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, cc.interruptFn)
	}
	fail := func(err error, stale bool) (*http.Response, error) {
		if ex != nil {
			ex.unwatchUpstream(cc)
		}
		if stop != nil {
			stop()
		}
		cc.nc.Close()
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		if stale && cc.reused {
			return nil, &staleConnError{err}
		}
		return nil, err
	}
	whole, err := cc.writeRequest(req)
	if err == nil {
		err = cc.flush(whole)
	}
	if err != nil {
		var be *bodyError
		if errors.As(err, &be) {
			return fail(be.err, false)
		}
		return fail(err, true)
	}
	resp, err := cc.readResponse(req)
	if err != nil {
		return fail(err, cc.nread == 0 && isConnReset(err))
	}
	resp.resp.Request = req
	cc.attachBody(req, resp, ex, stop)
	return &resp.resp, nil
}

// attachBody gives resp the body its framing says it has; a response without one releases the
// connection at once.
func (cc *clientConn) attachBody(req *http.Request, r *responseWithBody, ex *exchange, stop func() bool) {
	resp, b := &r.resp, &r.body
	*b = body{cc: cc, ex: ex, stop: stop, ctx: req.Context(), closeAfter: resp.Close || req.Close}
	switch {
	case !bodyAllowed(req.Method, resp.StatusCode), resp.ContentLength == 0:
		resp.Body = http.NoBody
		b.release(true)
		return
	case resp.TransferEncoding != nil:
		b.chunked = httputil.NewChunkedReader(cc.br)
	case resp.ContentLength > 0:
		b.remaining = resp.ContentLength
	default:
		b.untilClose = true
	}
	resp.Body = b
}

func (cc *clientConn) interrupt() {
	cc.interrupted.Store(true)
	_ = cc.nc.SetDeadline(aLongTimeAgo)
}

// bodyError is a failure of the request body itself (not of the connection): never retried.
type bodyError struct{ err error }

func (e *bodyError) Error() string { return e.err.Error() }

// writeRequest writes the request line, headers and body into the connection's buffer (which
// flushes on its own only when full). whole reports that all of it is still in the buffer, unsent.
func (cc *clientConn) writeRequest(req *http.Request) (whole bool, err error) {
	bw := cc.bw
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if strings.ContainsAny(host, "\r\n ") {
		return false, &bodyError{fmt.Errorf("h1: invalid Host %q", host)}
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet // as in net/http (a RoundTripper must not edit the request)
	}
	if !isToken(method) {
		return false, &bodyError{fmt.Errorf("h1: invalid method %q", method)}
	}
	uri := req.URL.RequestURI()
	if strings.ContainsAny(uri, "\r\n ") {
		return false, &bodyError{fmt.Errorf("h1: invalid request target %q", uri)}
	}
	b := bw.AvailableBuffer()
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, uri...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\n"...)

	hasBody := req.Body != nil && req.Body != http.NoBody
	n := req.ContentLength
	chunked := false
	switch {
	case !hasBody:
		// RFC 9110 §8.6: a POST/PUT/PATCH without a body still says so; GET and friends do not.
		if method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch {
			b = append(b, "Content-Length: 0\r\n"...)
		}
	case n > 0:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, n, 10)
		b = append(b, "\r\n"...)
	default:
		chunked = true
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	if req.Close && req.Header.Get("Connection") == "" {
		b = append(b, "Connection: close\r\n"...)
	}
	b = appendHeaderExcept(b, req.Header)
	b = append(b, "\r\n"...)
	// Nothing was buffered before this request, so the buffer holds all of it exactly when its
	// length is the head's plus the body's.
	size := int64(len(b))
	if _, err := bw.Write(b); err != nil {
		return false, err
	}
	if hasBody {
		var err error
		if chunked {
			err = writeChunked(bw, req.Body)
			size = -1
		} else {
			err = writeExactly(bw, req.Body, n)
			size += n
		}
		req.Body.Close()
		if err != nil {
			return false, err
		}
	}
	return int64(bw.Buffered()) == size, nil
}

// waitFirstIdle bounds how long a pooled connection may have been idle for flush to take its
// wait-first path: upstreams close idle connections after seconds, not within a few hundred
// milliseconds of an answer that did not announce the close.
const waitFirstIdle = 250 * time.Millisecond

// flush sends the buffered request. When the whole request is in the buffer, the connection is
// fresh or was idle only briefly and no unread byte is buffered, it also waits until the reply is
// readable, so that readResponse's first read finds data: a read attempted at once, as net.Conn
// does, nearly always fails with EAGAIN and parks — a wasted system call on every exchange.
//
// The wait must not miss readiness that came before it. RawConn.Read forgets earlier readiness
// before its first callback, so the flush runs inside that callback: the upstream cannot answer
// a request it has not received, so every byte of the answer arrives after the point that forgot
// older readiness, and is seen. What could have arrived earlier is an idle connection's close (an
// old FIN): that is why a long-idle connection takes the ordinary path, and why a request written
// partly before (a body larger than the buffer, which the upstream may answer early) does too. A
// connection the upstream closed answers the flush with a reset, which also ends the wait.
func (cc *clientConn) flush(whole bool) error {
	if cc.rc == nil || !whole || !cc.recent || cc.br.Buffered() > 0 {
		return cc.bw.Flush()
	}
	cc.flushed, cc.flushErr = false, nil
	_ = cc.rc.Read(cc.flushFn) // a failed wait (deadline, interrupt, close) shows again in the read
	if !cc.flushed {
		return cc.bw.Flush() // RawConn.Read failed before calling back: let the flush report it
	}
	return cc.flushErr
}

// flushInRead is flush's RawConn.Read callback: the first call flushes and asks to wait for
// readability (unless the flush failed), the second reports it.
func (cc *clientConn) flushInRead(uintptr) bool {
	if cc.flushed {
		return true
	}
	cc.flushed = true
	cc.flushErr = cc.bw.Flush()
	return cc.flushErr != nil
}

// appendHeaderExcept appends req's header fields except those the transport writes itself.
func appendHeaderExcept(b []byte, h http.Header) []byte {
	for k, vv := range h {
		switch k {
		case "Host", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		b = appendFieldLines(b, k, vv)
	}
	return b
}

// limitedWriter writes at most n bytes to w; a source that has more fails with ErrBodyLength. It
// remembers whether w failed (a connection error, retryable) as opposed to the source (a body
// error, not retryable).
type limitedWriter struct {
	w    io.Writer
	n    int64
	werr error
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.n {
		return 0, ErrBodyLength
	}
	n, err := l.w.Write(p)
	l.n -= int64(n)
	if err != nil {
		l.werr = err
	}
	return n, err
}

// writeExactly copies exactly n body bytes. A body that can write itself (the proxy's bytes, behind
// io.NopCloser) goes straight into the buffered writer; any other is read into the writer's buffer.
func writeExactly(bw *bufio.Writer, body io.Reader, n int64) error {
	// A body that knows its length and writes itself (a bytes.Reader or the proxy's bodies) needs
	// no limiting writer when the length is the declared one.
	if lb, ok := body.(interface {
		io.WriterTo
		Len() int
	}); ok && int64(lb.Len()) == n {
		_, err := lb.WriteTo(bw)
		return err // only the writer can fail: a connection error
	}
	lw := &limitedWriter{w: bw, n: n}
	var err error
	if wt, ok := body.(io.WriterTo); ok {
		_, err = wt.WriteTo(lw)
	} else {
		_, err = io.Copy(lw, io.LimitReader(body, n))
	}
	switch {
	case lw.werr != nil:
		return lw.werr
	case errors.Is(err, ErrBodyLength):
		return &bodyError{fmt.Errorf("%w: more than the declared %d bytes", ErrBodyLength, n)}
	case err != nil:
		return &bodyError{fmt.Errorf("h1: reading the request body: %w", err)}
	case lw.n != 0:
		return &bodyError{fmt.Errorf("%w: declared %d, got %d", ErrBodyLength, n, n-lw.n)}
	}
	return nil
}

func writeChunked(bw *bufio.Writer, body io.Reader) error {
	buf := make([]byte, 8<<10)
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			hdr := strconv.AppendInt(bw.AvailableBuffer(), int64(n), 16)
			hdr = append(hdr, "\r\n"...)
			if _, err := bw.Write(hdr); err != nil {
				return err
			}
			if _, err := bw.Write(buf[:n]); err != nil {
				return err
			}
			if _, err := bw.WriteString("\r\n"); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			_, err := bw.WriteString("0\r\n\r\n")
			return err
		}
		if rerr != nil {
			return &bodyError{fmt.Errorf("h1: reading the request body: %w", rerr)}
		}
	}
}

// readResponse reads the status line and header fields, skipping interim 1xx responses
// (RFC 9110 §15.2), and sets the body framing fields (RFC 9112 §6.3).
func (cc *clientConn) readResponse(req *http.Request) (*responseWithBody, error) {
	budget := cc.t.headerBudget()
	for {
		line, err := readLine(cc.br, &budget)
		if err != nil {
			return nil, err
		}
		r, err := parseStatusLine(line)
		if err != nil {
			return nil, err
		}
		resp := &r.resp
		resp.Header = make(http.Header, 8) // one group: an engine's answer has a handful of fields
		if err := readHeader(cc.br, resp.Header, &budget); err != nil {
			return nil, fmt.Errorf("h1: response from %s: %w", cc.addr, err)
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return nil, fmt.Errorf("h1: %s switched protocols, which this transport does not support", cc.addr)
		}
		if err := setFraming(resp, req.Method); err != nil {
			return nil, fmt.Errorf("h1: response from %s: %w", cc.addr, err)
		}
		return r, nil
	}
}

// parseStatusLine parses "HTTP/1.x SSS reason". The response comes with room for its body
// (attachBody), one allocation for both.
func parseStatusLine(line []byte) (*responseWithBody, error) {
	if string(line) == "HTTP/1.1 200 OK" { // the usual answer: no parse, no string
		r := new(responseWithBody)
		r.resp = http.Response{Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, StatusCode: 200, Status: "200 OK"}
		return r, nil
	}
	s := string(line)
	proto, rest, ok := strings.Cut(s, " ")
	if !ok || len(rest) < 3 || (len(rest) > 3 && rest[3] != ' ') {
		return nil, fmt.Errorf("h1: malformed status line %q", s)
	}
	r := new(responseWithBody)
	resp := &r.resp
	*resp = http.Response{Proto: proto, ProtoMajor: 1}
	switch proto {
	case "HTTP/1.1":
		resp.ProtoMinor = 1
	case "HTTP/1.0":
	default:
		return nil, fmt.Errorf("h1: status line %q: protocol %q is not HTTP/1.0 or HTTP/1.1", s, proto)
	}
	code := 0
	for i := 0; i < 3; i++ {
		c := rest[i]
		if c < '0' || c > '9' {
			return nil, fmt.Errorf("h1: status line %q: status code %q is not three digits", s, rest[:3])
		}
		code = code*10 + int(c-'0')
	}
	if code < 100 {
		return nil, fmt.Errorf("h1: status line %q: status code %d is below 100", s, code)
	}
	resp.StatusCode, resp.Status = code, rest
	return r, nil
}

// setFraming decides how the body is delimited and whether the connection survives it.
func setFraming(resp *http.Response, method string) error {
	h := resp.Header
	resp.Close = headerValuesContainToken(h["Connection"], "close") ||
		resp.ProtoMinor == 0 && !headerValuesContainToken(h["Connection"], "keep-alive")
	if !bodyAllowed(method, resp.StatusCode) {
		resp.ContentLength = 0
		if method == http.MethodHead {
			resp.ContentLength = -1
			if n, err := parseContentLength(h["Content-Length"]); err == nil && n >= 0 {
				resp.ContentLength = n
			}
		}
		return nil
	}
	if te := h["Transfer-Encoding"]; len(te) > 0 {
		// Only chunked as the final coding frames a response; anything else reads until close
		// (RFC 9112 §6.3 rule 4), which this transport does not relay as a coding it decodes.
		if !strings.EqualFold(strings.TrimSpace(te[len(te)-1]), "chunked") || len(te) > 1 || strings.Contains(te[0], ",") {
			return fmt.Errorf("unsupported Transfer-Encoding %q", strings.Join(te, ", "))
		}
		delete(h, "Transfer-Encoding")
		delete(h, "Content-Length") // §6.3 rule 3: chunked wins over a Content-Length
		resp.TransferEncoding = []string{"chunked"}
		resp.ContentLength = -1
		return nil
	}
	n, err := parseContentLength(h["Content-Length"])
	if err != nil {
		return err
	}
	resp.ContentLength = n
	if n < 0 {
		resp.Close = true // delimited by the connection's close
	}
	return nil
}

// parseContentLength returns -1 when there is no Content-Length; repeated equal values are one.
func parseContentLength(vv []string) (int64, error) {
	if len(vv) == 0 {
		return -1, nil
	}
	if len(vv) == 1 && strings.IndexByte(vv[0], ',') < 0 { // the usual single value
		m, err := strconv.ParseUint(strings.TrimSpace(vv[0]), 10, 63)
		if err != nil {
			return 0, fmt.Errorf("Content-Length %q is not a number", strings.TrimSpace(vv[0]))
		}
		return int64(m), nil
	}
	var n int64 = -1
	for _, v := range vv {
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			m, err := strconv.ParseUint(f, 10, 63)
			if err != nil {
				return 0, fmt.Errorf("Content-Length %q is not a number", f)
			}
			if n >= 0 && int64(m) != n {
				return 0, fmt.Errorf("conflicting Content-Length values %q", strings.Join(vv, ", "))
			}
			n = int64(m)
		}
	}
	return n, nil
}

// responseWithBody is a response and its body, allocated together.
type responseWithBody struct {
	resp http.Response
	body body
}

// bodyAllowed: responses to HEAD, 1xx, 204 and 304 have no body (RFC 9112 §6.3 rule 1).
func bodyAllowed(method string, status int) bool {
	return method != http.MethodHead && status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// body streams a response body off its connection and releases the connection at its end. Close
// may come from another goroutine while a Read blocks (as net/http allows): it closes the
// connection, which ends the Read.
type body struct {
	cc         *clientConn
	ctx        context.Context
	ex         *exchange   // the server exchange watching the context, if any (see watchUpstream)
	stop       func() bool // else the context.AfterFunc's stop; false if it already fired
	chunked    io.Reader   // chunked framing
	remaining  int64       // Content-Length framing: bytes left
	untilClose bool        // no framing: the body ends when the upstream closes
	closeAfter bool        // the connection may not be reused

	mu      sync.Mutex
	reading bool  // a Read is blocked on the connection
	done    bool  // released: EOF, error or Close
	err     error // what Read returns once done (nil: io.EOF)
}

var errBodyClosed = errors.New("h1: read on closed response body")

func (b *body) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.done || b.reading {
		err := b.err
		b.mu.Unlock()
		if err == nil {
			err = io.EOF
		}
		return 0, err
	}
	b.reading = true
	b.mu.Unlock()

	n, err := b.read(p)

	b.mu.Lock()
	defer b.mu.Unlock()
	b.reading = false
	if b.done { // closed while reading: Close already closed the connection
		return n, errBodyClosed
	}
	switch {
	case err == io.EOF:
		b.release(!b.untilClose)
	case err != nil:
		if cerr := b.ctx.Err(); cerr != nil {
			err = cerr
		}
		b.err = err
		b.release(false)
	}
	return n, err
}

func (b *body) read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	switch {
	case b.chunked != nil:
		n, err := b.chunked.Read(p)
		if err == io.EOF {
			// The last chunk is followed by optional trailer fields and an empty line (RFC 9112 §7.1.2).
			budget := b.cc.t.headerBudget()
			if terr := readHeader(b.cc.br, http.Header{}, &budget); terr != nil {
				err = fmt.Errorf("h1: chunked trailer: %w", terr)
			}
		}
		return n, err
	case b.untilClose:
		return b.cc.br.Read(p)
	}
	if int64(len(p)) > b.remaining {
		p = p[:b.remaining]
	}
	n, err := b.cc.br.Read(p)
	b.remaining -= int64(n)
	switch {
	case b.remaining == 0:
		err = io.EOF
	case err == io.EOF:
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// Close ends the body; a body not read to its end costs the connection.
func (b *body) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return nil
	}
	b.err = errBodyClosed
	b.release(false)
	return nil
}

// release ends the exchange: the connection goes back to the pool when reuse is true and nothing
// spoiled it, else it is closed. b.mu is held (or b is not shared yet).
func (b *body) release(reuse bool) {
	b.done = true
	cc := b.cc
	if b.ex != nil && !b.ex.unwatchUpstream(cc) || b.stop != nil && !b.stop() {
		reuse = false // the context fired: the connection's deadline is poisoned
	}
	if b.reading || cc.interrupted.Load() || b.closeAfter || cc.br.Buffered() > 0 {
		reuse = false
	}
	if reuse {
		cc.t.putConn(cc)
		return
	}
	cc.nc.Close()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// replayable: the request can be sent again after a stale connection (body absent or re-creatable).
func replayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

func shallowWithBody(req *http.Request, b io.ReadCloser) *http.Request {
	r2 := new(http.Request)
	*r2 = *req
	r2.Body = b
	return r2
}

// isConnReset: the error a request on an already-closed keep-alive connection gets.
func isConnReset(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// hostPort is the address to dial for u: its host with the port, 80 when it names none.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	return net.JoinHostPort(u.Hostname(), "80")
}
