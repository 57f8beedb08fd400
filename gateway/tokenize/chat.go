package tokenize

import (
	"bytes"
	"encoding/json"
	"encoding/json/jsontext"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// A chat request is parsed into a small tree of Python-like values rather than Go structs: chat
// templates print what the client sent (tojson of tool schemas and tool-call arguments), so integer vs
// float, key order and duplicate-key rules must survive exactly as Python's json.loads keeps them.
//
// Value kinds in the tree: nil, bool, json.Number (the literal as written), string, []any, *object.

// object is a JSON object with Python dict semantics: insertion order, and a repeated key keeps its
// first position and takes the last value (json.loads). Keys and values are parallel slices; an index
// is built only for objects with more than smallObject keys (most request objects are small, and a
// map per object dominated the parse).
type object struct {
	keys  []string
	vals  []any
	index map[string]int
}

const smallObject = 8

func newObject() *object { return &object{} }

func (o *object) find(k string) int {
	if o.index != nil {
		if i, ok := o.index[k]; ok {
			return i
		}
		return -1
	}
	for i, kk := range o.keys {
		if kk == k {
			return i
		}
	}
	return -1
}

func (o *object) set(k string, v any) {
	if i := o.find(k); i >= 0 {
		o.vals[i] = v
		return
	}
	o.keys, o.vals = append(o.keys, k), append(o.vals, v)
	switch {
	case o.index != nil:
		o.index[k] = len(o.keys) - 1
	case len(o.keys) > smallObject:
		o.reindex()
	}
}

func (o *object) reindex() {
	o.index = make(map[string]int, len(o.keys))
	for i, k := range o.keys {
		o.index[k] = i
	}
}

func (o *object) get(k string) (any, bool) {
	if i := o.find(k); i >= 0 {
		return o.vals[i], true
	}
	return nil, false
}

// val is the value of k, nil when absent.
func (o *object) val(k string) any {
	v, _ := o.get(k)
	return v
}

func (o *object) del(k string) {
	i := o.find(k)
	if i < 0 {
		return
	}
	o.keys = append(o.keys[:i:i], o.keys[i+1:]...)
	o.vals = append(o.vals[:i:i], o.vals[i+1:]...)
	if o.index != nil {
		o.reindex()
	}
}

// ErrBadChatRequest marks a request body that is not a valid chat completions request. The engine
// would answer 400; the gateway has nothing to route on.
var ErrBadChatRequest = errors.New("bad chat request")

// ChatRequest is the part of an OpenAI chat completions (or vLLM /tokenize chat) request that decides
// the prompt tokens. Fields hold the client's values with Python semantics; Raw keeps the whole body.
type ChatRequest struct {
	Model               string
	Messages            []any // each an *object with a string "role"
	Tools               []any // nil when absent or null
	ToolsGiven          bool
	AddGenerationPrompt bool // default true
	ContinueFinal       bool // continue_final_message, default false
	AddSpecialTokens    bool // default false for chat
	Documents           any  // nil when absent or null
	ChatTemplate        *string
	ChatTemplateKwargs  *object // nil when absent or null
	ReasoningEffort     *string
	Raw                 *object
}

// ParseChatRequest parses a chat request body. Errors wrap ErrBadChatRequest and name the JSON field
// (and byte offset for syntax errors).
func ParseChatRequest(body []byte) (*ChatRequest, error) {
	b, err := ParseChatBody(body)
	if err != nil {
		return nil, err
	}
	return b.Request()
}

// ChatBody is a chat completions body decoded once into Python-like values (json.loads semantics),
// before any chat-specific check: the proxy reads its routing members from it and hands the same
// tree to the keyer, so a body is parsed once.
type ChatBody struct{ root *object }

// Object is a decoded JSON object (ordered, json.loads duplicate rules), as Member returns it.
type Object = object

// ParseChatBody decodes body, which must be one JSON object. Errors wrap ErrBadChatRequest and give
// the byte offset.
func ParseChatBody(body []byte) (*ChatBody, error) {
	v, err := parseJSON(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadChatRequest, err)
	}
	root, ok := v.(*object)
	if !ok {
		return nil, fmt.Errorf("%w: body: want a JSON object, got %s", ErrBadChatRequest, pyType(v))
	}
	return &ChatBody{root: root}, nil
}

