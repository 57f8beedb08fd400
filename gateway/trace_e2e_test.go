package gateway_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/tracing"
)

// otlpReceiver is an in-process OTLP/gRPC trace collector: it keeps every span exported to it.
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (r *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			r.spans = append(r.spans, ss.GetSpans()...)
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (r *otlpReceiver) named(name string) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if s.GetName() == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s *tracepb.Span, key string) *commonpb.AnyValue {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return kv.GetValue()
		}
	}
	return nil
}

// upstreamHeaders records the traceparent of every request the proxy sends to an engine.
type upstreamHeaders struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen []string
}

func (u *upstreamHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	u.mu.Lock()
	u.seen = append(u.seen, r.Header.Get("Traceparent"))
	u.mu.Unlock()
	return u.next.RoundTrip(r)
}

// TestE2ETraceExported: with traces on, a request through a certified pool exports, over OTLP to
// an in-process collector, a server span per request (a child of the client's traceparent) and a
// span per routing decision carrying the decision's evidence; the engine receives the request's
// trace context (W3C traceparent of the same trace).
func TestE2ETraceExported(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	recv := &otlpReceiver{}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, recv)
	go gs.Serve(l)
	defer gs.Stop()
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		t.Setenv(k, "")
	}
	if (tracing.Config{}).Enabled() {
		t.Fatal("traces on without an endpoint")
	}
	tp, err := tracing.Start(context.Background(), tracing.Config{Endpoint: l.Addr().String(), Insecure: true})
	if err != nil || tp == nil {
		t.Fatalf("tracing.Start: %v %v", tp, err)
	}
	defer tp.Shutdown(context.Background())
	up := &upstreamHeaders{}
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", seed: strp("0"), n: 2, mode: 3, certify: true, blockSize: 16,
		tracer: tp.Tracer(), upstream: func(rt http.RoundTripper) http.RoundTripper { up.next = rt; return up }})
	prompt := strings.Repeat("Each decision leaves a span with its evidence. ", 24)
	p.complete(prompt, false)
	// The repeated prompt, sent with a client trace context: KV-exact decides it.
	const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	var resp *http.Response
	eventually(t, 10*time.Second, "a KV-exact decision", func() bool {
		body, _ := json.Marshal(map[string]any{"model": p.model, "prompt": prompt, "max_tokens": 1})
		req, _ := http.NewRequest(http.MethodPost, p.base+"/v1/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Traceparent", "00-"+clientTrace+"-00f067aa0ba902b7-01")
		if resp, err = http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == 200 && strings.Contains(resp.Header.Get(proxy.HeaderDecision), `"tier":"kv-exact"`)
	})
	if err := tp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get(proxy.HeaderRequestID)
	var req *tracepb.Span
	eventually(t, 10*time.Second, "the request's span at the collector", func() bool {
		for _, s := range recv.named("kvexact.request") {
			if attr(s, "kvexact.request_id").GetStringValue() == id {
				req = s
			}
		}
		return req != nil
	})
	if got := hex.EncodeToString(req.GetTraceId()); got != clientTrace {
		t.Fatalf("request span in trace %s, want the client's %s", got, clientTrace)
	}
	if got := hex.EncodeToString(req.GetParentSpanId()); got != "00f067aa0ba902b7" {
		t.Fatalf("request span's parent %s, want the client's span", got)
	}
	if req.GetKind() != tracepb.Span_SPAN_KIND_SERVER || attr(req, "http.response.status_code").GetIntValue() != 200 ||
		attr(req, "kvexact.rule").GetStringValue() != "pool" || attr(req, "kvexact.tier").GetStringValue() != "kv-exact" ||
		attr(req, "kvexact.endpoint").GetStringValue() != resp.Header.Get(proxy.HeaderEndpoint) {
		t.Fatalf("request span: %v", req)
	}
	var route *tracepb.Span
	for _, s := range recv.named("kvexact.route") {
		if bytes.Equal(s.GetParentSpanId(), req.GetSpanId()) {
			route = s
		}
	}
	if route == nil {
		t.Fatalf("no routing span under the request's (%d routing spans)", len(recv.named("kvexact.route")))
	}
	names := attr(route, "kvexact.endpoints.name").GetArrayValue().GetValues()
	prefix := attr(route, "kvexact.endpoints.prefix").GetArrayValue().GetValues()
	target := attr(route, "kvexact.target").GetStringValue()
	if attr(route, "kvexact.tier").GetStringValue() != "kv-exact" || target != resp.Header.Get(proxy.HeaderEndpoint) ||
		attr(route, "kvexact.blocks").GetIntValue() == 0 || len(names) != 2 || len(prefix) != 2 {
		t.Fatalf("routing span's evidence: %v", route.GetAttributes())
	}
	for i, n := range names {
		if n.GetStringValue() == target && prefix[i].GetIntValue() == 0 {
			t.Fatalf("the target's prefix is 0 in the evidence: %v", route.GetAttributes())
		}
	}
	// The engine got the request span's context: same trace, the request span as parent.
	want := "00-" + clientTrace + "-" + hex.EncodeToString(req.GetSpanId()) + "-01"
	up.mu.Lock()
	defer up.mu.Unlock()
	found := false
	for _, tp := range up.seen {
		found = found || tp == want
	}
	if !found {
		t.Fatalf("no upstream request carried %s: %q", want, up.seen)
	}
}
