package ctk

import (
	"encoding/json"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

// Probe is one corpus text, named by what it exercises (the name appears in failure messages).
type Probe struct {
	Name string
	Text string
}

// baseCorpus covers the places tokenizers disagree: pre-tokenizer splits (prose, code, whitespace
// runs, digit grouping), byte fallback and merges (CJK, emoji with ZWJ and modifiers), Unicode
// normalization, and text that only looks like a special token.
var baseCorpus = []Probe{
	{"prose", "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times."},
	{"code-go", "func main() {\n\tfmt.Println(\"hello, world\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i\n\t}\n}\n"},
	{"code-python", "def f(x):\n    if x:\n        return [y ** 2 for y in range(x)]  # squares\n    return None\n"},
	{"whitespace-runs", "a  b   c\t\td\n\n\ne    \n  f \u00a0g\r\nh"},
	{"leading-trailing-space", "   leading and trailing   "},
	{"digits", "3.14159265358979 1234567890 007 1,000,000 2026-08-22 12:34:56 0x1F 1e-9"},
	{"cjk", "日本語のテキストと中文文本，还有한국어 문장도 있습니다。"},
	{"emoji", "🙂👍🏽 family: 👨‍👩‍👧‍👦 flags 🇯🇵🇩🇪 ✈️ ❤️‍🔥"},
	{"accents-nfc-nfd", "café cafe\u0301 naïve coöperate Ångström ﬁ ligature Straße"},
	{"special-look-alikes", "< |begin_of_text| > <|not_a_token|> <s > </ s> [INST ] <unk > <|im_start |>"},
	{"url-and-punctuation", "https://example.com/path?q=1&r=2#frag — e-mail: a.b@c.de; «quotes» “curly” ‘single’…"},
	{"repeated", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!!!!!!!!!!!!??????"},
	{"markdown", "# Title\n\n- item one\n- item **two**\n\n```json\n{\"k\": [1, 2, 3]}\n```\n"},
	{"mixed-scripts", "Привет мир! Γειά σου κόσμε! مرحبا بالعالم! שלום עולם! नमस्ते दुनिया!"},
}

// Corpus is the built-in tokenizer probe corpus for a tokenizer: the base texts plus texts
// holding the model's real special tokens (BOS, EOS, and the added special tokens the chat
// template writes), which engines must match as single tokens.
func Corpus(tok *tokenize.Tokenizer) []Probe {
	out := append([]Probe(nil), baseCorpus...)
	cfg := tok.Config()
	var specials []string
	if cfg != nil {
		if cfg.BOSToken != nil && cfg.BOSToken.Content != "" {
			specials = append(specials, cfg.BOSToken.Content)
		}
		if cfg.EOSToken != nil && cfg.EOSToken.Content != "" {
			specials = append(specials, cfg.EOSToken.Content)
		}
	}
	// Chat markers common to the reference models, kept when this vocabulary has them as tokens.
	for _, s := range []string{"<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "[INST]", "[/INST]", "<|end|>", "<|start|>", "<|message|>"} {
		if _, ok := tok.TokenID(s); ok {
			specials = append(specials, s)
		}
	}
	if len(specials) > 0 {
		text := ""
		for i, s := range specials {
			if i > 0 {
				text += " text between "
			}
			text += s
		}
		out = append(out, Probe{"real-special-tokens", text + " trailing"})
	}
	return out
}

// conversations are the chat-template probes: a system prompt, multi-turn history, and content
// with whitespace and non-Latin text the template must pass through unchanged.
var conversations = []struct {
	Name     string
	Messages []map[string]string
}{
	{"system-and-user", []map[string]string{
		{"role": "system", "content": "You are a concise assistant."},
		{"role": "user", "content": "What is the capital of France?"},
	}},
	{"multi-turn", []map[string]string{
		{"role": "user", "content": "Hello!"},
		{"role": "assistant", "content": "Hi there. How can I help?"},
		{"role": "user", "content": "Write a haiku about caches."},
	}},
	{"unicode-and-whitespace", []map[string]string{
		{"role": "user", "content": "  日本語 and emoji 🙂\n\n  indented line\ttab  "},
	}},
}

// chatBody is the JSON request body of one probe conversation.
func chatBody(model string, msgs []map[string]string) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "add_generation_prompt": true})
	return b
}
