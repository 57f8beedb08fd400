package proxy

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/tracing"
)

// traceContext is the W3C trace context (traceparent, tracestate): read from the client, written
// to every upstream request while traces are on.
var traceContext = tracing.Propagator

// startSpan opens the request's span (a child of the client's trace context when it sent one)
// and carries it in the call's context, so that the routing decision's span and the upstream
// requests' trace context descend from it.
func (c *call) startSpan(t trace.Tracer) {
	ctx := traceContext.Extract(c.ctx, propagation.HeaderCarrier(c.r.Header))
	c.ctx, c.span = t.Start(ctx, "kvexact.request", trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("http.request.method", c.r.Method), attribute.String("url.path", c.r.URL.Path),
		attribute.String("kvexact.request_id", c.id), attribute.String("kvexact.listener", c.listener)))
}

// endSpan closes the request's span with what the access log says of the request.
func (c *call) endSpan() {
	if c.span == nil {
		return
	}
	tier := c.tier
	if tier == "" {
		tier = "none"
	}
	a := []attribute.KeyValue{attribute.Int("http.response.status_code", c.resp.status), attribute.String("kvexact.rule", c.rule.name),
		attribute.String("kvexact.tier", tier), attribute.Int64("kvexact.ttfb_ns", int64(c.resp.ttfb))}
	if n := c.serverName(); n != "" {
		a = append(a, attribute.String("kvexact.endpoint", n))
	}
	if c.resp.realized >= 0 {
		a = append(a, attribute.Int("kvexact.realized_cached_tokens", c.resp.realized))
	}
	c.span.SetAttributes(a...)
	if c.resp.status >= 500 {
		c.span.SetStatus(codes.Error, http.StatusText(c.resp.status))
	}
	c.span.End()
}

// decide is one routing decision, in a span of its own under the request's when traces are on;
// the span carries the decision's evidence (decisionAttributes).
func (c *call) decide(attempt int, retry inventory.Mask) (*route.Decision, error) {
	if c.span == nil {
		return c.rule.rt.Route(c.ctx, &c.in.route, retry)
	}
	ctx, span := c.p.cfg.Tracer.Start(c.ctx, "kvexact.route",
		trace.WithAttributes(attribute.String("kvexact.rule", c.rule.name), attribute.Int("kvexact.attempt", attempt)))
	defer span.End()
	d, err := c.rule.rt.Route(ctx, &c.in.route, retry)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return d, err
	}
	span.SetAttributes(tracing.DecisionAttributes(d)...)
	return d, nil
}

// injectTrace writes the trace context of ctx into an upstream request's header (traces on only:
// otherwise the client's own traceparent, if any, passes as it was sent).
func (c *call) injectTrace(ctx context.Context, h http.Header) {
	if c.span != nil {
		traceContext.Inject(ctx, propagation.HeaderCarrier(h))
	}
}
