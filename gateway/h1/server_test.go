package h1

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// quietLog drops everything below error level; tests that check logging
// install their own.
var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// srvUnderTest is an h1.Server serving on 127.0.0.1.
type srvUnderTest struct {
	*Server
	addr   string
	served chan error // Serve's result
}

func startServer(t testing.TB, h http.Handler, configure ...func(*Server)) *srvUnderTest {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Handler: h, Log: quietLog}
	for _, f := range configure {
		f(s)
	}
	st := &srvUnderTest{Server: s, addr: l.Addr().String(), served: make(chan error, 1)}
	go func() { st.served <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-st.served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
		}
	})
	return st
}

// startNetHTTP serves h with net/http on 127.0.0.1 and returns its address.
func startNetHTTP(t testing.TB, h http.Handler, maxHeader int, configure ...func(*http.Server)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &http.Server{Handler: h, MaxHeaderBytes: maxHeader, ErrorLog: log.New(io.Discard, "", 0)}
	for _, f := range configure {
		f(s)
	}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	return l.Addr().String()
}

// echo is the handler of the differential test: it answers what it was given
// as JSON, or 400 when the body cannot be read.
type echo struct {
	Method, URI, Path, Query, Host, Proto string
	ContentLength                         int64
	TransferEncoding                      []string
	Close                                 bool
	Body                                  string
	XTest, ContentType                    []string
}

var echoHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
		return
	}
	e := echo{r.Method, r.RequestURI, r.URL.Path, r.URL.RawQuery, r.Host, r.Proto, r.ContentLength,
		r.TransferEncoding, r.Close, string(body), r.Header["X-Test"], r.Header["Content-Type"]}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(e)
})

// rawResponse is one response read off a raw connection.
type rawResponse struct {
	status int
	header http.Header
	body   string
	err    error // the body could not be read completely
	close  bool  // Connection: close (ReadResponse removes the field)
}

// rawExchange sends raw on a fresh connection, half-closes it, and parses
// every response until the server closes (or wait passes). heads says which
// responses answer a HEAD (they carry no body).
func rawExchange(t testing.TB, addr, raw string, wait time.Duration, heads ...bool) []rawResponse {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		c.Write([]byte(raw))
		c.(*net.TCPConn).CloseWrite()
	}()
	c.SetReadDeadline(time.Now().Add(wait))
	data, _ := io.ReadAll(c) // until close, reset or deadline
	return parseResponses(data, heads...)
}

func parseResponses(data []byte, heads ...bool) []rawResponse {
	var out []rawResponse
	br := bufio.NewReader(bytes.NewReader(data))
	for i := 0; ; {
		if _, err := br.Peek(1); err != nil {
			return out
		}
		method := "GET"
		if i < len(heads) && heads[i] {
			method = "HEAD"
		}
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			return append(out, rawResponse{err: err})
		}
		b, err := io.ReadAll(resp.Body)
		out = append(out, rawResponse{resp.StatusCode, resp.Header, string(b), err, resp.Close})
		if resp.StatusCode >= 200 {
			i++
		}
	}
}

func statuses(rr []rawResponse) []int {
	var s []int
	for _, r := range rr {
		s = append(s, r.status)
	}
	return s
}

// TestDifferential sends the same raw requests to an h1.Server and a
// net/http.Server running the same handler, and compares the answers.
func TestDifferential(t *testing.T) {
	const maxHeader = 8 << 10
	h1 := startServer(t, echoHandler, func(s *Server) { s.MaxHeaderBytes = maxHeader })
	std := startNetHTTP(t, echoHandler, maxHeader)

	big := strings.Repeat("a", 32<<10) // beyond both limits (net/http allows 4 KiB over MaxHeaderBytes)
	for _, tc := range differentialCases(big) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := rawExchange(t, h1.addr, tc.raw, 3*time.Second, tc.heads...)
			ref := rawExchange(t, std, tc.raw, 3*time.Second, tc.heads...)
			want := statuses(ref)
			if tc.differs != "" {
				if want = tc.h1Want; fmt.Sprint(statuses(ref)) == fmt.Sprint(want) {
					t.Errorf("net/http now answers %v too: the documented difference (%s) is gone", want, tc.differs)
				}
			}
			if fmt.Sprint(statuses(got)) != fmt.Sprint(want) {
				t.Fatalf("h1 answered %v, want %v (net/http: %v)\nh1 bodies: %q", statuses(got), want, statuses(ref), bodies(got))
			}
			if len(want) == 0 && tc.differs == "" {
				t.Fatalf("no response from net/http either: the case tests nothing")
			}
			if tc.differs != "" {
				return
			}
			for i := range got {
				if got[i].err != nil || ref[i].err != nil {
					t.Fatalf("response %d: body errors h1=%v net/http=%v", i, got[i].err, ref[i].err)
				}
				if s := got[i].status; s >= 200 && s < 300 && got[i].body != ref[i].body {
					t.Errorf("response %d body:\nh1:       %s\nnet/http: %s", i, got[i].body, ref[i].body)
				}
			}
		})
	}
}

func bodies(rr []rawResponse) []string {
	var b []string
	for _, r := range rr {
		b = append(b, r.body)
	}
	return b
}

type diffCase struct {
	name  string
	raw   string
	heads []bool // which responses answer HEAD
	// differs, when set, says why h1 deliberately answers h1Want where
	// net/http answers otherwise.
	differs string
	h1Want  []int
}

