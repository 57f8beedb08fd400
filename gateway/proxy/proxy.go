// Package proxy owns the gateway's client-facing HTTP surface: the OpenAI full proxy. A request
// goes down one path, each step in the file named after it:
//
//	proxy.go    ServeHTTP: the request id, the limits (limits.go), then by path
//	parse.go    the body read once (size, deadline) and parsed into the typed request
//	resolve.go  the rule serving (listener, model), from the gateway's table (Config.Routes)
//	route.go    the rule's router decides; a connect failure excludes the endpoint and re-runs
//	            the whole selection, so the second-best overlap serves
//	forward.go  the upstream request (one, or the two legs of the rule's P/D dialect: pd.go)
//	relay.go    the answer relayed (SSE flushed event by event), with the receipts
//	account.go  metrics, the cached-token account (Config.Usage), the request's defined end
//
// Each step keeps its state in its own part of the call. Every outcome feeds the endpoint's
// circuit breaker. Like httputil.ReverseProxy it is a small core with a few named hooks (Rewrite,
// OnDecision, Usage); the P/D choreographies are the engine families' (engines.PDDialect), driven
// through the leg runner in pd.go.
//
// The answers the proxy gives itself are gateway/apierror's Error, the type the endpoint picker
// (gateway/epp) answers with too (errors.go writes it).
package proxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvexact/kvexact/gateway/apierror"
	"github.com/kvexact/kvexact/gateway/resolver"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/cowmap"
)

// Response headers the proxy sets.
const (
	HeaderRequestID = "X-Request-Id"
	// HeaderEndpoint names the endpoint whose response the client got (the decode endpoint for P/D),
	// rewritten on failover.
	HeaderEndpoint = "X-Kvexact-Endpoint"
	// HeaderPrefill names the P/D prefill endpoint whose KV the decode leg used.
	HeaderPrefill = "X-Kvexact-Prefill"
	// HeaderDecision carries the routing decision as compact JSON when Config.DebugHeader is set.
	HeaderDecision = "X-Kvexact-Decision"
	// HeaderRule names the rule that served.
	HeaderRule = "X-Kvexact-Rule"
)

// Config configures a Proxy.
type Config struct {
	// Routes resolves each request's rule: (listener, model) → router. An unknown model is
	// answered 404 model_not_found before any tier runs.
	Routes *resolver.Table
	// MaxBodyBytes caps request bodies (413 above it). 0 means 16 MiB.
	MaxBodyBytes int64
	// MaxHeaderFields caps a request's header field lines (431 above it). 0 means 100.
	MaxHeaderFields int
	// BodyTimeout bounds the time from the handler's start to the request body's last byte (408
	// and a closed connection past it). 0 means 60s.
	BodyTimeout time.Duration
	// WriteTimeout bounds each write to the client, renewed before every write (a response's
	// headers, each relayed chunk, each flush): a client that stops reading is cut when one write
	// makes no progress that long. 0 means 60s (nginx's send_timeout).
	WriteTimeout time.Duration
	// DebugHeader adds X-Kvexact-Decision to responses.
	DebugHeader bool
	// PrefillTimeout bounds a P/D prefill (context) leg; past it the client gets 504
	// pd_prefill_timeout. 0 means no bound beyond the client's own.
	PrefillTimeout time.Duration
	// Transport sends every upstream request when set (tests, benchmarks). Nil: each rule gets its
	// own transport from its upstream settings (NewTransport).
	Transport http.RoundTripper
	Log       *slog.Logger
	Metrics   *Metrics
	// AccessLog, when set, gets one INFO line per request (access.go); nil writes none.
	AccessLog *slog.Logger
	// Tracer, when set, gets a span per request and per routing decision, and every upstream
	// request carries the W3C trace context (trace.go); nil makes no span.
	Tracer trace.Tracer

	// Rewrite, when set, may edit every upstream request just before it is sent (headers only: the
	// body is already fixed). ep is the endpoint it goes to.
	Rewrite func(out *http.Request, ep *route.Endpoint)
	// OnDecision, when set, sees the decision that served each request (after failovers), before it
	// is released — for /admin/explain and access logs.
	OnDecision func(r *http.Request, d *route.Decision)
	// Usage, when set, receives the cached-token account of every relayed single-pool response
	// whose engine reported usage (predicted vs realized; see UsageReport), and of every P/D
	// request's prefill leg (reportPrefillUsage says why not the decode leg). The client's bytes
	// are never changed.
	Usage func(UsageReport)
}

// Proxy serves OpenAI requests for the rules in Config.Routes.
type Proxy struct {
	cfg Config
	log *slog.Logger
	// transports holds each rule's upstream transport, by rule version (see transportOf).
	transports cowmap.Map[*rules.Rule, ruleTransport]
}

