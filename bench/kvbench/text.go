package kvbench

import (
	"math/rand/v2"
	"strings"
)

// The synthetic language: a fixed vocabulary of made-up words built from syllables, so prompts
// tokenize like prose (one or two tokens a word) and two independently drawn texts share no
// block by accident.
var syllables = []string{"ka", "lo", "mi", "ter", "san", "vo", "rel", "din", "pa", "shu", "gra", "nel",
	"bo", "tri", "fen", "mar", "qui", "zo", "hal", "ve", "dor", "lin", "cu", "rast", "po", "ne", "sil", "tan"}

var vocabulary = func() []string {
	r := rand.New(rand.NewPCG(7, 11))
	seen := map[string]bool{}
	var out []string
	for len(out) < 3000 {
		n := 1 + r.IntN(3)
		var b strings.Builder
		for i := 0; i < n; i++ {
			b.WriteString(syllables[r.IntN(len(syllables))])
		}
		w := b.String()
		if !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
	}
	return out
}()

// words returns n words drawn from r, with sentence punctuation every few words.
func words(r *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(n * 7)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[r.IntN(len(vocabulary))])
		if i%11 == 10 {
			b.WriteByte('.')
		}
	}
	b.WriteByte('.')
	return b.String()
}

// textRand is the generator of one named piece of text (a system prompt, a document, a user
// turn): the same (seed, kind, id) always gives the same text.
func textRand(seed uint64, kind string, id int) *rand.Rand {
	h := uint64(14695981039346656037)
	for i := 0; i < len(kind); i++ {
		h = (h ^ uint64(kind[i])) * 1099511628211
	}
	return rand.New(rand.NewPCG(seed^h, uint64(id)+1))
}
