package tokenize

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func mustTemplate(t *testing.T, src string, opts ChatOptions) *ChatTemplate {
	t.Helper()
	ct, err := NewChatTemplate(&Config{ChatTemplate: src, ChatTemplates: map[string]string{"default": src}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	return ct
}

func render(t *testing.T, ct *ChatTemplate, body string) (string, error) {
	t.Helper()
	req, err := ParseChatRequest([]byte(body))
	if err != nil {
		t.Fatalf("parse %s: %v", body, err)
	}
	return ct.Render(req)
}

// Python's json.dumps / str() output for the numbers a client writes (tokenization.md §4.3).
func TestRenderPythonNumbers(t *testing.T) {
	ct := mustTemplate(t, `{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments|tojson }}|{{ c.function.arguments.a }}{% endfor %}{% endfor %}`, ChatOptions{})
	for _, tc := range []struct{ lit, json, str string }{
		{"1.0", "1.0", "1.0"}, {"1e3", "1000.0", "1000.0"}, {"1e-07", "1e-07", "1e-07"}, {"1E-7", "1e-07", "1e-07"},
		{"10", "10", "10"}, {"-0", "0", "0"}, {"9223372036854775807", "9223372036854775807", "9223372036854775807"},
		{"0.1", "0.1", "0.1"}, {"1e16", "1e+16", "1e+16"}, {"true", "true", "True"}, {"null", "null", "None"},
		{"12345678901234567890", "12345678901234567890", "12345678901234567890"}, {"-0.0", "-0.0", "-0.0"},
		{"-98765432109876543210987", "-98765432109876543210987", "-98765432109876543210987"},
	} {
		args := `{\"a\": ` + tc.lit + `, \"b\": \"x\"}`
		body := `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"` + args + `"}}]}],"add_generation_prompt":false}`
		got, err := render(t, ct, body)
		if err != nil {
			t.Fatalf("%s: %v", tc.lit, err)
		}
		if want := `{"a": ` + tc.json + `, "b": "x"}|` + tc.str; got != want {
			t.Errorf("%s: got %q, want %q", tc.lit, got, want)
		}
	}
	// Arithmetic or ordering on an integer beyond int64 fails the render: refused, not guessed.
	calc := mustTemplate(t, `{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments.a + 1 }}{{ [c.function.arguments.a]|sort }}{% endfor %}{% endfor %}`, ChatOptions{})
	body := `{"messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{\"a\": 12345678901234567890}"}}]}],"add_generation_prompt":false}`
	if _, err := render(t, calc, body); !errors.Is(err, ErrTemplate) {
		t.Errorf("arithmetic on a big integer: want ErrTemplate, got %v", err)
	}
}

func TestRenderKeyOrderAndTools(t *testing.T) {
	ct := mustTemplate(t, `{{ tools|tojson }}`, ChatOptions{})
	got, err := render(t, ct, `{"messages":[{"role":"user","content":"x"}],"tools":[{"function":{"strict":true,"name":"f","parameters":{"z":1,"a":2}},"type":"function"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"type": "function", "function": {"name": "f", "description": null, "parameters": {"z": 1, "a": 2}, "strict": true}}]`
	if got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
	got, err = render(t, ct, `{"messages":[{"role":"user","content":"x"}]}`)
	if err != nil || got != "null" {
		t.Errorf("no tools: got %q, %v", got, err)
	}
}

func TestRenderKwargsAndFlags(t *testing.T) {
	ct := mustTemplate(t, `{{ add_generation_prompt }} {{ enable_thinking }} {{ reasoning_effort }} {{ documents }} {{ bos_token }}`, ChatOptions{})
	for body, want := range map[string]string{
		`{"messages":[]}`: "", // empty messages: refused
		`{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"enable_thinking":false,"add_generation_prompt":false}}`: "True False  None ",
		`{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"none"}`:                                                      "True False none None ",
		`{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"documents":[{"t":"a"}],"bos_token":"B"}}`:               "True   [{'t': 'a'}] B",
	} {
		got, err := render(t, ct, body)
		if want == "" {
			if !errors.Is(err, ErrUnsupportedChat) {
				t.Errorf("%s: want ErrUnsupportedChat, got %v", body, err)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("%s: got %q, %v; want %q", body, got, err, want)
		}
	}
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"tokenize":true}}`,
		`{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"messages":[]}}`,
	} {
		if _, err := render(t, ct, body); !errors.Is(err, ErrBadChatRequest) {
			t.Errorf("%s: want ErrBadChatRequest, got %v", body, err)
		}
	}
}

func TestRenderContinueFinalMessage(t *testing.T) {
	ct := mustTemplate(t, `{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</s>{% endfor %}`, ChatOptions{})
	got, err := render(t, ct, `{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"The answer is "}],"add_generation_prompt":false,"continue_final_message":true}`)
	if err != nil || got != "<user>hi</s><assistant>The answer is" {
		t.Errorf("got %q, %v", got, err)
	}
	if _, err := ParseChatRequest([]byte(`{"messages":[{"role":"user","content":"x"}],"continue_final_message":true}`)); !errors.Is(err, ErrBadChatRequest) {
		t.Errorf("continue_final_message with add_generation_prompt: want ErrBadChatRequest, got %v", err)
	}
}

func TestRenderContentParts(t *testing.T) {
	str := mustTemplate(t, `{% for m in messages %}[{{ m.content }}]{% endfor %}`, ChatOptions{})
	oai := mustTemplate(t, `{% for m in messages %}{% for p in m['content'] %}({{ p.text }}){% endfor %}{% endfor %}`, ChatOptions{})
	body := `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":""},{"type":"text","text":null},"b"]},{"role":"assistant","content":null}],"add_generation_prompt":false}`
	if got, err := render(t, str, body); err != nil || got != "[a\nb][]" {
		t.Errorf("string format: got %q, %v", got, err)
	}
	if got, err := render(t, oai, body); err != nil || got != "(a)()(b)" {
		t.Errorf("openai format: got %q, %v", got, err)
	}
	img := `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`
	if _, err := render(t, str, img); !errors.Is(err, ErrUnsupportedChat) {
		t.Errorf("image part: want ErrUnsupportedChat, got %v", err)
	}
	bad := `{"messages":[{"role":"user","content":[{"type":"nonsense"}]}]}`
	if _, err := render(t, str, bad); !errors.Is(err, ErrBadChatRequest) {
		t.Errorf("unknown part: want ErrBadChatRequest, got %v", err)
	}
}

