package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/internal/jinja"
)

// The differential harness: fresh random inputs every run (the seed is logged; KVEXACT_DIFF_SEED
// replays one), rendered by this package and by Python jinja2 in transformers' environment
// (scripts/jinja2-oracle.py, Debian's /usr/bin/python3 with python3-jinja2). Two corpora:
//   - string filters and methods (trim, strip, split, upper, lower, title, capitalize, center,
//     truncate, format) and number printing (tojson and {{ }} of integers of any size, -0.0, floats)
//     on random text mixing Python's whitespace set, cased and uncased letters, ligatures, final
//     sigma, apostrophes, underscores and combining marks;
//   - random chats (system, turns, tools, tool calls with random arguments) through every model's
//     own chat template.
// KVEXACT_DIFF_N sets the cases per corpus and model (default 300; make fuzz runs thousands).

var diffWords = []string{"hello", "World", "they're", "snake_case", "ß", "straße", "ΣΑΣ", "ΌΣΟΣ ΑΣ", "ﬁle", "ﬀ",
	"İstanbul", "ǆemal", "ǅ", "e\u0301x", "ÉCOLE", "mcDonald's", "x-ray", "(paren", "[br", "{cu", "<ang", "a_b-c", "ŉ",
	"ΐ", "日本語", "😀", "Ⓐbc", "ªb", "123abc", "ǈ", "Σ", "σς", "ΑΣ.", "ǰ", "ẞ", "Ω", "ﬅ", "ʼn", "i\u0307", "A\u0345"}

var diffSpaces = []string{" ", "\t", "\n", "\r", "\v", "\f", "\u001c", "\u001d", "\u001e", "\u001f", "\u0085", "\u00a0",
	"\u1680", "\u2000", "\u200a", "\u3000", "\u2028", "\u2029", "\u202f", "\u205f", "\u200b", "\ufeff", "\u180e", "  ",
	"-", "'", "_", ".", ",", "(", "<"}

func randText(r *rand.Rand) string {
	var b strings.Builder
	if r.IntN(2) == 0 {
		b.WriteString(diffSpaces[r.IntN(len(diffSpaces))])
	}
	for i := range r.IntN(8) {
		if i > 0 {
			b.WriteString(diffSpaces[r.IntN(len(diffSpaces))])
		}
		b.WriteString(diffWords[r.IntN(len(diffWords))])
	}
	if r.IntN(2) == 0 {
		b.WriteString(diffSpaces[r.IntN(len(diffSpaces))])
	}
	return b.String()
}

// diffNumber is a JSON number literal as a client may send it.
func diffNumber(r *rand.Rand) string {
	switch r.IntN(9) {
	case 0:
		return "-0.0"
	case 1:
		return strconv.FormatInt(r.Int64(), 10) + strconv.Itoa(r.IntN(1000000)) // beyond int64
	case 2:
		return "-" + strconv.FormatUint(r.Uint64(), 10) + "7"
	case 3:
		return strconv.FormatInt(r.Int64N(1000)-500, 10)
	case 4:
		return strconv.FormatFloat(r.Float64()*1e20, 'g', -1, 64)
	case 5:
		return strconv.FormatFloat(r.NormFloat64()*1e-6, 'g', -1, 64)
	case 6:
		return "1.0"
	case 7:
		return "9223372036854775807"
	}
	return "-9223372036854775808"
}

func diffValue(r *rand.Rand, depth int) string {
	switch k := r.IntN(6); {
	case k == 0 && depth < 3:
		var parts []string
		for range r.IntN(4) {
			parts = append(parts, diffValue(r, depth+1))
		}
		return "[" + strings.Join(parts, ",") + "]"
	case k == 1 && depth < 3:
		var parts []string
		for i := range r.IntN(4) {
			q, _ := json.Marshal(fmt.Sprintf("k%d%s", i, diffWords[r.IntN(len(diffWords))]))
			parts = append(parts, string(q)+":"+diffValue(r, depth+1))
		}
		return "{" + strings.Join(parts, ",") + "}"
	case k == 2:
		q, _ := json.Marshal(randText(r))
		return string(q)
	case k == 3:
		return []string{"true", "false", "null"}[r.IntN(3)]
	}
	return diffNumber(r)
}

var diffTemplates = []string{
	"{{ s|trim }}", "{{ s|trim('x_-') }}", "{{ s|upper }}", "{{ s|lower }}", "{{ s|title }}", "{{ s|capitalize }}",
	"{{ s.strip() }}", "{{ s.lstrip() }}|{{ s.rstrip() }}", "{{ s.upper() }}", "{{ s.lower() }}", "{{ s.title() }}",
	"{{ s.capitalize() }}", "{{ s.split()|join('|') }}", "{{ s|center(n) }}", "{{ s|truncate(n) }}",
	"{{ s|truncate(n, true) }}", "{{ s|truncate(n, false, '…', 0) }}", "{{ '%s:%d'|format(s, n) }}",
	"{{ '%5s|%-6s|%r|%03d|%x'|format(s, s, s, n, n) }}", "{{ x|tojson }}", "{{ x }}", "{{ x|tojson(indent=2) }}",
	"{{ [x, s]|tojson }}", "{{ x|string }}|{{ x is number }}|{{ x is integer }}|{{ x is float }}",
}