// differentialCases is the table of TestDifferential; it also seeds the fuzz
// corpora.
func differentialCases(big string) []diffCase {
	return []diffCase{
		{name: "get", raw: "GET /a/b?x=1&y=%20 HTTP/1.1\r\nHost: example.com\r\nX-Test: 1\r\nX-Test: 2\r\n\r\n"},
		{name: "bare LF", raw: "GET / HTTP/1.1\nHost: x\n\n"},
		{name: "post length", raw: "POST /v1/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"a\":\"bcd\"}"},
		{name: "pipelined pair", raw: "GET /1 HTTP/1.1\r\nHost: x\r\n\r\nPOST /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"},
		{name: "pipelined after body", raw: "POST /1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /2 HTTP/1.1\r\nHost: x\r\n\r\n"},
		{name: "chunked", raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"},
		{name: "chunked upper case", raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
		{name: "chunk extensions", raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;foo=bar\r\nhello\r\nA;x\r\n0123456789\r\n0;end\r\n\r\n"},
		{name: "chunked trailer", raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\n\r\n"},
		{name: "chunked then pipelined", raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\n"},
		{name: "bad chunk size", raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"},
		{name: "chunk size overflow", raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nhello\r\n0\r\n\r\n"},
		{name: "chunk without CRLF after data", raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n"},
		{name: "CL and TE", raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
			differs: "Content-Length with Transfer-Encoding is refused (RFC 9112 §6.1, request smuggling); net/http drops the Content-Length", h1Want: []int{400}},
		{name: "double differing CL", raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"},
		{name: "double equal CL", raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"},
		{name: "CL list in one line", raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 3\r\n\r\nabc"},
		{name: "bad CL", raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\nabc"},
		{name: "negative CL", raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\nabc"},
		{name: "plus CL", raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\nabc"},
		{name: "empty CL", raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: \r\n\r\n"},
		{name: "huge CL", raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n"},
		{name: "short body", raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"},
		{name: "missing host", raw: "GET / HTTP/1.1\r\nX-Test: 1\r\n\r\n"},
		{name: "two hosts", raw: "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"},
		{name: "invalid host", raw: "GET / HTTP/1.1\r\nHost: a b\r\n\r\n"},
		{name: "empty host", raw: "GET / HTTP/1.1\r\nHost:\r\n\r\n"},
		{name: "http10 close", raw: "GET /old HTTP/1.0\r\n\r\nGET /never HTTP/1.0\r\n\r\n"},
		{name: "http10 keep-alive", raw: "GET /1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /2 HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"},
		{name: "http11 close", raw: "GET /1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /never HTTP/1.1\r\nHost: x\r\n\r\n"},
		{name: "header too large", raw: "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + big + "\r\n\r\n"},
		{name: "request line too large", raw: "GET /" + big + " HTTP/1.1\r\nHost: x\r\n\r\n"},
		{name: "invalid header name", raw: "GET / HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n"},
		{name: "header name with paren", raw: "GET / HTTP/1.1\r\nHost: x\r\nBad(Name): 1\r\n\r\n"},
		{name: "space before colon", raw: "GET / HTTP/1.1\r\nHost: x\r\nX-Test : 1\r\n\r\n"},
		{name: "missing colon", raw: "GET / HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n"},
		{name: "empty name", raw: "GET / HTTP/1.1\r\nHost: x\r\n: v\r\n\r\n"},
		{name: "NUL in value", raw: "GET / HTTP/1.1\r\nHost: x\r\nX-Test: a\x00b\r\n\r\n"},
		{name: "tab in value", raw: "GET / HTTP/1.1\r\nHost: x\r\nX-Test: a\tb \t\r\n\r\n"},
		{name: "obs-text in value", raw: "GET / HTTP/1.1\r\nHost: x\r\nX-Test: caf\xc3\xa9\r\n\r\n"},
		{name: "obs-fold", raw: "GET / HTTP/1.1\r\nHost: x\r\nX-Test: a\r\n b\r\n\r\n",
			differs: "obs-fold is rejected (RFC 9112 §5.2 lets a server reject it; a proxy must not guess); net/http joins the lines", h1Want: []int{400}},
		{name: "whitespace before first field", raw: "GET / HTTP/1.1\r\n Host: x\r\n\r\n"},
		{name: "absolute-form", raw: "GET http://example.com:8080/p?q=1 HTTP/1.1\r\nHost: other\r\n\r\n"},
		{name: "absolute-form https", raw: "GET https://example.com/p HTTP/1.1\r\nHost: example.com\r\n\r\n"},
		{name: "options star", raw: "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"},
		{name: "star with GET", raw: "GET * HTTP/1.1\r\nHost: x\r\n\r\n",
			differs: "\"*\" is only for OPTIONS (RFC 9112 §3.2.4); net/http hands it to the handler", h1Want: []int{400}},
		{name: "connect", raw: "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
			differs: "CONNECT is not supported by the gateway; net/http hands it to the handler", h1Want: []int{501}},
		{name: "authority-form with GET", raw: "GET example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n",
			differs: "authority-form is CONNECT's only (RFC 9112 §3.2.3); net/http parses it as an opaque URL", h1Want: []int{400}},
		{name: "head", raw: "HEAD /h HTTP/1.1\r\nHost: x\r\n\r\nGET /g HTTP/1.1\r\nHost: x\r\n\r\n", heads: []bool{true}},
		{name: "expect 100-continue", raw: "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"},
		{name: "expect 100-continue no body", raw: "GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n"},
		{name: "expect 100-continue http10", raw: "POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"},
		{name: "expect foo", raw: "POST / HTTP/1.1\r\nHost: x\r\nExpect: foo\r\nContent-Length: 3\r\n\r\nabc"},
		{name: "TE gzip", raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc"},
		{name: "TE gzip chunked", raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
		{name: "TE twice", raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
		{name: "TE in http10", raw: "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
			differs: "Transfer-Encoding in HTTP/1.0 is faulty framing (RFC 9112 §6.1); net/http ignores the field", h1Want: []int{400}},
		{name: "http2 request line", raw: "GET / HTTP/2.0\r\nHost: x\r\n\r\n"},
		{name: "http 1.2", raw: "GET / HTTP/1.2\r\nHost: x\r\n\r\n",
			differs: "only HTTP/1.0 and 1.1 are served; net/http accepts any HTTP/1.x", h1Want: []int{505}},
		{name: "lower-case version", raw: "GET / http/1.1\r\nHost: x\r\n\r\n"},
		{name: "garbage", raw: "hello there\r\n\r\n"},
		{name: "binary garbage", raw: "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"},
		{name: "missing version", raw: "GET /\r\nHost: x\r\n\r\n"},
		{name: "double space", raw: "GET  / HTTP/1.1\r\nHost: x\r\n\r\n"},
		{name: "invalid method", raw: "G(T / HTTP/1.1\r\nHost: x\r\n\r\n"},
		{name: "custom method", raw: "PURGE /x HTTP/1.1\r\nHost: x\r\n\r\n"},
		{name: "control byte in target", raw: "GET /a\x01b HTTP/1.1\r\nHost: x\r\n\r\n"},
		{name: "head cut short", raw: "GET / HTTP/1.1\r\nHost: x\r\n"},
		{name: "leading empty line", raw: "\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
			differs: "empty lines before the request line are ignored (RFC 9112 §2.2 SHOULD); net/http answers 400", h1Want: []int{200}},
	}
}

// get performs one request on a raw keep-alive connection and reads its
// response.
type rawClient struct {
	t  testing.TB
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t testing.TB, addr string) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{t, c, bufio.NewReader(c)}
}

func (rc *rawClient) send(raw string) {
	rc.t.Helper()
	if _, err := rc.c.Write([]byte(raw)); err != nil {
		rc.t.Fatal(err)
	}
}

// read reads one response; its body is read fully into the returned string.
func (rc *rawClient) read(method string) (*http.Response, string) {
	rc.t.Helper()
	rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		rc.t.Fatalf("reading response: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		rc.t.Fatalf("reading body: %v", err)
	}
	return resp, string(b)
}

// closed reports whether the server closed the connection (EOF within a
// short wait).
func (rc *rawClient) closed() bool {
	rc.c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, err := rc.br.ReadByte()
	return err == io.EOF || errors.Is(err, net.ErrClosed) || isReset(err)
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// rawHead returns the response head bytes of the next response, unparsed.
func (rc *rawClient) rawHead() string {
	rc.t.Helper()
	rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var sb strings.Builder
	for {
		line, err := rc.br.ReadString('\n')
		sb.WriteString(line)
		if err != nil {
			rc.t.Fatalf("reading head: %v (got %q)", err, sb.String())
		}
		if line == "\r\n" {
			return sb.String()
		}
	}
}

func TestResponseFraming(t *testing.T) {
	small := strings.Repeat("s", 100)
	large := strings.Repeat("L", 3*bufSize)
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, small)
	})
	mux.HandleFunc("/large", func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < len(large); i += 1000 {
			io.WriteString(w, large[i:min(i+1000, len(large))])
		}
	})
	mux.HandleFunc("/declared", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(large)))
		io.WriteString(w, large)
		if _, err := io.WriteString(w, "x"); !errors.Is(err, http.ErrContentLength) {
			t.Errorf("writing past the declared length: err %v, want http.ErrContentLength", err)
		}
	})
	mux.HandleFunc("/short", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10")
		io.WriteString(w, "abc")
	})
	mux.HandleFunc("/nocontent", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
		if _, err := io.WriteString(w, "x"); !errors.Is(err, http.ErrBodyNotAllowed) {
			t.Errorf("body on 204: err %v, want http.ErrBodyNotAllowed", err)
		}
	})
	mux.HandleFunc("/notmodified", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotModified)
	})
	mux.HandleFunc("/html", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "<!DOCTYPE html><html><body>hi</body></html>")
	})
	mux.HandleFunc("/empty", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("/twice", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.WriteHeader(http.StatusTeapot)
		w.Header().Set("X-After", "ignored") // after the status: no effect, like net/http
		io.WriteString(w, "made")
	})
	mux.HandleFunc("/inject", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Evil", "a\r\nSet-Cookie: x=1")
		w.Header()["Bad Key"] = []string{"v"}
		w.Header().Set("X-Fine", "ok")
	})
	mux.HandleFunc("/close", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, "bye")
	})
	mux.HandleFunc("/early-hints", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		io.WriteString(w, "final")
	})
	s := startServer(t, mux)

	t.Run("small body: Content-Length and keep-alive", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		for i := 0; i < 3; i++ {
			rc.send("GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, body := rc.read("GET")
			if resp.ContentLength != int64(len(small)) || len(resp.TransferEncoding) != 0 || body != small || resp.Close {
				t.Fatalf("CL %d TE %v close %v body %d bytes", resp.ContentLength, resp.TransferEncoding, resp.Close, len(body))
			}
			if resp.Header.Get("Date") == "" {
				t.Error("no Date header")
			}
			if _, err := time.Parse(http.TimeFormat, resp.Header.Get("Date")); err != nil {
				t.Errorf("Date: %v", err)
			}
			if resp.Header.Get("Server") != "" {
				t.Error("Server header sent")
			}
		}
	})
	t.Run("large body: chunked and keep-alive", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		for i := 0; i < 2; i++ {
			rc.send("GET /large HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, body := rc.read("GET")
			if fmt.Sprint(resp.TransferEncoding) != "[chunked]" || body != large || resp.Close {
				t.Fatalf("TE %v close %v body %d bytes", resp.TransferEncoding, resp.Close, len(body))
			}
		}
	})
	t.Run("large body to HTTP/1.0: no framing, close", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("GET /large HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
		resp, body := rc.read("GET")
		if len(resp.TransferEncoding) != 0 || resp.ContentLength != -1 || body != large || !resp.Close {
			t.Fatalf("TE %v CL %d close %v body %d bytes", resp.TransferEncoding, resp.ContentLength, resp.Close, len(body))
		}
	})
	t.Run("small body to HTTP/1.0 keep-alive", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("GET /small HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
		head := rc.rawHead()
		if !strings.Contains(head, "Connection: keep-alive\r\n") || !strings.Contains(head, "Content-Length: 100\r\n") {
			t.Fatalf("head %q", head)
		}
	})
	t.Run("declared Content-Length honoured", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("GET /declared HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, body := rc.read("GET")
		if resp.ContentLength != int64(len(large)) || len(resp.TransferEncoding) != 0 || body != large {
			t.Fatalf("CL %d TE %v body %d bytes", resp.ContentLength, resp.TransferEncoding, len(body))
		}
		rc.send("GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
		if _, body := rc.read("GET"); body != small {
			t.Fatal("connection not reusable after a declared length")
		}
	})
	t.Run("short write of a declared length closes", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("GET /short HTTP/1.1\r\nHost: x\r\n\r\n")
		rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(rc.br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		if string(b) != "abc" || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("body %q err %v, want \"abc\" and unexpected EOF", b, err)
		}
	})
	t.Run("HEAD", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("HEAD /small HTTP/1.1\r\nHost: x\r\n\r\n")
		head := rc.rawHead()
		if !strings.Contains(head, "Content-Length: 100\r\n") {
			t.Fatalf("HEAD head %q lacks the body's length", head)
		}
		rc.send("HEAD /large HTTP/1.1\r\nHost: x\r\n\r\n")
		head = rc.rawHead()
		if strings.Contains(head, "Transfer-Encoding") || strings.Contains(head, "Content-Length") {
			t.Fatalf("HEAD of a large body: head %q", head)
		}
		rc.send("HEAD /declared HTTP/1.1\r\nHost: x\r\n\r\n")
		if head = rc.rawHead(); !strings.Contains(head, fmt.Sprintf("Content-Length: %d\r\n", len(large))) {
			t.Fatalf("HEAD with declared length: head %q", head)
		}
		// No body bytes may follow: the next response starts right away.
		rc.send("GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
		if _, body := rc.read("GET"); body != small {
			t.Fatalf("after HEAD: body %q", body)
		}
	})
	t.Run("204 and 304", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		for _, path := range []string{"/nocontent", "/notmodified"} {
			rc.send("GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n")
			head := rc.rawHead()
			if strings.Contains(head, "Content-Length") || strings.Contains(head, "Transfer-Encoding") || strings.Contains(head, "Content-Type") {
				t.Fatalf("%s: head %q", path, head)
			}
		}
		rc.send("GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
		if _, body := rc.read("GET"); body != small {
			t.Fatalf("after 204/304: body %q", body)
		}
	})
	t.Run("content type detection", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("GET /html HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, _ := rc.read("GET")
		if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
			t.Fatalf("Content-Type %q", ct)
		}
		rc.send("GET /empty HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, _ = rc.read("GET")
		if ct, ok := resp.Header["Content-Type"]; ok || resp.ContentLength != 0 || resp.StatusCode != 200 {
			t.Fatalf("empty answer: Content-Type %q CL %d status %d", ct, resp.ContentLength, resp.StatusCode)
		}
	})
	t.Run("first WriteHeader wins, header snapshot", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("GET /twice HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, body := rc.read("GET")
		if resp.StatusCode != http.StatusCreated || body != "made" || resp.Header.Get("X-After") != "" {
			t.Fatalf("status %d body %q X-After %q", resp.StatusCode, body, resp.Header.Get("X-After"))
		}
	})
	t.Run("no header injection", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("GET /inject HTTP/1.1\r\nHost: x\r\n\r\n")
		head := rc.rawHead()
		if strings.Contains(head, "Set-Cookie") || strings.Contains(head, "Bad Key") || !strings.Contains(head, "X-Fine: ok\r\n") {
			t.Fatalf("head %q", head)
		}
	})
	t.Run("handler Connection: close", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("GET /close HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, body := rc.read("GET")
		if !resp.Close || body != "bye" || !rc.closed() {
			t.Fatalf("close %v body %q: connection should close", resp.Close, body)
		}
	})
	t.Run("request Connection: close", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("GET /small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		if resp, _ := rc.read("GET"); !resp.Close || !rc.closed() {
			t.Fatal("connection should close")
		}
	})
	t.Run("1xx interim", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("GET /early-hints HTTP/1.1\r\nHost: x\r\n\r\n")
		head := rc.rawHead()
		if !strings.HasPrefix(head, "HTTP/1.1 103 Early Hints\r\n") || !strings.Contains(head, "Link: </a.css>") {
			t.Fatalf("interim head %q", head)
		}
		if resp, body := rc.read("GET"); resp.StatusCode != 200 || body != "final" {
			t.Fatalf("final %d %q", resp.StatusCode, body)
		}
	})
}

func TestRequestBodyHandling(t *testing.T) {
	var reads atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/read", func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		reads.Add(1)
		fmt.Fprintf(w, "%d %v", len(b), err)
	})
	mux.HandleFunc("/ignore", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ignored")
	})
	s := startServer(t, mux)

	t.Run("unread small body is discarded, connection kept", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		body := strings.Repeat("b", 100<<10)
		rc.send("POST /ignore HTTP/1.1\r\nHost: x\r\nContent-Length: " + fmt.Sprint(len(body)) + "\r\n\r\n" + body)
		if resp, _ := rc.read("GET"); resp.Close {
			t.Fatal("closing after a small unread body")
		}
		rc.send("GET /ignore HTTP/1.1\r\nHost: x\r\n\r\n")
		if _, b := rc.read("GET"); b != "ignored" {
			t.Fatalf("second answer %q", b)
		}
	})
	t.Run("unread large body closes", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("POST /ignore HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\nabc")
		if resp, _ := rc.read("GET"); !resp.Close || !rc.closed() {
			t.Fatal("connection should close after a large unread body")
		}
	})
	t.Run("unread chunked body is discarded", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("POST /ignore HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /ignore HTTP/1.1\r\nHost: x\r\n\r\n")
		rc.read("GET")
		if _, b := rc.read("GET"); b != "ignored" {
			t.Fatalf("second answer %q", b)
		}
	})
	t.Run("100-continue only when the handler reads", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("POST /ignore HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
		head := rc.rawHead()
		if !strings.HasPrefix(head, "HTTP/1.1 200 OK\r\n") || !strings.Contains(head, "Connection: close") {
			t.Fatalf("handler that does not read: head %q", head)
		}
		rc = dialRaw(t, s.addr)
		rc.send("POST /read HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
		if head := rc.rawHead(); head != "HTTP/1.1 100 Continue\r\n\r\n" {
			t.Fatalf("interim %q", head)
		}
		rc.send("abc")
		if resp, b := rc.read("POST"); resp.StatusCode != 200 || b != "3 <nil>" || resp.Close {
			t.Fatalf("final %d %q close %v", resp.StatusCode, b, resp.Close)
		}
	})
}

