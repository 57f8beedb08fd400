package proxy

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/route"
)

// finish records the request's metrics.
func (c *call) finish() {
	if c.resp.status == 0 {
		c.resp.status = 499 // the client went away before any answer
	}
	if c.rule.inflight {
		c.p.cfg.Metrics.inflightAdd(c.rule.name, -1)
	}
	took := time.Since(c.start)
	c.p.cfg.Metrics.done(c.rule.name, c.resp.status, c.tier, took)
	c.accessLog(took)
}

// end gives the request its defined outcome when it did not get a complete response: the
// connection is cut (HTTP/1.1: closed without the final chunk; HTTP/2: the stream reset), never a
// default 200 with an empty body nor a truncated body framed as complete. A client that
// half-closes its side after the request is indistinguishable from one that left (net/http
// cancels the request's context on EOF), so it gets the same.
func (c *call) end() {
	switch {
	case !c.resp.committed:
		c.p.cfg.Metrics.clientError(c.rule.name, clientGoneEarly)
		c.p.log.Info("client left before the response; connection closed", "rule", c.rule.name, "request_id", c.id, "after", time.Since(c.start))
	case c.resp.truncated && c.resp.stalled:
		c.p.cfg.Metrics.clientError(c.rule.name, clientWriteTimeout)
		c.p.log.Info("client stopped reading the response; connection closed", "rule", c.rule.name, "endpoint", c.serverName(), "write_timeout", c.p.cfg.WriteTimeout, "request_id", c.id)
	case c.resp.truncated && c.resp.gone:
		c.p.cfg.Metrics.clientError(c.rule.name, clientGoneMidway)
		c.p.log.Info("client left during the response; connection closed", "rule", c.rule.name, "endpoint", c.serverName(), "request_id", c.id)
	case c.resp.truncated: // the upstream broke off: relay logged it and counted it
	default:
		return
	}
	// net/http recovers this sentinel without logging and closes the connection (resets the
	// HTTP/2 stream) without finishing the response.
	panic(http.ErrAbortHandler)
}

// UsageReport is one relayed response's cached-token account: what the routing decision predicted
// the serving endpoint would reuse, beside what the engine reports it reused
// (usage.prompt_tokens_details.cached_tokens). The gateway compares the two to see drift that the
// event stream cannot show (a tokenizer or chat template that changed on the engine).
type UsageReport struct {
	Rule, Endpoint string
	// Tier is the tier that decided; KVExact says the serving endpoint is the one KV-exact chose
	// and the engine's events confirmed at least one of its blocks (a hit only predict-on-route
	// predicted says nothing about the engine's parity, so the shortfall rule leaves it out).
	Tier    string
	KVExact bool
	// PredictedTokens is the serving endpoint's contiguous cached prefix in the decision, in tokens.
	PredictedTokens int
	// RealizedTokens and PromptTokens are the engine's own usage figures.
	RealizedTokens int
	PromptTokens   int
	BlockSize      int
	// LastBlockKey is the key of the prompt's deepest full block as the gateway computed it, and
	// Blocks the prompt's full blocks (0: no keys, LastBlockKey unset): the router binding's
	// token-side check expects the engine to publish that block once it served the prompt.
	LastBlockKey uint64
	Blocks       int
}

// usageTail is how much of a response's end the tap keeps: a non-streaming body ends with its
// usage object, a stream's final usage chunk comes just before [DONE].
const usageTail = 8 << 10

// usageTap wraps an upstream body and keeps its last usageTail bytes while the relay reads it; it
// never changes what is read.
type usageTap struct {
	io.ReadCloser
	tail []byte
	// stream: the answer is an event stream, whose first bytes come with the first token; first
	// is when they came.
	stream bool
	sent   time.Time // when the upstream request was sent
	first  time.Time
	// d is told of the first token (route.Decision.FirstToken): its prefill is over, so it no
	// longer queues ahead of the next request on its endpoint.
	d *route.Decision
}

func (t *usageTap) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if n > 0 && t.stream && t.first.IsZero() {
		t.first = time.Now()
		t.d.FirstToken()
	}
	if n > 0 {
		if n >= usageTail {
			t.tail = append(t.tail[:0], p[n-usageTail:n]...)
		} else {
			if over := len(t.tail) + n - usageTail; over > 0 {
				t.tail = append(t.tail[:0], t.tail[over:]...)
			}
			t.tail = append(t.tail, p[:n]...)
		}
	}
	return n, err
}

// tapUsage wraps resp's body when the proxy reports usage and the answer can carry it (a 200 of a
// parsed completion or chat request). It returns nil otherwise.
func (c *call) tapUsage(resp *http.Response, sent time.Time) *usageTap {
	if c.p.cfg.Usage == nil || c.in.body == nil || resp.StatusCode != http.StatusOK || header(resp.Header, "Content-Encoding") != "" {
		return nil
	}
	// In the call: one allocation less per request; the tail grows to at most usageTail. sent is
	// where the receipt's time to first token starts.
	t := &c.resp.tap
	*t = usageTap{ReadCloser: resp.Body, stream: strings.HasPrefix(header(resp.Header, "Content-Type"), "text/event-stream"), sent: sent, d: c.d}
	resp.Body = t
	return t
}

// reportUsage hands the tapped response's usage to Config.Usage (nothing when the engine sent none).
func (c *call) reportUsage(t *usageTap) {
	if t == nil || c.resp.server == nil {
		return
	}
	prompt, cached, ok := c.reportUsageOf(c.resp.server, t.tail)
	if ok && !t.first.IsZero() {
		// The receipt teaches the serving endpoint's rates (the ttft law's, route/ttft.go); the
		// answer has just ended, so the time since its first byte is its decode.
		c.d.Receipt(t.first.Sub(t.sent), time.Since(t.first), prompt, cached)
	}
}

