// Package proxy owns the gateway's client-facing HTTP surface: the OpenAI full proxy. It parses each
// body once (model, prompt or messages, user, stream), asks the rule's router where the request goes,
// forwards it — as one request, or as the two legs of the rule's prefill/decode dialect — and relays
// the answer (SSE flushed chunk by chunk), with a receipt naming the endpoint that served. A connect
// failure excludes the endpoint and re-runs the whole selection, so the second-best overlap serves;
// every outcome feeds the endpoint's circuit breaker.
//
// Like httputil.ReverseProxy it is a small core with a few named hooks (Rewrite, OnDecision,
// Usage); the rules and routers it serves come from the table the gateway keeps (Config.Routes).
package proxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvexact/kvexact/gateway/inventory"
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

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := &call{p: h.p, w: w, r: r, ctx: r.Context(), start: time.Now(), listener: h.listener, rule: "none"}
	id := header(r.Header, HeaderRequestID)
	if id == "" || len(id) > 256 {
		id = newRequestID()
	}
	c.id = id
	w.Header()[HeaderRequestID] = c.value(valRequestID, id)
	if e := c.limit(); e != nil {
		c.fail(e)
		c.finish()
		return
	}
	switch path := r.URL.Path; {
	case path == "/v1/completions" || path == "/v1/chat/completions":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			c.fail(&apiError{Status: http.StatusMethodNotAllowed, Type: typeInvalid, Code: "method_not_allowed", Message: r.Method + " is not allowed on " + path + "; use POST"})
			break
		}
		c.generate(path == "/v1/chat/completions")
	case path == "/v1/models" || strings.HasPrefix(path, "/v1/models/"):
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			c.fail(&apiError{Status: http.StatusMethodNotAllowed, Type: typeInvalid, Code: "method_not_allowed", Message: r.Method + " is not allowed on " + path + "; use GET"})
			break
		}
		c.models(strings.TrimPrefix(strings.TrimPrefix(path, "/v1/models"), "/"))
	default:
		c.passThrough()
	}
	c.finish()
	c.end()
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	var out [4 + 32]byte
	copy(out[:], "kvx-")
	hex.Encode(out[4:], b[:])
	return string(out[:])
}

// call is one client request in flight.
type call struct {
	p        *Proxy
	w        http.ResponseWriter
	r        *http.Request
	ctx      context.Context
	id       string
	start    time.Time
	listener string

	rule   string
	rt     *route.Router
	body   *parsed // nil on pass-through paths; else &pb
	raw    []byte
	req    *route.Request  // &rreq
	d      *route.Decision // the decision serving now
	tier   string
	status int // status sent to the client (499: the client left first)

	prefill   *route.Endpoint // receipt: the P/D prefill endpoint that served
	server    *route.Endpoint // receipt: the endpoint whose response is relayed
	committed bool
	// truncated: the response started but did not reach its end (the client left, or the upstream
	// broke off); the connection must be cut so that the client cannot take it for complete.
	truncated bool
	gone      bool // the client left (context canceled by net/http) while the relay ran
	inflight  bool
	// bodyDeadline: the body read deadline is armed (limit) and not yet cleared.
	bodyDeadline bool

	// Storage of the request's own objects, so that a request costs one allocation for them.
	pb   parsed
	rreq route.Request
	out  outbound        // the upstream request of a single (non-P/D) attempt
	vals [numVals]string // single header values, handed out by value
}

// Header values the proxy sets, each a one-element slice of call.vals: a slice literal per
// header would be an allocation each.
const (
	valRequestID = iota
	valRule
	valEndpoint
	valPrefill
	numVals
)

// value stores v in slot i and returns it as a header value ([]string{v}, capacity 1 so that an
// append copies rather than writes into the next slot).
func (c *call) value(i int, v string) []string {
	c.vals[i] = v
	return c.vals[i : i+1 : i+1]
}

// fail answers with an OpenAI-shaped error unless the response has started.
func (c *call) fail(e *apiError) {
	if c.committed {
		return
	}
	c.committed, c.status = true, e.Status
	writeError(c.w, e)
}