func TestSSEFlush(t *testing.T) {
	step := make(chan struct{})
	s := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := 0; i < 3; i++ {
			<-step
			fmt.Fprintf(w, "data: %d\n\n", i)
			if err := rc.Flush(); err != nil {
				t.Errorf("flush: %v", err)
			}
		}
	}))
	rc := dialRaw(t, s.addr)
	rc.send("GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
	step <- struct{}{}
	head := rc.rawHead()
	if !strings.Contains(head, "Transfer-Encoding: chunked") || !strings.Contains(head, "text/event-stream") {
		t.Fatalf("head %q", head)
	}
	tp := newChunkReader(rc)
	for i := 0; i < 3; i++ {
		if i > 0 {
			step <- struct{}{}
		}
		// The event must arrive while the handler waits for the next step.
		if got, want := tp.next(t), fmt.Sprintf("data: %d\n\n", i); got != want {
			t.Fatalf("event %d: %q, want %q", i, got, want)
		}
	}
	if last := tp.next(t); last != "" {
		t.Fatalf("last chunk %q", last)
	}
}

// chunkReader reads single chunks off a raw connection with a deadline.
type chunkReader struct{ rc *rawClient }

func newChunkReader(rc *rawClient) *chunkReader { return &chunkReader{rc} }

