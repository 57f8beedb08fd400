package epp_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/epp"
	"github.com/kvexact/kvexact/internal/promtest"
)

func errorCode(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error struct{ Code, Type string }
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("immediate response body %q is not OpenAI-shaped: %v", body, err)
	}
	return e.Error.Code
}

// TestSurfaceOnlyAPIPaths: a completion-shaped body on a path outside the rule's API surface gets
// no destination but the standalone proxy's 404 unknown_url, answered on the request headers
// (before any body is buffered) and decided on the canonical path: escapes, dot segments and
// doubled slashes that could resolve to an engine's admin route are refused, as the admin routes
// themselves are. The standalone proxy answers the same paths 404 too.
func TestSurfaceOnlyAPIPaths(t *testing.T) {
	w := startWorld(t, worldSpec{n: 1})
	body := completionBody("a completion-shaped prompt")
	// The admin routes, and other spellings of them, are the standalone proxy's 404s too; other
	// spellings of an API path the proxy canonicalizes and serves, the picker refuses (Envoy would
	// forward the spelling as sent).
	admin := map[string]bool{"/sim/clear": true, "/reset_prefix_cache": true, "/v1/%2e%2e/reset_prefix_cache": true, "/flush_cache": true, "/v1/completions/x": true}
	for _, path := range []string{"/sim/clear", "/reset_prefix_cache", "/v1/%2e%2e/reset_prefix_cache", "/v1/completions/../../reset_prefix_cache",
		"/v1//completions", "/v1/%63ompletions", "/v1/chat%2Fcompletions", "/flush_cache", "/v1/completions/x"} {
		res := w.request(envoyRequest{path: path, body: body, chunk: 4})
		if res.immediate == nil || res.immediate.Status.Code != http.StatusNotFound || errorCode(t, res.immediate.Body) != "unknown_url" {
			t.Fatalf("%s: want ImmediateResponse 404 unknown_url, got destination %q immediate %+v", path, res.header, res.immediate)
		}
		if !admin[path] {
			continue
		}
		resp, err := http.Post(w.base+path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s: the standalone proxy answers %d; the picker's 404 is meant to be its answer", path, resp.StatusCode)
		}
	}
	// The answer comes on the headers: the picker holds no body for a path it will refuse.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := w.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":method", "POST", ":path", "/reset_prefix_cache", "content-type", "application/json")}}})
	resp, err := st.Recv()
	if err != nil || resp.GetImmediateResponse().GetStatus().GetCode() != http.StatusNotFound {
		t.Fatalf("refusal on the headers alone: %v %+v", err, resp)
	}
	// The API surface still gets destinations.
	for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/v1/completions?x=1"} {
		b := body
		if strings.Contains(path, "chat") {
			b, _ = json.Marshal(map[string]any{"model": "llama3", "messages": []map[string]string{{"role": "user", "content": "hi"}}, "max_tokens": 2})
		}
		res := w.request(envoyRequest{path: path, body: b})
		if res.header == "" {
			t.Fatalf("%s: no destination (%+v)", path, res.immediate)
		}
		res.cancel()
	}
	w.noLeak()
}

// TestClientRoutingHeadersReplaced: routing headers the client sent are removed, and the
// picker's own are set with overwrite semantics (Envoy's default append action would leave the
// forged value beside the picker's).
func TestClientRoutingHeadersReplaced(t *testing.T) {
	w := startWorld(t, worldSpec{n: 2})
	res := w.request(envoyRequest{path: "/v1/completions", body: completionBody("forged headers"), headers: []string{
		epp.DestinationHeader, "6.6.6.6:80", epp.DestinationHeader, "6.6.6.7:80", epp.PrefillHeader, "6.6.6.6:81",
		epp.DecisionHeader, "forged", epp.ServedKey, "6.6.6.6:80", "X-Gateway-Destination-Endpoint-Subset", "6.6.6.6:80"}})
	defer res.cancel()
	if res.header == "" || strings.Contains(res.header, "6.6.6") {
		t.Fatalf("destination %q", res.header)
	}
	set := map[string]bool{}
	for _, h := range res.mutation.GetSetHeaders() {
		set[h.Header.Key] = true
		if h.AppendAction != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
			t.Fatalf("%s is set with %v; it must overwrite what the client sent", h.Header.Key, h.AppendAction)
		}
	}
	if !set[epp.DestinationHeader] || !set[epp.DecisionHeader] {
		t.Fatalf("the picker's headers are missing: %v", res.mutation)
	}
	removed := res.mutation.GetRemoveHeaders()
	for _, k := range []string{epp.PrefillHeader, epp.ServedKey, epp.SubsetKey} {
		if !slices.Contains(removed, k) {
			t.Fatalf("the client's %s is not removed (remove_headers %q)", k, removed)
		}
	}
	for _, k := range []string{epp.DestinationHeader, epp.DecisionHeader} {
		if slices.Contains(removed, k) {
			t.Fatalf("remove_headers %q names %s, which the picker sets (Envoy could apply the removal after the set)", removed, k)
		}
	}
}

