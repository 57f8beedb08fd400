package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/route"
)

// P/D dialects, as contracts name them.
const (
	dialectVLLM   = "vllm-nixl-v1"
	dialectSGLang = "sglang-bootstrap-v1"
	dialectTRTLLM = "trtllm-ctx-first-v1"
)

const (
	// maxLegBody caps a P/D leg's answer the proxy reads whole (prefill / context responses).
	maxLegBody = 8 << 20
	// maxTransferParams caps the transfer parameters relayed between legs; larger ones are
	// dropped and decode recomputes the prompt (the reference's 64 KB buffer).
	maxTransferParams = 64 << 10
	// sglangDefaultBootstrapPort is SGLang's --disaggregation-bootstrap-port default.
	sglangDefaultBootstrapPort = 8998
	// prefillGrace is how long a finished SGLang decode waits for its prefill leg to end on its own
	// before the proxy closes it (real prefill legs end before decode's first token).
	prefillGrace = time.Second
)

// dialect is the rule's P/D dialect, from its contract (or its engine family).
func (c *call) dialect() string {
	r := c.rt.Rule()
	if ct := r.Contract(); ct != nil && ct.PD != "" && ct.PD != "none" {
		return ct.PD
	}
	switch r.Engine.Family {
	case "sglang":
		return dialectSGLang
	case "trtllm":
		return dialectTRTLLM
	}
	return dialectVLLM
}

// patchJSON rewrites top-level fields of a JSON object (edit sets or deletes map entries).
func patchJSON(raw []byte, edit func(m map[string]json.RawMessage)) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	edit(m)
	return json.Marshal(m)
}

func rawJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v) // only called with plain values
	return b
}

// prefillCtx bounds a prefill leg by Config.PrefillTimeout.
func (c *call) prefillCtx() (context.Context, context.CancelFunc) {
	if t := c.p.cfg.PrefillTimeout; t > 0 {
		return context.WithTimeout(c.ctx, t)
	}
	return context.WithCancel(c.ctx)
}

func (c *call) prefillTimeout(ep *route.Endpoint) {
	c.fail(serverError(http.StatusGatewayTimeout, "pd_prefill_timeout", "the prefill endpoint %s did not answer within %s", ep.Name, c.p.cfg.PrefillTimeout))
}

func (c *call) internalError(err error) {
	c.fail(serverError(http.StatusInternalServerError, "internal_error", "%v", err))
}

// legAnswer is a P/D leg's answer, read whole.
type legAnswer struct {
	status int
	header http.Header
	body   []byte
	whole  bool  // the body fitted in maxLegBody
	err    error // the body broke off
}

// sendLeg sends a sequential prefill leg and reads its answer whole. done=true means the request
// is finished (answered or the client left); failed names an endpoint to exclude before retrying.
func (c *call) sendLeg(ctx context.Context, ep *route.Endpoint, body []byte) (a legAnswer, failed *route.Endpoint, done bool, err error) {
	resp, l, err := c.send(ctx, ep, body, true)
	if err != nil {
		if errors.Is(err, errPrefillTimeout) {
			c.prefillTimeout(ep)
			return a, nil, true, nil
		}
		failed, err = c.sendFailed(ep, err)
		return a, failed, true, err
	}
	a.status, a.header = resp.StatusCode, resp.Header
	a.body, a.whole, a.err = readAllLimit(resp.Body, maxLegBody)
	resp.Body.Close()
	switch {
	case a.err != nil && c.ctx.Err() != nil:
		l.report(health.Canceled, a.status)
		return a, nil, true, nil
	case a.err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		l.report(health.TransportFailure, a.status)
		c.p.cfg.Metrics.upstreamError(c.rule, errTimeout)
		c.prefillTimeout(ep)
		return a, nil, true, nil
	case a.err != nil:
		l.report(health.TransportFailure, a.status)
		c.p.cfg.Metrics.upstreamError(c.rule, errPrefill)
	default:
		l.report(health.Success, a.status)
		if a.status >= 500 {
			c.p.cfg.Metrics.upstreamError(c.rule, errPrefill)
		}
	}
	return a, nil, false, nil
}