func (cr *chunkReader) next(t *testing.T) string {
	t.Helper()
	cr.rc.c.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, err := cr.rc.br.ReadString('\n')
	if err != nil {
		t.Fatalf("chunk size: %v", err)
	}
	var n int
	if _, err := fmt.Sscanf(strings.TrimSpace(line), "%x", &n); err != nil {
		t.Fatalf("chunk size line %q", line)
	}
	buf := make([]byte, n+2)
	if _, err := io.ReadFull(cr.rc.br, buf); err != nil {
		t.Fatalf("chunk data: %v", err)
	}
	return string(buf[:n])
}

func TestClientDisconnect(t *testing.T) {
	t.Run("slow handler is cancelled", func(t *testing.T) {
		cancelled := make(chan time.Duration, 1)
		s := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.ReadAll(r.Body)
			start := time.Now()
			select {
			case <-r.Context().Done():
				cancelled <- time.Since(start)
			case <-time.After(5 * time.Second):
				cancelled <- -1
			}
		}))
		for _, req := range []string{
			"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
			"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
		} {
			c, err := net.Dial("tcp", s.addr)
			if err != nil {
				t.Fatal(err)
			}
			c.Write([]byte(req))
			time.Sleep(50 * time.Millisecond)
			c.Close()
			if d := <-cancelled; d < 0 || d > time.Second {
				t.Fatalf("context not cancelled within a second after the client left (%v)", d)
			}
		}
	})
	t.Run("watch from the start", func(t *testing.T) {
		cancelled := make(chan bool, 1)
		s := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
				cancelled <- true
			case <-time.After(5 * time.Second):
				cancelled <- false
			}
		}), func(s *Server) { s.DisconnectCheckAfter = -1 })
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		time.Sleep(20 * time.Millisecond)
		c.Close()
		if !<-cancelled {
			t.Fatal("not cancelled")
		}
	})
	t.Run("fast handler with the client present is not cancelled", func(t *testing.T) {
		s := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(20 * time.Millisecond) // long enough for the watch to start
			fmt.Fprint(w, r.Context().Err())
		}))
		rc := dialRaw(t, s.addr)
		for i := 0; i < 3; i++ {
			rc.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			if _, b := rc.read("GET"); b != "<nil>" {
				t.Fatalf("context error %q", b)
			}
		}
	})
	t.Run("pipelined bytes during the watch are served", func(t *testing.T) {
		release := make(chan struct{})
		var n atomic.Int64
		s := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if n.Add(1) == 1 {
				<-release
			}
			fmt.Fprintf(w, "%s %s %v", r.Method, r.URL.Path, r.Context().Err())
		}))
		rc := dialRaw(t, s.addr)
		rc.send("GET /1 HTTP/1.1\r\nHost: x\r\n\r\n")
		time.Sleep(50 * time.Millisecond) // the watch is reading now
		rc.send("GET /2 HTTP/1.1\r\nHost: x\r\n\r\nGET /3 HTTP/1.1\r\nHost: x\r\n\r\n")
		time.Sleep(50 * time.Millisecond)
		close(release)
		for _, want := range []string{"GET /1 <nil>", "GET /2 <nil>", "GET /3 <nil>"} {
			if _, b := rc.read("GET"); b != want {
				t.Fatalf("answer %q, want %q", b, want)
			}
		}
	})
	t.Run("watch waits for the body", func(t *testing.T) {
		got := make(chan string, 1)
		s := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(20 * time.Millisecond) // the timer fires before the body is read
			b, _ := io.ReadAll(r.Body)
			select {
			case <-r.Context().Done():
				got <- "cancelled after " + string(b)
			case <-time.After(5 * time.Second):
				got <- "not cancelled"
			}
		}), func(s *Server) { s.DisconnectCheckAfter = time.Millisecond })
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"))
		time.Sleep(100 * time.Millisecond)
		c.Close()
		if g := <-got; g != "cancelled after abc" {
			t.Fatal(g)
		}
	})
}

