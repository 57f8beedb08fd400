package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
	"github.com/kvexact/kvexact/gateway/apierror"
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
)

// maxLegBody caps an answer the proxy reads whole (P/D prefill answers, /v1/models lists).
const maxLegBody = 8 << 20

// dialects are the engine families' P/D dialects by contract name.
var dialects = func() map[string]engines.PDDialect {
	m := map[string]engines.PDDialect{}
	for _, f := range registry.All() {
		if d := f.PDDialect(); d != nil {
			m[d.Name()] = d
		}
	}
	return m
}()

// dialectOf is the rule's P/D dialect: the one its contract names, else its engine family's.
func dialectOf(r *rules.Rule) engines.PDDialect {
	if ct := r.Contract(); ct != nil && ct.PD != "" && ct.PD != "none" {
		if d := dialects[ct.PD]; d != nil {
			return d
		}
	}
	if f, err := registry.Lookup(r.Engine.Family); err == nil {
		return f.PDDialect()
	}
	return nil
}

// pd runs one P/D attempt: the rule's dialect drives the legs, pdAttempt sends them.
func (c *call) pd(d *route.Decision) (*route.Endpoint, error) {
	dl := dialectOf(c.rule.rt.Rule())
	if dl == nil {
		c.fail(apierror.Server(http.StatusInternalServerError, "internal_error", "rule %s has no prefill/decode dialect", c.rule.name))
		return nil, nil
	}
	x := &pdAttempt{c: c, d: d, dialect: dl}
	dl.Serve(x)
	return x.failed, x.err
}

// pdAttempt is the leg runner of one P/D attempt (engines.PDLegs). failed and err are the
// attempt's result: the endpoint to exclude before the selection re-runs, and why.
type pdAttempt struct {
	c       *call
	d       *route.Decision
	dialect engines.PDDialect
	failed  *route.Endpoint
	err     error
}

var _ engines.PDLegs = (*pdAttempt)(nil)

func (x *pdAttempt) ep(role engines.PDRole) *route.Endpoint {
	if role == engines.PDDecode {
		return x.d.Decode
	}
	return x.d.Target
}

func (x *pdAttempt) Request() engines.PDRequest {
	b := x.c.in.body
	return engines.PDRequest{Body: x.c.in.raw, Batch: b.batch, Stream: b.stream, Chat: b.chat}
}

func (x *pdAttempt) Endpoint(role engines.PDRole) engines.PDEndpoint {
	ep := x.ep(role)
	out := engines.PDEndpoint{Name: ep.Name, Address: ep.Address}
	if r := x.c.rule.rt.Rule(); ep.Index >= 0 && ep.Index < len(r.Endpoints) {
		out.BootstrapPort = r.Endpoints[ep.Index].BootstrapPort
	}
	return out
}

func (x *pdAttempt) Context() context.Context { return x.c.ctx }

// PrefillContext bounds a prefill leg by Config.PrefillTimeout.
func (x *pdAttempt) PrefillContext() (context.Context, context.CancelFunc) {
	if t := x.c.p.cfg.PrefillTimeout; t > 0 {
		return context.WithTimeout(x.c.ctx, t)
	}
	return context.WithCancel(x.c.ctx)
}

func (x *pdAttempt) FetchPrefill(body []byte) (engines.LegAnswer, bool) {
	ctx, cancel := x.PrefillContext()
	defer cancel()
	a, failed, done, err := x.sendLeg(ctx, body)
	if done {
		x.failed, x.err = failed, err
	}
	return a, done
}

// sendLeg sends a sequential prefill leg and reads its answer whole. done=true means the request
// is finished (answered or the client left); failed names an endpoint to exclude before retrying.
func (x *pdAttempt) sendLeg(ctx context.Context, body []byte) (a engines.LegAnswer, failed *route.Endpoint, done bool, err error) {
	c, ep := x.c, x.d.Target
	resp, l, err := c.send(ctx, ep, body, true)
	if err != nil {
		if errors.Is(err, errPrefillTimeout) {
			x.PrefillTimedOut()
			return a, nil, true, nil
		}
		failed, err = c.sendFailed(ep, err)
		return a, failed, true, err
	}
	a.Status, a.Header = resp.StatusCode, resp.Header
	a.Body, a.Whole, a.Err = readAllLimit(resp.Body, maxLegBody)
	resp.Body.Close()
	switch {
	case a.Err != nil && c.ctx.Err() != nil:
		l.report(health.Canceled, a.Status)
		return a, nil, true, nil
	case a.Err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		l.report(health.TransportFailure, a.Status)
		c.p.cfg.Metrics.upstreamError(c.rule.name, x.d.Target.Name, errTimeout)
		x.PrefillTimedOut()
		return a, nil, true, nil
	case a.Err != nil:
		l.report(health.TransportFailure, a.Status)
		c.p.cfg.Metrics.upstreamError(c.rule.name, x.d.Target.Name, errPrefill)
	default:
		l.report(health.Success, a.Status)
		if a.Status >= 500 {
			c.p.cfg.Metrics.upstreamError(c.rule.name, x.d.Target.Name, errPrefill)
		}
	}
	return a, nil, false, nil
}

