package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingServer is a net/http server on 127.0.0.1 that counts the connections it accepted.
type countingServer struct {
	*httptest.Server
	conns atomic.Int64
}

func newCountingServer(t *testing.T, h http.HandlerFunc) *countingServer {
	t.Helper()
	cs := &countingServer{}
	cs.Server = httptest.NewUnstartedServer(h)
	cs.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			cs.conns.Add(1)
		}
	}
	cs.Start()
	t.Cleanup(cs.Close)
	return cs
}

// rawServer accepts connections on 127.0.0.1 and runs serve on each; it counts them.
type rawServer struct {
	l     net.Listener
	conns atomic.Int64
	wg    sync.WaitGroup
}

func newRawServer(t *testing.T, serve func(n int64, c net.Conn, br *bufio.Reader)) *rawServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rs := &rawServer{l: l}
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n := rs.conns.Add(1)
			rs.wg.Add(1)
			go func() {
				defer rs.wg.Done()
				defer c.Close()
				serve(n, c, bufio.NewReader(c))
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); rs.wg.Wait() })
	return rs
}

func (rs *rawServer) url() string { return "http://" + rs.l.Addr().String() }

// readRawRequest reads one request head and its Content-Length body off br.
func readRawRequest(br *bufio.Reader) (head string, body []byte, err error) {
	var sb strings.Builder
	n := 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return sb.String(), nil, err
		}
		sb.WriteString(line)
		if line == "\r\n" {
			break
		}
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(k, "Content-Length") {
			fmt.Sscan(strings.TrimSpace(v), &n)
		}
	}
	body = make([]byte, n)
	_, err = io.ReadFull(br, body)
	return sb.String(), body, err
}

func do(t *testing.T, tr http.RoundTripper, method, u string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, u, err)
	}
	resp.Body.Close()
	return resp, b
}

func TestTransportForwardsRequestAndResponse(t *testing.T) {
	type seen struct {
		method, uri, host, ct, xa, te string
		cl                            int64
		body                          string
	}
	got := make(chan seen, 1)
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.RequestURI, r.Host, r.Header.Get("Content-Type"), strings.Join(r.Header.Values("X-A"), "|"), strings.Join(r.TransferEncoding, ","), r.ContentLength, string(b)}
		w.Header().Set("X-Answer", "42")
		w.Header().Add("X-Multi", "1")
		w.Header().Add("X-Multi", "2")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	resp, b := do(t, tr, "POST", srv.URL+"/v1/completions?x=1&y=%2F", strings.NewReader(`{"a":1}`), "Content-Type", "application/json", "X-A", "one", "X-A", "two")
	s := <-got
	want := seen{"POST", "/v1/completions?x=1&y=%2F", strings.TrimPrefix(srv.URL, "http://"), "application/json", "one|two", "", 7, `{"a":1}`}
	if s != want {
		t.Fatalf("upstream saw %+v, want %+v", s, want)
	}
	if resp.StatusCode != 201 || resp.Status != "201 Created" || string(b) != "made" || resp.Header.Get("X-Answer") != "42" ||
		strings.Join(resp.Header.Values("X-Multi"), ",") != "1,2" || resp.ContentLength != 4 || resp.ProtoMinor != 1 {
		t.Fatalf("response %d %q %q %v cl=%d", resp.StatusCode, resp.Status, b, resp.Header, resp.ContentLength)
	}

	// A GET without a body sends no Content-Length; a POST without one says 0.
	resp, _ = do(t, tr, "GET", srv.URL+"/g", nil)
	if s := <-got; s.method != "GET" || s.cl != 0 || resp.StatusCode != 201 {
		t.Fatalf("GET: %+v", s)
	}
}

