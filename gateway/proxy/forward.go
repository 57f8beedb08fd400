package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvexact/kvexact/gateway/apierror"
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
)

// single forwards the request unchanged to ep and relays the answer.
func (c *call) single(ep *route.Endpoint) (*route.Endpoint, error) {
	// The first attempt's request lives in the call. A retry gets its own: a transport may still
	// hold a failed request's body for a moment after RoundTrip returned (net/http's does).
	o := &c.out
	if o.leg.ep != nil {
		o = new(outbound)
	}
	sent := time.Now()
	// The gateway's own time so far: the client's time to first token holds it, the receipt's
	// (timed from sent) does not, so the ttft law learns it apart.
	c.d.Sent(sent.Sub(c.start))
	resp, l, err := c.sendOn(o, c.ctx, ep, c.in.raw, false)
	if err != nil {
		return c.sendFailed(ep, err)
	}
	c.resp.server = ep
	tap := c.tapUsage(resp, sent)
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
		c.fail(apierror.Server(http.StatusBadGateway, "upstream_failed", "the request to %s failed: %v", ep.Name, err))
	}
	return nil, nil
}

// connectError is a request that got no response at all (dial refused, reset before headers), or
// that the endpoint's breaker refused: the endpoint is excluded and the selection re-runs.
type connectError struct {
	ep      *route.Endpoint
	breaker bool
	err     error
}

func (e *connectError) Error() string {
	if e.breaker {
		return e.ep.Name + ": circuit breaker open"
	}
	return e.ep.Name + ": " + e.err.Error()
}

func (e *connectError) Unwrap() error { return e.err }

// errPrefillTimeout: a P/D prefill leg outlived Config.PrefillTimeout.
var errPrefillTimeout = errors.New("the prefill leg did not answer within the prefill timeout")

// leg is one upstream request: the endpoint and its breaker admission, reported exactly once.
type leg struct {
	ep       *route.Endpoint
	breaker  *health.Breaker
	reported bool
}

func (l *leg) report(o health.Outcome, status int) {
	if l == nil || l.breaker == nil || l.reported {
		return
	}
	l.reported = true
	l.breaker.Report(o, status)
}