type diffCase struct {
	Template string            `json:"template"`
	Vars     map[string]string `json:"vars"` // name → JSON text (the oracle json.loads each)
	ours     string
	oursErr  error
	label    string
}

// diffOracle is the oracle's command line: transformers' own compiled template on the pinned jinja2
// (scripts/chat-oracle.py in .cache/py/chat, scripts/python/chat.txt) when that environment exists,
// else Python jinja2 configured as transformers configures it (scripts/jinja2-oracle.py, Debian's
// python3-jinja2).
func diffOracle(t *testing.T) []string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..", "..")
	if py := filepath.Join(repo, ".cache", "py", "chat", "bin", "python"); fileExists(py) {
		return []string{py, filepath.Join(repo, "scripts", "chat-oracle.py")}
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("the jinja2 oracle needs .cache/py/chat (scripts/pyenv.sh chat) or Debian's /usr/bin/python3 with python3-jinja2 (apt-get install python3-jinja2)")
	}
	if err := exec.Command("/usr/bin/python3", "-c", "import jinja2.sandbox").Run(); err != nil {
		t.Skip("the jinja2 oracle needs .cache/py/chat (scripts/pyenv.sh chat) or python3-jinja2 (apt-get install python3-jinja2)")
	}
	return []string{"/usr/bin/python3", filepath.Join(repo, "scripts", "jinja2-oracle.py")}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func runOracle(t *testing.T, oracle []string, cases []*diffCase) []struct{ Out, Error *string } {
	t.Helper()
	in := make([]map[string]any, len(cases))
	for i, c := range cases {
		vars := map[string]json.RawMessage{}
		for k, v := range c.Vars {
			vars[k] = json.RawMessage(v)
		}
		in[i] = map[string]any{"template": c.Template, "vars": vars}
	}
	raw, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(oracle[0], oracle[1:]...)
	cmd.Env = append(os.Environ(), "TRANSFORMERS_VERBOSITY=error", "HF_HUB_OFFLINE=1")
	cmd.Stdin = strings.NewReader(string(raw))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("oracle: %v", err)
	}
	var res []struct{ Out, Error *string }
	if err := json.Unmarshal(out, &res); err != nil || len(res) != len(cases) {
		t.Fatalf("oracle answer: %v (%d results for %d cases)", err, len(res), len(cases))
	}
	return res
}