// TestHeaderLimits: a message of 100,000 headers (1.3 MB) is answered 431 at once; the
// field limit holds at its value and refuses one past it, and so does the byte limit.
func TestHeaderLimits(t *testing.T) {
	w := startWorld(t, worldSpec{n: 1})
	many := func(n int) []string {
		var kv []string
		for i := 0; i < n; i++ {
			kv = append(kv, fmt.Sprintf("x-h%06d", i), "v")
		}
		return kv
	}
	res := w.request(envoyRequest{path: "/v1/completions", body: completionBody("many headers"), headers: many(100_000)})
	if res.immediate == nil || res.immediate.Status.Code != http.StatusRequestHeaderFieldsTooLarge || errorCode(t, res.immediate.Body) != "request_header_fields_too_large" {
		t.Fatalf("100,000 headers: want 431, got destination %q immediate %+v", res.header, res.immediate)
	}
	base := 4 // :method, :path, :authority, content-type
	res = w.request(envoyRequest{path: "/v1/completions", body: completionBody("at the limit"), headers: many(epp.DefaultMaxHeaderFields - base)})
	if res.header == "" {
		t.Fatalf("%d header fields (the limit): want a destination, got %+v", epp.DefaultMaxHeaderFields, res.immediate)
	}
	res.cancel()
	res = w.request(envoyRequest{path: "/v1/completions", body: completionBody("one past"), headers: many(epp.DefaultMaxHeaderFields - base + 1)})
	if res.immediate.GetStatus().GetCode() != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("%d header fields: want 431, got %+v", epp.DefaultMaxHeaderFields+1, res)
	}
	res = w.request(envoyRequest{path: "/v1/completions", body: completionBody("big header"), headers: []string{"x-big", strings.Repeat("a", epp.DefaultMaxHeaderBytes)}})
	if res.immediate.GetStatus().GetCode() != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("a header over %d bytes: want 431, got %+v", epp.DefaultMaxHeaderBytes, res)
	}
	res = w.request(envoyRequest{path: "/v1/completions", body: completionBody("x"), headers: []string{"content-length", fmt.Sprint(16<<20 + 1)}})
	if res.immediate.GetStatus().GetCode() != http.StatusRequestEntityTooLarge {
		t.Fatalf("a Content-Length past the body cap: want 413 on the headers, got %+v", res)
	}
	w.noLeak()
}

// openStream sends request headers (and optionally a body chunk without end of stream) and leaves
// the stream open.
func (w *world) openStream(ctx context.Context, chunk []byte) extprocv3.ExternalProcessor_ProcessClient {
	w.t.Helper()
	st, err := w.client.Process(ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":method", "POST", ":path", "/v1/completions", "content-type", "application/json")}}}); err != nil {
		w.t.Fatal(err)
	}
	if chunk != nil {
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: chunk}}}); err != nil {
			w.t.Fatal(err)
		}
	}
	return st
}

