package tokenize

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// tinyJSON is a small SentencePiece-style tokenizer exercising byte fallback, unk fusing, merges,
// added tokens with lstrip/rstrip, a template post-processor and a decoder sequence.
const tinyJSON = `{
 "version": "1.0", "truncation": null, "padding": null,
 "added_tokens": [
  {"id": 7, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
  {"id": 8, "content": "[X]", "single_word": false, "lstrip": true, "rstrip": true, "normalized": false, "special": false},
  {"id": 9, "content": "w", "single_word": true, "lstrip": false, "rstrip": false, "normalized": false, "special": false}
 ],
 "normalizer": null,
 "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": false},
 "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
  "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "ab": 4, "abc": 5, "<0x64>": 6, "<s>": 7},
  "merges": ["a b", "ab c"]},
 "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
  "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [7], "tokens": ["<s>"]}}},
 "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}
}`

func tiny(t *testing.T) *Tokenizer {
	t.Helper()
	tk, err := FromBytes([]byte(tinyJSON), []byte(`{"model_max_length": 1e30, "chat_template": [{"name": "default", "template": "x"}, {"name": "tool_use", "template": "y"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestTinyEncode(t *testing.T) {
	tk := tiny(t)
	cases := []struct {
		text    string
		special bool
		want    []uint32
	}{
		{"abc ab", true, []uint32{7, 5, 4}},
		{"abc ab", false, []uint32{5, 4}},
		{"d", false, []uint32{6}},              // byte fallback <0x64>
		{"é", false, []uint32{0}},              // no <0xC3>: unk
		{"éé", false, []uint32{0}},             // fuse_unk
		{"aéb", false, []uint32{1, 0, 2}},      // unk between known chars
		{"ab [X] c", false, []uint32{4, 8, 3}}, // lstrip/rstrip take the spaces
		{"a<s>b", false, []uint32{1, 7, 2}},    // special tokens in text are tokens
		{"a w b", false, []uint32{1, 9, 2}},    // single_word: a word of its own
		{"awb", false, []uint32{1, 0, 2}},      // single_word inside a word: not matched (w is unk)
		{"", true, []uint32{7}},
	}
	for _, c := range cases {
		got, err := tk.Encode(c.text, c.special)
		if err != nil {
			t.Fatalf("%q: %v", c.text, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("Encode(%q, %t) = %v, want %v", c.text, c.special, got, c.want)
		}
	}
	if _, err := tk.Encode("a\xffb", false); !errors.Is(err, ErrInvalidUTF8) || !strings.Contains(err.Error(), "offset 1") {
		t.Errorf("invalid UTF-8: %v, want ErrInvalidUTF8 at byte offset 1", err)
	}
}

func TestTinyDecodeAndConfig(t *testing.T) {
	tk := tiny(t)
	for _, c := range []struct {
		ids  []uint32
		skip bool
		want string
	}{
		{[]uint32{7, 5, 4, 6}, true, "abcabd"},
		{[]uint32{7, 5, 4, 6}, false, "<s>abcabd"},
		{[]uint32{8, 1}, true, "[X]a"},
	} {
		got, err := tk.Decode(c.ids, c.skip)
		if err != nil || got != c.want {
			t.Errorf("Decode(%v, %t) = %q, %v; want %q", c.ids, c.skip, got, err, c.want)
		}
	}
	if _, err := tk.Decode([]uint32{1, 99}, false); err == nil || !strings.Contains(err.Error(), "ids[1] = 99") {
		t.Errorf("unknown id: %v, want an error naming ids[1] = 99", err)
	}
	if id, ok := tk.TokenID("abc"); !ok || id != 5 {
		t.Errorf("TokenID(abc) = %d, %t", id, ok)
	}
	if tk.VocabSize() != 10 {
		t.Errorf("VocabSize = %d, want 10", tk.VocabSize())
	}
	cfg := tk.Config()
	if cfg.ChatTemplate != "x" || cfg.ChatTemplates["tool_use"] != "y" || cfg.ModelMaxLength.String() != "1e30" {
		t.Errorf("config: %+v", cfg)
	}
	js, cs := tk.Files()
	if js != sha256Hex([]byte(tinyJSON)) || len(cs) != 64 {
		t.Errorf("Files() = %s, %s", js, cs)
	}
}

func TestSplitBehaviours(t *testing.T) {
	for _, c := range []struct {
		behavior int
		invert   bool
		want     string
	}{
		{behaviorRemoved, false, `["a" "b" "c"]`},
		{behaviorIsolated, false, `["a" "-" "b" "-" "-" "c"]`},
		{behaviorMergedWithPrevious, false, `["a-" "b-" "-" "c"]`},
		{behaviorMergedWithNext, false, `["a" "-b" "-" "-c"]`},
		{behaviorContiguous, false, `["a" "-" "b" "--" "c"]`},
		{behaviorRemoved, true, `["-" "-" "-"]`},
	} {
		var got []string
		(&splitStep{find: literalFinder{"-"}, behavior: c.behavior, invert: c.invert}).split("a-b--c", nil, func(s string) { got = append(got, s) })
		if fmt.Sprintf("%q", got) != c.want {
			t.Errorf("behaviour %d invert %t: %q, want %s", c.behavior, c.invert, got, c.want)
		}
	}
}

// TestLoadErrorsNameTheComponent: anything outside the supported subset is refused at load with
// its JSON path and type.
func TestLoadErrorsNameTheComponent(t *testing.T) {
	for _, c := range []struct {
		from, to, want string
	}{
		{`"normalizer": null`, `"normalizer": {"type": "Lowercase"}`, `tokenizer.json: $.normalizer.type "Lowercase" is not supported`},
		{`"normalizer": null`, `"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Precompiled"}]}`, `$.normalizer.normalizers[1].type "Precompiled" is not supported`},
		{`"pre_tokenizer": {"type": "Split"`, `"pre_tokenizer": {"type": "Metaspace"`, `$.pre_tokenizer.type "Metaspace" is not supported`},
		{`"behavior": "Removed"`, `"behavior": "Sideways"`, `$.pre_tokenizer.behavior: "Sideways" is not supported`},
		{`"model": {"type": "BPE"`, `"model": {"type": "WordPiece"`, `$.model.type "WordPiece" is not supported`},
		{`"post_processor": {"type": "TemplateProcessing"`, `"post_processor": {"type": "Fancy"`, `$.post_processor.type "Fancy" is not supported`},
		{`{"type": "Fuse"}`, `{"type": "Metaspace"}`, `$.decoder.decoders[1].type "Metaspace" is not supported`},
		{`"merges": ["a b", "ab c"]`, `"merges": ["a b", "ab z"]`, `$.model.merges[1]`},
		{`"dropout": null`, `"dropout": 0.1`, `$.model.dropout`},
		{`"truncation": null`, `"truncation": {"max_length": 5}`, `$.truncation`},
		{`"unk_token": "<unk>"`, `"unk_token": "<nope>"`, `$.model.unk_token`},
	} {
		js := strings.Replace(tinyJSON, c.from, c.to, 1)
		if js == tinyJSON {
			t.Fatalf("fixture has no %q", c.from)
		}
		_, err := FromBytes([]byte(js), []byte(`{}`))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("with %s: error %v, want it to contain %q", c.to, err, c.want)
		}
	}
	for _, c := range []struct{ cfg, want string }{
		{`{"add_bos_token": true}`, "$.add_bos_token is true but $.bos_token is not set"},
		{`{"add_bos_token": true, "bos_token": "<q>"}`, `$.bos_token "<q>" is not in the vocabulary`},
		{`{"add_bos_token": "yes"}`, "$.add_bos_token"},
		{`{"chat_template": 5}`, "$.chat_template"},
		{`{"chat_template": [{"name": "x"}]}`, `$.chat_template[0]`},
		{`[1]`, "tokenizer_config.json"},
	} {
		_, err := FromBytes([]byte(tinyJSON), []byte(c.cfg))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("config %s: error %v, want it to contain %q", c.cfg, err, c.want)
		}
	}
}

// TestBOSRule: transformers' add_bos_token/add_eos_token replace the tokenizer.json
// post-processor (the DeepSeek V3 trap).
func TestBOSRule(t *testing.T) {
	noPost := strings.Replace(tinyJSON, `"post_processor": {"type": "TemplateProcessing"`, `"post_processor": {"type": "ByteLevel", "x": {"type": "TemplateProcessing"`, 1)
	noPost = strings.Replace(noPost, `"tokens": ["<s>"]}}},`, `"tokens": ["<s>"]}}}},`, 1)
	for _, c := range []struct {
		json, cfg string
		want      string
	}{
		{noPost, `{}`, "[5]"},
		{noPost, `{"add_bos_token": true, "bos_token": {"__type": "AddedToken", "content": "<s>", "normalized": true}}`, "[7 5]"},
		{noPost, `{"add_bos_token": false, "add_eos_token": true, "eos_token": "a"}`, "[5 1]"},
		{tinyJSON, `{"add_bos_token": false}`, "[5]"}, // the template's BOS is replaced away
	} {
		tk, err := FromBytes([]byte(c.json), []byte(c.cfg))
		if err != nil {
			t.Fatalf("%s: %v", c.cfg, err)
		}
		got, _ := tk.Encode("abc", true)
		if fmt.Sprint(got) != c.want {
			t.Errorf("config %s: %v, want %s", c.cfg, got, c.want)
		}
	}
}