// decodeLeg re-validates the decode endpoint after the prefill leg (it may have died during a long
// prefill), sends body to it and relays its answer.
func (c *call) decodeLeg(d *route.Decision, body []byte) (*route.Endpoint, error) {
	dec := c.rt.ReselectDecode(d)
	if dec == nil {
		c.fail(serverError(http.StatusServiceUnavailable, "no_healthy_endpoint", "no decode endpoint is healthy"))
		return nil, nil
	}
	resp, l, err := c.send(c.ctx, dec, body, false)
	if err != nil {
		return c.sendFailed(dec, err)
	}
	c.server = dec
	c.relayLeg(resp, l, nil, "pd_decode_backend_died")
	return nil, nil
}

// vllmPrefillParams asks the prefill engine to keep the KV for a remote decode (vLLM's NIXL
// connector, as its own toy proxy sends it).
var vllmPrefillParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// vllm is the vllm-nixl-v1 dialect: a one-token prefill leg returns kv_transfer_params, which the
// decode leg (the client's body plus those params) uses to pull the KV. Missing params, a prefill
// 5xx or a broken prefill answer degrade to decode recomputing the prompt, never to a failure.
func (c *call) vllm(d *route.Decision) (*route.Endpoint, error) {
	pre, err := patchJSON(c.raw, func(m map[string]json.RawMessage) {
		m["kv_transfer_params"] = vllmPrefillParams
		m["stream"] = json.RawMessage("false")
		m["max_tokens"] = json.RawMessage("1")
		if _, ok := m["max_completion_tokens"]; ok {
			m["max_completion_tokens"] = json.RawMessage("1")
		}
		delete(m, "stream_options")
		delete(m, "min_tokens")
		delete(m, "min_completion_tokens")
	})
	if err != nil {
		c.internalError(err)
		return nil, nil
	}
	pctx, cancel := c.prefillCtx()
	a, failed, done, err := c.sendLeg(pctx, d.Target, pre)
	cancel()
	if done {
		return failed, err
	}
	c.reportPrefillUsage(d.Target, a)
	var params json.RawMessage
	switch {
	case a.err != nil || a.status >= 500:
		c.p.log.Warn("vLLM prefill failed; decode recomputes the prompt", "rule", c.rule, "prefill", d.Target.Name, "status", a.status, "err", a.err, "request_id", c.id)
	case a.status >= 400:
		// The prefill engine rejected the client's own body: the decode engine would too.
		c.server = d.Target
		c.writeBuffered(a.status, a.header, a.body)
		return nil, nil
	case !a.whole:
		c.p.log.Warn("vLLM prefill answer too large to read; decode recomputes the prompt", "rule", c.rule, "prefill", d.Target.Name, "request_id", c.id)
	default:
		var v struct {
			KV json.RawMessage `json:"kv_transfer_params"`
		}
		if json.Unmarshal(a.body, &v) != nil {
			c.p.cfg.Metrics.upstreamError(c.rule, errBadResponse)
		}
		switch {
		case len(v.KV) > maxTransferParams:
			c.p.log.Warn("kv_transfer_params over 64 KB; decode recomputes the prompt", "rule", c.rule, "bytes", len(v.KV), "request_id", c.id)
		case len(v.KV) > 0 && v.KV[0] == '{':
			params = v.KV
		}
	}
	c.p.cfg.Metrics.params(c.rule, dialectVLLM, params != nil)
	body := c.raw
	if params != nil {
		body, err = patchJSON(c.raw, func(m map[string]json.RawMessage) { m["kv_transfer_params"] = params })
		if err != nil {
			c.internalError(err)
			return nil, nil
		}
		c.prefill = d.Target
	}
	return c.decodeLeg(d, body)
}