// valueJSON is a template value as the oracle reads it: tojson's Python-style JSON, which
// json.loads turns back into the same Python values (integers of any size and -0.0 included).
func valueJSON(t *testing.T, v jinja.Value) string {
	t.Helper()
	tm, err := jinja.Compile("{{ v|tojson }}")
	if err != nil {
		t.Fatal(err)
	}
	s, err := tm.RenderValues(map[string]jinja.Value{"v": v})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func diffSeed(t *testing.T) (uint64, int) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("KVEXACT_DIFF_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	n := 300
	if s := os.Getenv("KVEXACT_DIFF_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	t.Logf("differential corpus: KVEXACT_DIFF_SEED=%d KVEXACT_DIFF_N=%d", seed, n)
	return seed, n
}

func compareOracle(t *testing.T, oracle []string, cases []*diffCase) {
	t.Helper()
	t.Logf("oracle: %s", strings.Join(oracle, " "))
	res := runOracle(t, oracle, cases)
	bad := 0
	for i, c := range cases {
		want := res[i]
		switch {
		case want.Error != nil && c.oursErr != nil:
		case want.Error != nil:
			t.Errorf("%s: jinja2 raised %s; we rendered %+q\ntemplate %q vars %v", c.label, *want.Error, c.ours, c.Template, c.Vars)
			bad++
		case c.oursErr != nil:
			t.Errorf("%s: jinja2 rendered %+q; we failed: %v\ntemplate %q vars %v", c.label, *want.Out, c.oursErr, c.Template, c.Vars)
			bad++
		case *want.Out != c.ours:
			t.Errorf("%s:\n ours   %+q\n jinja2 %+q\ntemplate %q vars %v", c.label, c.ours, *want.Out, c.Template, c.Vars)
			bad++
		}
		if bad >= 20 {
			t.Fatalf("stopping after %d mismatches", bad)
		}
	}
	t.Logf("%d cases, %d mismatches", len(cases), bad)
}

// TestDifferentialJinja2Filters: string filters, string methods and number printing.
func TestDifferentialJinja2Filters(t *testing.T) {
	script := diffOracle(t)
	seed, n := diffSeed(t)
	r := rand.New(rand.NewPCG(seed, 1))
	var cases []*diffCase
	for i := 0; i < n*len(diffTemplates)/4; i++ {
		src := diffTemplates[r.IntN(len(diffTemplates))]
		sj, _ := json.Marshal(randText(r))
		vars := map[string]string{"s": string(sj), "n": strconv.Itoa(r.IntN(40)), "x": diffValue(r, 0)}
		c := &diffCase{Template: src, Vars: vars, label: fmt.Sprintf("filter case %d", i)}
		data := map[string]jinja.Value{}
		for k, v := range vars {
			pv, err := parseJSON([]byte(v))
			if err != nil {
				t.Fatal(err)
			}
			if data[k], err = toValue(pv, k); err != nil {
				c.oursErr = err
			}
		}
		if c.oursErr == nil {
			ct := compileTemplate(src, "")
			if ct.compErr != nil {
				t.Fatalf("%s: %v", src, ct.compErr)
			}
			c.ours, c.oursErr = ct.tmpl.RenderValues(data)
		}
		cases = append(cases, c)
	}
	compareOracle(t, script, cases)
}

// TestDifferentialJinja2Chats: random chats through each model's own template, with the very
// variables our renderer passes.
func TestDifferentialJinja2Chats(t *testing.T) {
	script := diffOracle(t)
	seed, n := diffSeed(t)
	var cases []*diffCase
	for _, model := range []string{"llama3", "qwen3", "deepseek_v3", "mistral7b", "gemma3"} {
		tok := loadModel(t, model)
		if tok == nil {
			continue
		}
		ct, err := tok.ChatTemplate()
		if err != nil {
			t.Logf("%s: no Jinja chat path (%v)", model, err)
			continue
		}
		r := rand.New(rand.NewPCG(seed, uint64(len(cases))+7))
		for i := 0; i < n; i++ {
			body := diffChat(r)
			c := &diffCase{label: fmt.Sprintf("%s chat %d %s", model, i, body)}
			req, err := ParseChatRequest([]byte(body))
			if err != nil {
				t.Fatalf("%s: generated an invalid chat: %v", c.label, err)
			}
			tc, data, err := ct.renderData(req)
			if errors.Is(err, ErrNoJinjaPath) {
				t.Logf("%s: no Jinja chat path (%v)", model, err)
				break
			}
			if err != nil {
				t.Errorf("%s: variables: %v", c.label, err)
				continue
			}
			c.Template, c.Vars = tc.src, map[string]string{}
			for k, v := range data {
				c.Vars[k] = valueJSON(t, v)
			}
			c.ours, c.oursErr = tc.tmpl.RenderValues(data)
			cases = append(cases, c)
		}
	}
	if len(cases) == 0 {
		t.Skip("no model with a Jinja chat template found (KVEXACT_TOKENIZERS)")
	}
	compareOracle(t, script, cases)
}

func loadModel(t *testing.T, model string) *Tokenizer {
	tok, err := NewPool("").Get(model)
	if err != nil {
		t.Logf("%s: skipped (%v)", model, err)
		return nil
	}
	return tok
}

// diffChat is a random chat completions body: an optional system message, alternating turns,
// sometimes tools and an assistant tool call (arguments with numbers of every kind) answered by a
// tool message.
func diffChat(r *rand.Rand) string {
	str := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	var msgs []string
	if r.IntN(2) == 0 {
		msgs = append(msgs, `{"role":"system","content":`+str(randText(r))+`}`)
	}
	turns := 1 + r.IntN(3)
	tools := r.IntN(3) == 0
	for i := range turns {
		msgs = append(msgs, `{"role":"user","content":`+str(randText(r)+" ?")+`}`)
		if i == turns-1 && tools && r.IntN(2) == 0 {
			args, _ := json.Marshal(`{"q":` + diffValue(r, 1) + `,"n":` + diffNumber(r) + `}`)
			msgs = append(msgs, `{"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function","function":{"name":"lookup","arguments":`+string(args)+`}}]}`)
			msgs = append(msgs, `{"role":"tool","tool_call_id":"call_1","content":`+str(randText(r))+`}`)
			break
		}
		if i < turns-1 || r.IntN(2) == 0 {
			msgs = append(msgs, `{"role":"assistant","content":`+str(randText(r))+`}`)
		}
	}
	body := `{"model":"m","messages":[` + strings.Join(msgs, ",") + `]`
	if tools {
		body += `,"tools":[{"type":"function","function":{"name":"lookup","description":` + str(randText(r)) +
			`,"parameters":{"type":"object","properties":{"q":{"type":"string","default":` + diffValue(r, 2) + `},"n":{"type":"number","maximum":` + diffNumber(r) + `}}}}}]`
	}
	last := msgs[len(msgs)-1]
	if !strings.Contains(last, `"role":"assistant"`) || r.IntN(2) == 0 {
		body += `,"add_generation_prompt":` + strconv.FormatBool(r.IntN(4) != 0)
	}
	return body + "}"
}
