package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"unicode"

	"github.com/kvexact/kvexact/internal/jinja"
)

// Rendering a chat request the way vLLM's Jinja path does (docs/chat-templates.md): build vLLM's
// "conversation" from the request messages, choose the template, render it with transformers'
// apply_chat_template variables, and (in EncodeChat) encode the text with add_special_tokens=false
// unless the request says otherwise. Anything this layer cannot reproduce exactly is an error, never
// a guess: the gateway then routes that request without cache affinity.

var (
	// ErrNoJinjaPath: the engine does not render this model's chat through a Jinja template
	// (gpt-oss uses harmony, tokenizer_mode=mistral uses mistral_common, no chat_template at all).
	ErrNoJinjaPath = errors.New("no Jinja chat-template path")
	// ErrTemplate: the template failed or raised (raise_exception); vLLM answers 400.
	ErrTemplate = errors.New("chat template error")
	// ErrUnsupportedChat: the request is valid but uses something this layer does not reproduce
	// exactly (multimodal parts, integers beyond int64, an untrusted request template, ...).
	ErrUnsupportedChat = errors.New("chat request not reproducible")
	// ErrMultimodal (with ErrUnsupportedChat): the request has image, audio, video or embedding
	// parts, whose placeholders and hashes come from the engine's processor.
	ErrMultimodal = errors.New("multimodal content")
	// ErrRequestTemplate (with ErrUnsupportedChat): the request brings its own chat_template and the
	// server does not trust request templates.
	ErrRequestTemplate = errors.New("request chat_template")
)

// ChatOptions mirror the vLLM server flags that change chat rendering.
type ChatOptions struct {
	// ContentFormat forces --chat-template-content-format; "" means auto (detected).
	ContentFormat ContentFormat
	// TrustRequestChatTemplate mirrors --trust-request-chat-template: without it vLLM refuses
	// requests that carry their own chat_template.
	TrustRequestChatTemplate bool
	// TokenizerMode mirrors --tokenizer-mode; "mistral" bypasses Jinja.
	TokenizerMode string
}

// ChatTemplate is a model's compiled chat templates plus the special tokens transformers passes to
// them. It is safe for concurrent use.
type ChatTemplate struct {
	opts      ChatOptions
	templates map[string]*compiledTemplate // by name; the string form is "default"
	specials  []namedValue
	noJinja   error // non-nil when every request must fail with ErrNoJinjaPath
}

type namedValue struct {
	name string
	val  jinja.Value
}

type compiledTemplate struct {
	tmpl      *jinja.Template
	src       string
	format    ContentFormat
	formatErr error
	compErr   error
}

// NewChatTemplate compiles the templates of a tokenizer_config.json once. A model without a Jinja
// path still gets a ChatTemplate whose Render reports ErrNoJinjaPath with the reason.
func NewChatTemplate(cfg *Config, opts ChatOptions) (*ChatTemplate, error) {
	if cfg == nil {
		return nil, errors.New("chat template: nil tokenizer config")
	}
	switch opts.ContentFormat {
	case "", ContentString, ContentOpenAI:
	default:
		return nil, fmt.Errorf("chat options: content format %q: want \"string\", \"openai\" or empty (auto)", opts.ContentFormat)
	}
	ct := &ChatTemplate{opts: opts, templates: map[string]*compiledTemplate{}}
	switch {
	case opts.TokenizerMode == "mistral":
		ct.noJinja = fmt.Errorf("%w: tokenizer_mode=mistral renders chats with mistral_common", ErrNoJinjaPath)
	case isHarmony(cfg):
		ct.noJinja = fmt.Errorf("%w: gpt-oss (harmony tokens): vLLM renders its chats with openai-harmony", ErrNoJinjaPath)
	case len(cfg.ChatTemplates) == 0 && cfg.ChatTemplate == "":
		ct.noJinja = fmt.Errorf("%w: tokenizer_config.json has no chat_template", ErrNoJinjaPath)
	}
	for name, src := range cfg.ChatTemplates {
		ct.templates[name] = compileTemplate(src, opts.ContentFormat)
	}
	if _, ok := ct.templates["default"]; !ok && cfg.ChatTemplate != "" {
		ct.templates["default"] = compileTemplate(cfg.ChatTemplate, opts.ContentFormat)
	}
	specials, err := specialTokens(cfg)
	if err != nil {
		return nil, err
	}
	ct.specials = specials
	return ct, nil
}

