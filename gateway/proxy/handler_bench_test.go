package proxy

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// cannedTransport answers every request with the same small completion, in memory.
type cannedTransport struct{ body []byte }

func (t cannedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	h := http.Header{"Content-Type": {"application/json"}, "Content-Length": {"120"}, "Date": {"Sun, 29 Nov 2026 20:00:00 GMT"}, "Server": {"uvicorn"}}
	return &http.Response{StatusCode: 200, Header: h, Body: io.NopCloser(bytes.NewReader(t.body)), ContentLength: int64(len(t.body)), Request: r}, nil
}

// discardWriter is a ResponseWriter that keeps nothing.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}

// BenchmarkHandler measures the proxy handler alone (no sockets): one small round-robin completion
// per op, answered in memory.
func BenchmarkHandler(b *testing.B) {
	benchHandler(b, `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"Hello","finish_reason":"length"}],"usage":{}}`, nil)
}

// BenchmarkHandlerUsage is BenchmarkHandler with a usage sink, as the gateway wires it
// (Config.Usage): the usage tap and the account run on every request.
func BenchmarkHandlerUsage(b *testing.B) {
	var reports int
	benchHandler(b, `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"Hello","finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}}`,
		func(UsageReport) { reports++ })
	if reports == 0 {
		b.Fatal("no usage report")
	}
}

// BenchmarkHandlerAccessLog is BenchmarkHandler with the access log on (JSON, discarded), as
// gateway --log-format json runs it by default.
func BenchmarkHandlerAccessLog(b *testing.B) {
	benchHandler(b, `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"Hello","finish_reason":"length"}],"usage":{}}`, nil, func(c *Config) {
		c.AccessLog = slog.New(slog.NewJSONHandler(io.Discard, nil))
	})
}

// BenchmarkHandlerTraced is BenchmarkHandler with traces on: the SDK's tracer, every span sampled
// and recorded (no exporter: the export is the batch processor's, off the request path).
func BenchmarkHandlerTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	benchHandler(b, `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"Hello","finish_reason":"length"}],"usage":{}}`, nil, func(c *Config) {
		c.Tracer = tp.Tracer("bench")
	})
}

func benchHandler(b *testing.B, answer string, usage func(UsageReport), mods ...func(*Config)) {
	p := newPool(b, "vllm", 0, []epSpec{{name: "a", addr: "http://127.0.0.1:1"}}, nil, nil, func(c *Config) {
		c.Transport = cannedTransport{body: []byte(answer)}
		c.Usage = usage
		for _, m := range mods {
			m(c)
		}
	})
	h := p.proxy.Handler("test")
	body := `{"model":"m","prompt":"Say hello.","max_tokens":1}`
	b.ReportAllocs()
	for b.Loop() {
		r, _ := http.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
		r.Header = http.Header{"Content-Type": {"application/json"}, "User-Agent": {"wrk"}}
		r.ContentLength = int64(len(body))
		r.RemoteAddr = "127.0.0.1:5555"
		w := &discardWriter{h: http.Header{}}
		h.ServeHTTP(w, r)
	}
}