func TestTransportReusesConnections(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/chunked":
			for i := 0; i < 3; i++ {
				fmt.Fprintf(w, "part%d;", i)
				w.(http.Flusher).Flush()
			}
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		default:
			io.WriteString(w, "ok")
		}
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	for i := 0; i < 5; i++ {
		if _, b := do(t, tr, "POST", srv.URL+"/x", strings.NewReader("body")); string(b) != "ok" {
			t.Fatalf("body %q", b)
		}
		resp, b := do(t, tr, "GET", srv.URL+"/chunked", nil)
		if string(b) != "part0;part1;part2;" || resp.ContentLength != -1 || len(resp.TransferEncoding) != 1 {
			t.Fatalf("chunked body %q cl=%d te=%v", b, resp.ContentLength, resp.TransferEncoding)
		}
		if resp, b := do(t, tr, "DELETE", srv.URL+"/empty", nil); resp.StatusCode != 204 || len(b) != 0 {
			t.Fatalf("204: %d %q", resp.StatusCode, b)
		}
		if resp, b := do(t, tr, "HEAD", srv.URL+"/x", nil); resp.StatusCode != 200 || len(b) != 0 || resp.ContentLength != 2 {
			t.Fatalf("HEAD: %d %q cl=%d", resp.StatusCode, b, resp.ContentLength)
		}
	}
	if n := srv.conns.Load(); n != 1 {
		t.Fatalf("20 sequential exchanges used %d connections, want 1", n)
	}
}

func TestTransportChunkedRequestBody(t *testing.T) {
	got := make(chan string, 1)
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- fmt.Sprintf("%d %v %s", r.ContentLength, r.TransferEncoding, b)
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte("streamed "))
		pw.Write([]byte("body"))
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", srv.URL, pr)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if s := <-got; s != "-1 [chunked] streamed body" {
		t.Fatalf("upstream saw %q", s)
	}
}

func TestTransportInterimAndUntilClose(t *testing.T) {
	rs := newRawServer(t, func(n int64, c net.Conn, br *bufio.Reader) {
		for {
			head, _, err := readRawRequest(br)
			if err != nil {
				return
			}
			switch {
			case strings.HasPrefix(head, "GET /interim "):
				io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nyes")
			case strings.HasPrefix(head, "GET /close "):
				io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\nuntil the end")
				return
			case strings.HasPrefix(head, "GET /http10 "):
				io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
				return
			case strings.HasPrefix(head, "GET /trailer "):
				io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n0\r\nX-T: 1\r\n\r\n")
			}
		}
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	if resp, b := do(t, tr, "GET", rs.url()+"/interim", nil); resp.StatusCode != 200 || string(b) != "yes" || resp.Header.Get("Link") != "" {
		t.Fatalf("interim: %d %q %v", resp.StatusCode, b, resp.Header)
	}
	if resp, b := do(t, tr, "GET", rs.url()+"/trailer", nil); string(b) != "abc" || resp.StatusCode != 200 {
		t.Fatalf("trailer: %q", b)
	}
	if n := rs.conns.Load(); n != 1 {
		t.Fatalf("interim + chunked with trailer used %d connections, want 1 (reuse after a trailer)", n)
	}
	if resp, b := do(t, tr, "GET", rs.url()+"/close", nil); string(b) != "until the end" || !resp.Close || resp.ContentLength != -1 {
		t.Fatalf("until close: %q close=%v", b, resp.Close)
	}
	if resp, b := do(t, tr, "GET", rs.url()+"/http10", nil); string(b) != "ok" || !resp.Close {
		t.Fatalf("HTTP/1.0: %q close=%v", b, resp.Close)
	}
	// The connections that ended with the body were not pooled: the next request dials anew and works.
	before := rs.conns.Load()
	if _, b := do(t, tr, "GET", rs.url()+"/interim", nil); string(b) != "yes" {
		t.Fatalf("after close: %q", b)
	}
	if rs.conns.Load() != before+1 {
		t.Fatalf("a closed connection was reused from the pool")
	}
}

// The upstream closes an idle keep-alive connection between requests (uvicorn does after 5 s): the
// next request on it is sent again on a fresh connection, once, when its body can be re-created.
func TestTransportRetriesStaleConnection(t *testing.T) {
	var served atomic.Int64
	rs := newRawServer(t, func(n int64, c net.Conn, br *bufio.Reader) {
		_, body, err := readRawRequest(br)
		if err != nil {
			return
		}
		served.Add(1)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		// ... and close the connection without saying so.
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	for i := 0; i < 3; i++ {
		_, b := do(t, tr, "POST", rs.url()+"/v1/completions", strings.NewReader(fmt.Sprintf("req%d", i)))
		if string(b) != fmt.Sprintf("req%d", i) {
			t.Fatalf("request %d echoed %q", i, b)
		}
		time.Sleep(20 * time.Millisecond) // let the close land before the next request
	}
	if served.Load() != 3 || rs.conns.Load() != 3 {
		t.Fatalf("served %d on %d connections, want 3 on 3", served.Load(), rs.conns.Load())
	}

	// A body that cannot be re-created is not sent twice: the error surfaces.
	req, _ := http.NewRequest("POST", rs.url()+"/v1/completions", io.NopCloser(strings.NewReader("once")))
	req.ContentLength = 4
	resp, err := tr.RoundTrip(req)
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// The pool held the connection of the last request, which the server closed.
		t.Fatalf("a non-replayable request on a stale connection was answered %q", b)
	}
	if !isConnReset(err) {
		t.Fatalf("error %v is not the connection's", err)
	}
}

func TestTransportCancellation(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var gone atomic.Int64
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: 1\n\n")
			w.(http.Flusher).Flush()
		}
		select {
		case <-r.Context().Done():
			gone.Add(1)
		case <-release:
		}
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()

	// Waiting for the head.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/slow", nil)
	start := time.Now()
	_, err := tr.RoundTrip(req)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting for the head: err %v, want the context's deadline", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("the deadline did not interrupt the read")
	}

	// Mid-body.
	ctx2, cancel2 := context.WithCancel(context.Background())
	req, _ = http.NewRequestWithContext(ctx2, "GET", srv.URL+"/stream", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := resp.Body.Read(buf); err != nil || string(buf[:n]) != "data: 1\n\n" {
		t.Fatalf("first event %q %v", buf[:n], err)
	}
	go func() { time.Sleep(20 * time.Millisecond); cancel2() }()
	_, err = resp.Body.Read(buf)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("mid-body cancel: err %v, want context.Canceled", err)
	}
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for gone.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if gone.Load() != 2 {
		t.Fatalf("the upstream saw %d of 2 cancellations as a closed connection", gone.Load())
	}
	// Neither interrupted connection went back to the pool.
	tr.mu.Lock()
	idle := len(tr.idle[strings.TrimPrefix(srv.URL, "http://")])
	tr.mu.Unlock()
	if idle != 0 {
		t.Fatalf("%d interrupted connections pooled", idle)
	}
}

// Close from another goroutine ends a blocked Read (as net/http allows) and costs the connection.
func TestTransportCloseDuringRead(t *testing.T) {
	release := make(chan struct{})
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "x")
		w.(http.Flusher).Flush()
		<-release
	})
	defer close(release)
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	resp.Body.Read(buf)
	done := make(chan error, 1)
	go func() { _, err := resp.Body.Read(buf); done <- err }()
	time.Sleep(20 * time.Millisecond)
	resp.Body.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Read after Close returned no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the blocked Read")
	}
}