// TestIdleStreamsEnd: a stream that sends nothing more ends with DeadlineExceeded at the request
// idle limit (each message re-arms it), and after the decision at the response idle limit;
// 2,000 idle streams opened at once all end and their goroutines go.
func TestIdleStreamsEnd(t *testing.T) {
	const reqIdle, respIdle = 400 * time.Millisecond, 900 * time.Millisecond
	w := startWorld(t, worldSpec{n: 1, picker: func(p *assemble.Picker) {
		p.Limits.RequestIdle, p.Limits.ResponseIdle = reqIdle, respIdle
	}})
	goroutines := runtime.NumGoroutine()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Messages at 100 ms intervals keep the stream alive past the limit; then silence ends it. (The
	// interval leaves 300 ms for a sleep that overshoots on a loaded machine.)
	st := w.openStream(ctx, nil)
	t0 := time.Now()
	body := completionBody("idle")
	for i := 0; i < 6; i++ {
		time.Sleep(100 * time.Millisecond)
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body[i : i+1]}}}); err != nil {
			t.Fatalf("stream ended after %s although a message came every 100 ms: %v", time.Since(t0), err)
		}
	}
	last := time.Now()
	_, err := st.Recv()
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "request") {
		t.Fatalf("want DeadlineExceeded naming the request's idle limit, got %v", err)
	}
	if d := time.Since(last); d < reqIdle || d > reqIdle+2*time.Second {
		t.Fatalf("the stream ended %s after its last message; the limit is %s", d, reqIdle)
	}

	// After the decision the response limit applies, and the load is given back.
	res := w.request(envoyRequest{path: "/v1/completions", body: completionBody("decided, then silence")})
	t1 := time.Now()
	_, err = res.stream.Recv()
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "response") {
		t.Fatalf("after the decision: want DeadlineExceeded naming the response's idle limit, got %v", err)
	}
	if d := time.Since(t1); d < respIdle-50*time.Millisecond {
		t.Fatalf("ended after %s, before the response idle limit %s", d, respIdle)
	}
	w.noLeak()

	// 2,000 idle streams (one per request, headers sent, nothing more).
	var open []extprocv3.ExternalProcessor_ProcessClient
	for i := 0; i < 2000; i++ {
		open = append(open, w.openStream(ctx, nil))
	}
	for _, s := range open {
		if _, err := s.Recv(); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("idle stream: %v", err)
		}
	}
	if v := promtest.Value(t, w.reg, "kvexact_epp_idle_streams_total", nil); v != 2002 {
		t.Fatalf("kvexact_epp_idle_streams_total %v, want 2002", v)
	}
	w.noLeak()
	eventually(t, 10*time.Second, "the idle streams' goroutines to go", func() bool { return runtime.NumGoroutine() < goroutines+50 })
}

// TestBodyBudget: bodies buffered across streams are bounded process-wide: a chunk that would pass
// the budget is answered 503 body_budget_exhausted (Retry-After), one that reaches it exactly is
// taken, and the bytes come back when a stream ends or its body has been given back.
func TestBodyBudget(t *testing.T) {
	const chunk = 400 << 10
	w := startWorld(t, worldSpec{n: 1, picker: func(p *assemble.Picker) { p.Limits.BodyBudget = 2 * chunk }})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	part := bytes.Repeat([]byte{' '}, chunk)
	c1, cancel1 := context.WithCancel(ctx)
	s1 := w.openStream(c1, part)
	c2, cancel2 := context.WithCancel(ctx)
	s2 := w.openStream(c2, part) // the budget exactly
	eventually(t, 5*time.Second, "both bodies buffered", func() bool {
		return promtest.Value(t, w.reg, "kvexact_epp_buffered_body_bytes", nil) == 2*chunk
	})
	s3 := w.openStream(ctx, []byte{' '}) // one byte past
	resp, err := s3.Recv()
	im := resp.GetImmediateResponse()
	if err != nil || im.GetStatus().GetCode() != http.StatusServiceUnavailable || errorCode(t, im.Body) != "body_budget_exhausted" {
		t.Fatalf("one byte past the budget: want 503 body_budget_exhausted, got %v %+v", err, resp)
	}
	retry := false
	for _, h := range im.GetHeaders().GetSetHeaders() {
		retry = retry || h.Header.Key == "retry-after"
	}
	if !retry {
		t.Fatal("503 body_budget_exhausted without Retry-After")
	}
	cancel1() // stream 1 ends: its bytes go back
	_ = s1
	eventually(t, 5*time.Second, "stream 1's bytes back", func() bool {
		return promtest.Value(t, w.reg, "kvexact_epp_buffered_body_bytes", nil) == chunk
	})
	// Stream 2 finishes its body: decided, given back, and its bytes return too (before the stream
	// ends: the response may take minutes).
	if err := s2.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: completionBody("budget"), EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	for { // the decision, then the body given back (flow control holds it until read)
		r, err := s2.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
			break
		}
	}
	eventually(t, 5*time.Second, "the budget empty", func() bool {
		return promtest.Value(t, w.reg, "kvexact_epp_buffered_body_bytes", nil) == 0
	})
	res := w.request(envoyRequest{path: "/v1/completions", body: completionBody("after the budget freed"), chunk: 100})
	if res.header == "" {
		t.Fatalf("after the budget was given back: no destination (%+v)", res.immediate)
	}
	res.cancel()
	if v := promtest.Value(t, w.reg, "kvexact_epp_body_budget_exhausted_total", nil); v != 1 {
		t.Fatalf("kvexact_epp_body_budget_exhausted_total %v, want 1", v)
	}
	cancel2()
	w.noLeak()
}