func isHarmony(cfg *Config) bool {
	return bytes.Contains(cfg.Raw["added_tokens_decoder"], []byte(`"<|channel|>"`))
}

func compileTemplate(src string, forced ContentFormat) *compiledTemplate {
	c := &compiledTemplate{src: src}
	fixed, err := fixTrimAdjacency(src)
	if err != nil {
		c.compErr = err
	} else {
		c.tmpl, c.compErr = jinja.Compile(fixed)
	}
	if forced != "" {
		c.format = forced
	} else {
		c.format, c.formatErr = DetectContentFormat(src)
	}
	return c
}

// specialTokens is transformers' special_tokens_map: the set special tokens as strings, in the order
// transformers lists its attributes.
func specialTokens(cfg *Config) ([]namedValue, error) {
	var out []namedValue
	for _, name := range []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"} {
		raw, ok := cfg.Raw[name]
		if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			continue
		}
		var tok AddedTokenSpec
		if err := json.Unmarshal(raw, &tok); err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: $.%s: %w", name, err)
		}
		out = append(out, namedValue{name, jinja.NewString(tok.Content)})
	}
	if len(cfg.AdditionalSpecialTokens) > 0 {
		items := make([]jinja.Value, len(cfg.AdditionalSpecialTokens))
		for i, t := range cfg.AdditionalSpecialTokens {
			items[i] = jinja.NewString(t.Content)
		}
		out = append(out, namedValue{"additional_special_tokens", jinja.NewList(items)})
	}
	return out, nil
}

// pick chooses the template vLLM would use: the request's (when trusted; a name selects a named
// template), else "tool_use" when tools are given and the model has one, else "default".
func (ct *ChatTemplate) pick(req *ChatRequest) (*compiledTemplate, error) {
	if req.ChatTemplate != nil {
		if !ct.opts.TrustRequestChatTemplate {
			return nil, fmt.Errorf("%w: %w: the server does not trust request templates (vLLM answers 400)", ErrUnsupportedChat, ErrRequestTemplate)
		}
		if c, ok := ct.templates[*req.ChatTemplate]; ok {
			return c, nil
		}
		c := compileTemplate(*req.ChatTemplate, ct.opts.ContentFormat)
		return c, nil
	}
	if ct.noJinja != nil {
		return nil, ct.noJinja
	}
	if req.ToolsGiven {
		if c, ok := ct.templates["tool_use"]; ok {
			return c, nil
		}
	}
	if c, ok := ct.templates["default"]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("%w: the model has several chat templates and none named \"default\"", ErrNoJinjaPath)
}

// ContentFormat reports the content format vLLM would use for a request.
func (ct *ChatTemplate) ContentFormat(req *ChatRequest) (ContentFormat, error) {
	c, err := ct.pick(req)
	if err != nil {
		return "", err
	}
	if c.formatErr != nil {
		return "", fmt.Errorf("%w: content format detection: %v", ErrUnsupportedChat, c.formatErr)
	}
	return c.format, nil
}

// hfNamedParams are apply_chat_template's own parameters: request kwargs with these names bind to
// them instead of reaching the template.
var hfNamedParams = map[string]bool{
	"padding": true, "truncation": true, "max_length": true, "return_tensors": true, "return_dict": true,
	"return_assistant_tokens_mask": true, "tokenizer_kwargs": true,
	"add_generation_prompt": true, "continue_final_message": true, "documents": true,
}

// Render returns the prompt text vLLM renders for req.
func (ct *ChatTemplate) Render(req *ChatRequest) (string, error) {
	c, data, err := ct.renderData(req)
	if err != nil {
		return "", err
	}
	out, err := c.tmpl.RenderValuesSized(data, contentBytes(req)+256)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrTemplate, err)
	}
	if req.ContinueFinal {
		return continueFinal(out, data["messages"])
	}
	return out, nil
}

