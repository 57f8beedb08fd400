package ctk

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

// Probe is one corpus text, named by what it exercises (the name appears in failure messages).
type Probe struct {
	Name string
	Text string
	// Added are the added tokens the text exercises (none for the fixed texts).
	Added []tokenize.AddedToken
	// Parts are the probes a grouped text joins (grouped), probed one by one where the group
	// cannot stand for them.
	Parts []Probe
}

// baseCorpus covers the places tokenizers disagree: pre-tokenizer splits (prose, code, whitespace
// runs, digit grouping), byte fallback and merges (CJK, emoji with ZWJ and modifiers), Unicode
// normalization, and text that only looks like a special token.
var baseCorpus = []Probe{
	{Name: "prose", Text: "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times."},
	{Name: "code-go", Text: "func main() {\n\tfmt.Println(\"hello, world\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i\n\t}\n}\n"},
	{Name: "code-python", Text: "def f(x):\n    if x:\n        return [y ** 2 for y in range(x)]  # squares\n    return None\n"},
	{Name: "whitespace-runs", Text: "a  b   c\t\td\n\n\ne    \n  f \u00a0g\r\nh"},
	{Name: "leading-trailing-space", Text: "   leading and trailing   "},
	{Name: "digits", Text: "3.14159265358979 1234567890 007 1,000,000 2026-08-22 12:34:56 0x1F 1e-9"},
	{Name: "cjk", Text: "日本語のテキストと中文文本，还有한국어 문장도 있습니다。"},
	{Name: "emoji", Text: "🙂👍🏽 family: 👨‍👩‍👧‍👦 flags 🇯🇵🇩🇪 ✈️ ❤️‍🔥"},
	{Name: "accents-nfc-nfd", Text: "café cafe\u0301 naïve coöperate Ångström ﬁ ligature Straße"},
	{Name: "special-look-alikes", Text: "< |begin_of_text| > <|not_a_token|> <s > </ s> [INST ] <unk > <|im_start |>"},
	{Name: "url-and-punctuation", Text: "https://example.com/path?q=1&r=2#frag — e-mail: a.b@c.de; «quotes» “curly” ‘single’…"},
	{Name: "repeated", Text: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!!!!!!!!!!!!??????"},
	{Name: "markdown", Text: "# Title\n\n- item one\n- item **two**\n\n```json\n{\"k\": [1, 2, 3]}\n```\n"},
	{Name: "mixed-scripts", Text: "Привет мир! Γειά σου κόσμε! مرحبا بالعالم! שלום עולם! नमस्ते दुनिया!"},
}

// Corpus is the tokenizer probe corpus for a staged tokenizer: the base texts, then every added
// and special token of the tokenizer (reserved ones included) alone and glued to text on both
// sides — an engine whose tokenizer lacks or renames one splits it into ordinary tokens — and a
// text holding BOS, EOS and the chat markers between words.
func Corpus(tok *tokenize.Tokenizer) []Probe {
	out := append([]Probe(nil), baseCorpus...)
	for _, a := range tok.AddedTokens() {
		at := []tokenize.AddedToken{a}
		out = append(out,
			Probe{Name: fmt.Sprintf("added-token %d %q alone", a.ID, a.Content), Text: a.Content, Added: at},
			Probe{Name: fmt.Sprintf("added-token %d %q glued", a.ID, a.Content), Text: "word" + a.Content + "next", Added: at})
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
		out = append(out, Probe{Name: "real-special-tokens", Text: text + " trailing"})
	}
	return out
}

// grouped joins runs of up to n added-token probes into one text (newline-separated): for engines
// where each probe costs a completion and an event round trip (TensorRT-LLM), and for an
// admission, whose probe costs the serving engine requests; other probes stay.
func grouped(probes []Probe, n int) []Probe {
	var out []Probe
	var run []Probe
	flush := func() {
		if len(run) == 0 {
			return
		}
		texts := make([]string, len(run))
		var added []tokenize.AddedToken
		for i, p := range run {
			texts[i] = p.Text
			for _, a := range p.Added {
				if !slices.Contains(added, a) {
					added = append(added, a)
				}
			}
		}
		out = append(out, Probe{Name: fmt.Sprintf("%s … %s (%d added-token probes)", run[0].Name, run[len(run)-1].Name, len(run)),
			Text: strings.Join(texts, "\n"), Added: added, Parts: slices.Clone(run)})
		run = run[:0]
	}
	for _, p := range probes {
		if len(p.Added) == 0 {
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

// pins reports whether a grouped probe's text stands for its parts under tok: each added token
// comes out of the joined text (without special tokens added) as many times as out of its parts
// one by one. The group's ids are then its parts' tokens in order, so an engine that lacks,
// renumbers or splits an added token, or strips the text around it otherwise, gives other ids
// for the group. A token that merges with the newline between parts (an added token made of
// whitespace, say) does not pin: its parts are probed alone.
func pins(tok *tokenize.Tokenizer, p Probe) (bool, error) {
	count := func(text string) (map[uint32]int, error) {
		ids, err := tok.Encode(text, false)
		if err != nil {
			return nil, err
		}
		n := map[uint32]int{}
		for _, id := range ids {
			n[id]++
		}
		return n, nil
	}
	whole, err := count(p.Text)
	if err != nil {
		return false, err
	}
	want := map[uint32]int{}
	for _, part := range p.Parts {
		n, err := count(part.Text)
		if err != nil {
			return false, err
		}
		for _, a := range part.Added {
			want[a.ID] += n[a.ID]
		}
	}
	for _, a := range p.Added {
		if want[a.ID] == 0 || whole[a.ID] != want[a.ID] {
			return false, nil
		}
	}
	return true, nil
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
