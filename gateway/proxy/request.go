package proxy

import (
	"bytes"
	"encoding/json"
	"encoding/json/jsontext"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/kvexact/kvexact/gateway/route"
)

// parsed is what the proxy reads from an OpenAI body, once. The raw bytes stay the source of what
// is forwarded; only P/D dialects rewrite them (see patch).
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
}

// wireBody holds the raw JSON values of the top-level members the proxy reads; everything else
// passes through untouched.
type wireBody struct {
	Model, Stream, User, Prompt, Messages json.RawMessage
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
// named model, stream, user, prompt and messages (names match exactly, as the engines' JSON readers
// do; the last of duplicates wins). The values are slices of raw. It walks the tokens once without
// building anything: a body is forwarded as it came, so only these five values matter here.
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
	}
	return nil
}

// checkJSONType answers 415 for a body that is declared as something other than JSON. A missing
// Content-Type is accepted (some clients omit it); the body must still parse as JSON.
func checkJSONType(r *http.Request) *apiError {
	ct := header(r.Header, "Content-Type")
	if ct == "" || ct == "application/json" { // the common case, without a parameter map
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json")) {
		return nil
	}
	return &apiError{Status: http.StatusUnsupportedMediaType, Type: typeInvalid, Code: "unsupported_media_type",
		Message: "Content-Type " + quote(ct) + " is not supported; send application/json"}
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

// parseBody reads an OpenAI completions (chat=false) or chat completions body.
func parseBody(raw []byte, chat bool) (*parsed, *apiError) {
	p := new(parsed)
	if e := p.parse(raw, chat); e != nil {
		return nil, e
	}
	return p, nil
}

// parse fills p from raw (p is zero).
func (p *parsed) parse(raw []byte, chat bool) *apiError {
	var wb wireBody
	if len(bytes.TrimSpace(raw)) == 0 {
		return badRequest("", "invalid_json", "the request body is empty; send a JSON object")
	}
	if err := scanBody(raw, &wb); err != nil {
		if err == errNotObject {
			return badRequest("", "invalid_json", "%s", err.Error())
		}
		return badRequest("", "invalid_json", "the request body is not valid JSON: %v", err)
	}
	p.raw, p.chat = raw, chat
	if isNull(wb.Model) {
		return badRequest("model", "missing_model", "you must provide a model parameter")
	}
	if err := unmarshalString(wb.Model, &p.model); err != nil {
		return badRequest("model", "invalid_type", "model must be a string")
	}
	if p.model == "" {
		return badRequest("model", "missing_model", "you must provide a model parameter")
	}
	if !isNull(wb.Stream) {
		if err := json.Unmarshal(wb.Stream, &p.stream); err != nil {
			return badRequest("stream", "invalid_type", "stream must be a boolean")
		}
	}
	if !isNull(wb.User) {
		if err := unmarshalString(wb.User, &p.user); err != nil {
			return badRequest("user", "invalid_type", "user must be a string")
		}
	}
	if chat {
		if e := p.readMessages(wb.Messages); e != nil {
			return e
		}
		return nil
	}
	if e := p.readPrompt(wb.Prompt); e != nil {
		return e
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
func (p *parsed) readPrompt(m json.RawMessage) *apiError {
	if isNull(m) {
		return badRequest("prompt", "missing_prompt", "prompt is required")
	}
	wrong := func() *apiError {
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

// readMessages checks that messages is a non-empty array of objects and collects their text.
func (p *parsed) readMessages(m json.RawMessage) *apiError {
	if isNull(m) {
		return badRequest("messages", "missing_messages", "messages is required")
	}
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(m, &msgs) != nil {
		return badRequest("messages", "invalid_type", "messages must be an array of message objects")
	}
	if len(msgs) == 0 {
		return badRequest("messages", "invalid_value", "messages must not be empty")
	}
	var sb strings.Builder
	for _, msg := range msgs {
		if isNull(msg.Content) {
			continue
		}
		var s string
		if msg.Content[0] == '"' && json.Unmarshal(msg.Content, &s) == nil {
			sb.WriteString(s)
			sb.WriteByte('\n')
			continue
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(msg.Content, &parts) == nil {
			for _, part := range parts {
				if part.Text != "" {
					sb.WriteString(part.Text)
					sb.WriteByte('\n')
				}
			}
		}
	}
	p.affinity = sb.String()
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
		Model:          p.model,
		Chat:           p.chat,
		Body:           p.raw,
		Prompt:         p.prompt,
		PromptTokens:   p.tokens,
		AffinityText:   p.affinity,
		ConversationID: header(r.Header, "X-Conversation-Id"),
		User:           p.user,
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
