package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvexact/kvexact/gateway/apierror"
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/route"
)

// response is what the client has been sent so far.
type response struct {
	status    int // status sent to the client (499: the client left first)
	committed bool
	// truncated: the response started but did not reach its end (the client left, or the upstream
	// broke off); the connection must be cut so that the client cannot take it for complete.
	truncated bool
	gone      bool            // the client left (context canceled by net/http) while the relay ran
	stalled   bool            // a write to the client made no progress within Config.WriteTimeout
	server    *route.Endpoint // receipt: the endpoint whose response is relayed
	prefill   *route.Endpoint // receipt: the P/D prefill endpoint that served
	vals      [numVals]string // single header values, handed out by value
	tap       usageTap        // account.go: the usage tap of the single attempt's answer (tapUsage)
	ttfb      time.Duration   // from the request's arrival to the response's head being written
	// realized is the engine's cached_tokens of the response accounted (reportUsageOf); -1: the
	// engine reported none.
	realized int
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
	c.resp.vals[i] = v
	return c.resp.vals[i : i+1 : i+1]
}

// fail answers with an OpenAI-shaped error unless the response has started.
func (c *call) fail(e *apierror.Error) {
	if c.resp.committed {
		return
	}
	c.resp.committed, c.resp.status = true, e.Status
	c.resp.ttfb = time.Since(c.start) // the access log's; the TTFB histogram counts relayed answers only
	c.progress()
	writeError(c.w, e)
}

// commitHeaders starts the client's response: the upstream's end-to-end headers plus the receipts.
func (c *call) commitHeaders(status int, h http.Header) {
	dst := c.w.Header()
	copyHeadersTo(dst, h, true)
	if v := dst[HeaderRequestID]; len(v) != 1 || v[0] != c.id {
		dst[HeaderRequestID] = c.value(valRequestID, c.id) // the upstream's own X-Request-Id does not reach the client
	}
	if c.rule.rt != nil {
		dst[HeaderRule] = c.value(valRule, c.rule.name)
	}
	if c.resp.server != nil {
		dst[HeaderEndpoint] = c.value(valEndpoint, c.resp.server.Name)
	}
	if c.resp.prefill != nil {
		dst[HeaderPrefill] = c.value(valPrefill, c.resp.prefill.Name)
	}
	if c.p.cfg.DebugHeader && c.d != nil {
		if b, err := json.Marshal(c.d); err == nil {
			dst.Set(HeaderDecision, string(b))
		}
	}
	c.resp.committed, c.resp.status = true, status
	c.progress()
	c.w.WriteHeader(status)
	c.resp.ttfb = time.Since(c.start)
	c.p.cfg.Metrics.firstByte(c.rule.name, c.resp.ttfb)
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
	c.progress()
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
			c.p.cfg.Metrics.upstreamError(c.rule.name, l.ep.Name, errStatus5xx)
		}
	case upstreamDied:
		l.report(health.TransportFailure, resp.StatusCode)
		c.p.cfg.Metrics.upstreamError(c.rule.name, l.ep.Name, errMidstream)
	default:
		l.report(health.Canceled, resp.StatusCode)
	}
	return res
}

func (c *call) relay(resp *http.Response, commit func() bool, diedCode string) relayResult {
	if resp.StatusCode >= 400 {
		if res, ok := c.relayEngineError(resp, commit); ok {
			c.resp.gone = c.resp.gone || res == clientGone
			return res
		}
	}
	res, started := c.relayBody(resp, commit, diedCode)
	if started && (res == clientGone || res == upstreamDied) {
		c.resp.truncated = true
	}
	c.resp.gone = c.resp.gone || res == clientGone
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
	flush := eventStream || c.in.body != nil && c.in.body.stream
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
					if _, err := c.emit(pending[:cut]); err != nil {
						return clientGone, started
					}
				}
				pending = append(pending[:0], pending[cut:]...)
				out = nil
			}
			if len(out) > 0 {
				if _, err := c.emit(out); err != nil {
					return clientGone, started
				}
			}
			if flush {
				if err := c.emitFlush(rc); err != nil && !errors.Is(err, http.ErrNotSupported) {
					return clientGone, started
				}
			}
		}
		if rerr == nil {
			continue
		}
		if rerr == io.EOF {
			if len(pending) > 0 {
				if _, err := c.emit(pending); err != nil {
					return clientGone, started
				}
			}
			if flush {
				_ = c.emitFlush(rc)
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
			c.p.log.Warn("upstream response broke off before its body", "rule", c.rule.name, "endpoint", c.serverName(), "err", rerr, "request_id", c.id)
			c.fail(apierror.Server(http.StatusBadGateway, diedCode, "the upstream endpoint %s failed before sending its body: %v", c.serverName(), rerr))
			return upstreamDied, started
		}
		c.p.log.Warn("upstream response broke off", "rule", c.rule.name, "endpoint", c.serverName(), "err", rerr, "request_id", c.id)
		if sse {
			// The error event tells an SSE client why; the cut connection (end) tells every
			// client that the stream is incomplete.
			_, _ = c.emit(sseError(&apierror.Error{Type: apierror.TypeServer, Code: diedCode,
				Message: fmt.Sprintf("the upstream endpoint %s stopped mid-stream: %v", c.serverName(), rerr)}))
		}
		_ = c.emitFlush(rc) // what was relayed reaches the client before the cut
		return upstreamDied, started
	}
}

// emit writes b to the client within a fresh write deadline (progress); emitFlush flushes within one.
// A deadline that passes marks the response as cut for a client that stopped reading.
func (c *call) emit(b []byte) (int, error) {
	c.progress()
	n, err := c.w.Write(b)
	c.noteWriteErr(err)
	return n, err
}

func (c *call) emitFlush(f flusher) error {
	c.progress()
	err := f.Flush()
	c.noteWriteErr(err)
	return err
}

func (c *call) noteWriteErr(err error) {
	var ne net.Error
	if err != nil && errors.As(err, &ne) && ne.Timeout() {
		c.resp.stalled = true
	}
}

func (c *call) serverName() string {
	if c.resp.server == nil {
		return ""
	}
	return c.resp.server.Name
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
func sseError(e *apierror.Error) []byte {
	b := e.Body()
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

// sync.Pool of relay buffers.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
