// Package tracing owns the gateway's OpenTelemetry traces: the tracer provider that exports spans
// over OTLP (gRPC), configured by the standard OTEL_* environment variables, and off unless asked.
//
// Traces are on when Config.Endpoint is set (gateway --otlp-endpoint) or when the environment
// names an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), and
// neither OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none says otherwise. The exporter reads
// the rest of its settings (headers, TLS, timeout, compression) from the same variables; the
// resource takes OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the sampler OTEL_TRACES_SAMPLER
// (default: parent-based, always on).
//
// What the gateway puts in its spans is the proxy's (gateway/proxy): one span per client request,
// one per routing decision with the decision's evidence as attributes, and W3C trace context
// (traceparent, tracestate) on every upstream request.
package tracing

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/internal/buildinfo"
)

// Config says where spans go.
type Config struct {
	// Endpoint is the OTLP gRPC collector's host:port; empty: the OTEL_* variables decide (see
	// the package comment).
	Endpoint string
	// Insecure sends to Endpoint without TLS (a collector beside the gateway, or a test's).
	Insecure bool
	// Service is the service.name when OTEL_SERVICE_NAME is unset (default "kvexact-gateway").
	Service string
}

// Enabled reports whether cfg and the environment turn traces on.
func (c Config) Enabled() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(os.Getenv("OTEL_TRACES_EXPORTER"), "none") {
		return false
	}
	return c.Endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Provider is a running tracer provider; Shutdown flushes what is buffered.
type Provider struct {
	*sdktrace.TracerProvider
}

// Start builds the provider, or returns nil when traces are off (the proxy then makes no span).
func Start(ctx context.Context, cfg Config) (*Provider, error) {
	if !cfg.Enabled() {
		return nil, nil
	}
	var opts []otlptracegrpc.Option
	if cfg.Endpoint != "" {
		opts = append(opts, otlptracegrpc.WithEndpoint(cfg.Endpoint))
	}
	if cfg.Insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	service := cfg.Service
	if service == "" {
		service = "kvexact-gateway"
	}
	in := buildinfo.Read()
	// The environment (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) overrides the defaults here.
	res, err := resource.Merge(resource.NewSchemaless(attribute.String("service.name", service), attribute.String("service.version", in.Version)), resource.Environment())
	if err != nil {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Provider{tp}, nil
}

// Tracer is the gateway's tracer of p (nil when p is nil: traces off).
func (p *Provider) Tracer() trace.Tracer {
	if p == nil {
		return nil
	}
	return p.TracerProvider.Tracer("github.com/kvexact/kvexact/gateway")
}

// Propagator is the W3C trace context (traceparent, tracestate) the gateway reads from clients
// and writes to engines.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// DecisionAttributes are a decision's evidence: the tier and target, why KV-exact missed, the
// prompt's blocks and the winner's score, then each endpoint's overlap, prefix, load, exclusion and
// eligibility (parallel arrays in the decision's endpoint order).
func DecisionAttributes(d *route.Decision) []attribute.KeyValue {
	a := []attribute.KeyValue{attribute.String("kvexact.tier", d.Tier), attribute.String("kvexact.target", d.TargetN),
		attribute.Int("kvexact.blocks", d.Blocks), attribute.Int("kvexact.score", d.Score), attribute.Bool("kvexact.predicted", d.Predicted)}
	if d.DecodeN != "" {
		a = append(a, attribute.String("kvexact.decode", d.DecodeN))
	}
	if d.Miss != route.MissNone {
		a = append(a, attribute.String("kvexact.miss", string(d.Miss)), attribute.String("kvexact.miss_reason", d.Reason))
	}
	if d.MaxHit > 0 {
		a = append(a, attribute.Int("kvexact.max_hit", d.MaxHit))
	}
	if n := len(d.Endpoints); n > 0 {
		names, excl := make([]string, n), make([]string, n)
		overlap, prefix, load, predicted := make([]int, n), make([]int, n), make([]int, n), make([]int, n)
		eligible := make([]bool, n)
		for i, e := range d.Endpoints {
			names[i], excl[i], eligible[i] = e.Name, e.Excluded, e.Eligible
			overlap[i], prefix[i], load[i], predicted[i] = e.Overlap, e.Prefix, e.Load, e.Predicted
		}
		a = append(a, attribute.StringSlice("kvexact.endpoints.name", names), attribute.IntSlice("kvexact.endpoints.overlap", overlap),
			attribute.IntSlice("kvexact.endpoints.prefix", prefix), attribute.IntSlice("kvexact.endpoints.predicted", predicted),
			attribute.IntSlice("kvexact.endpoints.load", load), attribute.StringSlice("kvexact.endpoints.excluded", excl),
			attribute.BoolSlice("kvexact.endpoints.eligible", eligible))
	}
	return a
}