// Member returns a top-level member's value: nil (JSON null), bool, json.Number, string, []any or
// *Object; ok is false when the member is absent.
func (b *ChatBody) Member(name string) (v any, ok bool) { return b.root.get(name) }

// Len is the number of members of o.
func (o *Object) Len() int { return len(o.keys) }

// Get returns the member name of o (see ChatBody.Member for the value types).
func (o *Object) Get(name string) (any, bool) { return o.get(name) }

// Request checks the body as vLLM's ChatCompletionRequest does and returns the fields that decide
// the prompt tokens.
func (b *ChatBody) Request() (*ChatRequest, error) {
	root := b.root
	r := &ChatRequest{Raw: root, AddGenerationPrompt: true}
	bad := func(field, format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrBadChatRequest, field, fmt.Sprintf(format, a...))
	}
	if m, ok := root.get("model"); ok && m != nil {
		s, ok := m.(string)
		if !ok {
			return nil, bad("model", "want a string, got %s", pyType(m))
		}
		r.Model = s
	}
	msgs, ok := root.get("messages")
	if !ok {
		return nil, bad("messages", "required")
	}
	list, ok := msgs.([]any)
	if !ok {
		return nil, bad("messages", "want an array, got %s", pyType(msgs))
	}
	for i, m := range list {
		field := fmt.Sprintf("messages[%d]", i)
		mo, ok := m.(*object)
		if !ok {
			return nil, bad(field, "want an object, got %s", pyType(m))
		}
		role, ok := mo.get("role")
		if !ok {
			return nil, bad(field+".role", "required")
		}
		if _, ok := role.(string); !ok {
			return nil, bad(field+".role", "want a string, got %s", pyType(role))
		}
		if err := checkContent(mo, field); err != nil {
			return nil, err
		}
		if tc, ok := mo.get("tool_calls"); ok && tc != nil {
			if _, ok := tc.([]any); !ok {
				return nil, bad(field+".tool_calls", "want an array, got %s", pyType(tc))
			}
		}
	}
	r.Messages = list
	for _, f := range []struct {
		name string
		dst  *bool
	}{
		{"add_generation_prompt", &r.AddGenerationPrompt},
		{"continue_final_message", &r.ContinueFinal},
		{"add_special_tokens", &r.AddSpecialTokens},
	} {
		if v, ok := root.get(f.name); ok {
			b, ok := v.(bool)
			if !ok {
				return nil, bad(f.name, "want true or false, got %s", pyType(v))
			}
			*f.dst = b
		}
	}
	if r.ContinueFinal && r.AddGenerationPrompt {
		return nil, bad("continue_final_message", "cannot be true together with add_generation_prompt (vLLM answers 400)")
	}
	if v, ok := root.get("tools"); ok && v != nil {
		tl, ok := v.([]any)
		if !ok {
			return nil, bad("tools", "want an array, got %s", pyType(v))
		}
		if len(tl) == 0 {
			return nil, bad("tools", "must not be an empty array (vLLM answers 400)")
		}
		for i, t := range tl {
			if err := checkTool(t, fmt.Sprintf("tools[%d]", i)); err != nil {
				return nil, err
			}
		}
		r.Tools, r.ToolsGiven = tl, true
	}
	if v, ok := root.get("documents"); ok && v != nil {
		dl, ok := v.([]any)
		if !ok {
			return nil, bad("documents", "want an array of objects, got %s", pyType(v))
		}
		for i, d := range dl {
			do, ok := d.(*object)
			if !ok {
				return nil, bad(fmt.Sprintf("documents[%d]", i), "want an object, got %s", pyType(d))
			}
			for _, k := range do.keys {
				if _, ok := do.val(k).(string); !ok {
					return nil, bad(fmt.Sprintf("documents[%d].%s", i, k), "want a string, got %s", pyType(do.val(k)))
				}
			}
		}
		r.Documents = dl
	}
	if v, ok := root.get("chat_template"); ok && v != nil {
		s, ok := v.(string)
		if !ok {
			return nil, bad("chat_template", "want a string, got %s", pyType(v))
		}
		r.ChatTemplate = &s
	}
	if v, ok := root.get("chat_template_kwargs"); ok && v != nil {
		o, ok := v.(*object)
		if !ok {
			return nil, bad("chat_template_kwargs", "want an object, got %s", pyType(v))
		}
		r.ChatTemplateKwargs = o
	}
	if v, ok := root.get("reasoning_effort"); ok && v != nil {
		s, ok := v.(string)
		if !ok {
			return nil, bad("reasoning_effort", "want a string, got %s", pyType(v))
		}
		switch s {
		case "none", "minimal", "low", "medium", "high", "xhigh", "max":
		default:
			return nil, bad("reasoning_effort", "unknown value %q", s)
		}
		r.ReasoningEffort = &s
	}
	return r, nil
}