// New builds a proxy.
func New(cfg Config) *Proxy {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 16 << 20
	}
	if cfg.MaxHeaderFields <= 0 {
		cfg.MaxHeaderFields = 100
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = 60 * time.Second
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 60 * time.Second
	}
	captureStdLog(cfg.Log)
	p := &Proxy{cfg: cfg, log: cfg.Log}
	if p.log == nil {
		p.log = slog.Default()
	}
	return p
}

// Handler serves one client listener: /v1/completions, /v1/chat/completions, /v1/models (and
// /v1/models/{id}); the rest of the OpenAI surface the rule's engine family serves (its contract's
// api list: embeddings, responses, audio, …) and the paths a rule lists under passthrough are forwarded to an endpoint of the rule serving the body's model;
// anything else is 404 unknown_url (surface.go).
func (p *Proxy) Handler(listener string) http.Handler {
	return &handler{p: p, listener: listener}
}

type handler struct {
	p        *Proxy
	listener string
}

// ServeHTTP is the request path, top to bottom.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := &call{p: h.p, w: w, r: r, ctx: r.Context(), start: time.Now(), listener: h.listener, id: requestID(r)}
	c.rule.name = "none"
	c.resp.realized = -1
	if t := h.p.cfg.Tracer; t != nil {
		c.startSpan(t)
	}
	w.Header()[HeaderRequestID] = c.value(valRequestID, c.id)
	if e := c.limit(); e != nil {
		c.fail(e)
	} else {
		c.serve()
	}
	c.finish()
	c.endSpan()
	c.end()
}

// serve dispatches on the path: the two generation paths, the models listing, or a path forwarded
// as it is.
func (c *call) serve() {
	if e := checkQuery(c.r); e != nil {
		c.fail(e)
		return
	}
	switch path := c.r.URL.Path; {
	case path == "/v1/completions" || path == "/v1/chat/completions":
		if !canonicalPath(c.r) {
			c.fail(nonCanonical(c.r)) // forwarded as written: it must read as what was matched
			return
		}
		if c.allow(http.MethodPost) {
			c.generate(path == "/v1/chat/completions")
		}
	case path == "/v1/models" || strings.HasPrefix(path, "/v1/models/"):
		if c.allow(http.MethodGet) {
			c.models(strings.TrimPrefix(strings.TrimPrefix(path, "/v1/models"), "/"))
		}
	default:
		c.passThrough()
	}
}

// allow answers 405 unless the request's method is method.
func (c *call) allow(method string) bool {
	if c.r.Method == method {
		return true
	}
	c.w.Header().Set("Allow", method)
	c.fail(&apierror.Error{Status: http.StatusMethodNotAllowed, Type: apierror.TypeInvalid, Code: "method_not_allowed", Message: c.r.Method + " is not allowed on " + c.r.URL.Path + "; use " + method})
	return false
}

// generate serves /v1/completions and /v1/chat/completions: parse, resolve, then route, forward
// and relay (run).
func (c *call) generate(chat bool) {
	if e := c.parse(chat); e != nil {
		c.fail(e)
		return
	}
	if e := c.resolve(c.in.body.model); e != nil {
		c.fail(e)
		return
	}
	c.run()
}

// passThrough forwards another path of the family's API surface, or a passthrough path, to one
// endpoint of the rule serving the request's model (the body's "model", else X-Model, else the
// listener's wildcard rule).
func (c *call) passThrough() {
	if !c.anyForwards(c.r.URL.Path) {
		c.fail(unknownPath(c.r))
		return
	}
	if !canonicalPath(c.r) {
		c.fail(nonCanonical(c.r))
		return
	}
	if e := c.parseForwarded(); e != nil {
		c.fail(e)
		return
	}
	if e := c.resolve(c.in.route.Model); e != nil {
		c.fail(e)
		return
	}
	if !forwardable(c.rule.rt, c.r) {
		c.fail(unknownPath(c.r))
		return
	}
	c.run()
}

// call is one client request in flight: the exchange's own facts, then each step's state in its
// own part (values, so that a request costs one allocation for all of them).
type call struct {
	p        *Proxy
	w        http.ResponseWriter
	r        *http.Request
	ctx      context.Context
	id       string
	start    time.Time
	listener string
	span     trace.Span // the request's span (nil: traces off)
	// bodyDeadline: the body read deadline is armed (limit) and not yet cleared.
	bodyDeadline bool

	in   request         // parse.go
	rule resolved        // resolve.go
	d    *route.Decision // route.go: the decision serving now
	tier string          // route.go: the tier that decided it
	out  outbound        // forward.go: the upstream request of a single (non-P/D) attempt
	resp response        // relay.go: what the client has been sent
}

// requestID is the client's X-Request-Id (at most 256 bytes), else a new one.
func requestID(r *http.Request) string {
	if id := header(r.Header, HeaderRequestID); id != "" && len(id) <= 256 {
		return id
	}
	return newRequestID()
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	var out [4 + 32]byte
	copy(out[:], "kvx-")
	hex.Encode(out[4:], b[:])
	return string(out[:])
}