// finish records the request's metrics.
func (c *call) finish() {
	if c.status == 0 {
		c.status = 499 // the client went away before any answer
	}
	if c.inflight {
		c.p.cfg.Metrics.inflightAdd(c.rule, -1)
	}
	c.p.cfg.Metrics.done(c.rule, c.status, c.tier, time.Since(c.start))
}

// readBody reads the whole body within the size limit and the body deadline, as it arrives: the
// buffer grows with the bytes received, never to a declared Content-Length up front (a client
// declaring 16 MiB and sending one byte costs 16 KiB, not 16 MiB).
func (c *call) readBody() ([]byte, *apiError) {
	limit := c.p.cfg.MaxBodyBytes
	tooBig := func() *apiError {
		return &apiError{Status: http.StatusRequestEntityTooLarge, Type: typeInvalid, Code: "request_too_large",
			Message: "the request body exceeds " + strconv.FormatInt(limit, 10) + " bytes"}
	}
	n := c.r.ContentLength
	switch {
	case n > limit:
		return nil, tooBig()
	case n == 0 || c.r.Body == nil || c.r.Body == http.NoBody:
		return nil, nil
	}
	const firstChunk = 16 << 10
	b := make([]byte, 0, min(limit, firstChunk, max(n, 512)))
	b, err := readAll(b, http.MaxBytesReader(c.w, c.r.Body, limit))
	if err != nil {
		// The deadline stays armed: net/http discards an unread rest of the body after the
		// handler, and must not wait for it.
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooBig()
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			c.w.Header().Set("Connection", "close")
			c.p.cfg.Metrics.clientError(c.rule, clientBodyTimeout)
			c.p.log.Info("client body too slow", "timeout", c.p.cfg.BodyTimeout, "received", len(b), "request_id", c.id)
			return nil, &apiError{Status: http.StatusRequestTimeout, Type: typeInvalid, Code: "request_timeout",
				Message: "the request body did not arrive within " + c.p.cfg.BodyTimeout.String()}
		}
		return nil, badRequest("", "body_read_failed", "reading the request body failed: %v", err)
	}
	c.endBodyDeadline()
	return b, nil
}