// TestStreamsPerConnection: the picker advertises its stream bound on every connection, so a
// client cannot open more than that many streams on one connection (gRPC waits for a free one).
func TestStreamsPerConnection(t *testing.T) {
	w := startWorld(t, worldSpec{n: 1, picker: func(p *assemble.Picker) { p.Limits.MaxStreamsPerConn = 2 }})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c1, cancel1 := context.WithCancel(ctx)
	w.openStream(c1, nil)
	w.openStream(ctx, nil)
	eventually(t, 5*time.Second, "two streams open", func() bool {
		return promtest.Value(t, w.reg, "kvexact_epp_streams_active", nil) == 2
	})
	third := make(chan struct{})
	go func() {
		res := w.request(envoyRequest{path: "/v1/completions", body: completionBody("the third stream")})
		if res.header != "" {
			close(third)
		}
	}()
	time.Sleep(500 * time.Millisecond)
	if v := promtest.Value(t, w.reg, "kvexact_epp_streams_active", nil); v != 2 {
		t.Fatalf("%v streams open on one connection; the bound is 2", v)
	}
	select {
	case <-third:
		t.Fatal("a third stream was served while two were open")
	default:
	}
	cancel1()
	select {
	case <-third:
	case <-time.After(10 * time.Second):
		t.Fatal("the third stream was not served once a stream ended")
	}
}

// TestKeepalivePingFlood: a client pinging more often than the keepalive policy allows gets
// GOAWAY too_many_pings; pings at the allowed rate are answered.
func TestKeepalivePingFlood(t *testing.T) {
	const minTime = 200 * time.Millisecond
	var addr string
	w := startWorld(t, worldSpec{n: 1, picker: func(p *assemble.Picker) { p.Limits.KeepaliveMinTime = minTime }})
	addr = w.conn.Target()
	ping := func(every time.Duration, n int) (goaway bool) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte(http2.ClientPreface))
		fr := http2.NewFramer(c, c)
		var wmu sync.Mutex // a Framer's writes are not safe from two goroutines
		fr.WriteSettings()
		got := make(chan bool, 1)
		go func() {
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					got <- false
					return
				}
				switch f := f.(type) {
				case *http2.SettingsFrame:
					if !f.IsAck() {
						wmu.Lock()
						fr.WriteSettingsAck()
						wmu.Unlock()
					}
				case *http2.GoAwayFrame:
					got <- f.ErrCode == http2.ErrCodeEnhanceYourCalm && strings.Contains(string(f.DebugData()), "too_many_pings")
					return
				}
			}
		}()
		for i := 0; i < n; i++ {
			wmu.Lock()
			fr.WritePing(false, [8]byte{byte(i)})
			wmu.Unlock()
			time.Sleep(every)
		}
		select {
		case g := <-got:
			return g
		case <-time.After(time.Second):
			return false
		}
	}
	if !ping(time.Millisecond, 10) {
		t.Fatal("10 pings in 10 ms: want GOAWAY too_many_pings")
	}
	if ping(minTime+100*time.Millisecond, 4) {
		t.Fatalf("pings every %s (the policy allows %s): GOAWAY", minTime+100*time.Millisecond, minTime)
	}
}

