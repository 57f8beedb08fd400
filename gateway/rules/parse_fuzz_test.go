package rules

import (
	"strings"
	"testing"
)

// FuzzParse: any gateway.yaml either fails with an error or yields rules whose normalized load law
// is inside the ranges validation promises (the router builds its law from them unchecked).
func FuzzParse(f *testing.F) {
	f.Add([]byte(base))
	for _, law := range []string{"{kind: soft, lambda: 7}", "{capFloor: 8, epsilon: 2}", "{capFloor: 0}", "{kind: adaptive, spillRelief: false}", "{epsilon: -1}"} {
		f.Add([]byte(strings.Replace(base, `seed: "0"`, "seed: \"0\"\n    loadLaw: "+law, 1)))
	}
	f.Add([]byte(base + "tokenizers:\n  hub: {cacheDir: /c, models: {llama3: {repo: org/m, revision: main}}}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a text")
			}
			return
		}
		if h := c.Tokenizers.Hub; h != nil {
			for m, hm := range h.Models {
				if err := h.Source(hm).Validate(); err != nil {
					t.Fatalf("tokenizers.hub.models.%s accepted but invalid: %v", m, err)
				}
			}
		}
		for i, r := range c.Rules {
			l := r.LoadLaw
			if l.Epsilon == nil || l.CapFloor == nil || l.SpillRelief == nil || l.ColdStartSeedN == nil {
				t.Fatalf("rules[%d].loadLaw not normalized: %+v", i, l)
			}
			if *l.CapFloor < 1 || *l.CapFloor > 100000 || *l.Epsilon < 0 || *l.Epsilon > 9 || l.Lambda < 1 || l.Lambda > 100000 {
				t.Fatalf("rules[%d].loadLaw outside its ranges: capFloor %d, epsilon %g, lambda %d", i, *l.CapFloor, *l.Epsilon, l.Lambda)
			}
		}
	})
}