// contentBytes is the length of the messages' string contents: about what the rendering holds
// besides the template's own text.
func contentBytes(req *ChatRequest) int {
	n := 0
	for _, m := range req.Messages {
		if o, ok := m.(*object); ok {
			if s, ok := o.val("content").(string); ok {
				n += len(s)
			}
		}
	}
	return n
}

// renderData picks the template and builds its variables, as transformers passes them.
func (ct *ChatTemplate) renderData(req *ChatRequest) (*compiledTemplate, map[string]jinja.Value, error) {
	c, err := ct.pick(req)
	if err != nil {
		return nil, nil, err
	}
	if c.compErr != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrTemplate, c.compErr)
	}
	if c.formatErr != nil {
		return nil, nil, fmt.Errorf("%w: content format detection: %v", ErrUnsupportedChat, c.formatErr)
	}
	conv, err := buildConversation(req.Messages, c.format)
	if err != nil {
		return nil, nil, err
	}
	data := map[string]jinja.Value{}
	for _, s := range ct.specials {
		data[s.name] = s.val
	}
	documents := req.Documents
	if k := req.ChatTemplateKwargs; k != nil {
		for _, name := range k.keys {
			switch name {
			case "chat_template", "tokenize":
				return nil, nil, fmt.Errorf("%w: chat_template_kwargs.%s: not allowed (vLLM answers 400)", ErrBadChatRequest, name)
			case "messages", "conversation", "tools":
				return nil, nil, fmt.Errorf("%w: chat_template_kwargs.%s: duplicates an apply_chat_template argument (vLLM answers 400)", ErrBadChatRequest, name)
			}
			if name == "documents" && documents == nil {
				documents = k.val(name)
				continue
			}
			if hfNamedParams[name] {
				continue
			}
			v, err := toValue(k.val(name), "chat_template_kwargs."+name)
			if err != nil {
				return nil, nil, err
			}
			data[name] = v
		}
	}
	if req.ReasoningEffort != nil {
		data["reasoning_effort"] = jinja.NewString(*req.ReasoningEffort)
		if _, set := req.kwarg("enable_thinking"); !set {
			data["enable_thinking"] = jinja.NewBool(*req.ReasoningEffort != "none")
		}
	}
	data["messages"] = conv
	data["add_generation_prompt"] = jinja.NewBool(req.AddGenerationPrompt)
	if data["tools"], err = toolsValue(req); err != nil {
		return nil, nil, err
	}
	if data["documents"], err = toValue(documents, "documents"); err != nil {
		return nil, nil, err
	}
	return c, data, nil
}

func (r *ChatRequest) kwarg(name string) (any, bool) {
	if r.ChatTemplateKwargs == nil {
		return nil, false
	}
	return r.ChatTemplateKwargs.get(name)
}

// toolsValue is the request's tools as vLLM's pydantic model_dump gives them: declared fields first
// (type, then function's name, description, parameters, with null for omitted ones), extra keys after,
// in the client's order.
func toolsValue(req *ChatRequest) (jinja.Value, error) {
	if !req.ToolsGiven {
		return jinja.None(), nil
	}
	items := make([]jinja.Value, len(req.Tools))
	for i, t := range req.Tools {
		to := t.(*object) // checked by ParseChatRequest
		fo := to.val("function").(*object)
		fn := newObject()
		fn.set("name", fo.val("name"))
		fn.set("description", fo.val("description"))
		fn.set("parameters", fo.val("parameters"))
		for _, k := range fo.keys {
			fn.set(k, fo.val(k))
		}
		tool := newObject()
		tool.set("type", "function")
		tool.set("function", fn)
		for _, k := range to.keys {
			if k != "type" && k != "function" {
				tool.set(k, to.val(k))
			}
		}
		v, err := toValue(tool, fmt.Sprintf("tools[%d]", i))
		if err != nil {
			return jinja.Value{}, err
		}
		items[i] = v
	}
	return jinja.NewList(items), nil
}