func TestHandlerPanic(t *testing.T) {
	var logs syncBuffer
	mux := http.NewServeMux()
	mux.HandleFunc("/abort", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		io.WriteString(w, "partial")
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	})
	mux.HandleFunc("/boom", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "never sent")
		panic("boom")
	})
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	s := startServer(t, mux, func(s *Server) { s.Log = slog.New(slog.NewTextHandler(&logs, nil)) })

	rc := dialRaw(t, s.addr)
	rc.send("GET /abort HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if string(b) != "partial" || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("aborted body %q err %v, want the partial body then an unexpected EOF", b, err)
	}
	if strings.Contains(logs.String(), "panic") {
		t.Errorf("ErrAbortHandler was logged: %s", logs.String())
	}

	rc = dialRaw(t, s.addr)
	rc.send("GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, body := rc.read("GET")
	if resp.StatusCode != 500 || strings.Contains(body, "never sent") || !resp.Close || !rc.closed() {
		t.Fatalf("panic answer %d %q close %v", resp.StatusCode, body, resp.Close)
	}
	if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "boom") || !strings.Contains(l, "goroutine") {
		t.Errorf("panic not logged with its stack: %s", l)
	}

	rc = dialRaw(t, s.addr)
	rc.send("GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, body := rc.read("GET"); body != "ok" {
		t.Fatalf("server after panics: %q", body)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestInvalidStatusPanics(t *testing.T) {
	var logs syncBuffer
	s := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(1000)
	}), func(s *Server) { s.Log = slog.New(slog.NewTextHandler(&logs, nil)) })
	got := rawExchange(t, s.addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 3*time.Second)
	if len(got) != 1 || got[0].status != 500 || !strings.Contains(logs.String(), "invalid WriteHeader code 1000") {
		t.Fatalf("WriteHeader(1000): %v, log %s", statuses(got), logs.String())
	}
}

