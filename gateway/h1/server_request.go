package h1

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
)

// requestError is a request the server answers itself with status.
type requestError struct {
	status int
	detail string
}

func (e *requestError) Error() string { return itoa(e.status) + " " + e.detail }

func badRequest(format string, args ...any) error {
	return &requestError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// Body framing of a request (RFC 9112 §6.3).
const (
	bodyNone = iota
	bodyLength
	bodyChunked
)

// reqInfo is what parsing learnt beyond the http.Request fields.
type reqInfo struct {
	bodyKind       int
	expectContinue bool // HTTP/1.1 "Expect: 100-continue" with a body
	http10         bool
	keepAlive10    bool // an HTTP/1.0 client asked for keep-alive
	optionsStar    bool // "OPTIONS *": answered by the server
}

// maxEmptyLines is how many empty lines before a request line are ignored
// (RFC 9112 §2.2 asks a server to ignore at least one).
const maxEmptyLines = 4

// readRequest reads one request head from br into r (every field a server
// fills, except Body, RemoteAddr and the context) and info. It returns io.EOF
// when the connection ended cleanly before a request, a network error as is
// (the caller closes without answering), and a *requestError for a request
// the server must answer itself.
func readRequest(br *bufio.Reader, maxHeader int, r *http.Request, info *reqInfo) error {
	budget := maxHeader
	var line []byte
	var err error
	for i := 0; ; i++ {
		line, err = readLine(br, &budget)
		if err != nil {
			return headError(err, maxHeader)
		}
		if len(line) > 0 || i == maxEmptyLines {
			break
		}
	}
	if err := parseRequestLine(line, r, info); err != nil {
		return err
	}

	h := make(http.Header, 8)
	if err := readHeader(br, h, &budget); err != nil {
		return headError(err, maxHeader)
	}
	r.Header = h
	return checkHeader(r, info)
}

// headError maps a read error inside the request head to what the caller
// does with it: io.EOF and network errors close silently, the rest is
// answered (431 for size, 400 otherwise).
func headError(err error, maxHeader int) error {
	var ne net.Error
	switch {
	case err == io.EOF:
		return io.EOF
	case errors.Is(err, ErrHeaderTooLarge):
		return &requestError{http.StatusRequestHeaderFieldsTooLarge,
			fmt.Sprintf("request line and header fields exceed %d bytes", maxHeader)}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("connection closed in the middle of the request head")
	case errors.As(err, &ne), errors.Is(err, net.ErrClosed):
		return err
	case errors.Unwrap(err) == nil && strings.HasPrefix(err.Error(), "header line "):
		return badRequest("%s", err.Error()) // readHeader's syntax errors wrap nothing
	}
	return err
}

var (
	methodGet     = "GET"
	methodPost    = "POST"
	methodHead    = "HEAD"
	methodPut     = "PUT"
	methodDelete  = "DELETE"
	methodOptions = "OPTIONS"
	methodPatch   = "PATCH"
)

// internMethod returns a shared string for common methods.
func internMethod(m []byte) (string, bool) {
	switch string(m) { // no allocation: the compiler compares in place
	case "GET":
		return methodGet, true
	case "POST":
		return methodPost, true
	case "HEAD":
		return methodHead, true
	case "PUT":
		return methodPut, true
	case "DELETE":
		return methodDelete, true
	case "OPTIONS":
		return methodOptions, true
	case "PATCH":
		return methodPatch, true
	}
	return "", false
}

// parseRequestLine parses "METHOD SP request-target SP HTTP-version"
// (RFC 9112 §3) into r.
func parseRequestLine(line []byte, r *http.Request, info *reqInfo) error {
	sp1 := indexByteSlice(line, ' ')
	if sp1 < 0 {
		return badRequest("malformed request line %q", clip(line))
	}
	sp2 := indexByteSlice(line[sp1+1:], ' ')
	if sp2 < 0 {
		return badRequest("malformed request line %q", clip(line))
	}
	sp2 += sp1 + 1
	method, target, version := line[:sp1], line[sp1+1:sp2], line[sp2+1:]

	// RFC 9112 §2.3: HTTP-version = "HTTP/" DIGIT "." DIGIT, case-sensitive.
	switch string(version) {
	case "HTTP/1.1":
		r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.1", 1, 1
	case "HTTP/1.0":
		r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.0", 1, 0
		info.http10 = true
	default:
		if len(version) == 8 && string(version[:5]) == "HTTP/" && isDigit(version[5]) && version[6] == '.' && isDigit(version[7]) {
			return &requestError{http.StatusHTTPVersionNotSupported, fmt.Sprintf("HTTP version %q is not supported", version)}
		}
		return badRequest("malformed HTTP version %q in the request line", clip(version))
	}
	if len(method) == 0 {
		return badRequest("malformed request line %q: empty method", clip(line))
	}
	for i, c := range method {
		if !isTokenByte(c) {
			return badRequest("invalid byte 0x%02x in method at offset %d", c, i)
		}
	}
	if len(target) == 0 {
		return badRequest("malformed request line %q: empty request target", clip(line))
	}
	for i, c := range target {
		if c <= ' ' || c == 0x7f {
			return badRequest("invalid byte 0x%02x in request target at offset %d", c, sp1+1+i)
		}
	}
	if string(method) == "CONNECT" {
		return &requestError{http.StatusNotImplemented, "CONNECT is not supported"}
	}

	// One string for the whole line: method (when uncommon) and the target
	// are slices of it.
	s := string(line)
	if m, ok := internMethod(method); ok {
		r.Method = m
	} else {
		r.Method = s[:sp1]
	}
	r.RequestURI = s[sp1+1 : sp2]

	// RFC 9112 §3.2: origin-form, absolute-form, asterisk-form (OPTIONS
	// only); authority-form is CONNECT's, refused above.
	switch {
	case r.RequestURI == "*":
		if r.Method != methodOptions {
			return badRequest("request target \"*\" is only allowed with OPTIONS, not %s", r.Method)
		}
		info.optionsStar = true
	case target[0] != '/':
		u, err := url.ParseRequestURI(r.RequestURI)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return badRequest("invalid request target %q: neither origin-form nor absolute-form", clip(target))
		}
		r.URL = u
		return nil
	}
	u, err := url.ParseRequestURI(r.RequestURI)
	if err != nil {
		return badRequest("invalid request target %q: %v", clip(target), unwrapURLError(err))
	}
	r.URL = u
	return nil
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// checkHeader applies the header rules of a request: Host, body framing,
// Expect, Connection.
func checkHeader(r *http.Request, info *reqInfo) error {
	h := r.Header

	// RFC 9112 §3.2: exactly one Host in HTTP/1.1; absolute-form overrides it.
	hosts := h["Host"]
	if len(hosts) > 1 {
		return badRequest("%d Host header fields; exactly one is allowed", len(hosts))
	}
	if len(hosts) == 0 && !info.http10 {
		return badRequest("missing Host header (required in HTTP/1.1)")
	}
	if len(hosts) == 1 {
		if i := invalidHostByte(hosts[0]); i >= 0 {
			return badRequest("invalid byte 0x%02x in Host header at offset %d", hosts[0][i], i)
		}
	}
	if r.URL.Host != "" {
		r.Host = r.URL.Host
	} else if len(hosts) == 1 {
		r.Host = hosts[0]
	}
	delete(h, "Host") // like net/http: the host lives in r.Host

	// Body framing, RFC 9112 §6.1 and §6.3.
	te, hasTE := h["Transfer-Encoding"]
	cls, hasCL := h["Content-Length"]
	switch {
	case hasTE && info.http10:
		// §6.1: a Transfer-Encoding in HTTP/1.0 means faulty framing.
		return badRequest("Transfer-Encoding in an HTTP/1.0 request")
	case hasTE && (len(te) != 1 || !asciiEqualFold(te[0], "chunked")):
		return &requestError{http.StatusNotImplemented, fmt.Sprintf("Transfer-Encoding %s is not supported", quoteList(te))}
	case hasTE && hasCL:
		// §6.1: both is a smuggling attempt; refuse rather than pick one.
		return badRequest("both Transfer-Encoding and Content-Length")
	case hasTE:
		info.bodyKind = bodyChunked
		r.ContentLength = -1
		r.TransferEncoding = []string{"chunked"}
		delete(h, "Transfer-Encoding")
	case hasCL:
		n, err := parseRequestLength(cls[0])
		if err != nil {
			return err
		}
		for _, v := range cls[1:] {
			if v != cls[0] {
				return badRequest("differing Content-Length values %q and %q", cls[0], v)
			}
		}
		r.ContentLength = n
		if n > 0 {
			info.bodyKind = bodyLength
		}
	}

	// RFC 9110 §10.1.1: 100-continue is ignored in HTTP/1.0 and pointless
	// without a body; any other expectation is refused with 417.
	if ev, ok := h["Expect"]; ok {
		if len(ev) != 1 || !asciiEqualFold(ev[0], "100-continue") {
			return &requestError{http.StatusExpectationFailed, fmt.Sprintf("expectation %s is not supported", quoteList(ev))}
		}
		info.expectContinue = !info.http10 && info.bodyKind != bodyNone
	}

	conn := h["Connection"]
	if info.http10 {
		info.keepAlive10 = headerValuesContainToken(conn, "keep-alive")
		r.Close = !info.keepAlive10
	} else {
		r.Close = headerValuesContainToken(conn, "close")
	}
	return nil
}

// parseRequestLength parses a Content-Length value: 1*DIGIT (RFC 9110 §8.6).
func parseRequestLength(v string) (int64, error) {
	if v == "" {
		return 0, badRequest("empty Content-Length")
	}
	for i := 0; i < len(v); i++ {
		if !isDigit(v[i]) {
			return 0, badRequest("Content-Length %q is not a number", clipString(v))
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, badRequest("Content-Length %q is out of range", clipString(v))
	}
	return n, nil
}

func quoteList(vv []string) string {
	b := []byte(nil)
	for i, v := range vv {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendQuote(b, clipString(v))
	}
	return string(b)
}

func clipString(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func indexByteSlice(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// hostTable marks the bytes a Host value may hold: reg-name, IP-literal and
// port characters (RFC 3986 §3.2.2, RFC 9110 §7.2); no userinfo.
var hostTable = func() (t [256]bool) {
	for c := 0; c < 256; c++ {
		b := byte(c)
		t[c] = 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || isDigit(b)
	}
	for _, c := range "-._~!$&'()*+,;=:[]%" {
		t[c] = true
	}
	return t
}()

// invalidHostByte returns the offset of the first byte not allowed in a
// Host value, or -1.
func invalidHostByte(h string) int {
	for i := 0; i < len(h); i++ {
		if !hostTable[h[i]] {
			return i
		}
	}
	return -1
}

// reqBody is a request body: length-delimited or chunked. It lives inside the
// request's exchange so that it costs no allocation of its own.
type reqBody struct {
	br        *bufio.Reader
	ex        *exchange // nil when used outside a server (fuzzing)
	remaining int64     // length-delimited: bytes still to read
	chunked   io.Reader // chunked: the decoder, nil otherwise
	maxTrail  int       // budget for a chunked body's trailer section
	err       error     // sticky: io.EOF at the end, or what broke the framing
	closed    bool
}

var (
	errBodyAfterHandler   = errors.New("h1: request body read after the handler returned")
	errWriterAfterHandler = errors.New("h1: ResponseWriter used after the handler returned")
)

func (b *reqBody) init(br *bufio.Reader, kind int, length int64, maxTrail int) {
	b.br, b.maxTrail = br, maxTrail
	if kind == bodyChunked {
		b.chunked = httputil.NewChunkedReader(br)
	} else {
		b.remaining = length
	}
}

// Read implements io.Reader for the handler.
func (b *reqBody) Read(p []byte) (int, error) {
	if ex := b.ex; ex != nil {
		if ex.done.Load() {
			return 0, errBodyAfterHandler
		}
		if ex.info.expectContinue {
			ex.sendContinue()
		}
	}
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.read(p)
}

// Close marks the body closed; what is left is dealt with after the handler.
func (b *reqBody) Close() error {
	b.closed = true
	return nil
}

// read reads the body without the handler-facing checks.
func (b *reqBody) read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var err error
	if b.chunked == nil {
		if int64(len(p)) > b.remaining {
			p = p[:b.remaining]
		}
		n, err = b.br.Read(p)
		b.remaining -= int64(n)
		switch {
		case b.remaining == 0:
			err = io.EOF
		case err == io.EOF:
			err = fmt.Errorf("request body: %w (%d bytes missing)", io.ErrUnexpectedEOF, b.remaining)
		case err != nil:
			err = fmt.Errorf("request body: %w", err)
		}
	} else {
		n, err = b.chunked.Read(p)
		if err == io.EOF {
			err = b.readTrailer()
		} else if err != nil {
			err = fmt.Errorf("chunked request body: %w", err)
		}
	}
	if err != nil {
		b.err = err
		if err == io.EOF && b.ex != nil {
			b.ex.c.bodyDone(b.ex)
		}
	}
	return n, err
}

// readTrailer consumes a chunked body's trailer section (RFC 9112 §7.1.2).
// Trailer fields are parsed for validity and dropped: nothing on the
// gateway's path uses request trailers.
func (b *reqBody) readTrailer() error {
	if p, _ := b.br.Peek(2); len(p) == 2 && p[0] == '\r' && p[1] == '\n' {
		b.br.Discard(2)
		return io.EOF
	}
	budget := b.maxTrail
	if err := readHeader(b.br, make(http.Header), &budget); err != nil {
		return fmt.Errorf("chunked request body trailer: %w", err)
	}
	return io.EOF
}

// discard reads and drops the rest of the body, at most limit bytes. It
// reports whether the body ended cleanly within the limit.
func (b *reqBody) discard(limit int64) bool {
	if b.err != nil {
		return b.err == io.EOF
	}
	if b.chunked == nil {
		if b.remaining > limit {
			return false
		}
		n, err := b.br.Discard(int(b.remaining))
		b.remaining -= int64(n)
		if err != nil {
			b.err = err
			return false
		}
		b.err = io.EOF
		return true
	}
	_, err := io.CopyN(io.Discard, rawBody{b}, limit+1)
	return err == io.EOF && b.err == io.EOF
}

// rawBody reads a body past the handler-facing checks (a one-pointer struct:
// no allocation as an io.Reader).
type rawBody struct{ b *reqBody }

func (r rawBody) Read(p []byte) (int, error) { return r.b.read(p) }
