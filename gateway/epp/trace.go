package epp

import (
	"context"
	"net/http"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvexact/kvexact/gateway/apierror"
	"github.com/kvexact/kvexact/gateway/tracing"
)

// startSpan opens the decision's span under the request's trace context (Config.Tracer; nil span
// when traces are off).
func (st *stream) startSpan() (context.Context, trace.Span) {
	ctx := st.srv.Context()
	t := st.s.cfg.Tracer
	if t == nil {
		return ctx, nil
	}
	h := http.Header{}
	if st.hr != nil {
		h = st.hr.Header
	}
	ctx = tracing.Propagator.Extract(ctx, propagation.HeaderCarrier(h))
	return t.Start(ctx, "kvexact.pick", trace.WithSpanKind(trace.SpanKindServer))
}

// endSpan closes the decision's span with its evidence, or the picker's refusal.
func endSpan(span trace.Span, p *pick, e *apierror.Error) {
	if span == nil {
		return
	}
	defer span.End()
	if e != nil {
		span.SetAttributes(attribute.Int("http.response.status_code", e.Status), attribute.String("kvexact.error_code", e.Code))
		span.SetStatus(codes.Error, e.Message)
		return
	}
	span.SetAttributes(attribute.String("kvexact.rule", p.router.Rule().Name))
	if p.d != nil {
		span.SetAttributes(tracing.DecisionAttributes(p.d)...)
	}
}

// appendTraceContext adds the decision span's traceparent (and tracestate) to the request's
// header mutation, so that the engine Envoy sends it to continues the trace.
func appendTraceContext(set []*corev3.HeaderValueOption, ctx context.Context, span trace.Span) []*corev3.HeaderValueOption {
	if span == nil {
		return set
	}
	c := propagation.MapCarrier{}
	tracing.Propagator.Inject(ctx, c)
	for _, k := range c.Keys() {
		set = append(set, header(k, c.Get(k)))
	}
	return set
}