func TestRenderToolMessages(t *testing.T) {
	ct := mustTemplate(t, `{% for m in messages %}{{ m|tojson }}
{% endfor %}`, ChatOptions{})
	got, err := render(t, ct, `{"messages":[
	 {"role":"assistant","reasoning_content":"think","content":"c","tool_calls":[]},
	 {"role":"assistant","content":"c","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"[1]"}}],"name":"bot"},
	 {"role":"tool","content":[{"type":"text","text":"r1"},{"type":"text","text":"r2"}],"tool_call_id":"1"}],"add_generation_prompt":false}`)
	want := `{"role": "assistant", "content": "c", "reasoning": "think", "reasoning_content": "think"}
{"role": "assistant", "content": "c", "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": {}}}], "name": "bot"}
{"role": "tool", "content": "r1\nr2", "tool_call_id": "1"}
`
	if err != nil || got != want {
		t.Errorf("got %s, %v\nwant %s", got, err, want)
	}
}

func TestRenderTemplateSelection(t *testing.T) {
	cfg := &Config{ChatTemplates: map[string]string{"default": "D", "tool_use": "T"}, ChatTemplate: "D"}
	ct, err := NewChatTemplate(cfg, ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for body, want := range map[string]string{
		`{"messages":[{"role":"user","content":"x"}]}`:                                                       "D",
		`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`: "T",
	} {
		if got, err := render(t, ct, body); err != nil || got != want {
			t.Errorf("%s: got %q, %v; want %q", body, got, err, want)
		}
	}
	if _, err := render(t, ct, `{"messages":[{"role":"user","content":"x"}],"chat_template":"X"}`); !errors.Is(err, ErrUnsupportedChat) {
		t.Errorf("untrusted request template: want ErrUnsupportedChat, got %v", err)
	}
	trusted, _ := NewChatTemplate(cfg, ChatOptions{TrustRequestChatTemplate: true})
	if got, err := render(t, trusted, `{"messages":[{"role":"user","content":"x"}],"chat_template":"X{{ 1 }}"}`); err != nil || got != "X1" {
		t.Errorf("trusted request template: got %q, %v", got, err)
	}
	for _, c := range []struct {
		cfg  *Config
		opts ChatOptions
	}{
		{&Config{}, ChatOptions{}},
		{cfg, ChatOptions{TokenizerMode: "mistral"}},
		{&Config{ChatTemplate: "x", ChatTemplates: map[string]string{"default": "x"}, Raw: map[string]json.RawMessage{"added_tokens_decoder": json.RawMessage(`{"200005":{"content":"<|channel|>"}}`)}}, ChatOptions{}},
	} {
		ct, err := NewChatTemplate(c.cfg, c.opts)
		if err != nil {
			t.Fatal(err)
		}
		_, err = render(t, ct, `{"messages":[{"role":"user","content":"x"}]}`)
		if !errors.Is(err, ErrNoJinjaPath) {
			t.Errorf("%+v: want ErrNoJinjaPath, got %v", c.opts, err)
		}
	}
	broken := mustTemplate(t, `{{ raise_exception('nope') }}`, ChatOptions{})
	if _, err := render(t, broken, `{"messages":[{"role":"user","content":"x"}]}`); !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), "nope") {
		t.Errorf("raise_exception: got %v", err)
	}
}