// trtllm is the trtllm-ctx-first-v1 dialect: a context-only leg returns disaggregated_params (with
// ctx_request_id); a request it already finished is relayed as is, else the generation leg (the
// client's body plus those params as generation_only) streams the answer. A context 5xx, a broken
// or unusable context answer, or params over 64 KB degrade to the decode endpoint serving the
// client's body alone.
func (c *call) trtllm(d *route.Decision) (*route.Endpoint, error) {
	pre, err := patchJSON(c.raw, func(m map[string]json.RawMessage) {
		m["disaggregated_params"] = json.RawMessage(`{"request_type":"context_only"}`)
		m["stream"] = json.RawMessage("false")
		m["stream_options"] = json.RawMessage("null")
	})
	if err != nil {
		c.internalError(err)
		return nil, nil
	}
	pctx, cancel := c.prefillCtx()
	a, failed, done, err := c.sendLeg(pctx, d.Target, pre)
	cancel()
	if done {
		return failed, err
	}
	c.reportPrefillUsage(d.Target, a)
	var params json.RawMessage
	switch {
	case a.err != nil || a.status >= 500:
		c.p.log.Warn("TensorRT-LLM context leg failed; the generation endpoint serves the whole request", "rule", c.rule, "prefill", d.Target.Name, "status", a.status, "err", a.err, "request_id", c.id)
	case a.status >= 400:
		c.server = d.Target
		c.writeBuffered(a.status, a.header, a.body)
		return nil, nil
	case !a.whole:
		c.p.log.Warn("TensorRT-LLM context answer too large to read", "rule", c.rule, "prefill", d.Target.Name, "request_id", c.id)
	default:
		var v struct {
			Choices []struct {
				FinishReason *string         `json:"finish_reason"`
				Params       json.RawMessage `json:"disaggregated_params"`
			} `json:"choices"`
		}
		var ids struct {
			CtxRequestID json.RawMessage `json:"ctx_request_id"`
		}
		switch {
		case json.Unmarshal(a.body, &v) != nil || len(v.Choices) != 1:
			c.p.cfg.Metrics.upstreamError(c.rule, errBadResponse)
			c.p.log.Warn("TensorRT-LLM context answer does not carry exactly one choice", "rule", c.rule, "prefill", d.Target.Name, "request_id", c.id)
		case len(v.Choices[0].Params) > maxTransferParams:
			c.p.log.Warn("disaggregated_params over 64 KB; the generation endpoint recomputes", "rule", c.rule, "bytes", len(v.Choices[0].Params), "request_id", c.id)
		case json.Unmarshal(v.Choices[0].Params, &ids) != nil || isNull(ids.CtxRequestID):
			c.p.log.Warn("TensorRT-LLM context answer has no disaggregated_params.ctx_request_id", "rule", c.rule, "prefill", d.Target.Name, "request_id", c.id)
		default:
			if fr := v.Choices[0].FinishReason; fr != nil && *fr != "length" && *fr != "not_finished" {
				// The context step already finished the request (stop token, one-token answer).
				c.p.cfg.Metrics.params(c.rule, dialectTRTLLM, true)
				c.server = d.Target
				c.trtEarlyExit(a)
				return nil, nil
			}
			var m map[string]json.RawMessage
			if json.Unmarshal(v.Choices[0].Params, &m) == nil {
				m["request_type"] = json.RawMessage(`"generation_only"`)
				params = rawJSON(m)
			}
		}
	}
	c.p.cfg.Metrics.params(c.rule, dialectTRTLLM, params != nil)
	body := c.raw
	if params != nil {
		body, err = patchJSON(c.raw, func(m map[string]json.RawMessage) { m["disaggregated_params"] = params })
		if err != nil {
			c.internalError(err)
			return nil, nil
		}
		c.prefill = d.Target
	}
	return c.decodeLeg(d, body)
}

// trtEarlyExit relays a context answer that finished the request: as is for a JSON client,
// re-framed as one SSE chunk plus [DONE] for a streaming one.
func (c *call) trtEarlyExit(a legAnswer) {
	if !c.body.stream {
		c.writeBuffered(a.status, a.header, a.body)
		return
	}
	ev, err := reframeSSE(a.body, c.body.chat)
	if err != nil {
		c.internalError(err)
		return
	}
	h := http.Header{}
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	c.commitHeaders(http.StatusOK, h)
	_, _ = c.w.Write(ev)
	_ = http.NewResponseController(c.w).Flush()
}