// reportPrefillUsage accounts a P/D request on its prefill endpoint, the one KV-exact chose: the
// prefill leg's answer (read whole by the proxy, never relayed as such) carries that engine's own
// cached_tokens. The decode leg's usage is not the account of a prediction: vLLM counts the KV it
// pulled from the prefill engine as cached (num_cached_tokens includes the connector's external
// tokens), so its cached_tokens would "realize" any prediction, right or wrong.
func (c *call) reportPrefillUsage(ep *route.Endpoint, a engines.LegAnswer) {
	if c.p.cfg.Usage == nil || c.in.body == nil || a.Err != nil || a.Status != http.StatusOK || header(a.Header, "Content-Encoding") != "" {
		return
	}
	switch {
	case a.Tail != nil: // a drained answer
		c.reportUsageOf(ep, a.Tail)
	case a.Whole:
		c.reportUsageOf(ep, a.Body[max(0, len(a.Body)-usageTail):])
	}
}

// reportUsageOf hands the usage at the end of tail, served by ep, to Config.Usage, and returns it.
func (c *call) reportUsageOf(ep *route.Endpoint, tail []byte) (prompt, cached int, ok bool) {
	if c.d == nil {
		return 0, 0, false
	}
	prompt, cached, ok = parseUsage(tail)
	if !ok {
		return 0, 0, false
	}
	rep := UsageReport{Rule: c.rule.name, Endpoint: ep.Name, Tier: c.d.Tier, RealizedTokens: cached, PromptTokens: prompt}
	rep.KVExact = c.d.Tier == route.TierKVExact && c.d.Target == ep
	if k, ok := c.d.LastKey(); ok {
		rep.LastBlockKey, rep.Blocks = k, c.d.Blocks
	}
	if r := c.rule.rt.Rule(); r != nil {
		rep.BlockSize = r.BlockSize
	}
	confirmed := 0
	for _, ev := range c.d.Endpoints {
		if ev.Name == ep.Name {
			// The engine counts the blocks it loads from a lower tier as cached.
			rep.PredictedTokens = (ev.Prefix + ev.LowerBlocks()) * rep.BlockSize
			confirmed = ev.Prefix - ev.Predicted
		}
	}
	rep.KVExact = rep.KVExact && confirmed > 0
	c.resp.realized = cached
	c.p.cfg.Usage(rep)
	return prompt, cached, true
}

var usageKey = []byte(`"usage"`)

// parseUsage finds the last usage object with cached tokens in the tail of a response (a JSON body
// or an SSE stream) and returns prompt_tokens and prompt_tokens_details.cached_tokens. It scans the
// object by hand: encoding/json costs ~40× the relay's own work on a small response, and only two
// integers are wanted.
func parseUsage(tail []byte) (prompt, cached int, ok bool) {
	end := len(tail)
	for range 4 {
		i := bytes.LastIndex(tail[:end], usageKey)
		if i < 0 {
			return 0, 0, false
		}
		end = i
		rest := skipSpace(tail[i+len(usageKey):])
		if len(rest) == 0 || rest[0] != ':' {
			continue
		}
		obj, ok := value(skipSpace(rest[1:]))
		if !ok || obj[0] != '{' {
			continue
		}
		p, okp := intOf(field(obj, "prompt_tokens"))
		det := field(obj, "prompt_tokens_details")
		if !okp || len(det) == 0 || det[0] != '{' {
			continue
		}
		c, okc := intOf(field(det, "cached_tokens"))
		if !okc {
			continue
		}
		return p, c, true
	}
	return 0, 0, false
}

func skipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r' || b[0] == '\n') {
		b = b[1:]
	}
	return b
}

// value returns the JSON value at the start of b (object, array, string or scalar), unparsed.
func value(b []byte) ([]byte, bool) {
	if len(b) == 0 {
		return nil, false
	}
	switch b[0] {
	case '{', '[':
		depth := 0
		for i := 0; i < len(b); i++ {
			switch b[i] {
			case '"':
				n, ok := stringLen(b[i:])
				if !ok {
					return nil, false
				}
				i += n - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return b[:i+1], true
				}
			}
		}
		return nil, false
	case '"':
		n, ok := stringLen(b)
		return b[:n], ok
	default:
		i := 0
		for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\n' && b[i] != '\r' && b[i] != '\t' {
			i++
		}
		return b[:i], i > 0
	}
}

// stringLen is the length of the JSON string at the start of b, quotes included.
func stringLen(b []byte) (int, bool) {
	for i := 1; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1, true
		}
	}
	return 0, false
}

// field returns the raw value of key among obj's own members, the last one when repeated (as
// encoding/json reads it); nil when absent or malformed.
func field(obj []byte, key string) []byte {
	b := obj[1:]
	var found []byte
	for {
		b = skipSpace(b)
		if len(b) == 0 || b[0] != '"' {
			return nil
		}
		n, ok := stringLen(b)
		if !ok {
			return nil
		}
		k := b[1 : n-1]
		b = skipSpace(b[n:])
		if len(b) == 0 || b[0] != ':' {
			return nil
		}
		v, ok := value(skipSpace(b[1:]))
		if !ok {
			return nil
		}
		if string(k) == key {
			found = v
		}
		b = skipSpace(skipSpace(b[1:])[len(v):])
		if len(b) > 0 && b[0] == '}' {
			return found
		}
		if len(b) == 0 || b[0] != ',' {
			return nil
		}
		b = b[1:]
	}
}

// intOf parses a non-negative JSON integer (at most 15 digits).
func intOf(v []byte) (int, bool) {
	if len(v) == 0 || len(v) > 15 {
		return 0, false
	}
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}