func TestSuperfluousWriteHeaderLogged(t *testing.T) {
	var logs syncBuffer
	s := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		w.WriteHeader(202)
		w.WriteHeader(203)
	}), func(s *Server) {
		s.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	got := rawExchange(t, s.addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 3*time.Second)
	if len(got) != 1 || got[0].status != 201 {
		t.Fatalf("statuses %v", statuses(got))
	}
	if n := strings.Count(logs.String(), "superfluous WriteHeader"); n != 1 {
		t.Fatalf("logged %d times, want once: %s", n, logs.String())
	}
	// Protocol errors are logged at debug level.
	rawExchange(t, s.addr, "GET / HTTP/1.1\r\n\r\n", 3*time.Second)
	if l := logs.String(); !strings.Contains(l, "level=DEBUG") || !strings.Contains(l, "missing Host header") {
		t.Fatalf("rejection not logged: %s", l)
	}
}

type ctxKey struct{}

func TestRequestFields(t *testing.T) {
	got := make(chan *http.Request, 1)
	s := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r
	}), func(s *Server) {
		s.BaseContext = func(net.Listener) context.Context { return context.WithValue(context.Background(), ctxKey{}, "base") }
	})
	rc := dialRaw(t, s.addr)
	rc.send("POST /p?q=1 HTTP/1.1\r\nHost: h.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n")
	rc.read("POST")
	r := <-got
	if r.Method != "POST" || r.URL.Path != "/p" || r.URL.RawQuery != "q=1" || r.RequestURI != "/p?q=1" || r.Host != "h.example" ||
		r.Proto != "HTTP/1.1" || r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.ContentLength != -1 ||
		fmt.Sprint(r.TransferEncoding) != "[chunked]" || !r.Close || r.RemoteAddr != rc.c.LocalAddr().String() {
		t.Errorf("request %+v", r)
	}
	if r.Context().Value(ctxKey{}) != "base" {
		t.Error("BaseContext value missing")
	}
	if a, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr); a == nil || a.String() != s.addr {
		t.Errorf("LocalAddrContextKey %v", a)
	}
	if r.Context().Err() == nil {
		t.Error("context not cancelled after the handler returned")
	}
}

func TestStaleResponseWriter(t *testing.T) {
	kept := make(chan http.ResponseWriter, 1)
	keptBody := make(chan io.Reader, 1)
	var n atomic.Int64
	s := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			kept <- w
			keptBody <- r.Body
			return
		}
		io.WriteString(w, "second")
	}))
	rc := dialRaw(t, s.addr)
	rc.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
	rc.read("GET")
	w, body := <-kept, <-keptBody
	if _, err := io.WriteString(w, "stale"); err == nil {
		t.Error("a write after the handler returned succeeded")
	}
	w.WriteHeader(http.StatusTeapot)
	if err := http.NewResponseController(w).Flush(); err == nil {
		t.Error("a flush after the handler returned succeeded")
	}
	if _, err := body.Read(make([]byte, 10)); err == nil {
		t.Error("a body read after the handler returned succeeded")
	}
	rc.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, b := rc.read("GET"); resp.StatusCode != 200 || b != "second" {
		t.Fatalf("next request: %d %q", resp.StatusCode, b)
	}
}