// TestTLSClientCA: with a client CA the picker's port refuses plaintext and clients without a
// certificate that CA signed, and serves one with it.
func TestTLSClientCA(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := selfSigned(t, "kvexact test CA", nil, nil, true)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	srv, srvKey := selfSigned(t, "127.0.0.1", ca, caKey, false)
	writePEM(t, filepath.Join(dir, "srv.pem"), "CERTIFICATE", srv.Raw)
	writeKey(t, filepath.Join(dir, "srv.key"), srvKey)
	cli, cliKey := selfSigned(t, "envoy", ca, caKey, false)
	other, otherKey := selfSigned(t, "stranger", nil, nil, false)

	creds, err := epp.ServerTLS(filepath.Join(dir, "srv.pem"), filepath.Join(dir, "srv.key"), filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	w := startWorld(t, worldSpec{n: 1, picker: func(p *assemble.Picker) { p.Creds = creds }})
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	check := func(c credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(w.conn.Target(), grpc.WithTransportCredentials(c))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: epp.HealthExtProc})
		if err == nil && r.Status != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("status %v", r.Status)
		}
		return err
	}
	pair := func(c *x509.Certificate, k *ecdsa.PrivateKey) []tls.Certificate {
		return []tls.Certificate{{Certificate: [][]byte{c.Raw}, PrivateKey: k}}
	}
	if err := check(credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: pair(cli, cliKey)})); err != nil {
		t.Fatalf("a client certificate the CA signed: %v", err)
	}
	if check(credentials.NewTLS(&tls.Config{RootCAs: roots})) == nil {
		t.Fatal("served a client without a certificate")
	}
	if check(credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: pair(other, otherKey)})) == nil {
		t.Fatal("served a client whose certificate another CA signed")
	}
	if check(insecure.NewCredentials()) == nil {
		t.Fatal("served plaintext")
	}
}

func selfSigned(t *testing.T, cn string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, isCA bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: isCA, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	if isCA {
		tmpl.KeyUsage = x509.KeyUsageCertSign
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, key
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeKey(t *testing.T, path string, k *ecdsa.PrivateKey) {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, path, "EC PRIVATE KEY", der)
}

// TestBodyMemoryBounded is the memory probe behind the body budget: many streams each send a
// large body and never finish it. The picker's heap grows by about the budget (buffers grow by
// doubling, so up to twice it), not by what the clients sent: with a 16 MiB budget, 24 streams ×
// 8 MiB (192 MiB sent) leave the heap within 64 MiB of where it started, the streams past the
// budget answered 503. With the budget lifted the same run holds every byte.
func TestBodyMemoryBounded(t *testing.T) {
	const budget, streams, perStream, chunk = 16 << 20, 24, 8 << 20, 1 << 20
	w := startWorld(t, worldSpec{n: 1, picker: func(p *assemble.Picker) { p.Limits.BodyBudget = budget }})
	heap := func() uint64 {
		runtime.GC()
		runtime.GC() // the second empties the pools' victim caches (gRPC's transport buffers)
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	part := bytes.Repeat([]byte{' '}, chunk)
	var wg sync.WaitGroup
	for i := 0; i < streams; i++ {
		st := w.openStream(ctx, nil)
		wg.Go(func() {
			for sent := 0; sent < perStream; sent += chunk {
				if st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: part}}}) != nil {
					return // answered 503 and ended
				}
			}
		})
	}
	wg.Wait()
	eventually(t, 10*time.Second, "the picker to refuse the streams past the budget and hold the others' bodies", func() bool {
		return promtest.Value(t, w.reg, "kvexact_epp_body_budget_exhausted_total", nil) >= streams-budget/perStream &&
			promtest.Value(t, w.reg, "kvexact_epp_buffered_body_bytes", nil) == budget
	})
	if b := promtest.Value(t, w.reg, "kvexact_epp_buffered_body_bytes", nil); b > budget {
		t.Fatalf("%v bytes buffered, budget %d", b, budget)
	}
	if grew := int64(heap()) - int64(before); grew > 4*budget {
		t.Fatalf("the heap grew by %d MiB holding %d streams × %d MiB unfinished bodies; the budget is %d MiB", grew>>20, streams, perStream>>20, budget>>20)
	}
	cancel()
	w.noLeak()
}