func TestTransportBadResponses(t *testing.T) {
	answers := map[string]string{
		"/status":   "HTTP/1.1 2x0 OK\r\n\r\n",
		"/proto":    "HTTP/2.0 200 OK\r\n\r\n",
		"/cl":       "HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n",
		"/cl2":      "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
		"/te":       "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
		"/name":     "HTTP/1.1 200 OK\r\nBad Name: 1\r\n\r\n",
		"/short":    "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
		"/switch":   "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
		"/badchunk": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
	}
	want := map[string]string{
		"/status": "not three digits", "/proto": "HTTP/2.0", "/cl": `Content-Length "abc"`, "/cl2": "conflicting Content-Length",
		"/te": "Transfer-Encoding", "/name": "invalid field name", "/short": "unexpected EOF", "/switch": "switched protocols",
		"/badchunk": "chunk",
	}
	rs := newRawServer(t, func(n int64, c net.Conn, br *bufio.Reader) {
		head, _, err := readRawRequest(br)
		if err != nil {
			return
		}
		path := strings.Fields(head)[1]
		io.WriteString(c, answers[path])
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	for path, frag := range want {
		req, _ := http.NewRequest("GET", rs.url()+path, nil)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		if err == nil || !strings.Contains(err.Error(), frag) {
			t.Errorf("%s: error %v, want one naming %q", path, err, frag)
		}
	}
}

func TestTransportRequestChecks(t *testing.T) {
	var hits atomic.Int64
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("X-Evil") != "" || r.Header.Get("Injected") != "" {
			w.WriteHeader(500)
		}
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	// A value with CR LF is dropped, never written as a second field.
	if resp, _ := do(t, tr, "GET", srv.URL, nil, "X-Evil", "a\r\nInjected: yes"); resp.StatusCode != 200 {
		t.Fatalf("header injection reached the upstream (status %d)", resp.StatusCode)
	}
	// A method that is not a token (a space, a CR LF) is refused before anything is written.
	req0, _ := http.NewRequest("GET", srv.URL, nil)
	req0.Method = "GET / HTTP/1.1\r\nX-Evil: 1\r\n\r\nGET"
	if _, err := tr.RoundTrip(req0); err == nil || !strings.Contains(err.Error(), "invalid method") {
		t.Fatalf("a method with CR LF: %v", err)
	}
	// A body shorter than declared fails without being retried.
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("abc"))
	req.ContentLength = 10
	if _, err := tr.RoundTrip(req); !errors.Is(err, ErrBodyLength) {
		t.Fatalf("short body: %v", err)
	}
	// ... as does a longer one, and a short one that cannot write itself.
	req, _ = http.NewRequest("POST", srv.URL, strings.NewReader("abcdef"))
	req.ContentLength = 3
	if _, err := tr.RoundTrip(req); !errors.Is(err, ErrBodyLength) {
		t.Fatalf("long body: %v", err)
	}
	req, _ = http.NewRequest("POST", srv.URL, struct{ io.Reader }{strings.NewReader("ab")})
	req.ContentLength = 5
	if _, err := tr.RoundTrip(req); !errors.Is(err, ErrBodyLength) {
		t.Fatalf("short reader body: %v", err)
	}
	// https goes to the fallback, or fails naming why.
	req, _ = http.NewRequest("GET", "https://127.0.0.1:1/", nil)
	if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), `scheme "https"`) {
		t.Fatalf("https without fallback: %v", err)
	}
	var fell atomic.Bool
	tr2 := &Transport{Fallback: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		fell.Store(true)
		return nil, errors.New("fallback")
	})}
	req, _ = http.NewRequest("POST", srv.URL, strings.NewReader("x"))
	req.Header.Set("Expect", "100-continue")
	tr2.RoundTrip(req)
	if !fell.Load() {
		t.Fatal("Expect: 100-continue did not go to the fallback")
	}
	// Connection refused is an error, promptly.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	req, _ = http.NewRequest("GET", "http://"+addr+"/", nil)
	if _, err := tr.RoundTrip(req); err == nil {
		t.Fatal("a closed port answered")
	}
	if hits.Load() != 1 {
		t.Fatalf("upstream hit %d times, want 1", hits.Load())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestTransportIdleLimits(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	tr := &Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: 50 * time.Millisecond}
	defer tr.CloseIdleConnections()
	// Four overlapping exchanges need four connections; only two stay pooled.
	var resps []*http.Response
	for i := 0; i < 4; i++ {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resps = append(resps, resp)
	}
	for _, r := range resps {
		io.ReadAll(r.Body)
		r.Body.Close()
	}
	addr := strings.TrimPrefix(srv.URL, "http://")
	tr.mu.Lock()
	n := len(tr.idle[addr])
	tr.mu.Unlock()
	if n != 2 || srv.conns.Load() != 4 {
		t.Fatalf("%d idle of %d dialled, want 2 of 4", n, srv.conns.Load())
	}
	time.Sleep(80 * time.Millisecond)
	do(t, tr, "GET", srv.URL, nil)
	if srv.conns.Load() != 5 {
		t.Fatalf("an expired idle connection was reused (%d dialled)", srv.conns.Load())
	}
}

