// Package epp is the gateway's second front end: a Gateway API Inference Extension Endpoint Picker
// (protocol v1 of proposal 004) over Envoy's ext_proc. Envoy carries the bytes; the picker reads
// each request's headers and body from the ext_proc stream, decides with the very routers the
// standalone gateway uses, found through the same resolver table (same inventory, ingest,
// certificate verdict, load counts and metrics),
// and answers with the chosen endpoint as the x-gateway-destination-endpoint header and, identically,
// in the envoy.lb dynamic metadata. On the response path it reads which endpoint served
// (x-gateway-destination-endpoint-served) and the usage the response body carries, so receipts and
// predicted-vs-realized accounting see what the standalone proxy would see. docs/epp.md says which
// parts of the protocol are relied on and how they are tested.
package epp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvexact/kvexact/gateway/apierror"
	"github.com/kvexact/kvexact/gateway/resolver"
	"github.com/kvexact/kvexact/gateway/route"
)

// Protocol names (proposal 004, v1.0.0).
const (
	// DestinationHeader and DestinationKey carry the chosen endpoint(s), "ip:port[,ip:port…]".
	DestinationHeader = "x-gateway-destination-endpoint"
	// DestinationNamespace is the dynamic-metadata namespace of the destination and of the served
	// endpoint the data plane reports back.
	DestinationNamespace = "envoy.lb"
	// ServedKey is the endpoint that actually served, in metadata_context[DestinationNamespace].
	ServedKey = "x-gateway-destination-endpoint-served"
	// SubsetNamespace and SubsetKey carry the data plane's subset hint (a list of "ip:port").
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
	// PrefillHeader names the prefill endpoint of a P/D decision for the decode pod's P/D sidecar
	// (llm-d's convention; the destination is then the decode endpoint).
	PrefillHeader = "x-prefiller-host-port"
	// ReceiptHeader is the standalone gateway's receipt (the endpoint name that served), set on the
	// response path from the served-endpoint metadata.
	ReceiptHeader = "x-kvexact-endpoint"
	// DecisionHeader carries the decision's evidence when Config.DebugHeader is set.
	DecisionHeader = "x-kvexact-decision"
)

// Limits.
const (
	// DefaultMaxBodyBytes is the request body cap (the standalone gateway's default too).
	DefaultMaxBodyBytes = 16 << 20
	// MaxFallbacks bounds the fallback endpoints listed after the primary.
	MaxFallbacks = 8
	// maxChunk is the largest body chunk sent back in a streamed body response: some Envoy builds
	// cap a streamed chunk at 64 KiB.
	maxChunk = 62000
	// maxUsageScan is how much of a response body's tail is kept to find its usage object.
	maxUsageScan = 64 << 10
	// maxSubset bounds the subset hint's entries.
	maxSubset = 4096
)

// ParseFunc turns a request (headers as an *http.Request) and its body into the router's request:
// the standalone proxy's parser, so that both front ends read a body the same way.
type ParseFunc func(r *http.Request, body []byte) (*route.Request, error)

// SurfaceFunc is the proxy's API-surface check: nil when rt may serve r's path, else the answer.
type SurfaceFunc func(rt *route.Router, r *http.Request) *apierror.Error

// Config configures a Server.
type Config struct {
	// Routes resolves a request's rule to its router: the gateway's table, the one the standalone
	// proxy reads (Gateway.Routes); required.
	Routes *resolver.Table
	// RecordUsage takes one served response's cached-token account, as from the standalone proxy's
	// Usage hook: the predicted-vs-realized counters and the shortfall suspension are the gateway's
	// (Gateway.RecordUsage), whichever front end relayed the response. Nil records none.
	RecordUsage func(rule, endpoint string, kvExact bool, predicted, realized, blockSize int)
	// Parse is the proxy's request parser (proxy.ParseRequest); required.
	Parse ParseFunc
	// Surface answers whether a request's path may get a destination among rt's endpoints: nil
	// when it may, else the error the client gets (proxy.SurfaceCheck, the standalone proxy's own
	// check, so that both front ends serve the same paths); required.
	Surface SurfaceFunc
	// Listener is the gateway listener whose rules the picker serves (the config's listen address
	// when the rules name none).
	Listener string
	// MaxBodyBytes caps a request body (413 above it); 0 takes DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Fallbacks is how many endpoints follow the primary in the destination list (0..MaxFallbacks;
	// negative lists none). 0 takes 2.
	Fallbacks int
	// Limits bound buffered bodies, headers, stream lifetimes and connections (zero: defaults).
	Limits Limits
	// DebugHeader adds the decision's evidence as x-kvexact-decision to the request headers.
	DebugHeader bool
	// Metrics records the picker's own series; nil records none.
	Metrics *Metrics
	// Tracer, when set, gets a span per routing decision (a child of the request's traceparent),
	// and the decision's header mutation carries its W3C trace context to the engine; nil makes
	// no span.
	Tracer trace.Tracer
	Log    *slog.Logger
}

func (c *Config) normalize() error {
	if c.Routes == nil || c.Parse == nil || c.Surface == nil {
		return errors.New("epp: Routes, Parse and Surface are required")
	}
	if err := c.Limits.normalize(); err != nil {
		return err
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("epp: MaxBodyBytes %d is negative", c.MaxBodyBytes)
	}
	switch {
	case c.Fallbacks == 0:
		c.Fallbacks = 2
	case c.Fallbacks < 0:
		c.Fallbacks = 0
	case c.Fallbacks > MaxFallbacks:
		return fmt.Errorf("epp: Fallbacks %d is above %d", c.Fallbacks, MaxFallbacks)
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return nil
}

// HostPort is an endpoint's data-plane address as the protocol spells it ("ip:port"), from its
// configured base URL (the scheme's default port when the URL names none).
func HostPort(e *route.Endpoint) (string, error) {
	u, err := e.URL()
	if err != nil {
		return "", fmt.Errorf("endpoint %s: address %q: %w", e.Name, e.Address, err)
	}
	return hostPortOf(u)
}

func hostPortOf(u *url.URL) (string, error) {
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return "", fmt.Errorf("address %q has no host", u.String())
	}
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(host, port), nil
}

// invalid is a request error the picker answers the client itself (an ext_proc ImmediateResponse).
func invalid(status int, code, format string, args ...any) *apierror.Error {
	return apierror.Invalid(status, "", code, format, args...)
}

// unavailable is the picker's own failure; shedding (429) is a rate_limit_error, as in the proxy.
func unavailable(status int, code, format string, args ...any) *apierror.Error {
	e := apierror.Server(status, code, format, args...)
	if status == http.StatusTooManyRequests {
		e.Type = apierror.TypeRateLimit
	}
	return e
}

// routeError maps the router's errors to the protocol's answers: nothing eligible 503, shedding 429.
func routeError(err error) *apierror.Error {
	switch {
	case errors.Is(err, route.ErrShed):
		return unavailable(http.StatusTooManyRequests, "overloaded", "%v; retry later", err)
	case errors.Is(err, route.ErrParkTimeout):
		return unavailable(http.StatusServiceUnavailable, "park_timeout", "%v", err)
	case errors.Is(err, route.ErrNoEndpoint):
		return unavailable(http.StatusServiceUnavailable, "no_healthy_endpoint", "%v", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return unavailable(http.StatusServiceUnavailable, "canceled", "the request ended before an endpoint was chosen: %v", err)
	}
	return unavailable(http.StatusInternalServerError, "routing_failed", "routing failed: %v", err)
}

// joinList is "a,b,c" without a trailing comma.
func joinList(xs []string) string { return strings.Join(xs, ",") }
