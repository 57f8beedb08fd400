package h1

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// ErrHeaderTooLarge: the request/status line plus header fields exceed the budget.
var ErrHeaderTooLarge = errors.New("h1: header block too large")

// readLine returns one line without its CRLF (a bare LF is accepted as the
// terminator, as net/http does), charging its length+2 against *budget; the
// slice is valid until the next read on br.
//
// A line longer than br's buffer is assembled in a fresh slice; the budget
// bounds how much that can grow. At EOF with nothing read it returns io.EOF,
// at EOF inside a line io.ErrUnexpectedEOF.
func readLine(br *bufio.Reader, budget *int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == nil {
		return chargeLine(trimEOL(line), budget)
	}
	if err != bufio.ErrBufferFull {
		if err == io.EOF && len(line) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	// Rare: the line does not fit the buffer. Copy and keep reading,
	// stopping as soon as the budget is exceeded.
	long := append([]byte(nil), line...)
	for {
		if len(long)+2 > *budget {
			return nil, ErrHeaderTooLarge
		}
		line, err = br.ReadSlice('\n')
		long = append(long, line...)
		if err == nil {
			return chargeLine(trimEOL(long), budget)
		}
		if err != bufio.ErrBufferFull {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
}

// chargeLine charges a line and its CRLF against the budget.
func chargeLine(line []byte, budget *int) ([]byte, error) {
	if len(line)+2 > *budget {
		return nil, ErrHeaderTooLarge
	}
	*budget -= len(line) + 2
	return line, nil
}

// trimEOL strips the trailing LF and, if present, the CR before it.
func trimEOL(line []byte) []byte {
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line
}

// headerEntry records one parsed field while the block is being read; the
// values are gathered in one buffer so the whole block costs one string.
type headerEntry struct {
	key        string
	start, end int
}

// readHeader reads header fields up to the empty line into h with canonical
// keys (http.CanonicalHeaderKey semantics; common keys are interned and do not
// allocate), charging bytes against *budget. Values are trimmed of leading and
// trailing SP/HTAB. Field lines are numbered from 1 in errors.
//
// All values of the block share one string allocation and one []string
// backing array, like net/textproto does, so a request with a dozen fields
// costs a handful of allocations plus the map.
func readHeader(br *bufio.Reader, h http.Header, budget *int) error {
	var (
		valArr   [1024]byte
		entryArr [32]headerEntry
		vals     = valArr[:0]
		entries  = entryArr[:0]
	)
	for n := 1; ; n++ {
		line, err := readLine(br, budget)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("header line %d: %w", n, err)
		}
		if len(line) == 0 {
			break
		}
		// RFC 9112 §5.2: obs-fold must be rejected (or replaced) by a server;
		// §2.2: whitespace before the first field must be rejected too.
		if line[0] == ' ' || line[0] == '\t' {
			if n == 1 {
				return fmt.Errorf("header line 1: whitespace before the first header field")
			}
			return fmt.Errorf("header line %d: obs-fold (line folding) is not allowed", n)
		}
		colon := -1
		for i, c := range line {
			if c == ':' {
				colon = i
				break
			}
		}
		if colon < 0 {
			return fmt.Errorf("header line %d: missing colon in %q", n, clip(line))
		}
		name := line[:colon]
		// RFC 9112 §5.1: no whitespace between field name and colon; the
		// name is a token (RFC 9110 §5.1).
		if len(name) == 0 {
			return fmt.Errorf("header line %d: empty field name", n)
		}
		for _, c := range name {
			if !isTokenByte(c) {
				return fmt.Errorf("header line %d: invalid field name %q", n, clip(name))
			}
		}
		for i, c := range line[colon+1:] {
			// RFC 9110 §5.5: field-vchar / SP / HTAB / obs-text; CTLs
			// (including bare CR and NUL) and DEL are invalid. The offset
			// counts from the start of the line.
			if (c < ' ' && c != '\t') || c == 0x7f {
				return fmt.Errorf("header line %d: invalid byte 0x%02x in value of %s at offset %d", n, c, clip(name), colon+1+i)
			}
		}
		value := trimOWS(line[colon+1:])
		start := len(vals)
		vals = append(vals, value...)
		entries = append(entries, headerEntry{canonicalKey(name), start, len(vals)})
	}
	if len(entries) == 0 {
		return nil
	}
	all := string(vals)
	backing := make([]string, len(entries))
	for i, e := range entries {
		backing[i] = all[e.start:e.end]
		if old, ok := h[e.key]; ok {
			h[e.key] = append(old, backing[i])
		} else {
			h[e.key] = backing[i : i+1 : i+1]
		}
	}
	return nil
}

// clip shortens a byte slice quoted in an error message.
func clip(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// tokenTable marks tchar (RFC 9110 §5.6.2).
var tokenTable = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

func isTokenByte(c byte) bool { return tokenTable[c] }

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenTable[s[i]] {
			return false
		}
	}
	return true
}

// commonKeys interns the canonical form of frequent field names so that
// parsing them does not allocate a key string.
var commonKeys = func() map[string]string {
	m := make(map[string]string)
	for _, k := range []string{
		"Accept", "Accept-Charset", "Accept-Encoding", "Accept-Language",
		"Authorization", "Cache-Control", "Connection", "Content-Encoding",
		"Content-Length", "Content-Type", "Cookie", "Date", "Expect", "Host",
		"Keep-Alive", "Origin", "Pragma", "Referer", "Server", "Te",
		"Trailer", "Transfer-Encoding", "Upgrade", "User-Agent", "Via",
		"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
		"X-Real-Ip", "X-Request-Id", "Traceparent", "Tracestate",
		"Openai-Organization", "Openai-Project", "Anthropic-Version",
		"Api-Key", "X-Api-Key", "Last-Modified", "Etag", "Vary",
		"Content-Security-Policy", "Set-Cookie", "Location",
		// kvexact's own receipts (the simulated engines send X-Kvexact-Served-By).
		"X-Kvexact-Endpoint", "X-Kvexact-Prefill", "X-Kvexact-Rule", "X-Kvexact-Decision",
		"X-Kvexact-Served-By", "X-Model", "X-Conversation-Id",
	} {
		m[k] = k
	}
	return m
}()

// canonicalKey returns the canonical form of a valid token name
// (http.CanonicalHeaderKey semantics: upper-case the first letter and every
// letter after a hyphen, lower-case the rest). Common keys are interned.
func canonicalKey(name []byte) string {
	var arr [64]byte
	var buf []byte
	if len(name) <= len(arr) {
		buf = arr[:len(name)]
	} else {
		buf = make([]byte, len(name))
	}
	upper := true
	for i, c := range name {
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		buf[i] = c
		upper = c == '-'
	}
	if k, ok := commonKeys[string(buf)]; ok { // no allocation for the lookup
		return k
	}
	return string(buf)
}

// appendHeader writes "Key: value\r\n" for each value of h. Keys that are not
// tokens and values containing CR or LF are skipped: nothing a handler puts in
// a header may inject a field or end the header block.
func appendHeader(b []byte, h http.Header) []byte {
	for k, vv := range h {
		b = appendFieldLines(b, k, vv)
	}
	return b
}

// appendFieldLines writes "k: v\r\n" for each value, with appendHeader's
// skipping rules.
func appendFieldLines(b []byte, k string, vv []string) []byte {
	if !isToken(k) {
		return b
	}
	for _, v := range vv {
		if hasCRLF(v) {
			continue
		}
		b = append(b, k...)
		b = append(b, ": "...)
		b = append(b, v...)
		b = append(b, "\r\n"...)
	}
	return b
}

func hasCRLF(s string) bool {
	return strings.IndexByte(s, '\n') >= 0 || strings.IndexByte(s, '\r') >= 0
}

// headerValuesContainToken reports whether any comma-separated element of vv
// equals token, ignoring ASCII case and surrounding whitespace (e.g.
// "Connection: keep-alive, close" contains "close").
func headerValuesContainToken(vv []string, token string) bool {
	for _, v := range vv {
		for len(v) > 0 {
			elem := v
			if i := indexByte(v, ','); i >= 0 {
				elem, v = v[:i], v[i+1:]
			} else {
				v = ""
			}
			if asciiEqualFold(trimOWSString(elem), token) {
				return true
			}
		}
	}
	return false
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

func trimOWSString(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
