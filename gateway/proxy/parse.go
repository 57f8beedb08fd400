package proxy

import (
	"bytes"
	"encoding/json"
	"encoding/json/jsontext"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/kvexact/kvexact/gateway/apierror"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// request is the parse step's result: the body as received and its typed reading.
type request struct {
	raw  []byte
	body *parsed // the generation paths' parsed body (&pb); nil on forwarded paths
	pb   parsed
	// route is what the router sees.
	route route.Request
}

// parse reads the body of a generation request and parses it, once, into the typed request.
func (c *call) parse(chat bool) *apierror.Error {
	if e := checkJSONType(c.r); e != nil {
		return e
	}
	raw, e := c.readBody()
	if e != nil {
		return e
	}
	pb := &c.in.pb
	if e := pb.parse(raw, chat); e != nil {
		return e
	}
	// One source for the model: the body. A header that disagrees is rejected rather than letting
	// routing and the engine read different models (routing-semantics §7.3).
	if hm := header(c.r.Header, "X-Model"); hm != "" && hm != pb.model {
		return badRequest("model", "model_mismatch", "the X-Model header %s and the body's model %s disagree", quote(hm), quote(pb.model))
	}
	pb.fillRouteRequest(&c.in.route, c.r)
	c.in.body, c.in.raw = pb, raw
	return nil
}

// parseForwarded reads the body of a forwarded path; of it only its model is read (the body's
// "model", else X-Model).
func (c *call) parseForwarded() *apierror.Error {
	raw, e := c.readBody()
	if e != nil {
		return e
	}
	model := sniffModel(c.r, raw)
	if model == "" {
		model = header(c.r.Header, "X-Model")
	}
	c.in.raw = raw
	c.in.route = route.Request{Model: model, ConversationID: header(c.r.Header, "X-Conversation-Id")}
	return nil
}

// readBody reads the whole body within the size limit and the body deadline, as it arrives: the
// buffer grows with the bytes received, never to a declared Content-Length up front (a client
// declaring 16 MiB and sending one byte costs 16 KiB, not 16 MiB).
func (c *call) readBody() ([]byte, *apierror.Error) {
	limit := c.p.cfg.MaxBodyBytes
	tooBig := func() *apierror.Error {
		return &apierror.Error{Status: http.StatusRequestEntityTooLarge, Type: apierror.TypeInvalid, Code: "request_too_large",
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
			c.p.cfg.Metrics.clientError(c.rule.name, clientBodyTimeout)
			c.p.log.Info("client body too slow", "timeout", c.p.cfg.BodyTimeout, "received", len(b), "request_id", c.id)
			return nil, &apierror.Error{Status: http.StatusRequestTimeout, Type: apierror.TypeInvalid, Code: "request_timeout",
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

// parsed is the one typed request the proxy reads from an OpenAI body, once: what routing and the
// keys depend on (docs/request-fields.md). The raw bytes stay the source of what is forwarded; only
// P/D dialects rewrite them (see patch).
type parsed struct {
	raw    []byte
	model  string
	stream bool
	user   string
	chat   bool
	// batch is the number of prompts in a completions request (1 for a single prompt).
	batch  int
	prompt string   // single text prompt
	tokens []uint32 // single token prompt
	// affinity is the prompt text, the first prompt of a batch, or the messages' text joined.
	affinity string
	// Key-shaping fields: add_special_tokens (completions; chat reads it from chatReq), cache_salt,
	// truncate_prompt_tokens / truncation_side, prompt_embeds.
	addSpecial   *bool
	cacheSalt    string
	truncate     *int64
	truncSide    string
	promptEmbeds bool
	// skipsCache: the engine reads no prefix-cache hit for the request (route.Request.SkipsPrefixCache).
	skipsCache bool
	// chatReq is the chat body checked as vLLM does, or chatErr why it is not a valid one (the
	// request is still forwarded: the engine gives the client its own answer).
	chatReq *tokenize.ChatRequest
	chatErr error
}

// wireBody holds the raw JSON values of the top-level members a completions body is routed on;
// everything else passes through untouched.
type wireBody struct {
	Model, Stream, User, Prompt, Messages                                           json.RawMessage
	AddSpecialTokens, CacheSalt, TruncatePromptTokens, TruncationSide, PromptEmbeds json.RawMessage
	PromptLogprobs, SkipReadingPrefixCache                                          json.RawMessage
}

// bodyScanner is a pooled JSON token reader for request bodies.
type bodyScanner struct {
	buf bytes.Buffer
	dec *jsontext.Decoder
}

// Duplicate member names are allowed (the engines' JSON readers keep the last one, and so do we);
// invalid UTF-8 inside strings is accepted as encoding/json does (strings read later replace it).
var scanOptions = []jsontext.Options{jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)}

var bodyScanners = sync.Pool{New: func() any {
	s := new(bodyScanner)
	s.dec = jsontext.NewDecoder(&s.buf, scanOptions...)
	return s
}}

// scanBody checks that raw is exactly one JSON object and collects the raw values of the members
// wireBody names (names match exactly, as the engines' JSON readers do; the last of duplicates
// wins). The values are slices of raw. It walks the tokens once without building anything: a body
// is forwarded as it came, so only these values matter here.
func scanBody(raw []byte, wb *wireBody) error {
	s := bodyScanners.Get().(*bodyScanner)
	defer func() {
		s.buf = bytes.Buffer{}
		s.dec.Reset(&s.buf, scanOptions...)
		bodyScanners.Put(s)
	}()
	// A bytes.Buffer is read in place: the decoder does not copy the body.
	s.buf = *bytes.NewBuffer(raw)
	d := s.dec
	d.Reset(&s.buf, scanOptions...)
	if k := d.PeekKind(); k != '{' {
		if _, err := d.ReadValue(); err != nil {
			return err
		}
		return errNotObject
	}
	if _, err := d.ReadToken(); err != nil {
		return err
	}
	for d.PeekKind() != '}' {
		name, err := d.ReadValue()
		if err != nil {
			return err
		}
		dst := wb.member(name)
		if dst == nil {
			if err := d.SkipValue(); err != nil {
				return err
			}
			continue
		}
		v, err := d.ReadValue()
		if err != nil {
			return err
		}
		end := int(d.InputOffset())
		*dst = raw[end-len(v) : end : end]
	}
	if _, err := d.ReadToken(); err != nil {
		return err
	}
	if _, err := d.ReadValue(); err != io.EOF {
		if err == nil {
			err = fmt.Errorf("unexpected data after the top-level object at byte offset %d", d.InputOffset())
		}
		return err
	}
	return nil
}

var errNotObject = errors.New("the request body must be a JSON object")

// member returns where the value of the member with the quoted name goes, nil for members the
// proxy does not read.
func (wb *wireBody) member(quoted []byte) *json.RawMessage {
	name := quoted
	if bytes.IndexByte(quoted, '\\') >= 0 { // an escaped name: compare its decoded text
		name, _ = jsontext.AppendUnquote(nil, quoted)
	} else {
		name = quoted[1 : len(quoted)-1]
	}
	switch string(name) {
	case "model":
		return &wb.Model
	case "stream":
		return &wb.Stream
	case "user":
		return &wb.User
	case "prompt":
		return &wb.Prompt
	case "messages":
		return &wb.Messages
	case "add_special_tokens":
		return &wb.AddSpecialTokens
	case "cache_salt":
		return &wb.CacheSalt
	case "truncate_prompt_tokens":
		return &wb.TruncatePromptTokens
	case "truncation_side":
		return &wb.TruncationSide
	case "prompt_embeds":
		return &wb.PromptEmbeds
	case "prompt_logprobs":
		return &wb.PromptLogprobs
	case "skip_reading_prefix_cache":
		return &wb.SkipReadingPrefixCache
	}
	return nil
}

// checkJSONType answers 415 for a body that is declared as something other than JSON. A missing
// Content-Type is accepted (some clients omit it); the body must still parse as JSON.
func checkJSONType(r *http.Request) *apierror.Error {
	ct := header(r.Header, "Content-Type")
	if ct == "" || ct == "application/json" { // the common case, without a parameter map
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json")) {
		return nil
	}
	return &apierror.Error{Status: http.StatusUnsupportedMediaType, Type: apierror.TypeInvalid, Code: "unsupported_media_type",
		Message: "Content-Type " + quote(ct) + " is not supported; send application/json"}
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

// parseBody reads an OpenAI completions (chat=false) or chat completions body.
func parseBody(raw []byte, chat bool) (*parsed, *apierror.Error) {
	p := new(parsed)
	if e := p.parse(raw, chat); e != nil {
		return nil, e
	}
	return p, nil
}

// parse fills p from raw (p is zero). A chat body is decoded once into the value tree the chat
// template needs, and its routing members are read from that tree; a completions body is scanned
// for its routing members without building anything.
func (p *parsed) parse(raw []byte, chat bool) *apierror.Error {
	if len(bytes.TrimSpace(raw)) == 0 {
		return badRequest("", "invalid_json", "the request body is empty; send a JSON object")
	}
	p.raw, p.chat = raw, chat
	if chat {
		return p.parseChat(raw)
	}
	var wb wireBody
	if err := scanBody(raw, &wb); err != nil {
		return scanError(err)
	}
	if e := p.readCommon(wb.Model, wb.Stream, wb.User); e != nil {
		return e
	}
	if !isNull(wb.AddSpecialTokens) {
		var b bool
		if json.Unmarshal(wb.AddSpecialTokens, &b) != nil {
			return badRequest("add_special_tokens", "invalid_type", "add_special_tokens must be a boolean")
		}
		p.addSpecial = &b
	}
	if e := p.readKeyFields(wb.CacheSalt, wb.TruncatePromptTokens, wb.TruncationSide); e != nil {
		return e
	}
	p.skipsCache = skipsPrefixCache(wb.PromptLogprobs, wb.SkipReadingPrefixCache)
	p.promptEmbeds = !isNull(wb.PromptEmbeds)
	if p.promptEmbeds && isNull(wb.Prompt) {
		return nil // vLLM accepts prompt_embeds alone
	}
	return p.readPrompt(wb.Prompt)
}

func scanError(err error) *apierror.Error {
	if err == errNotObject {
		return badRequest("", "invalid_json", "%s", err.Error())
	}
	return badRequest("", "invalid_json", "the request body is not valid JSON: %v", err)
}

// parseChat decodes a chat body once (tokenize.ParseChatBody) and reads the routing members from it.
func (p *parsed) parseChat(raw []byte) *apierror.Error {
	cb, err := tokenize.ParseChatBody(raw)
	if err != nil {
		// The scanner words syntax errors as the completions path does; the tree's own message
		// stands where only it objects (nesting depth).
		var wb wireBody
		if serr := scanBody(raw, &wb); serr != nil {
			return scanError(serr)
		}
		return badRequest("", "invalid_json", "the request body is not valid JSON: %v", errors.Unwrap(err))
	}
	member := func(name string) json.RawMessage {
		v, ok := cb.Member(name)
		if !ok {
			return nil
		}
		return valueJSON(v)
	}
	if e := p.readCommon(member("model"), member("stream"), member("user")); e != nil {
		return e
	}
	msgs, ok := cb.Member("messages")
	if !ok || msgs == nil {
		return badRequest("messages", "missing_messages", "messages is required")
	}
	list, ok := msgs.([]any)
	if !ok {
		return badRequest("messages", "invalid_type", "messages must be an array of message objects")
	}
	if len(list) == 0 {
		return badRequest("messages", "invalid_value", "messages must not be empty")
	}
	for _, m := range list {
		if _, ok := m.(*tokenize.Object); !ok {
			return badRequest("messages", "invalid_type", "messages must be an array of message objects")
		}
	}
	if e := p.readKeyFields(member("cache_salt"), member("truncate_prompt_tokens"), member("truncation_side")); e != nil {
		return e
	}
	p.skipsCache = skipsPrefixCache(member("prompt_logprobs"), member("skip_reading_prefix_cache"))
	p.affinity = cb.MessagesText()
	p.chatReq, p.chatErr = cb.Request()
	return nil
}

// valueJSON re-encodes a scalar member of the chat tree as JSON for the shared readers (objects and
// arrays become a marker that fails every scalar reader).
func valueJSON(v any) json.RawMessage {
	switch v := v.(type) {
	case nil:
		return json.RawMessage("null")
	case bool:
		if v {
			return json.RawMessage("true")
		}
		return json.RawMessage("false")
	case json.Number:
		return json.RawMessage(v)
	case string:
		b, _ := json.Marshal(v)
		return b
	case []any:
		return json.RawMessage("[]")
	}
	return json.RawMessage("{}")
}

// readCommon reads model, stream and user.
func (p *parsed) readCommon(model, stream, user json.RawMessage) *apierror.Error {
	if isNull(model) {
		return badRequest("model", "missing_model", "you must provide a model parameter")
	}
	if err := unmarshalString(model, &p.model); err != nil {
		return badRequest("model", "invalid_type", "model must be a string")
	}
	if p.model == "" {
		return badRequest("model", "missing_model", "you must provide a model parameter")
	}
	if !isNull(stream) {
		if err := json.Unmarshal(stream, &p.stream); err != nil {
			return badRequest("stream", "invalid_type", "stream must be a boolean")
		}
	}
	if !isNull(user) {
		if err := unmarshalString(user, &p.user); err != nil {
			return badRequest("user", "invalid_type", "user must be a string")
		}
	}
	return nil
}

// readKeyFields reads cache_salt, truncate_prompt_tokens and truncation_side, checked as vLLM's
// request models check them (each a 400 there too).
func (p *parsed) readKeyFields(salt, truncate, side json.RawMessage) *apierror.Error {
	if !isNull(salt) {
		if unmarshalString(salt, &p.cacheSalt) != nil {
			return badRequest("cache_salt", "invalid_type", "cache_salt must be a string")
		}
		if p.cacheSalt == "" {
			return badRequest("cache_salt", "invalid_value", "cache_salt must be a non-empty string if provided")
		}
	}
	if !isNull(truncate) {
		var n int64
		if json.Unmarshal(truncate, &n) != nil || n < -1 {
			return badRequest("truncate_prompt_tokens", "invalid_value", "truncate_prompt_tokens must be an integer in -1..%d", int64(math.MaxInt64))
		}
		p.truncate = &n
	}
	if !isNull(side) {
		if unmarshalString(side, &p.truncSide) != nil || (p.truncSide != "left" && p.truncSide != "right") {
			return badRequest("truncation_side", "invalid_value", `truncation_side must be "left" or "right"`)
		}
	}
	return nil
}

func isNull(m json.RawMessage) bool { return len(m) == 0 || string(m) == "null" }

// unmarshalString decodes a JSON value into a string. m comes from a body json.Unmarshal already
// validated, so a quoted value without escapes and in valid UTF-8 is its own contents: the common
// case skips a decoder run. Anything else goes through json.Unmarshal (same result, same errors).
func unmarshalString(m json.RawMessage, dst *string) error {
	if n := len(m); n >= 2 && m[0] == '"' && m[n-1] == '"' {
		in := m[1 : n-1]
		if bytes.IndexByte(in, '\\') < 0 && bytes.IndexByte(in, '"') < 0 && utf8.Valid(in) {
			*dst = string(in)
			return nil
		}
	}
	return json.Unmarshal(m, dst)
}

// readPrompt accepts string | []string | []int | [][]int, as OpenAI does. Token ids are u32.
func (p *parsed) readPrompt(m json.RawMessage) *apierror.Error {
	if isNull(m) {
		return badRequest("prompt", "missing_prompt", "prompt is required")
	}
	wrong := func() *apierror.Error {
		return badRequest("prompt", "invalid_type", "prompt must be a string, an array of strings, an array of token ids or an array of token-id arrays (token ids are integers in 0..4294967295)")
	}
	p.batch = 1
	switch m[0] {
	case '"':
		if unmarshalString(m, &p.prompt) != nil {
			return wrong()
		}
		p.affinity = p.prompt
		return nil
	case '[':
	default:
		return wrong()
	}
	inner := bytes.TrimLeft(m[1:], " \t\r\n")
	if len(inner) == 0 || inner[0] == ']' {
		return badRequest("prompt", "invalid_value", "prompt must not be an empty array")
	}
	switch inner[0] {
	case '"':
		var ss []string
		if json.Unmarshal(m, &ss) != nil {
			return wrong()
		}
		p.batch, p.affinity = len(ss), ss[0]
		if len(ss) == 1 {
			p.prompt = ss[0]
		}
	case '[':
		var tt [][]uint32
		if json.Unmarshal(m, &tt) != nil {
			return wrong()
		}
		for _, t := range tt {
			if len(t) == 0 {
				return badRequest("prompt", "invalid_value", "prompt must not contain an empty token array")
			}
		}
		p.batch = len(tt)
		if len(tt) == 1 {
			p.tokens = tt[0]
		}
	default:
		if json.Unmarshal(m, &p.tokens) != nil {
			return wrong()
		}
	}
	return nil
}

// routeRequest is what the router sees.
func (p *parsed) routeRequest(r *http.Request) *route.Request {
	rr := new(route.Request)
	p.fillRouteRequest(rr, r)
	return rr
}

func (p *parsed) fillRouteRequest(rr *route.Request, r *http.Request) {
	*rr = route.Request{
		Model:                p.model,
		Chat:                 p.chat,
		Body:                 p.raw,
		Prompt:               p.prompt,
		PromptTokens:         p.tokens,
		AffinityText:         p.affinity,
		ConversationID:       header(r.Header, "X-Conversation-Id"),
		User:                 p.user,
		AddSpecialTokens:     p.addSpecial,
		CacheSalt:            p.cacheSalt,
		ChatRequest:          p.chatReq,
		ChatError:            p.chatErr,
		Batch:                p.batch,
		TruncatePromptTokens: p.truncate,
		TruncationSide:       p.truncSide,
		PromptEmbeds:         p.promptEmbeds,
		SkipsPrefixCache:     p.skipsCache,
	}
}

// header is h.Get(key) for a key already in canonical form: a map index without
// canonicalizing the key on every call.
func header(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// sniffModel reads a top-level "model" string from a JSON body of a path the proxy does not parse
// (embeddings, tokenize, …); "" when there is none.
func sniffModel(r *http.Request, raw []byte) string {
	if len(raw) == 0 || checkJSONType(r) != nil {
		return ""
	}
	var v struct {
		Model string `json:"model"`
	}
	if json.Unmarshal(raw, &v) != nil {
		return ""
	}
	return v.Model
}

// skipsPrefixCache is vLLM's skip_reading_prefix_cache for a body: its own value when it is a
// boolean, else whether prompt_logprobs is set (vLLM's SamplingParams default). The engine
// validates both; a value it refuses fails there, so anything unreadable here counts as set.
func skipsPrefixCache(promptLogprobs, skip json.RawMessage) bool {
	if !isNull(skip) {
		var b bool
		if json.Unmarshal(skip, &b) == nil {
			return b
		}
	}
	return !isNull(promptLogprobs)
}
