package proxy

import (
	"bytes"
	"context"
	"encoding/json"
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

	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/route"
)

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
			c.p.cfg.Metrics.upstreamError(c.rule, errBreakerOpen)
			return nil, l, &connectError{ep: ep, breaker: true, err: errors.New("circuit breaker open")}
		}
		l.breaker = ep.Health.Breaker
	}
	out, err := c.upstreamRequest(ctx, ep, body, o)
	if err != nil {
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
	o.vals[0] = c.id
	h[HeaderRequestID] = o.vals[0:1:1]
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
		l.report(health.Canceled, 0) // configuration, not the endpoint's health
		return nil, l, fmt.Errorf("endpoint %s: %w", ep.Name, err)
	}
	resp, err := t.RoundTrip(out)
	if err == nil {
		return resp, l, nil
	}
	switch {
	case c.ctx.Err() != nil:
		l.report(health.Canceled, 0)
		return nil, l, c.ctx.Err()
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		l.report(health.TransportFailure, 0)
		c.p.cfg.Metrics.upstreamError(c.rule, errTimeout)
		return nil, l, errPrefillTimeout
	case ctx.Err() != nil: // the proxy itself abandoned the leg (P/D coupling)
		l.report(health.Canceled, 0)
		return nil, l, ctx.Err()
	}
	l.report(health.TransportFailure, 0)
	c.p.cfg.Metrics.upstreamError(c.rule, errConnect)
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

// commitHeaders starts the client's response: the upstream's end-to-end headers plus the receipts.
func (c *call) commitHeaders(status int, h http.Header) {
	dst := c.w.Header()
	copyHeadersTo(dst, h, true)
	if v := dst[HeaderRequestID]; len(v) != 1 || v[0] != c.id {
		dst[HeaderRequestID] = c.value(valRequestID, c.id) // the upstream's own X-Request-Id does not reach the client
	}
	if c.rt != nil {
		dst[HeaderRule] = c.value(valRule, c.rule)
	}
	if c.server != nil {
		dst[HeaderEndpoint] = c.value(valEndpoint, c.server.Name)
	}
	if c.prefill != nil {
		dst[HeaderPrefill] = c.value(valPrefill, c.prefill.Name)
	}
	if c.p.cfg.DebugHeader && c.d != nil {
		if b, err := json.Marshal(c.d); err == nil {
			dst.Set(HeaderDecision, string(b))
		}
	}
	c.committed, c.status = true, status
	c.w.WriteHeader(status)
	c.p.cfg.Metrics.firstByte(c.rule, time.Since(c.start))
}

// writeBuffered answers with a response the proxy has read whole (a P/D leg's answer).
func (c *call) writeBuffered(status int, h http.Header, body []byte) {
	hh := h.Clone()
	if hh == nil {
		hh = http.Header{}
	}
	if b, rewritten := openAIError(status, body); rewritten {
		body = b
		hh.Set("Content-Type", "application/json")
	}
	hh.Del("Content-Encoding")
	hh.Set("Content-Length", strconv.Itoa(len(body)))
	c.commitHeaders(status, hh)
	_, _ = c.w.Write(body)
}

// relayResult says how a relay ended.
type relayResult int

const (
	relayed      relayResult = iota // the whole upstream body reached the client
	relayRefused                    // commit refused: nothing was written (P/D coupling aborted it)
	clientGone                      // the client stopped reading
	upstreamDied                    // the upstream body broke off; the client got a clean error
)

// relayLeg relays resp to the client and reports the leg's outcome to its breaker. commit, when
// set, is asked just before the first byte goes out and may refuse (nothing is written then).
// diedCode is the error code of the SSE error event sent if the upstream dies mid-stream.
func (c *call) relayLeg(resp *http.Response, l *leg, commit func() bool, diedCode string) relayResult {
	res := c.relay(resp, commit, diedCode)
	switch res {
	case relayed:
		l.report(health.Success, resp.StatusCode)
		if resp.StatusCode >= 500 {
			c.p.cfg.Metrics.upstreamError(c.rule, errStatus5xx)
		}
	case upstreamDied:
		l.report(health.TransportFailure, resp.StatusCode)
		c.p.cfg.Metrics.upstreamError(c.rule, errMidstream)
	default:
		l.report(health.Canceled, resp.StatusCode)
	}
	return res
}

func (c *call) relay(resp *http.Response, commit func() bool, diedCode string) relayResult {
	if resp.StatusCode >= 400 {
		if res, ok := c.relayEngineError(resp, commit); ok {
			c.gone = c.gone || res == clientGone
			return res
		}
	}
	res, started := c.relayBody(resp, commit, diedCode)
	if started && (res == clientGone || res == upstreamDied) {
		c.truncated = true
	}
	c.gone = c.gone || res == clientGone
	return res
}