func TestTransportConcurrent(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(bytes.ToUpper(b))
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := 0; g < 50; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				msg := fmt.Sprintf("g%di%d", g, i)
				req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(msg))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					errs <- err
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || string(b) != strings.ToUpper(msg) {
					errs <- fmt.Errorf("%s: got %q %v", msg, b, err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := srv.conns.Load(); n > 50 {
		t.Fatalf("%d connections for 50 concurrent clients", n)
	}
}

func TestHostPort(t *testing.T) {
	for in, want := range map[string]string{"http://a": "a:80", "http://a:81/x": "a:81", "http://[::1]/": "[::1]:80", "http://[::1]:9/": "[::1]:9"} {
		u, _ := url.Parse(in)
		if got := hostPort(u); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}

// BenchmarkTransport compares a keep-alive POST through this transport and net/http's, against the
// same net/http server on 127.0.0.1.
func BenchmarkTransport(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-up","object":"text_completion","choices":[{"index":0,"text":" hello"}]}`)
	}))
	defer srv.Close()
	body := []byte(`{"model":"llama3","prompt":"Say hello.","max_tokens":1}`)
	run := func(b *testing.B, tr http.RoundTripper) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				req, _ := http.NewRequest("POST", srv.URL+"/v1/completions", bytes.NewReader(body))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	b.Run("h1", func(b *testing.B) {
		tr := &Transport{}
		defer tr.CloseIdleConnections()
		run(b, tr)
	})
	b.Run("nethttp", func(b *testing.B) {
		tr := &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}
		defer tr.CloseIdleConnections()
		run(b, tr)
	})
}