// isHopHeader: fields meaningful for one connection only, never forwarded (RFC 9110 §7.6.1).
func isHopHeader(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// copyHeadersTo copies src into dst without hop-by-hop headers (including those Connection names).
// With share, dst takes src's value slices instead of copies: for headers nothing edits in place
// afterwards (an upstream response's, committed at once; a client request's, read-only here).
func copyHeadersTo(dst, src http.Header, share bool) {
	var named []string
	for _, v := range src["Connection"] {
		for v != "" {
			var f string
			f, v, _ = strings.Cut(v, ",")
			if f = strings.TrimSpace(f); f != "" {
				named = append(named, http.CanonicalHeaderKey(f))
			}
		}
	}
	for k, vv := range src {
		if isHopHeader(k) || slices.Contains(named, k) {
			continue
		}
		if share {
			dst[k] = vv
		} else {
			dst[k] = append(dst[k][:0:0], vv...)
		}
	}
}

// outbound is one upstream request and its leg, allocated together.
type outbound struct {
	leg  leg
	req  http.Request // the template WithContext copies
	url  url.URL
	body bytes.Reader
	vals [2]string // X-Request-Id and X-Forwarded-For values
}

// send issues one upstream request with body to ep, after the breaker admits it. internal legs
// (whose answer the proxy reads itself) ask for an uncompressed body.
func (c *call) send(ctx context.Context, ep *route.Endpoint, body []byte, internal bool) (*http.Response, *leg, error) {
	return c.sendOn(new(outbound), ctx, ep, body, internal)
}

// sendOn is send with the request's objects in o, which must not be in use.
func (c *call) sendOn(o *outbound, ctx context.Context, ep *route.Endpoint, body []byte, internal bool) (*http.Response, *leg, error) {
	o.leg = leg{ep: ep}
	l := &o.leg
	if ep.Health != nil && ep.Health.Breaker != nil {
		if !ep.Health.Breaker.Acquire() {
			c.p.cfg.Metrics.upstreamError(c.rule.name, ep.Name, errBreakerOpen)
			return nil, l, &connectError{ep: ep, breaker: true, err: errors.New("circuit breaker open")}
		}
		l.breaker = ep.Health.Breaker
	}
	// The leg's own context: canceled (with errUpstreamIdle) when its response body stays silent
	// longer than the rule's upstream.idleTimeout (idleBody), else when the body is closed.
	ctx, cancel := context.WithCancelCause(ctx)
	out, err := c.upstreamRequest(ctx, ep, body, o)
	if err != nil {
		cancel(nil)
		l.report(health.Canceled, 0) // a bad address is configuration, not the endpoint's health
		return nil, l, fmt.Errorf("endpoint %s: %w", ep.Name, err)
	}
	// The client's header values are shared, not copied: nothing edits them in place after this,
	// except a Rewrite hook, which gets copies.
	h := out.Header
	copyHeadersTo(h, c.r.Header, c.p.cfg.Rewrite == nil)
	delete(h, "Content-Length")
	delete(h, "Host")
	delete(h, "Expect") // the body is already read: no 100-continue round trip upstream
	c.injectTrace(ctx, h)
	o.vals[0] = c.id
	h[HeaderRequestID] = o.vals[0:1:1]
	if d := c.d; d != nil && d.Rank != nil && ep == d.Target && ep.RankHeader != "" {
		// KV-exact scored one data-parallel rank of the endpoint: the request must land there.
		h.Set(ep.RankHeader, strconv.Itoa(*d.Rank))
	}
	if len(body) > 0 && header(h, "Content-Type") == "" {
		h["Content-Type"] = []string{"application/json"}
	}
	if internal {
		delete(h, "Accept-Encoding")
		h["Accept"] = []string{"application/json"}
	}
	if ip, _, err := net.SplitHostPort(c.r.RemoteAddr); err == nil {
		if prior := c.r.Header["X-Forwarded-For"]; len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		o.vals[1] = ip
		h["X-Forwarded-For"] = o.vals[1:2:2]
	}
	if c.p.cfg.Rewrite != nil {
		c.p.cfg.Rewrite(out, ep)
	}
	t, err := c.transport()
	if err != nil {
		cancel(nil)
		l.report(health.Canceled, 0) // configuration, not the endpoint's health
		return nil, l, fmt.Errorf("endpoint %s: %w", ep.Name, err)
	}
	resp, err := t.RoundTrip(out)
	if err == nil {
		resp.Body = newIdleBody(resp.Body, ctx, cancel, c.upstreamIdle())
		return resp, l, nil
	}
	defer cancel(nil)
	switch {
	case c.ctx.Err() != nil:
		l.report(health.Canceled, 0)
		return nil, l, c.ctx.Err()
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		l.report(health.TransportFailure, 0)
		c.p.cfg.Metrics.upstreamError(c.rule.name, ep.Name, errTimeout)
		return nil, l, errPrefillTimeout
	case ctx.Err() != nil: // the proxy itself abandoned the leg (P/D coupling)
		l.report(health.Canceled, 0)
		return nil, l, ctx.Err()
	}
	l.report(health.TransportFailure, 0)
	c.p.cfg.Metrics.upstreamError(c.rule.name, ep.Name, errConnect)
	return nil, l, &connectError{ep: ep, err: err}
}

// upstreamRequest is the client's request re-addressed to ep: the endpoint's scheme and host, its
// path (if any) joined with the client's path, the client's query. Built field by field rather than
// through http.NewRequest, which would parse the URL again for every request.
func (c *call) upstreamRequest(ctx context.Context, ep *route.Endpoint, body []byte, o *outbound) (*http.Request, error) {
	base, err := ep.URL()
	if err != nil {
		return nil, err
	}
	if base.Scheme == "" || base.Host == "" {
		return nil, fmt.Errorf("address %q is not an absolute URL", ep.Address)
	}
	u := &o.url
	*u = url.URL{Scheme: base.Scheme, Host: base.Host, Path: c.r.URL.Path, RawPath: c.r.URL.RawPath, RawQuery: c.r.URL.RawQuery}
	if p := strings.TrimSuffix(base.Path, "/"); p != "" {
		u.Path, u.RawPath = p+u.Path, ""
		if c.r.URL.RawPath != "" || base.RawPath != "" {
			u.RawPath = strings.TrimSuffix(base.EscapedPath(), "/") + c.r.URL.EscapedPath()
		}
	}
	// The request is assembled in o and copied once by WithContext, the only way to give it its
	// context (NewRequestWithContext would also parse a URL and make a header map to replace).
	o.req = http.Request{Method: c.r.Method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: make(http.Header, len(c.r.Header)+3), Host: base.Host}
	out := o.req.WithContext(ctx)
	switch {
	case len(body) > 0:
		out.ContentLength = int64(len(body))
		// io.NopCloser over a *bytes.Reader: net/http recognizes it as a body in memory and sends
		// the headers and the body in one write (any other reader type gets the headers flushed
		// first, a second syscall per request).
		o.body.Reset(body)
		out.Body = io.NopCloser(&o.body)
		out.GetBody = func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(body)), nil
		}
	case c.r.Method != http.MethodGet && c.r.Method != http.MethodHead:
		out.Body = http.NoBody // an empty POST still says Content-Length: 0
	}
	return out, nil
}

// errUpstreamIdle is how a response body that stayed silent past upstream.idleTimeout ends.
var errUpstreamIdle = errors.New("no body byte within the rule's upstream.idleTimeout")

// upstreamIdle is the rule's upstream read-idle bound.
func (c *call) upstreamIdle() time.Duration {
	if c.rule.rt != nil {
		if d := time.Duration(c.rule.rt.Rule().Upstream.IdleTimeout); d > 0 {
			return d
		}
	}
	return time.Duration(rules.Upstream{}.WithDefaults().IdleTimeout)
}

// idleBody bounds the silence of an upstream response body: each Read must return within idle,
// else the leg's context is canceled and the read fails with errUpstreamIdle (the relay then sends
// the client an error event and cuts the connection). The clock runs only while a Read waits, so a
// client that reads slowly never makes its upstream look idle.
type idleBody struct {
	body   io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	idle   time.Duration
	timer  *time.Timer
}

func newIdleBody(body io.ReadCloser, ctx context.Context, cancel context.CancelCauseFunc, idle time.Duration) *idleBody {
	b := &idleBody{body: body, ctx: ctx, cancel: cancel, idle: idle}
	b.timer = time.AfterFunc(time.Hour, func() { cancel(errUpstreamIdle) })
	b.timer.Stop()
	return b
}

func (b *idleBody) Read(p []byte) (int, error) {
	b.timer.Reset(b.idle)
	n, err := b.body.Read(p)
	b.timer.Stop()
	if err != nil && err != io.EOF && errors.Is(context.Cause(b.ctx), errUpstreamIdle) {
		err = fmt.Errorf("%w (%s)", errUpstreamIdle, b.idle)
	}
	return n, err
}

func (b *idleBody) Close() error {
	b.timer.Stop()
	err := b.body.Close()
	b.cancel(nil)
	return err
}