func checkContent(mo *object, field string) error {
	c, ok := mo.get("content")
	if !ok || c == nil {
		return nil
	}
	switch c := c.(type) {
	case string:
		return nil
	case []any:
		for j, p := range c {
			switch p := p.(type) {
			case string:
			case *object:
				if t, ok := p.get("type"); ok && t != nil {
					if _, ok := t.(string); !ok {
						return fmt.Errorf("%w: %s.content[%d].type: want a string, got %s", ErrBadChatRequest, field, j, pyType(t))
					}
				}
			default:
				return fmt.Errorf("%w: %s.content[%d]: want an object or a string, got %s", ErrBadChatRequest, field, j, pyType(p))
			}
		}
		return nil
	default:
		return fmt.Errorf("%w: %s.content: want a string, an array of parts or null, got %s", ErrBadChatRequest, field, pyType(c))
	}
}

func checkTool(t any, field string) error {
	to, ok := t.(*object)
	if !ok {
		return fmt.Errorf("%w: %s: want an object, got %s", ErrBadChatRequest, field, pyType(t))
	}
	if ty, ok := to.get("type"); ok && ty != "function" {
		return fmt.Errorf("%w: %s.type: want \"function\", got %s", ErrBadChatRequest, field, pyRepr(ty))
	}
	fn, ok := to.get("function")
	if !ok {
		return fmt.Errorf("%w: %s.function: required", ErrBadChatRequest, field)
	}
	fo, ok := fn.(*object)
	if !ok {
		return fmt.Errorf("%w: %s.function: want an object, got %s", ErrBadChatRequest, field, pyType(fn))
	}
	name, ok := fo.get("name")
	if !ok {
		return fmt.Errorf("%w: %s.function.name: required", ErrBadChatRequest, field)
	}
	if _, ok := name.(string); !ok {
		return fmt.Errorf("%w: %s.function.name: want a string, got %s", ErrBadChatRequest, field, pyType(name))
	}
	if d, ok := fo.get("description"); ok && d != nil {
		if _, ok := d.(string); !ok {
			return fmt.Errorf("%w: %s.function.description: want a string or null, got %s", ErrBadChatRequest, field, pyType(d))
		}
	}
	if p, ok := fo.get("parameters"); ok && p != nil {
		if _, ok := p.(*object); !ok {
			return fmt.Errorf("%w: %s.function.parameters: want an object or null, got %s", ErrBadChatRequest, field, pyType(p))
		}
	}
	return nil
}

// maxJSONDepth bounds nesting so a hostile body cannot exhaust the stack.
const maxJSONDepth = 512

// parseJSON decodes one JSON value with Python json.loads semantics for the value tree (ordered
// objects, numbers kept as written, the last of duplicate keys wins). Trailing data after the value
// is an error. It reads tokens with encoding/json/jsontext (no reflection, strings unquoted once).
func parseJSON(data []byte) (any, error) {
	p := &jsonParser{dec: jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))}
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	if _, err := p.dec.ReadToken(); err != io.EOF {
		return nil, fmt.Errorf("offset %d: unexpected data after the JSON value", p.dec.InputOffset())
	}
	return v, nil
}

