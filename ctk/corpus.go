package ctk

import (
	"encoding/json"
	"fmt"
	"strings"

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

// Corpus is the tokenizer probe corpus for a staged tokenizer: the base texts, then every added
// and special token of the tokenizer (reserved ones included) alone and glued to text on both
// sides — an engine whose tokenizer lacks or renames one splits it into ordinary tokens — and a
// text holding BOS, EOS and the chat markers between words.
func Corpus(tok *tokenize.Tokenizer) []Probe {
	out := append([]Probe(nil), baseCorpus...)
	for _, a := range tok.AddedTokens() {
		out = append(out,
			Probe{fmt.Sprintf("added-token %d %q alone", a.ID, a.Content), a.Content},
			Probe{fmt.Sprintf("added-token %d %q glued", a.ID, a.Content), "word" + a.Content + "next"})
	}
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

// grouped joins runs of up to n added-token probes into one text (newline-separated), for engines
// where each probe costs a completion and an event round trip (TensorRT-LLM); other probes stay.
func grouped(probes []Probe, n int) []Probe {
	var out []Probe
	var run []Probe
	flush := func() {
		if len(run) == 0 {
			return
		}
		texts := make([]string, len(run))
		for i, p := range run {
			texts[i] = p.Text
		}
		out = append(out, Probe{fmt.Sprintf("%s … %s (%d added-token probes)", run[0].Name, run[len(run)-1].Name, len(run)), strings.Join(texts, "\n")})
		run = run[:0]
	}
	for _, p := range probes {
		if !strings.HasPrefix(p.Name, "added-token ") {
			flush()
			out = append(out, p)
			continue
		}
		run = append(run, p)
		if len(run) == n {
			flush()
		}
	}
	flush()
	return out
}

// addedTokenConversations puts every added token inside a chat message: one user message per
// token, up to perConversation messages per conversation.
func addedTokenConversations(tok *tokenize.Tokenizer, perConversation int) []conversation {
	var out []conversation
	var cur conversation
	for _, a := range tok.AddedTokens() {
		if len(cur.Messages) == 0 {
			cur.Name = fmt.Sprintf("added tokens from %d %q", a.ID, a.Content)
		}
		cur.Messages = append(cur.Messages, map[string]string{"role": "user", "content": "Say " + a.Content + " back."})
		if len(cur.Messages) == perConversation {
			out = append(out, cur)
			cur = conversation{}
		}
	}
	if len(cur.Messages) > 0 {
		out = append(out, cur)
	}
	return out
}

// conversation is one chat-template probe.
type conversation struct {
	Name     string
	Messages []map[string]string
}

// conversations are the chat-template probes: a system prompt, multi-turn history, and content
// with whitespace and non-Latin text the template must pass through unchanged.
var conversations = []conversation{
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
