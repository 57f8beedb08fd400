package tokenize

import "testing"

func TestAddedTokensListsEveryAddedToken(t *testing.T) {
	dir, err := FindModelDir(DefaultRoots(), "llama3")
	if err != nil {
		t.Skipf("llama3 tokenizer not available: %v", err)
	}
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := tok.AddedTokens()
	if len(got) != 256 {
		t.Fatalf("%d added tokens, llama3 has 256 (BOS, EOS, headers, reserved)", len(got))
	}
	for i, a := range got {
		if i > 0 && a.ID <= got[i-1].ID {
			t.Fatalf("not in id order at %d", i)
		}
		if id, ok := tok.TokenID(a.Content); !ok || id != a.ID || !a.Special {
			t.Fatalf("%+v: TokenID %d %v", a, id, ok)
		}
	}
	if got[0].Content != "<|begin_of_text|>" {
		t.Fatalf("first added token %q", got[0].Content)
	}
}