// relayBody is relay's loop; started says whether the response was committed to the client.
func (c *call) relayBody(resp *http.Response, commit func() bool, diedCode string) (_ relayResult, started bool) {
	defer resp.Body.Close()
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	// Event framing is only visible in an uncompressed stream; a compressed one is relayed as is.
	eventStream := isSSE(resp.Header)
	sse := eventStream && header(resp.Header, "Content-Encoding") == ""
	flush := eventStream || c.body != nil && c.body.stream
	rc := flusher{c.w}
	var pending []byte // SSE: bytes after the last complete event, held until the event completes
	for {
		n, rerr := resp.Body.Read(buf)
		// Bytes that come with a read error still commit and go out (a stream that then breaks
		// is cut, not answered with a second status).
		if !started && (n > 0 || rerr == io.EOF) {
			if commit != nil && !commit() {
				return relayRefused, started
			}
			c.commitHeaders(resp.StatusCode, resp.Header)
			started = true
		}
		if n > 0 {
			out := buf[:n]
			if sse && (len(pending) > 0 || eventEnd(out) != len(out)) {
				// Relay whole events only, so an error event after a mid-stream death never lands
				// inside a half-written one. (Upstreams usually write whole events: no copy then.)
				pending = append(pending, out...)
				cut := eventEnd(pending)
				if len(pending) > 1<<20 {
					cut = len(pending) // not SSE framing we understand: stop holding it
				}
				if cut > 0 {
					if _, err := c.w.Write(pending[:cut]); err != nil {
						return clientGone, started
					}
				}
				pending = append(pending[:0], pending[cut:]...)
				out = nil
			}
			if len(out) > 0 {
				if _, err := c.w.Write(out); err != nil {
					return clientGone, started
				}
			}
			if flush {
				if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
					return clientGone, started
				}
			}
		}
		if rerr == nil {
			continue
		}
		if rerr == io.EOF {
			if len(pending) > 0 {
				if _, err := c.w.Write(pending); err != nil {
					return clientGone, started
				}
			}
			if flush {
				_ = rc.Flush()
			}
			return relayed, started
		}
		if c.ctx.Err() != nil {
			return clientGone, started
		}
		if !started {
			// Died after the headers but before any body byte: a clean error answer is still possible.
			if commit != nil && !commit() {
				return relayRefused, started
			}
			c.p.log.Warn("upstream response broke off before its body", "rule", c.rule, "endpoint", c.serverName(), "err", rerr, "request_id", c.id)
			c.fail(serverError(http.StatusBadGateway, diedCode, "the upstream endpoint %s failed before sending its body: %v", c.serverName(), rerr))
			return upstreamDied, started
		}
		c.p.log.Warn("upstream response broke off", "rule", c.rule, "endpoint", c.serverName(), "err", rerr, "request_id", c.id)
		if sse {
			// The error event tells an SSE client why; the cut connection (end) tells every
			// client that the stream is incomplete.
			_, _ = c.w.Write(sseError(&apiError{Type: typeServer, Code: diedCode,
				Message: fmt.Sprintf("the upstream endpoint %s stopped mid-stream: %v", c.serverName(), rerr)}))
		}
		_ = rc.Flush() // what was relayed reaches the client before the cut
		return upstreamDied, started
	}
}

func (c *call) serverName() string {
	if c.server == nil {
		return ""
	}
	return c.server.Name
}

func isSSE(h http.Header) bool {
	ct := strings.TrimLeft(header(h, "Content-Type"), " \t")
	return len(ct) >= len("text/event-stream") && strings.EqualFold(ct[:len("text/event-stream")], "text/event-stream")
}

// flusher flushes a ResponseWriter as http.ResponseController does (FlushError, else Flush, else
// http.ErrNotSupported), without allocating a controller per request.
type flusher struct{ w http.ResponseWriter }

func (f flusher) Flush() error {
	w := f.w
	for {
		switch t := w.(type) {
		case interface{ FlushError() error }:
			return t.FlushError()
		case http.Flusher:
			t.Flush()
			return nil
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return http.ErrNotSupported
		}
	}
}

// eventEnd returns the length of b's prefix made of complete SSE events (0 when none is complete).
func eventEnd(b []byte) int {
	end := 0
	if i := bytes.LastIndex(b, []byte("\n\n")); i >= 0 {
		end = i + 2
	}
	if i := bytes.LastIndex(b, []byte("\r\n\r\n")); i >= 0 && i+4 > end {
		end = i + 4
	}
	return end
}

// sseError is an error event in the shape OpenAI-compatible servers stream errors.
func sseError(e *apiError) []byte {
	b := errorBody(e)
	out := make([]byte, 0, len(b)+10)
	out = append(out, "data: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// readAllLimit reads r up to limit bytes; over the limit it returns what it read and ok=false.
func readAllLimit(r io.Reader, limit int64) (b []byte, ok bool, err error) {
	b, err = io.ReadAll(io.LimitReader(r, limit+1))
	if int64(len(b)) > limit {
		return b[:limit], false, err
	}
	return b, true, err
}
