package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

var handWritten = map[string]string{
	"llama3": patternLlama3, "qwen": patternQwen, "o200k": patternO200k, "deepseek": patternDeepSeek,
	"digits3": patternDigits3, "digit1": patternDigit1, "cjk": patternCJK,
}

// goClass is the class byte Go's own tables (which regexp2 uses) give r.
func goClass(r rune) uint8 {
	var f uint8
	for code, tab := range map[uint8]*unicode.RangeTable{cLu: unicode.Lu, cLl: unicode.Ll, cLt: unicode.Lt, cLm: unicode.Lm, cLo: unicode.Lo, cM: unicode.M, cN: unicode.N, cP: unicode.P, cS: unicode.S} {
		if unicode.Is(tab, r) {
			f = code
		}
	}
	if unicode.IsSpace(r) {
		f |= cWS
	}
	return f
}

// oracleSplit runs scripts/split-oracle.js (HF tokenizers through Node), or skips naming what is
// missing.
func oracleSplit(t *testing.T, pattern string, texts []string) [][]string {
	t.Helper()
	repo := RepoRoot()
	if _, err := exec.LookPath("node"); err != nil || repo == "" {
		t.Skip("oracle needs node (apt-get install nodejs npm) and the repository checkout")
	}
	if _, err := os.Stat(filepath.Join(repo, ".cache/node/node_modules/tokenizers")); err != nil {
		t.Skip("oracle needs npm tokenizers: npm install --prefix .cache/node tokenizers@0.23.2")
	}
	in, _ := json.Marshal(map[string]any{"pattern": pattern, "texts": texts})
	cmd := exec.Command("node", filepath.Join(repo, "scripts", "split-oracle.js"))
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("split-oracle.js: %v", err)
	}
	var res [][]string
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestPatternsMatchOracle compares the hand-written matchers with the reference tokenizer itself
// (Oniguruma, Unicode 16.0) on random text over every character kind, including letters and digits
// new in Unicode 15.1, 16.0 and 17.0.
func TestPatternsMatchOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	extra := []rune("\U0002EBF0\U00010D50\U00010D40\U00011BC0\U00016EA0\U0001E5D0\u0C5D\u1E9E\u212A\u0130")
	runes := append(append([]rune{}, corpusRunes...), extra...)
	var texts []string
	for i := 0; i < 1500; i++ {
		var b strings.Builder
		for n := rng.IntN(20); n >= 0; n-- {
			b.WriteRune(runes[rng.IntN(len(runes))])
		}
		texts = append(texts, b.String())
	}
	for name, pat := range handWritten {
		want := oracleSplit(t, pat, texts)
		for i, s := range texts {
			got := splitWith(matcherFinder{knownMatcher(pat)}, s)
			if fmt.Sprintf("%q", want[i]) != fmt.Sprintf("%q", got) {
				t.Errorf("%s on %q:\n  oracle: %q\n  ours:   %q", name, s, want[i], got)
			}
		}
	}
}

// comparable reports whether regexp2 (Go's Unicode tables) and our 16.0 tables agree on every rune
// of s, so that the two implementations must split it identically.
func comparable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		// regexp2 does not apply Oniguruma's case fold of U+017F (long s) to 's in (?i:'s|...);
		// the oracle test below covers it.
		if r == 0x17F || goClass(r) != charClass(r) {
			return false
		}
	}
	return true
}

func splitWith(f finder, s string) []string {
	var out []string
	(&splitStep{find: f, behavior: behaviorIsolated}).split(s, nil, func(p string) { out = append(out, p) })
	return out
}

func checkSameSplit(t testing.TB, name, s string) {
	t.Helper()
	re, err := compileRegex(name, handWritten[name])
	if err != nil {
		t.Fatal(err)
	}
	want := splitWith(regexFinder{re}, s)
	got := splitWith(matcherFinder{knownMatcher(handWritten[name])}, s)
	if fmt.Sprintf("%q", want) != fmt.Sprintf("%q", got) {
		t.Errorf("%s on %q:\n  regexp2: %q\n  ours:    %q", name, s, want, got)
	}
}

// corpusRunes mixes the character kinds the patterns distinguish.
var corpusRunes = []rune("aZ'sStTrReEvVmMlLdD ſ \t\r\n\v\f 09١٢३ .,!?/-_\"#$%&()*+:;<=>@[\\]^`{|}~" +
	"\u00a0\u0085\u2028\u3000\ufeff\u200b éÉǅʰ漢字ひらカタ한글ا\u064e\u0301\u0308\u20dd\U0001F600\U0001F3FB\u200d" +
	"\u0000\u0001\u007f\u00ad\ue000ΩωЖж")