// TestTransportFlushWaitsForReply: a request written whole is flushed inside a readiness wait,
// which returns only once the reply can be read (so the read that follows does not fail with
// EAGAIN first); a request that does not fit the buffer is flushed without waiting, since the
// upstream may answer before it has all of it.
func TestTransportFlushWaitsForReply(t *testing.T) {
	gotRequest := make(chan struct{}, 1)
	release, stop := make(chan struct{}), make(chan struct{})
	rs := newRawServer(t, func(n int64, c net.Conn, br *bufio.Reader) {
		for {
			_, body, err := readRawRequest(br)
			if err != nil {
				return
			}
			gotRequest <- struct{}{}
			select {
			case <-release:
			case <-stop: // the test failed: do not hold the server's cleanup
				return
			}
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
	})
	t.Cleanup(func() { close(stop) }) // runs before the server's cleanup waits for it
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	cc, err := tr.getConn(context.Background(), rs.l.Addr().String(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.nc.Close()
	if cc.rc == nil || !cc.recent {
		t.Fatalf("a fresh TCP connection has no wait-first path (rc %v, recent %v)", cc.rc, cc.recent)
	}

	for _, tc := range []struct {
		name string
		body string
		wait bool
	}{
		{"whole request", "small", true},
		{"larger than the buffer", strings.Repeat("x", 8<<10), false},
	} {
		req, _ := http.NewRequest("POST", rs.url()+"/", strings.NewReader(tc.body))
		whole, err := cc.writeRequest(req)
		if err != nil || whole != tc.wait {
			t.Fatalf("%s: writeRequest = %v, %v; want whole=%v", tc.name, whole, err, tc.wait)
		}
		flushed := make(chan error, 1)
		go func() { flushed <- cc.flush(whole) }()
		<-gotRequest
		if tc.wait {
			select {
			case err := <-flushed:
				t.Fatalf("%s: flush returned (%v) before the upstream answered", tc.name, err)
			case <-time.After(100 * time.Millisecond):
			}
		} else {
			select {
			case err := <-flushed:
				if err != nil {
					t.Fatalf("%s: flush: %v", tc.name, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: flush waited for the answer", tc.name)
			}
		}
		release <- struct{}{}
		if tc.wait {
			if err := <-flushed; err != nil {
				t.Fatalf("%s: flush: %v", tc.name, err)
			}
		}
		r, err := cc.readResponse(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		cc.attachBody(req, r, nil, nil)
		b, err := io.ReadAll(r.resp.Body)
		if err != nil || string(b) != tc.body {
			t.Fatalf("%s: body %d bytes, %v", tc.name, len(b), err)
		}
		cc = mustIdle(t, tr, rs)
	}
}

// mustIdle takes the connection the last exchange returned to the pool.
func mustIdle(t *testing.T, tr *Transport, rs *rawServer) *clientConn {
	t.Helper()
	cc, err := tr.getConn(context.Background(), rs.l.Addr().String(), false)
	if err != nil || !cc.reused {
		t.Fatalf("the connection did not go back to the pool (%v)", err)
	}
	return cc
}
