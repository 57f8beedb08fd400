package tokenize

import "sort"

// AddedToken is one added token of tokenizer.json (special or not), as the tokenizer matches it.
type AddedToken struct {
	Content string
	ID      uint32
	Special bool
}

// AddedTokens lists the tokenizer's added tokens in id order: what a parity probe must cover, since
// an engine whose tokenizer lacks or renames one splits its text into ordinary tokens.
func (t *Tokenizer) AddedTokens() []AddedToken {
	var out []AddedToken
	for _, tr := range []*tokenTrie{t.added.raw, t.added.norm} {
		if tr == nil {
			continue
		}
		for _, s := range tr.specs {
			out = append(out, AddedToken{Content: s.content, ID: s.id, Special: t.specialIDs[s.id]})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