// readAll appends r's bytes to b until EOF, growing b as data arrives (io.ReadAll, from a buffer).
func readAll(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// resolve finds the model's router.
func (c *call) resolve(model string) *apiError {
	rt, err := c.p.cfg.Routes.Resolve(c.listener, model)
	if err != nil { // *resolver.UnknownModelError, the only error Resolve returns
		if model == "" {
			return badRequest("model", "missing_model", "you must provide a model parameter")
		}
		return &apiError{Status: http.StatusNotFound, Type: typeInvalid, Param: "model", Code: "model_not_found", Message: "the model `" + model + "` does not exist"}
	}
	c.rt, c.rule = rt, rt.Rule().Name
	c.inflight = true
	c.p.cfg.Metrics.inflightAdd(c.rule, 1)
	return nil
}

// generate serves /v1/completions and /v1/chat/completions.
func (c *call) generate(chat bool) {
	if e := checkJSONType(c.r); e != nil {
		c.fail(e)
		return
	}
	raw, e := c.readBody()
	if e != nil {
		c.fail(e)
		return
	}
	pb := &c.pb
	if e := pb.parse(raw, chat); e != nil {
		c.fail(e)
		return
	}
	// One source for the model: the body. A header that disagrees is rejected rather than letting
	// routing and the engine read different models (routing-semantics §7.3).
	if hm := header(c.r.Header, "X-Model"); hm != "" && hm != pb.model {
		c.fail(badRequest("model", "model_mismatch", "the X-Model header %s and the body's model %s disagree", quote(hm), quote(pb.model)))
		return
	}
	if e := c.resolve(pb.model); e != nil {
		c.fail(e)
		return
	}
	pb.fillRouteRequest(&c.rreq, c.r)
	c.body, c.raw, c.req = pb, raw, &c.rreq
	c.run()
}

// passThrough forwards another path of the family's API surface or a passthrough path to one endpoint of the rule serving the request's model (the
// body's "model", else X-Model, else the listener's wildcard rule).
func (c *call) passThrough() {
	if !c.anyForwards(c.r.URL.Path) {
		c.fail(unknownPath(c.r))
		return
	}
	raw, e := c.readBody()
	if e != nil {
		c.fail(e)
		return
	}
	model := sniffModel(c.r, raw)
	if model == "" {
		model = header(c.r.Header, "X-Model")
	}
	if e := c.resolve(model); e != nil {
		c.fail(e)
		return
	}
	if !forwardable(c.rt, c.r) {
		c.fail(unknownPath(c.r))
		return
	}
	c.raw = raw
	c.rreq = route.Request{Model: model, ConversationID: header(c.r.Header, "X-Conversation-Id")}
	c.req = &c.rreq
	c.run()
}

// attempt is one try at serving the request on decision d. It returns the endpoint whose connect
// failed (nil when the request was answered, well or badly) and the failure.
type attempt func(d *route.Decision) (failed *route.Endpoint, err error)

// run is the retry loop: route, try, and on a connect failure exclude the endpoint and re-run the
// whole selection (so the second-best overlap serves), at most once per endpoint of the rule.
func (c *call) run() {
	var retry inventory.Mask
	var last error
	n := len(c.rt.Endpoints())
	for i := 0; i < n; i++ {
		d, err := c.rt.Route(c.ctx, c.req, retry)
		if err != nil {
			if c.ctx.Err() != nil {
				return
			}
			c.fail(routeError(err, last))
			return
		}
		c.d, c.tier = d, d.Tier
		failed, ferr := c.try(d)
		if failed == nil {
			if c.p.cfg.OnDecision != nil {
				c.p.cfg.OnDecision(c.r, d)
			}
			d.Release()
			return
		}
		d.Release()
		last = ferr
		retry.Set(failed.ID)
		c.p.cfg.Metrics.failover(c.rule)
		c.p.log.Info("upstream unreachable, re-running selection without it", "rule", c.rule, "endpoint", failed.Name, "err", ferr, "request_id", c.id)
	}
	c.fail(serverError(http.StatusServiceUnavailable, "no_healthy_endpoint", "no endpoint could be reached (last failure: %v)", last))
}

// try dispatches one attempt: a single request for role-less decisions and pass-through paths, else
// the rule's P/D dialect.
func (c *call) try(d *route.Decision) (*route.Endpoint, error) {
	if d.Decode == nil || c.body == nil {
		return c.single(d.Target)
	}
	return c.pd(d)
}

// single forwards the request unchanged to ep and relays the answer.
func (c *call) single(ep *route.Endpoint) (*route.Endpoint, error) {
	// The first attempt's request lives in the call. A retry gets its own: a transport may still
	// hold a failed request's body for a moment after RoundTrip returned (net/http's does).
	o := &c.out
	if o.leg.ep != nil {
		o = new(outbound)
	}
	resp, l, err := c.sendOn(o, c.ctx, ep, c.raw, false)
	if err != nil {
		return c.sendFailed(ep, err)
	}
	c.server = ep
	tap := c.tapUsage(resp)
	if c.relayLeg(resp, l, nil, "upstream_died") == relayed {
		c.reportUsage(tap)
	}
	return nil, nil
}

// isConnectError reports whether a send got no response at all (the endpoint is excluded and the
// selection re-runs).
func isConnectError(err error) bool {
	var ce *connectError
	return errors.As(err, &ce)
}

// sendFailed turns a send error into the attempt's result: a connect failure or an open breaker is
// retried elsewhere; a client that left ends the request.
func (c *call) sendFailed(ep *route.Endpoint, err error) (*route.Endpoint, error) {
	if isConnectError(err) {
		return ep, err
	}
	if c.ctx.Err() == nil {
		c.fail(serverError(http.StatusBadGateway, "upstream_failed", "the request to %s failed: %v", ep.Name, err))
	}
	return nil, nil
}

// sync.Pool of relay buffers.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