func TestParseChatRequestErrors(t *testing.T) {
	for body, field := range map[string]string{
		``:                               "offset",
		`[]`:                             "body",
		`{}`:                             "messages",
		`{"messages":{}}`:                "messages",
		`{"messages":[1]}`:               "messages[0]",
		`{"messages":[{"content":"x"}]}`: "messages[0].role",
		`{"messages":[{"role":1}]}`:      "messages[0].role",
		`{"messages":[{"role":"user","content":5}]}`:                                 "messages[0].content",
		`{"messages":[{"role":"user","content":[5]}]}`:                               "messages[0].content[0]",
		`{"messages":[{"role":"user"}],"add_generation_prompt":"yes"}`:               "add_generation_prompt",
		`{"messages":[{"role":"user"}],"tools":[]}`:                                  "tools",
		`{"messages":[{"role":"user"}],"tools":[{"type":"function","function":{}}]}`: "tools[0].function.name",
		`{"messages":[{"role":"user"}],"chat_template_kwargs":[]}`:                   "chat_template_kwargs",
		`{"messages":[{"role":"user"}]} x`:                                           "offset",
		`{"messages":[{"role":"user","content":"x}]}`:                                "offset",
	} {
		_, err := ParseChatRequest([]byte(body))
		if !errors.Is(err, ErrBadChatRequest) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: want ErrBadChatRequest naming %q, got %v", body, field, err)
		}
	}
	r, err := ParseChatRequest([]byte(`{"messages":[{"role":"user","content":"x"}]}`))
	if err != nil || !r.AddGenerationPrompt || r.AddSpecialTokens || r.ContinueFinal {
		t.Errorf("defaults: %+v, %v", r, err)
	}
}

// Whitespace control must match jinja2 (trim_blocks, lstrip_blocks, "-" flags); expectations are
// jinja2 3.1.6 renderings with x = [1, 2].
func TestRenderWhitespaceLikeJinja2(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"{% for m in x %}{{ m }}\n{% endfor %}", "1\n2\n"},
		{"{% for m in x %}{{ m }}\n  {% endfor %}", "1\n2\n"},
		{"{% for m in x %}{{ m }}\n\n{% endfor %}", "1\n\n2\n\n"},
		{"a\n{% if true %}b{% endif %}", "a\nb"},
		{"{% for m in x %}{{ m }}\nz{% endfor %}", "1\nz2\nz"},
		{"{% for m in x %}{{ m }}\n{{ '' }}{% endfor %}", "1\n2\n"},
		{"a \n{{ 1 }}{%- if true %}b{% endif %}", "a \n1b"},
		{"x  {% if true %}{%- endif %}y", "x  y"},
		{"{% for m in x -%}\n  {{ m }}  {#- c #}\n{% endfor %}", "12"},
		{"  {% if true %}\n{{ 1 -}}\n{% endif %}\n", "1"},
		{"{% raw %}{{ a }}\n{% endraw %}\nq{# c #}\nz", "{{ a }}\nqz"},
	} {
		ct := mustTemplate(t, c.src, ChatOptions{})
		req, err := ParseChatRequest([]byte(`{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"x":[1,2]}}`))
		if err != nil {
			t.Fatal(err)
		}
		got, err := ct.Render(req)
		if err != nil || got != c.want {
			t.Errorf("%q: got %q, %v; want %q", c.src, got, err, c.want)
		}
	}
}