// jsonParser builds the value tree; path holds the member names and indexes above the current
// value, joined only for an error message.
type jsonParser struct {
	dec  *jsontext.Decoder
	path []pathSeg
}

// pathSeg is a member name (idx < 0) or an array index.
type pathSeg struct {
	key string
	idx int
}

func (p *jsonParser) fail(err error) error {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%s: offset %d: %v", p.where(), p.dec.InputOffset(), err)
}

func (p *jsonParser) where() string {
	var b strings.Builder
	b.WriteByte('$')
	for _, s := range p.path {
		if s.idx < 0 {
			b.WriteString("." + s.key)
		} else {
			b.WriteString("[" + strconv.Itoa(s.idx) + "]")
		}
	}
	return b.String()
}

func (p *jsonParser) value(depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("%s: nested deeper than %d", p.where(), maxJSONDepth)
	}
	dec := p.dec
	switch dec.PeekKind() {
	case '0':
		raw, err := dec.ReadValue()
		if err != nil {
			return nil, p.fail(err)
		}
		return json.Number(raw), nil
	case '{':
		if _, err := dec.ReadToken(); err != nil {
			return nil, p.fail(err)
		}
		o := newObject()
		for dec.PeekKind() != '}' {
			kt, err := dec.ReadToken()
			if err != nil {
				return nil, p.fail(err)
			}
			k := kt.String()
			p.path = append(p.path, pathSeg{key: k, idx: -1})
			v, err := p.value(depth + 1)
			p.path = p.path[:len(p.path)-1]
			if err != nil {
				return nil, err
			}
			o.set(k, v)
		}
		if _, err := dec.ReadToken(); err != nil {
			return nil, p.fail(err)
		}
		return o, nil
	case '[':
		if _, err := dec.ReadToken(); err != nil {
			return nil, p.fail(err)
		}
		list := []any{}
		for i := 0; dec.PeekKind() != ']'; i++ {
			p.path = append(p.path, pathSeg{idx: i})
			v, err := p.value(depth + 1)
			p.path = p.path[:len(p.path)-1]
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		if _, err := dec.ReadToken(); err != nil {
			return nil, p.fail(err)
		}
		return list, nil
	}
	tok, err := dec.ReadToken()
	if err != nil {
		return nil, p.fail(err)
	}
	switch tok.Kind() {
	case 'n':
		return nil, nil
	case 't', 'f':
		return tok.Bool(), nil
	case '"':
		return tok.String(), nil
	}
	return nil, p.fail(fmt.Errorf("unexpected %s", tok.Kind()))
}

// pyType names a value's type as Python would, for error messages.
func pyType(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		if isIntLiteral(string(v)) {
			return "an integer"
		}
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case *object:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

func pyRepr(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	if n, ok := v.(json.Number); ok {
		return string(n)
	}
	return pyType(v)
}

func isIntLiteral(s string) bool { return !strings.ContainsAny(s, ".eE") }

// pyFloat converts a JSON number literal as Python's float() does: out-of-range literals become
// ±inf or ±0 instead of failing.
func pyFloat(s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && ne.Err == strconv.ErrRange {
			return f, nil
		}
		return 0, err
	}
	return f, nil
}

// MessagesText joins the text of every message (a string content, or the text of each part), one
// line each: what content affinity hashes. Values of other shapes are skipped.
func (b *ChatBody) MessagesText() string {
	msgs, _ := b.root.get("messages")
	list, _ := msgs.([]any)
	var sb strings.Builder
	for _, m := range list {
		mo, ok := m.(*object)
		if !ok {
			continue
		}
		c, _ := mo.get("content")
		switch c := c.(type) {
		case string:
			sb.WriteString(c)
			sb.WriteByte('\n')
		case []any:
			for _, p := range c {
				po, ok := p.(*object)
				if !ok {
					continue
				}
				if t, _ := po.get("text"); t != nil {
					if s, ok := t.(string); ok && s != "" {
						sb.WriteString(s)
						sb.WriteByte('\n')
					}
				}
			}
		}
	}
	return sb.String()
}
