package tokenize

import (
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// FuzzEncode: no input (valid UTF-8 or not) panics any reference tokenizer; invalid UTF-8 is an
// error; for byte-level models, decode(encode(x)) == x when x is valid UTF-8 in the model's normal
// form (NFC for qwen3).
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", " ", "Hello, world!", "I'm 'ſ ĺ\r\n\t  x", "<|begin_of_text|><|im_start|>", "\xff\xfe", "漢字 😀👍🏽 ١٢٣", "<｜User｜>hi", "e\u0301"} {
		f.Add(s)
	}
	var toks []*Tokenizer
	var names []string
	for _, m := range refModels {
		dir, err := FindModelDir(DefaultRoots(), m)
		if err != nil {
			continue
		}
		tk, err := Load(dir)
		if err != nil {
			f.Fatalf("%s: %v", m, err)
		}
		toks, names = append(toks, tk), append(names, m)
	}
	if len(toks) == 0 {
		f.Skip("no reference tokenizer found (run `make tokenizers`)")
	}
	f.Fuzz(func(t *testing.T, s string) {
		for i, tk := range toks {
			ids, err := tk.Encode(s, true)
			if !utf8.ValidString(s) {
				if err == nil {
					t.Fatalf("%s: invalid UTF-8 %q encoded without error", names[i], s)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %q: %v", names[i], s, err)
			}
			if _, err := tk.Decode(ids, false); err != nil {
				t.Fatalf("%s: decode of own ids: %v", names[i], err)
			}
			if _, isBL := tk.decoder.(byteLevelDecoder); !isBL {
				continue
			}
			if _, isNFC := tk.normalizer.(nfcNormalizer); isNFC && !norm.NFC.IsNormalString(s) {
				continue
			}
			ids, _ = tk.Encode(s, false)
			back, err := tk.Decode(ids, false)
			if err != nil || back != s {
				t.Fatalf("%s: decode(encode(%q)) = %q, %v", names[i], s, back, err)
			}
		}
	})
}