func TestServerRejections(t *testing.T) {
	s := startServer(t, echoHandler, func(s *Server) {
		s.ErrorBody = func(status int, detail string) (string, []byte) {
			return "application/json", []byte(fmt.Sprintf(`{"status":%d,"detail":%q}`, status, detail))
		}
	})
	for _, tc := range []struct{ raw, detail string }{
		{"GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\nB: 2\r\nx y: 3\r\n\r\n", `header line 4: invalid field name \"x y\"`},
		{"GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\n b\r\n\r\n", `header line 3: obs-fold (line folding) is not allowed`},
		{"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", `Content-Length \"abc\" is not a number`},
		{"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", `Transfer-Encoding \"gzip\" is not supported`},
		{"GET / HTTP/1.1\r\n\r\n", "missing Host header"},
		{"GET /\r\n\r\n", "malformed request line"},
		{"GET / HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n", "header line 2: invalid byte 0x01 in value of X at offset 4"},
	} {
		got := rawExchange(t, s.addr, tc.raw, 3*time.Second)
		if len(got) != 1 || got[0].status < 400 {
			t.Errorf("%q: %v", tc.raw, statuses(got))
			continue
		}
		if !strings.Contains(got[0].body, tc.detail) || got[0].header.Get("Content-Type") != "application/json" || !got[0].close {
			t.Errorf("%q: body %q (%v), want detail %q", tc.raw, got[0].body, got[0].header, tc.detail)
		}
	}
	// Default body and the default header limit.
	s2 := startServer(t, echoHandler)
	got := rawExchange(t, s2.addr, "GET / HTTP/1.1\r\nHost: x\r\nX: "+strings.Repeat("a", http.DefaultMaxHeaderBytes)+"\r\n\r\n", 5*time.Second)
	if len(got) != 1 || got[0].status != 431 || !strings.HasPrefix(got[0].body, "431 Request Header Fields Too Large: ") {
		t.Fatalf("over the default limit: %v %q", statuses(got), bodies(got))
	}
	got = rawExchange(t, s2.addr, "GET / HTTP/1.1\r\nHost: x\r\nX: "+strings.Repeat("a", 100<<10)+"\r\n\r\n", 5*time.Second)
	if len(got) != 1 || got[0].status != 200 {
		t.Fatalf("100 KiB header under the default limit: %v", statuses(got))
	}
}

func TestTimeouts(t *testing.T) {
	s := startServer(t, echoHandler, func(s *Server) {
		s.ReadHeaderTimeout = 200 * time.Millisecond
		s.IdleTimeout = 300 * time.Millisecond
	})
	t.Run("slow header", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("GET / HTTP/1.1\r\n")
		start := time.Now()
		if !waitClosed(rc, 3*time.Second) || time.Since(start) > 2*time.Second {
			t.Fatal("connection with an incomplete header not closed after ReadHeaderTimeout")
		}
	})
	t.Run("idle", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		rc.read("GET")
		start := time.Now()
		if !waitClosed(rc, 3*time.Second) || time.Since(start) < 200*time.Millisecond {
			t.Fatalf("idle connection closed after %v, want about 300ms", time.Since(start))
		}
	})
	t.Run("slow body is not cut by the header timeout", func(t *testing.T) {
		rc := dialRaw(t, s.addr)
		rc.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nabc")
		time.Sleep(400 * time.Millisecond)
		rc.send("def")
		if _, b := rc.read("POST"); !strings.Contains(b, `"Body":"abcdef"`) {
			t.Fatalf("answer %q", b)
		}
	})
}

func waitClosed(rc *rawClient, d time.Duration) bool {
	rc.c.SetReadDeadline(time.Now().Add(d))
	_, err := io.ReadAll(rc.br)
	return err == nil || isReset(err)
}

// goroutines waits for the goroutine count to drop to at most want.
func checkGoroutines(t *testing.T, want int) {
	t.Helper()
	var n int
	for i := 0; i < 100; i++ {
		if n = runtime.NumGoroutine(); n <= want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	t.Fatalf("%d goroutines, want at most %d:\n%s", n, want, buf[:runtime.Stack(buf, true)])
}

func TestShutdown(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		step := make(chan struct{})
		streaming := make(chan struct{})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{Log: quietLog, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/stream" {
				io.WriteString(w, "quick")
				return
			}
			close(streaming)
			for i := 0; i < 3; i++ {
				<-step
				fmt.Fprintf(w, "part %d;", i)
				w.(http.Flusher).Flush()
			}
		})}
		served := make(chan error, 1)
		go func() { served <- s.Serve(l) }()
		addr := l.Addr().String()

		idle := dialRaw(t, addr)
		idle.send("GET /quick HTTP/1.1\r\nHost: x\r\n\r\n")
		idle.read("GET")
		stream := dialRaw(t, addr)
		stream.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
		<-streaming

		shut := make(chan error, 1)
		go func() { shut <- s.Shutdown(context.Background()) }()
		if !waitClosed(idle, 2*time.Second) {
			t.Fatal("idle keep-alive connection not closed by Shutdown")
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Fatalf("Serve: %v", err)
		}
		if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			t.Error("still accepting after Shutdown")
		}
		select {
		case err := <-shut:
			t.Fatalf("Shutdown returned %v with a stream in flight", err)
		case <-time.After(100 * time.Millisecond):
		}
		for i := 0; i < 3; i++ {
			step <- struct{}{}
		}
		resp, body := stream.read("GET")
		if body != "part 0;part 1;part 2;" || !resp.Close {
			t.Fatalf("stream body %q close %v", body, resp.Close)
		}
		select {
		case err := <-shut:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("Shutdown did not return after the stream ended")
		}
		if err := s.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			t.Fatalf("Serve after Shutdown: %v", err)
		}
	}()
	checkGoroutines(t, before)
}

func TestShutdownDeadline(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	s := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
	rc := dialRaw(t, s.addr)
	rc.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with a blocked handler: %v", err)
	}
}

func TestClose(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		ctxDone := make(chan struct{})
		started := make(chan struct{})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{Log: quietLog, DisconnectCheckAfter: time.Hour, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "head")
			w.(http.Flusher).Flush()
			close(started)
			<-r.Context().Done()
			close(ctxDone)
		})}
		served := make(chan error, 1)
		go func() { served <- s.Serve(l) }()
		stream := dialRaw(t, l.Addr().String())
		stream.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		idle := dialRaw(t, l.Addr().String())
		<-started
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctxDone:
		case <-time.After(2 * time.Second):
			t.Fatal("Close did not cancel the request context")
		}
		if !waitClosed(stream, 2*time.Second) || !waitClosed(idle, 2*time.Second) {
			t.Fatal("connections not closed")
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Fatalf("Serve: %v", err)
		}
	}()
	checkGoroutines(t, before)
}