func TestPatternsMatchRegexp2(t *testing.T) {
	var corpus []string
	for _, m := range refModels {
		func() {
			defer func() { _ = recover() }()
			ref := readRefTextNoSkip(m)
			if ref == nil {
				return
			}
			for _, c := range ref.Cases {
				corpus = append(corpus, c.Text)
			}
		}()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 3000; i++ {
		var b strings.Builder
		for n := rng.IntN(24); n >= 0; n-- {
			b.WriteRune(corpusRunes[rng.IntN(len(corpusRunes))])
		}
		corpus = append(corpus, b.String())
	}
	checked := 0
	for _, s := range corpus {
		if !comparable(s) {
			continue
		}
		checked++
		for name := range handWritten {
			checkSameSplit(t, name, s)
		}
	}
	if checked < 2000 {
		t.Fatalf("only %d corpus strings were comparable", checked)
	}
}

// FuzzPatternsMatchRegexp2 is the differential fuzz target: every hand-written matcher splits like
// regexp2 on inputs where both use the same character classes.
func FuzzPatternsMatchRegexp2(f *testing.F) {
	for _, s := range []string{"Hello world", "I'm  \n\n  fine's", "ABCdef DEF'LL x1234y", "  \t\r\n", "'ſ ſ'", "漢字ひらがなカタカナ123", "a.b/c\n/d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !comparable(s) {
			return
		}
		for name := range handWritten {
			checkSameSplit(t, name, s)
		}
	})
}

func readRefTextNoSkip(model string) *refText {
	var out *refText
	tb := &testing.T{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		out = readRefText(tb, model)
	}()
	<-done
	return out
}

// TestReferencePatternsAreHandWritten makes sure every Split regex of the reference models runs
// on a hand-written matcher (Unicode 16.0 tables, speed), not on the regexp2 fallback.
func TestReferencePatternsAreHandWritten(t *testing.T) {
	for _, model := range refModels {
		t.Run(model, func(t *testing.T) {
			tk := loadRefTokenizer(t, model)
			for i, st := range tk.pre {
				if sp, ok := st.(*splitStep); ok {
					if _, isRe := sp.find.(regexFinder); isRe {
						t.Errorf("pre-tokenizer step %d uses regexp2", i)
					}
				}
			}
		})
	}
}

// TestClassTables checks the generated tables against facts the reference relies on.
func TestClassTables(t *testing.T) {
	for c := rune(0); c < 128; c++ {
		classOnce.Do(buildClassTable)
		if got, want := asciiClass[c], classBlocks[int(classIndex[c>>8])<<8|int(c&0xff)]; got != want {
			t.Errorf("ASCII U+%04X: fast table %#x, generated %#x", c, got, want)
		}
	}
	cases := []struct {
		r    rune
		want uint8
		why  string
	}{
		{0x10D50, cLu, "Garay capital letter (Unicode 16.0) is \\p{L}"},
		{0x10D40, cN, "Garay digit zero (16.0) is \\p{N}"},
		{0x2EBF0, cLo, "CJK Ext I (15.1) is \\p{L}"},
		{0x0085, cWS, "NEL is \\s"},
		{0xFEFF, cNone, "BOM is not \\s in Oniguruma"},
		{0x3000, cWS, "ideographic space is \\s"},
		{0x200B, cNone, "ZWSP is Cf"},
	}
	for _, c := range cases {
		if got := charClass(c.r); got != c.want {
			t.Errorf("U+%04X: class %#x, want %#x (%s)", c.r, got, c.want, c.why)
		}
	}
	if charClass(0x16EA0) != cNone { // Beria Erfe (Unicode 17.0) must not be a letter yet
		t.Errorf("U+16EA0 (Unicode 17.0) should be unassigned in 16.0 tables, got %#x", charClass(0x16EA0))
	}
}

// TestNFCMatchesOracle compares our NFC with HF tokenizers' own NFC normalizer on mixes of
// combining marks old and new (those HF's older tables do not know) and Hangul / composites.
func TestNFCMatchesOracle(t *testing.T) {
	repo := RepoRoot()
	if _, err := exec.LookPath("node"); err != nil || repo == "" {
		t.Skip("oracle needs node (apt-get install nodejs npm)")
	}
	if _, err := os.Stat(filepath.Join(repo, ".cache/node/node_modules/tokenizers")); err != nil {
		t.Skip("oracle needs npm tokenizers: npm install --prefix .cache/node tokenizers@0.23.2")
	}
	var marks []rune
	for r := range nfcOpaque {
		marks = append(marks, r)
	}
	marks = append(marks, []rune("\u0301\u0316\u0308\u0327\u1161\u11a8\u05b7\u093c\u3099x aAeE\u1100\u110b\u00e9\U000113C9\U00011383")...)
	rng := rand.New(rand.NewPCG(5, 6))
	var texts []string
	for i := 0; i < 3000; i++ {
		var b strings.Builder
		for n := rng.IntN(8); n >= 0; n-- {
			b.WriteRune(marks[rng.IntN(len(marks))])
		}
		texts = append(texts, b.String())
	}
	in, _ := json.Marshal(texts)
	cmd := exec.Command("node", "-e", `const {nfcNormalizer}=require(process.argv[1]);const n=nfcNormalizer();let d='';process.stdin.setEncoding('utf8');process.stdin.on('data',x=>d+=x);process.stdin.on('end',()=>process.stdout.write(JSON.stringify(JSON.parse(d).map(s=>n.normalizeString(s)))))`,
		filepath.Join(repo, ".cache/node/node_modules/tokenizers"))
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	n := nfcNormalizer{norm.NFC}
	bad := 0
	for i, s := range texts {
		if got := n.normalize(s); got != want[i] {
			if bad++; bad <= 10 {
				t.Errorf("NFC(%+q) = %+q, HF gives %+q", s, got, want[i])
			}
		}
	}
}
