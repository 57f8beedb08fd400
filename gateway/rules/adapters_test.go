package rules

import (
	"strings"
	"testing"
)

func TestAdapters(t *testing.T) {
	src := strings.Replace(base, "    models: [llama3]\n", "    models: [llama3]\n    adapters: [{name: sql-lora}, {name: chat-lora, base: llama3, loraName: chat-v2}]\n", 1)
	c, err := Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	a := c.Rules[0].Adapters
	if len(a) != 2 || a[0].Base != "llama3" || a[0].LoRAName != "sql-lora" || a[1].LoRAName != "chat-v2" {
		t.Fatalf("adapter defaults: %+v", a)
	}
	for _, tc := range []struct{ adapters, want string }{
		{"[{name: llama3}]", `rules[0].adapters[0].name: "llama3" is also one of models`},
		{"[{name: a}, {name: a}]", `rules[0].adapters[1].name: "a" is listed twice`},
		{"[{name: a, base: other}]", `rules[0].adapters[0].base: "other" is not one of this rule's models`},
		{`[{name: "a b"}]`, `rules[0].adapters[0].name: "a b": byte 1 (" ") is not allowed`},
		{"[{base: llama3}]", "rules[0].adapters[0].name: required"},
	} {
		src := strings.Replace(base, "    models: [llama3]\n", "    models: [llama3]\n    adapters: "+tc.adapters+"\n", 1)
		if _, err := Parse([]byte(src)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("adapters %s: want %q, got %v", tc.adapters, tc.want, err)
		}
	}
	// An adapter name is a model on its listener: two rules cannot both serve it.
	two := src + `  - name: other
    models: [sql-lora]
    engine: {family: vllm, release: v0.25.1}
    endpoints: [{name: c, address: "http://127.0.0.1:8003"}]
`
	if _, err := Parse([]byte(two)); err == nil || !strings.Contains(err.Error(), `model "sql-lora"`) {
		t.Errorf("overlapping adapter: %v", err)
	}
}

func TestDiscoveredAdapter(t *testing.T) {
	src := strings.Replace(base, "    models: [llama3]\n", "    models: [llama3]\n    discoverAdapters: true\n", 1)
	c, err := Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	r := &c.Rules[0]
	if !r.DiscoverAdapters {
		t.Fatal("discoverAdapters not read")
	}
	if a, err := r.DiscoveredAdapter("sql-lora", "llama3", "/adapters/sql"); err != nil || a != (Adapter{Name: "sql-lora", Base: "llama3", LoRAName: "sql-lora", LoRAPath: "/adapters/sql"}) {
		t.Fatalf("discovered: %+v %v", a, err)
	}
	long := strings.Repeat("p", maxPathLen)
	if _, err := r.DiscoveredAdapter("sql-lora", "llama3", long); err != nil {
		t.Fatalf("a root of %d bytes: %v", maxPathLen, err)
	}
	for _, tc := range []struct{ id, parent, root, want string }{
		{"sql-lora", "mistral", "", `parent "mistral" is not one of the rule's models`},
		{"llama3", "llama3", "", "is one of the rule's models"},
		{"a\nb", "llama3", "", `id: "a\nb": byte 1 (LF) is not allowed`},
		{"sql-lora", "", "", `"sql-lora": parent: required`},
		{"sql-lora", "llama3", long + "p", `"sql-lora": root must be valid UTF-8 of at most 4096 bytes`},
		{"sql-lora", "llama3", "\xff", `"sql-lora": root must be valid UTF-8`},
	} {
		if _, err := r.DiscoveredAdapter(tc.id, tc.parent, tc.root); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q/%q: want %q, got %v", tc.id, tc.parent, tc.want, err)
		}
	}
}