// DrainPrefill runs a concurrent prefill leg to its end, draining its answer (kept when it is an
// error the client may need to see).
func (x *pdAttempt) DrainPrefill(ctx context.Context, body []byte) engines.LegAnswer {
	c := x.c
	resp, l, err := c.send(ctx, x.d.Target, body, true)
	if err != nil {
		return engines.LegAnswer{Err: err, Unreachable: isConnectError(err), TimedOut: errors.Is(err, errPrefillTimeout)}
	}
	defer resp.Body.Close()
	a := engines.LegAnswer{Status: resp.StatusCode, Header: resp.Header}
	if resp.StatusCode >= 400 {
		a.Body, a.Whole, a.Err = readAllLimit(resp.Body, maxLegBody)
	} else {
		tap := &usageTap{ReadCloser: resp.Body}
		_, a.Err = io.Copy(io.Discard, tap)
		a.Tail = tap.tail
	}
	switch {
	case a.Err != nil && (c.ctx.Err() != nil || ctx.Err() == context.Canceled):
		l.report(health.Canceled, resp.StatusCode)
	case a.Err != nil:
		l.report(health.TransportFailure, resp.StatusCode)
		c.p.cfg.Metrics.upstreamError(c.rule.name, x.d.Target.Name, errPrefill)
	default:
		l.report(health.Success, resp.StatusCode)
		if resp.StatusCode >= 500 {
			c.p.cfg.Metrics.upstreamError(c.rule.name, x.d.Target.Name, errPrefill)
		}
	}
	return a
}

// RelayDecode re-validates the decode endpoint after the prefill leg, sends body to it and relays
// its answer.
func (x *pdAttempt) RelayDecode(body []byte, viaPrefill bool) {
	c := x.c
	if viaPrefill {
		c.resp.prefill = x.d.Target
	}
	dec := c.rule.rt.ReselectDecode(x.d)
	if dec == nil {
		c.fail(apierror.Server(http.StatusServiceUnavailable, "no_healthy_endpoint", "no decode endpoint is healthy"))
		return
	}
	resp, l, err := c.send(c.ctx, dec, body, false)
	if err != nil {
		x.failed, x.err = c.sendFailed(dec, err)
		return
	}
	c.resp.server = dec
	c.relayLeg(resp, l, nil, "pd_decode_backend_died")
}

func (x *pdAttempt) StreamDecode(ctx context.Context, body []byte, commit func() bool) engines.DecodeResult {
	c := x.c
	resp, l, err := c.send(ctx, x.d.Decode, body, false)
	if err != nil {
		return engines.DecodeResult{Err: err, Unreachable: isConnectError(err)}
	}
	c.resp.server, c.resp.prefill = x.d.Decode, x.d.Target
	res := c.relayLeg(resp, l, commit, "pd_decode_backend_died")
	if res == relayRefused {
		c.resp.server, c.resp.prefill = nil, nil
	}
	return engines.DecodeResult{Status: resp.StatusCode, Relayed: res == relayed, Refused: res == relayRefused}
}

func (x *pdAttempt) RelayPrefill(a engines.LegAnswer) {
	x.c.resp.server = x.d.Target
	x.c.writeBuffered(a.Status, a.Header, a.Body)
}

func (x *pdAttempt) RelayPrefillEvents(events []byte) {
	c := x.c
	c.resp.server = x.d.Target
	h := http.Header{}
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	c.commitHeaders(http.StatusOK, h)
	_, _ = c.w.Write(events)
	_ = http.NewResponseController(c.w).Flush()
}

func (x *pdAttempt) AccountPrefill(a engines.LegAnswer) { x.c.reportPrefillUsage(x.d.Target, a) }

func (x *pdAttempt) SendFailed(role engines.PDRole, err error) {
	x.failed, x.err = x.c.sendFailed(x.ep(role), err)
}

func (x *pdAttempt) Fail(status int, code, format string, args ...any) {
	x.c.fail(apierror.Server(status, code, format, args...))
}

func (x *pdAttempt) PrefillTimedOut() {
	x.c.fail(apierror.Server(http.StatusGatewayTimeout, "pd_prefill_timeout", "the prefill endpoint %s did not answer within %s", x.d.Target.Name, x.c.p.cfg.PrefillTimeout))
}

func (x *pdAttempt) InternalError(err error) {
	x.c.fail(apierror.Server(http.StatusInternalServerError, "internal_error", "%v", err))
}

func (x *pdAttempt) Params(found bool) {
	x.c.p.cfg.Metrics.params(x.c.rule.name, x.dialect.Name(), found)
}

func (x *pdAttempt) BadResponse() {
	x.c.p.cfg.Metrics.upstreamError(x.c.rule.name, x.d.Target.Name, errBadResponse)
}

func (x *pdAttempt) Warn(msg string, args ...any) {
	kv := make([]any, 0, len(args)+4)
	kv = append(kv, "rule", x.c.rule.name)
	kv = append(kv, args...)
	x.c.p.log.Warn(msg, append(kv, "request_id", x.c.id)...)
}