// reframeSSE turns a complete (non-streamed) completion into the equivalent single stream chunk.
func reframeSSE(body []byte, chat bool) ([]byte, error) {
	var r struct {
		ID      json.RawMessage              `json:"id"`
		Created json.RawMessage              `json:"created"`
		Model   json.RawMessage              `json:"model"`
		Usage   json.RawMessage              `json:"usage"`
		Choices []map[string]json.RawMessage `json:"choices"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("context answer: %w", err)
	}
	chunk := map[string]json.RawMessage{"id": r.ID, "created": r.Created, "model": r.Model}
	chunk["object"] = rawJSON("text_completion")
	if chat {
		chunk["object"] = rawJSON("chat.completion.chunk")
	}
	if !isNull(r.Usage) {
		chunk["usage"] = r.Usage
	}
	choices := make([]map[string]json.RawMessage, 0, len(r.Choices))
	for _, ch := range r.Choices {
		out := map[string]json.RawMessage{"index": ch["index"], "finish_reason": ch["finish_reason"]}
		if lp, ok := ch["logprobs"]; ok {
			out["logprobs"] = lp
		}
		if chat {
			out["delta"] = ch["message"]
		} else {
			out["text"] = ch["text"]
		}
		for k, v := range out {
			if v == nil {
				out[k] = json.RawMessage("null")
			}
		}
		choices = append(choices, out)
	}
	chunk["choices"] = rawJSON(choices)
	for k, v := range chunk {
		if v == nil {
			chunk[k] = json.RawMessage("null")
		}
	}
	b, err := json.Marshal(chunk)
	if err != nil {
		return nil, err
	}
	out := append([]byte("data: "), b...)
	return append(out, "\n\ndata: [DONE]\n\n"...), nil
}

// sglangCoupling ties the two concurrent SGLang legs: a prefill failure aborts the decode leg
// unless decode bytes already reached the client.
type sglangCoupling struct {
	mu        sync.Mutex
	committed bool
	aborted   bool
	abort     context.CancelFunc
}

func (s *sglangCoupling) prefillFailed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.committed {
		s.aborted = true
		s.abort()
	}
}

func (s *sglangCoupling) commit() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aborted {
		return false
	}
	s.committed = true
	return true
}

// sglang is the sglang-bootstrap-v1 dialect: the same body, carrying the prefill's bootstrap
// rendezvous (host, port, room), goes to prefill and decode concurrently — never sequentially:
// prefill answers only once decode has joined the room. The client gets the decode answer only;
// the prefill answer is drained and discarded.
func (c *call) sglang(d *route.Decision) (*route.Endpoint, error) {
	host, port := bootstrapHost(d.Target.Address), c.bootstrapPort(d.Target)
	body, err := patchJSON(c.raw, func(m map[string]json.RawMessage) {
		if n := c.body.batch; n > 1 {
			hosts, ports, rooms := make([]string, n), make([]int, n), make([]int64, n)
			for i := range n {
				hosts[i], ports[i], rooms[i] = host, port, rand.Int64()
			}
			m["bootstrap_host"], m["bootstrap_port"], m["bootstrap_room"] = rawJSON(hosts), rawJSON(ports), rawJSON(rooms)
			return
		}
		// rand.Int64 is uniform over [0, 2^63-1], SGLang's room range.
		m["bootstrap_host"], m["bootstrap_port"], m["bootstrap_room"] = rawJSON(host), rawJSON(port), rawJSON(rand.Int64())
	})
	if err != nil {
		c.internalError(err)
		return nil, nil
	}
	dctx, dcancel := context.WithCancel(c.ctx)
	defer dcancel()
	pctx, pcancel := c.prefillCtx()
	defer pcancel()
	co := &sglangCoupling{abort: dcancel}
	pdone := make(chan sglangPrefill, 1)
	go func() { pdone <- c.sglangPrefill(pctx, d.Target, body, co) }()

	resp, l, err := c.send(dctx, d.Decode, body, false)
	if err != nil {
		var ce *connectError
		if errors.As(err, &ce) {
			// Decode unreachable: close the prefill leg too and re-run the pair elsewhere.
			pcancel()
			<-pdone
			return d.Decode, err
		}
		if co.commit() {
			// Not aborted by a prefill failure: the client left, or the request could not be built.
			pcancel()
			<-pdone
			return c.sendFailed(d.Decode, err)
		}
		return c.sglangPrefillFailure(d, <-pdone)
	}
	c.server, c.prefill = d.Decode, d.Target
	res := c.relayLeg(resp, l, co.commit, "pd_decode_backend_died")
	if res == relayRefused {
		c.server, c.prefill = nil, nil
		return c.sglangPrefillFailure(d, <-pdone)
	}
	if res != relayed || resp.StatusCode >= 400 {
		pcancel() // decode failed: the prefill would wait for a decode that never joins
	}
	t := time.NewTimer(prefillGrace)
	defer t.Stop()
	select {
	case pr := <-pdone:
		if res == relayed && pr.err == nil && pr.status == http.StatusOK {
			c.reportPrefillUsage(d.Target, legAnswer{status: pr.status, header: pr.header, body: pr.tail, whole: true})
		}
	case <-t.C:
		c.p.log.Warn("SGLang prefill leg still open after decode finished; closing it", "rule", c.rule, "prefill", d.Target.Name, "request_id", c.id)
		pcancel()
		<-pdone
	}
	return nil, nil
}

// sglangPrefill is the status of a finished SGLang prefill leg.
type sglangPrefill struct {
	status int
	header http.Header
	body   []byte
	tail   []byte // a successful answer's last bytes, for its usage
	err    error
}

func (s sglangPrefill) failed() bool { return s.err != nil || s.status >= 400 }

// sglangPrefill runs the prefill leg to its end, draining its answer (kept when it is an error the
// client may need to see).
func (c *call) sglangPrefill(ctx context.Context, ep *route.Endpoint, body []byte, co *sglangCoupling) sglangPrefill {
	resp, l, err := c.send(ctx, ep, body, true)
	if err != nil {
		co.prefillFailed()
		return sglangPrefill{err: err}
	}
	defer resp.Body.Close()
	out := sglangPrefill{status: resp.StatusCode, header: resp.Header}
	if resp.StatusCode >= 400 {
		out.body, _, out.err = readAllLimit(resp.Body, maxLegBody)
	} else {
		tap := &usageTap{ReadCloser: resp.Body}
		_, out.err = io.Copy(io.Discard, tap)
		out.tail = tap.tail
	}
	switch {
	case out.err != nil && (c.ctx.Err() != nil || ctx.Err() == context.Canceled):
		l.report(health.Canceled, resp.StatusCode)
	case out.err != nil:
		l.report(health.TransportFailure, resp.StatusCode)
		c.p.cfg.Metrics.upstreamError(c.rule, errPrefill)
	default:
		l.report(health.Success, resp.StatusCode)
		if resp.StatusCode >= 500 {
			c.p.cfg.Metrics.upstreamError(c.rule, errPrefill)
		}
	}
	if out.failed() {
		co.prefillFailed()
	}
	return out
}

// sglangPrefillFailure answers a request whose decode leg was aborted because its prefill failed.
func (c *call) sglangPrefillFailure(d *route.Decision, p sglangPrefill) (*route.Endpoint, error) {
	if c.ctx.Err() != nil {
		return nil, nil
	}
	var ce *connectError
	switch {
	case errors.As(p.err, &ce):
		return d.Target, p.err // one more pair, with a fresh room, without this prefill
	case errors.Is(p.err, errPrefillTimeout):
		c.prefillTimeout(d.Target)
	case p.err == nil && p.status >= 400 && p.status < 500:
		c.server = d.Target // the prefill engine's own verdict on the client's body
		c.writeBuffered(p.status, p.header, p.body)
	case p.failed():
		reason := fmt.Sprintf("status %d", p.status)
		if p.err != nil {
			reason = p.err.Error()
		}
		c.fail(serverError(http.StatusBadGateway, "pd_sg_prefill_failed", "the SGLang prefill endpoint %s failed (%s) before the decode endpoint sent anything", d.Target.Name, reason))
	default:
		c.fail(serverError(http.StatusBadGateway, "pd_decode_backend_died", "the decode endpoint %s failed", d.Decode.Name))
	}
	return nil, nil
}

// bootstrapHost is the prefill endpoint's host as SGLang expects it (IPv6 bracketed).
func bootstrapHost(address string) string {
	u, err := url.Parse(address)
	if err != nil {
		return address
	}
	h := u.Hostname()
	if strings.Contains(h, ":") {
		return "[" + h + "]"
	}
	return h
}

func (c *call) bootstrapPort(ep *route.Endpoint) int {
	r := c.rt.Rule()
	if c.p.cfg.BootstrapPort != nil {
		return c.p.cfg.BootstrapPort(r, ep)
	}
	if ep.Index >= 0 && ep.Index < len(r.Endpoints) && r.Endpoints[ep.Index].BootstrapPort > 0 {
		return r.Endpoints[ep.Index].BootstrapPort
	}
	return sglangDefaultBootstrapPort
}