// textPartExtrasKnown are content-part fields vLLM does not copy into an "openai" text part.
var textPartExtrasKnown = map[string]bool{
	"type": true, "text": true, "image_url": true, "input_audio": true, "audio_url": true, "video_url": true,
	"file": true, "refusal": true, "uuid": true, "image_embeds": true, "audio_embeds": true, "video_embeds": true,
	"image_pil": true, "input_image": true, "prompt_embeds": true, "data": true,
}

var mediaPartTypes = map[string]bool{
	"image_url": true, "input_image": true, "image_pil": true, "image_embeds": true, "audio_url": true,
	"input_audio": true, "audio_embeds": true, "video_url": true, "video_embeds": true, "prompt_embeds": true,
	"file": true,
}

// buildConversation turns request messages into vLLM's conversation (chat_utils message parsing and
// post-processing). The request tree is not modified.
func buildConversation(msgs []any, format ContentFormat) (jinja.Value, error) {
	if len(msgs) == 0 {
		return jinja.Value{}, fmt.Errorf("%w: messages is empty (engines disagree on the error)", ErrUnsupportedChat)
	}
	out := make([]jinja.Value, 0, len(msgs))
	for i, m := range msgs {
		mo := m.(*object) // checked by ParseChatRequest
		field := fmt.Sprintf("messages[%d]", i)
		role := mo.val("role").(string)
		parts, err := contentParts(mo, field, format, role)
		if err != nil {
			return jinja.Value{}, err
		}
		msg := newObject()
		msg.set("role", role)
		if format == ContentOpenAI {
			msg.set("content", parts)
		} else {
			var texts []string
			for _, p := range parts {
				if s := p.(string); s != "" {
					texts = append(texts, s)
				}
			}
			msg.set("content", strings.Join(texts, "\n"))
		}
		switch role {
		case "assistant":
			if tc, ok := mo.get("tool_calls"); ok && tc != nil {
				calls, err := toolCalls(tc.([]any), field)
				if err != nil {
					return jinja.Value{}, err
				}
				if len(calls) > 0 {
					msg.set("tool_calls", calls)
				}
			}
			reasoning, _ := mo.get("reasoning")
			if reasoning == nil {
				reasoning, _ = mo.get("reasoning_content")
			}
			if reasoning != nil {
				msg.set("reasoning", reasoning)
				msg.set("reasoning_content", reasoning)
			}
		case "tool":
			if id, ok := mo.get("tool_call_id"); ok {
				msg.set("tool_call_id", id)
			}
			if list, ok := msg.val("content").([]any); ok {
				var texts []string
				allText := true
				for _, p := range list {
					po := p.(*object)
					if po.val("type") != "text" {
						allText = false
						break
					}
					texts = append(texts, po.val("text").(string))
				}
				if allText {
					msg.set("content", strings.Join(texts, "\n"))
				}
			}
		}
		if name, ok := mo.get("name"); ok {
			if _, isStr := name.(string); isStr {
				msg.set("name", name)
			}
		}
		if task, ok := mo.get("task"); ok {
			if _, isStr := task.(string); isStr {
				msg.set("task", task)
			}
		}
		if role == "developer" {
			tools, _ := mo.get("tools")
			msg.set("tools", tools)
		}
		v, err := toValue(msg, field)
		if err != nil {
			return jinja.Value{}, err
		}
		out = append(out, v)
	}
	return jinja.NewList(out), nil
}

