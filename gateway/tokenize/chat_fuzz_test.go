package tokenize

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseChatRequest: no panic; every rejection is ErrBadChatRequest naming a field or offset; an
// accepted request renders or fails with one of the typed errors.
func FuzzParseChatRequest(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"Hello!"}],"add_generation_prompt":true}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\": 1.0}"}}]}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"chat_template_kwargs":{"enable_thinking":false}}`,
		`{"messages":[],"documents":[{"title":"t"}]}`, `[1,2`, `{"messages":"x"}`,
	} {
		f.Add([]byte(s))
	}
	ct, err := NewChatTemplate(&Config{ChatTemplate: "x", ChatTemplates: map[string]string{"default": `{% for m in messages %}{{ m|tojson }}{% endfor %}{{ tools|tojson }}`}}, ChatOptions{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := ParseChatRequest(body)
		if err != nil {
			if !errors.Is(err, ErrBadChatRequest) || !strings.Contains(err.Error(), ": ") {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if _, err := ct.Render(req); err != nil && !errors.Is(err, ErrBadChatRequest) && !errors.Is(err, ErrUnsupportedChat) && !errors.Is(err, ErrTemplate) {
			t.Fatalf("untyped render error %v", err)
		}
	})
}
