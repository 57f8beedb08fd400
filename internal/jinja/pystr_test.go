package jinja

import (
	"math/big"
	"testing"
)

// Expected outputs are Python jinja2 3.1's (ImmutableSandboxedEnvironment, CPython 3.11), recorded
// once; gateway/tokenize's differential harness checks thousands of fresh inputs against the live
// oracle.
func TestPythonStringSemantics(t *testing.T) {
	for _, tc := range []struct {
		tmpl string
		vars map[string]Value
		want string
	}{
		{"{{ s|trim }}", map[string]Value{"s": NewString("\x1c\x1d a \x1e\x1f\u0085\u3000")}, "a"},
		{"{{ s|upper }}", map[string]Value{"s": NewString("straße ﬁle ŉ ΐ")}, "STRASSE FILE \u02bcN \u0399\u0308\u0301"},
		{"{{ s|lower }}", map[string]Value{"s": NewString("ΌΣΟΣ ΑΣ. İ")}, "όσος ας. i̇"},
		{"{{ s|title }}", map[string]Value{"s": NewString("they're snake_case x-ray(ab [cd ß")}, "They're Snake_case X-Ray(Ab [Cd SS"},
		{"{{ s.title() }}", map[string]Value{"s": NewString("they're snake_case e\u0301x ǆemal ﬁle")}, "They'Re Snake_Case E\u0301X ǅemal File"},
		{"{{ s|capitalize }}", map[string]Value{"s": NewString("ǆemal ΣΑΣ")}, "ǅemal σας"},
		{"{{ s|center(9) }}", map[string]Value{"s": NewString("ab")}, "    ab   "},
		{"{{ s|center(8) }}", map[string]Value{"s": NewString("abc")}, "  abc   "},
		{"{{ s|truncate(9) }}", map[string]Value{"s": NewString("hello wonderful world")}, "hello..."},
		{"{{ s|truncate(9, true) }}", map[string]Value{"s": NewString("hello wonderful world")}, "hello ..."},
		{"{{ '%s|%5d|%-4s|%r|%x|%.2f'|format(s, 42, 'a', s, 255, 3.14159) }}", map[string]Value{"s": NewString("x\u00a0y")}, "x\u00a0y|   42|a   |'x\\xa0y'|ff|3.14"},
		{"{{ '%(a)s=%(b)d'|format(a='k', b=7) }}", nil, "k=7"},
		{"{{ [s] }}", map[string]Value{"s": NewString("\u200b\u2028 \u0085")}, `['\u200b\u2028 \x85']`},
		{"{{ x }}|{{ x|tojson }}|{{ x is integer }}|{{ x == x }}|{{ '%d'|format(x) }}", map[string]Value{"x": bigLit("-123456789012345678901234")},
			"-123456789012345678901234|-123456789012345678901234|True|True|-123456789012345678901234"},
		{"{{ true is number }}", nil, "True"},
	} {
		tm, err := Compile(tc.tmpl)
		if err != nil {
			t.Fatalf("%s: %v", tc.tmpl, err)
		}
		got, err := tm.RenderValues(tc.vars)
		if err != nil || got != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.tmpl, got, err, tc.want)
		}
	}
	for _, tmpl := range []string{"{{ x + 1 }}", "{{ x > 0 }}", "{{ -x }}", "{{ [x, 1]|sort }}", "{{ x|int }}", "{{ x|abs }}", "{{ [x]|sum }}"} {
		tm, _ := Compile(tmpl)
		if out, err := tm.RenderValues(map[string]Value{"x": bigLit("99999999999999999999")}); err == nil {
			t.Errorf("%s on a big integer rendered %q; want an error", tmpl, out)
		}
	}
}

func bigLit(s string) Value {
	n, ok := new(big.Int).SetString(s, 10)
	if !ok {
		panic(s)
	}
	return NewBigInt(n)
}
