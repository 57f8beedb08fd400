package hub

import (
	"strings"
	"testing"
)

// FuzzParseListing: any revision listing either fails with an error or yields a 40-hex commit,
// the only thing of it that reaches a path (the snapshot's folder) or a URL.
func FuzzParseListing(f *testing.F) {
	f.Add([]byte(`{"id":"org/m","sha":"` + strings.Repeat("ab", 20) + `","siblings":[{"rfilename":"tokenizer.json"}]}`))
	f.Add([]byte(`{"sha":"../../etc"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		commit, files, err := parseListing(b)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a text")
			}
			return
		}
		if !commitRe.MatchString(commit) || files == nil {
			t.Fatalf("accepted commit %q, files %v", commit, files)
		}
	})
}