// contentParts returns a message's text parts: strings for the "string" format, {"type": "text",
// "text": ...} objects for "openai". Parts whose text is null are skipped, as vLLM does.
func contentParts(mo *object, field string, format ContentFormat, role string) ([]any, error) {
	c, _ := mo.get("content")
	var raw []any
	switch c := c.(type) {
	case nil:
	case string:
		raw = []any{c}
	case []any:
		raw = c
	}
	var out []any
	for j, p := range raw {
		pfield := fmt.Sprintf("%s.content[%d]", field, j)
		var text string
		var extras *object
		switch p := p.(type) {
		case string:
			text = p
		case *object:
			t, _ := p.get("type")
			ts, _ := t.(string)
			if t == nil {
				for _, k := range p.keys {
					if mediaPartTypes[k] || k == "tool_reference" {
						return nil, fmt.Errorf("%w: %w: %s: multimodal or tool_reference content is not reproduced", ErrUnsupportedChat, ErrMultimodal, pfield)
					}
				}
				return nil, fmt.Errorf("%w: %s.type: required", ErrBadChatRequest, pfield)
			}
			switch {
			case ts == "text":
				tv, ok := p.get("text")
				if !ok {
					return nil, fmt.Errorf("%w: %s.text: required", ErrBadChatRequest, pfield)
				}
				if tv == nil {
					continue
				}
				s, ok := tv.(string)
				if !ok {
					return nil, fmt.Errorf("%w: %s.text: want a string, got %s", ErrBadChatRequest, pfield, pyType(tv))
				}
				text = s
				extras = p
			case mediaPartTypes[ts] || ts == "tool_reference":
				return nil, fmt.Errorf("%w: %w: %s: %q content (multimodal placeholders and hashes) is not reproduced", ErrUnsupportedChat, ErrMultimodal, pfield, ts)
			case ts == "refusal" || ts == "input_text" || ts == "output_text" || ts == "thinking":
				return nil, fmt.Errorf("%w: %s: %q parts are not reproduced yet", ErrUnsupportedChat, pfield, ts)
			default:
				return nil, fmt.Errorf("%w: %s.type: unsupported content part type %q (vLLM answers 400)", ErrBadChatRequest, pfield, ts)
			}
		}
		if role == "system" && strings.HasPrefix(text, "x-anthropic-billing-header") {
			return nil, fmt.Errorf("%w: %s: vLLM releases differ on stripping the billing header line", ErrUnsupportedChat, pfield)
		}
		if format == ContentString {
			out = append(out, text)
			continue
		}
		part := newObject()
		part.set("type", "text")
		part.set("text", text)
		if extras != nil {
			for _, k := range extras.keys {
				if !textPartExtrasKnown[k] {
					part.set(k, extras.val(k))
				}
			}
		}
		out = append(out, part)
	}
	if out == nil {
		out = []any{}
	}
	return out, nil
}

// toolCalls copies an assistant's tool calls with each function's arguments decoded into an object,
// as vLLM does (an invalid or non-object JSON string becomes {}).
func toolCalls(calls []any, field string) ([]any, error) {
	out := make([]any, 0, len(calls))
	for k, c := range calls {
		cf := fmt.Sprintf("%s.tool_calls[%d]", field, k)
		co, ok := c.(*object)
		if !ok {
			return nil, fmt.Errorf("%w: %s: want an object, got %s", ErrBadChatRequest, cf, pyType(c))
		}
		if t, ok := co.get("type"); ok && t != "function" {
			return nil, fmt.Errorf("%w: %s.type: only \"function\" tool calls are supported (vLLM answers 400)", ErrBadChatRequest, cf)
		}
		fn, _ := co.get("function")
		fo, ok := fn.(*object)
		if !ok {
			return nil, fmt.Errorf("%w: %s.function: want an object, got %s", ErrBadChatRequest, cf, pyType(fn))
		}
		args, err := decodeArguments(fo.val("arguments"), cf+".function.arguments")
		if err != nil {
			return nil, err
		}
		nf := newObject()
		for _, key := range fo.keys {
			nf.set(key, fo.val(key))
		}
		nf.set("arguments", args)
		nc := newObject()
		for _, key := range co.keys {
			nc.set(key, co.val(key))
		}
		nc.set("function", nf)
		out = append(out, nc)
	}
	return out, nil
}

func decodeArguments(a any, field string) (any, error) {
	switch a := a.(type) {
	case *object:
		if len(a.keys) == 0 {
			return newObject(), nil
		}
		return a, nil
	case string:
		if a == "" {
			return newObject(), nil
		}
		v, err := parseJSON([]byte(a))
		if err != nil {
			// Python's json.loads also reads NaN and Infinity; Go's decoder does not.
			if strings.Contains(a, "NaN") || strings.Contains(a, "Infinity") {
				return nil, fmt.Errorf("%w: %s: NaN/Infinity in tool-call arguments", ErrUnsupportedChat, field)
			}
			return newObject(), nil
		}
		if o, ok := v.(*object); ok {
			return o, nil
		}
		return newObject(), nil
	}
	return newObject(), nil
}

