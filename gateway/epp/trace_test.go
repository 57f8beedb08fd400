package epp_test

import (
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestPickerTracesDecisions: with a tracer, each decision is a span under the request's
// traceparent carrying the decision's evidence, and the header mutation hands the decision's trace
// context on to the engine; without one, no traceparent is set.
func TestPickerTracesDecisions(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	w := startWorld(t, worldSpec{n: 2, tracer: tp.Tracer("test")})
	const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	res := w.request(envoyRequest{path: "/v1/completions", body: completionBody(strings.Repeat("traced decision. ", 20)),
		headers: []string{"traceparent", "00-" + clientTrace + "-00f067aa0ba902b7-01"}})
	defer res.cancel()
	if res.header == "" {
		t.Fatalf("no destination: %+v", res.immediate)
	}
	var spans []sdktrace.ReadOnlySpan
	for _, s := range exp.GetSpans().Snapshots() {
		if s.Name() == "kvexact.pick" {
			spans = append(spans, s)
		}
	}
	if len(spans) != 1 {
		t.Fatalf("%d pick spans, want 1", len(spans))
	}
	s := spans[0]
	if s.SpanContext().TraceID().String() != clientTrace || s.Parent().SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("pick span in trace %s under %s, want the client's", s.SpanContext().TraceID(), s.Parent().SpanID())
	}
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		attrs[kv.Key] = kv.Value
	}
	if attrs["kvexact.rule"].AsString() == "" || attrs["kvexact.tier"].AsString() == "" || attrs["kvexact.target"].AsString() == "" ||
		len(attrs["kvexact.endpoints.name"].AsStringSlice()) != 2 {
		t.Fatalf("pick span's evidence: %v", s.Attributes())
	}
	want := "00-" + clientTrace + "-" + s.SpanContext().SpanID().String() + "-01"
	got := ""
	for _, h := range res.mutation.GetSetHeaders() {
		if h.Header.Key == "traceparent" {
			got = string(h.Header.RawValue)
		}
	}
	if got != want {
		t.Fatalf("traceparent to the engine %q, want %q", got, want)
	}

	off := startWorld(t, worldSpec{n: 1})
	r2 := off.request(envoyRequest{path: "/v1/completions", body: completionBody("untraced"), headers: []string{"traceparent", "00-" + clientTrace + "-00f067aa0ba902b7-01"}})
	defer r2.cancel()
	for _, h := range r2.mutation.GetSetHeaders() {
		if h.Header.Key == "traceparent" {
			t.Fatalf("traces off, yet the picker set traceparent %q", h.Header.RawValue)
		}
	}
}
