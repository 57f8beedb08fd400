package tokenize

import "testing"

func TestDetectContentFormat(t *testing.T) {
	for src, want := range map[string]ContentFormat{
		`{% for m in messages %}{{ m.content }}{% endfor %}`:                                                                                                              ContentString,
		`{% for m in messages %}{% for c in m['content'] %}{{ c.text }}{% endfor %}{% endfor %}`:                                                                          ContentOpenAI,
		`{% for m in messages %}{% for c in m.content %}{% endfor %}{% endfor %}`:                                                                                         ContentOpenAI,
		`{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{%- for c in m["content"] | selectattr("type", "equalto", "text") -%}{% endfor %}{% endfor %}`: ContentOpenAI,
		`{% set a = messages %}{% set b = a|reverse %}{% for m in b %}{% for c in m.content %}{% endfor %}{% endfor %}`:                                                   ContentOpenAI,
		`{% for m in messages if m.role != 'system' recursive %}{% for c in m.content if c.type == 'text' %}{% endfor %}{% endfor %}`:                                     ContentOpenAI,
		// A loop over something else's content does not count.
		`{% for m in tools %}{% for c in m.content %}{% endfor %}{% endfor %}`: ContentString,
		// `is not` wraps the test in Not: no match, as in jinja2's AST.
		`{% for m in messages %}{% for c in (m.content is not none) %}{% endfor %}{% endfor %}`: ContentString,
		// vLLM's assertion on non-name targets falls back to "string".
		`{% set ns = namespace(x=1) %}{% set ns.m = messages %}{% for m in messages %}{% for c in m.content %}{% endfor %}{% endfor %}`: ContentString,
		`{% for m in messages %}{% for a, b in m.content %}{% endfor %}{% endfor %}`:                                                    ContentString,
		`{# {% for c in m.content %} #}{% raw %}{% for m in messages %}{% for c in m.content %}{% endraw %}`:                            ContentString,
		`{{ '{% for m in messages %}' }}{% set x = {'a': [1, 2]} %}{% if x is defined and not x %}{% endif %}`:                          ContentString,
	} {
		got, err := DetectContentFormat(src)
		if err != nil || got != want {
			t.Errorf("%s: got %q, %v; want %q", src, got, err, want)
		}
	}
	for _, src := range []string{`{% for m in %}`, `{% set x = (1 %}`, `{% for x in y`} {
		if _, err := DetectContentFormat(src); err == nil {
			t.Errorf("%s: want an error", src)
		}
	}
}