func TestManyKeepAliveClients(t *testing.T) {
	const clients, requests = 1000, 5
	s := startServer(t, echoHandler)
	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var wg sync.WaitGroup
	var failures atomic.Int64
	var firstErr atomic.Value
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < requests; j++ {
				body := fmt.Sprintf(`{"client":%d,"request":%d}`, i, j)
				resp, err := hc.Post("http://"+s.addr+"/p", "application/json", strings.NewReader(body))
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					return
				}
				var e echo
				err = json.NewDecoder(resp.Body).Decode(&e)
				resp.Body.Close()
				if err != nil || e.Body != body || resp.StatusCode != 200 {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("status %d err %v body %q", resp.StatusCode, err, e.Body))
				}
			}
		}()
	}
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d failures; first: %v", n, firstErr.Load())
	}
}

// BenchmarkServerKeepAlive: one keep-alive client POSTs a 60-byte JSON body
// and the handler answers 170 bytes of JSON, over 127.0.0.1.
func BenchmarkServerKeepAlive(b *testing.B) {
	reqBody := []byte(`{"model":"m","prompt":"hello, world","max_tokens":16,"n":1}`)
	reqBody = append(reqBody, strings.Repeat(" ", 60-len(reqBody))...)
	answer := []byte(`{"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"m","choices":[{"text":"hi","index":0,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
	answer = answer[:170]
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(answer)
	})
	run := func(b *testing.B, addr string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		req := []byte(fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: %s\r\nUser-Agent: bench\r\nContent-Type: application/json\r\nAccept: */*\r\nContent-Length: %d\r\n\r\n%s", addr, len(reqBody), reqBody))
		br := bufio.NewReader(c)
		b.ReportAllocs()
		b.ResetTimer()
		cpu := processCPU()
		for i := 0; i < b.N; i++ {
			if _, err := c.Write(req); err != nil {
				b.Fatal(err)
			}
			if err := readBenchResponse(br, len(answer)); err != nil {
				b.Fatal(err)
			}
		}
		// CPU of the whole process (client included) per request: the
		// wall time is mostly loopback round trips.
		if cpu := processCPU() - cpu; cpu > 0 {
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		}
	}
	// Both servers as the gateway configures them (serve.go).
	const rht = 10 * time.Second
	b.Run("h1", func(b *testing.B) {
		run(b, startServer(b, h, func(s *Server) { s.ReadHeaderTimeout = rht }).addr)
	})
	b.Run("nethttp", func(b *testing.B) {
		run(b, startNetHTTP(b, h, 0, func(s *http.Server) { s.ReadHeaderTimeout = rht }))
	})
}

// readBenchResponse reads a Content-Length response cheaply, so the client
// side costs little next to the server.
func readBenchResponse(br *bufio.Reader, want int) error {
	n := -1
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) == 2 {
			break
		}
		if bytes.HasPrefix(line, []byte("Content-Length: ")) {
			n = 0
			for _, c := range line[16 : len(line)-2] {
				n = 10*n + int(c-'0')
			}
		}
	}
	if n != want {
		return fmt.Errorf("Content-Length %d, want %d", n, want)
	}
	_, err := br.Discard(n)
	return err
}

// TestInputDuringHandler: a keep-alive response is flushed inside a wait for the next request
// that does not see input which arrived while the handler ran (its readiness came before the
// wait). The watch timer's look covers that: a request pipelined during the handler is served,
// and a client that half-closed during the handler gets its answer and then the close, each
// within a few check delays rather than at the idle timeout.
func TestInputDuringHandler(t *testing.T) {
	entered := make(chan string, 4)
	proceed := make(chan struct{}, 4)
	st := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- r.URL.Path
		<-proceed
		io.WriteString(w, "ok "+r.URL.Path)
	}), func(s *Server) {
		s.IdleTimeout = time.Minute
		// Longer than the handlers below run: the disconnect watch, whose read would pick the
		// input up, must not start.
		s.DisconnectCheckAfter = 200 * time.Millisecond
	})

	t.Run("pipelined", func(t *testing.T) {
		rc := dialRaw(t, st.addr)
		rc.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
		<-entered
		rc.send("GET /b HTTP/1.1\r\nHost: x\r\n\r\n") // arrives while /a's handler runs
		time.Sleep(20 * time.Millisecond)
		proceed <- struct{}{}
		start := time.Now()
		if _, body := rc.read("GET"); body != "ok /a" {
			t.Fatalf("first answer %q", body)
		}
		select {
		case p := <-entered:
			if p != "/b" {
				t.Fatalf("second request %q", p)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the request pipelined during the handler was not served (its readiness was lost)")
		}
		proceed <- struct{}{}
		if _, body := rc.read("GET"); body != "ok /b" {
			t.Fatalf("second answer %q", body)
		}
		t.Logf("pipelined request answered %v after the first was released", time.Since(start))
	})

	t.Run("half-closed", func(t *testing.T) {
		rc := dialRaw(t, st.addr)
		rc.send("GET /c HTTP/1.1\r\nHost: x\r\n\r\n")
		<-entered
		rc.c.(*net.TCPConn).CloseWrite() // the FIN arrives while the handler runs
		time.Sleep(20 * time.Millisecond)
		proceed <- struct{}{}
		if _, body := rc.read("GET"); body != "ok /c" {
			t.Fatalf("answer %q", body)
		}
		if !waitClosed(rc, 10*time.Second) {
			t.Fatal("the server kept a half-closed connection open after answering")
		}
	})
}