// toValue converts a request value to a template value with Python's meaning: integers of any size
// (beyond int64 they print and serialize exactly; arithmetic on them fails the render rather than
// round), floats as Python prints them, -0.0 included.
func toValue(v any, path string) (jinja.Value, error) {
	switch v := v.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(v), nil
	case string:
		return jinja.NewString(v), nil
	case json.Number:
		s := string(v)
		if isIntLiteral(s) {
			if i, err := v.Int64(); err == nil {
				return jinja.NewInt(i), nil
			}
			b, ok := new(big.Int).SetString(s, 10)
			if !ok {
				return jinja.Value{}, fmt.Errorf("%w: %s: integer %s: not a decimal integer", ErrBadChatRequest, path, s)
			}
			return jinja.NewBigInt(b), nil // prints exactly; arithmetic on it fails the render
		}
		f, err := pyFloat(s)
		if err != nil {
			return jinja.Value{}, fmt.Errorf("%w: %s: number %s: %v", ErrBadChatRequest, path, s, err)
		}
		return jinja.NewFloat(f), nil
	case []any:
		items := make([]jinja.Value, len(v))
		for i, it := range v {
			x, err := toValue(it, fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return jinja.Value{}, err
			}
			items[i] = x
		}
		return jinja.NewList(items), nil
	case *object:
		d := jinja.NewDict()
		dict := d.AsDict()
		for _, k := range v.keys {
			x, err := toValue(v.val(k), path+"."+k)
			if err != nil {
				return jinja.Value{}, err
			}
			dict.Set(k, x)
		}
		return d, nil
	case jinja.Value:
		return v, nil
	}
	return jinja.Value{}, fmt.Errorf("%w: %s: unexpected value %T", ErrUnsupportedChat, path, v)
}

// continueFinal cuts the rendering after the final message's text, as transformers does for
// continue_final_message, so the model continues that message.
func continueFinal(rendered string, conv jinja.Value) (string, error) {
	msgs := conv.AsList()
	last := msgs.Items[len(msgs.Items)-1].AsDict()
	content, _ := last.Get("content")
	final := ""
	switch {
	case content.IsString():
		final = content.AsString()
	case content.IsList():
		found := false
		for i := content.AsList().Len() - 1; i >= 0; i-- {
			block := content.AsList().Get(i)
			if block.IsDict() {
				if t, ok := block.AsDict().Get("text"); ok && t.IsString() {
					final, found = t.AsString(), true
					break
				}
			}
		}
		if !found {
			return "", fmt.Errorf("%w: continue_final_message is set but the final message has no text to continue", ErrTemplate)
		}
	default:
		return "", fmt.Errorf("%w: continue_final_message: final message content is not text", ErrTemplate)
	}
	stripped := strings.TrimFunc(final, pyIsSpace)
	loc := strings.LastIndex(rendered, stripped)
	if loc < 0 {
		return "", fmt.Errorf("%w: continue_final_message is set but the final message does not appear in the rendered chat", ErrTemplate)
	}
	left := strings.TrimLeftFunc(final, pyIsSpace)
	if end := loc + len(left); end <= len(rendered) && rendered[loc:end] == final {
		return rendered[:end], nil
	}
	return rendered[:loc+len(stripped)], nil
}

// pyIsSpace is Python's str.isspace for one character.
func pyIsSpace(r rune) bool { return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f }

// chatTemplates caches each tokenizer's compiled templates: the gateway renders on every request.
var chatTemplates sync.Map // *Config → *chatTemplateOnce

type chatTemplateOnce struct {
	once sync.Once
	ct   *ChatTemplate
	err  error
}

// ChatTemplateFor returns the cached ChatTemplate (default ChatOptions) of a tokenizer config.
func ChatTemplateFor(cfg *Config) (*ChatTemplate, error) {
	e, _ := chatTemplates.LoadOrStore(cfg, &chatTemplateOnce{})
	o := e.(*chatTemplateOnce)
	o.once.Do(func() { o.ct, o.err = NewChatTemplate(cfg, ChatOptions{}) })
	return o.ct, o.err
}
