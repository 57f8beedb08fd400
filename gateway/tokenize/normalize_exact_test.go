package tokenize

import (
	"encoding/json"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"
)

// Marks known to every Unicode version involved (≤ 9.0), with several combining classes, and
// starters that compose with some of them.
var (
	oldMarks    = []rune("\u0300\u0301\u0302\u0303\u0308\u0316\u0317\u031b\u0323\u0327\u0328\u0345\u035c\u035d\u0591\u05b0\u05b4\u05bc\u0e38\u0e39\u0e3a\u0650\u0651\u1dc0\u20d0")
	oldStarters = []rune("aeiouAEOSsnNyYc\u03b1\u03c9\u0438\u05d0x ")
)

func randomMarkRun(r *rand.Rand) string {
	var b strings.Builder
	for range 1 + r.IntN(3) {
		b.WriteRune(oldStarters[r.IntN(len(oldStarters))])
		for range r.IntN(70) {
			b.WriteRune(oldMarks[r.IntN(len(oldMarks))])
		}
	}
	return b.String()
}

// exactForm agrees with x/text wherever x/text's stream-safe limit does not apply.
func TestExactFormMatchesXText(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 5000; i++ {
		var b strings.Builder
		for range 1 + r.IntN(8) {
			b.WriteRune(oldStarters[r.IntN(len(oldStarters))])
			for range r.IntN(6) {
				b.WriteRune(oldMarks[r.IntN(len(oldMarks))])
			}
			if r.IntN(4) == 0 {
				b.WriteString("\u00e9\u1e69\uac00\u11a8\ufb01\u2460")
			}
		}
		s := b.String()
		for _, f := range []norm.Form{norm.NFC, norm.NFD, norm.NFKC, norm.NFKD} {
			if got, want := exactForm(f, s), f.String(s); got != want {
				t.Fatalf("form %v of %+q: %+q, x/text %+q", f, s, got, want)
			}
		}
	}
}

// HF's NFC inserts no U+034F after 30 combining marks: it reorders and composes the whole run.
// Python's unicodedata runs the same plain algorithm and is the oracle here.
func TestNFCLongMarkRunsMatchPython(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("needs Debian's /usr/bin/python3 (apt-get install python3)")
	}
	r := rand.New(rand.NewPCG(3, 4))
	var in []string
	for range 400 {
		in = append(in, randomMarkRun(r))
	}
	raw, _ := json.Marshal(in)
	cmd := exec.Command("/usr/bin/python3", "-c", `import json,sys,unicodedata
d=json.load(sys.stdin)
print(json.dumps([[unicodedata.normalize(f,s) for f in ("NFC","NFD","NFKC","NFKD")] for s in d]))`)
	cmd.Stdin = strings.NewReader(string(raw))
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	var want [][4]string
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	long := 0
	for i, s := range in {
		for j, f := range []norm.Form{norm.NFC, norm.NFD, norm.NFKC, norm.NFKD} {
			got := nfcNormalizer{f}.normalize(s)
			if got != want[i][j] {
				t.Fatalf("form %v of %+q:\n got %+q\nwant %+q", f, s, got, want[i][j])
			}
		}
		if f := norm.NFC.String(s); strings.Contains(f, cgj) {
			long++
		}
	}
	if long < 50 {
		t.Fatalf("only %d inputs reach x/text's stream-safe limit; the test lost its point", long)
	}
}
