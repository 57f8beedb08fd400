package tokenize

import "sort"

// addedSpec is one added token of tokenizer.json.
type addedSpec struct {
	content                    string
	id                         uint32
	lstrip, rstrip, singleWord bool
	normalized                 bool
	pattern                    string // what is matched: content, normalized when normalized
}

// addedVocab extracts added tokens from text before (raw set) and after (normalized set)
// normalization, leftmost-longest, as HF's AddedVocabulary does.
type addedVocab struct {
	raw, norm *tokenTrie
}

func newAddedVocab(specs []addedSpec, n normalizer) *addedVocab {
	var raw, nrm []addedSpec
	for _, s := range specs {
		s.pattern = s.content
		if s.normalized {
			if n != nil {
				s.pattern = n.normalize(s.content)
			}
			nrm = append(nrm, s)
		} else {
			raw = append(raw, s)
		}
	}
	return &addedVocab{raw: newTokenTrie(raw), norm: newTokenTrie(nrm)}
}

// split calls emit for every segment of s in order: added tokens with their id, other text with
// id -1. The normalized set is used when normalized is true.
func (a *addedVocab) split(s string, normalized bool, emit func(seg string, id int64)) {
	t := a.raw
	if normalized {
		t = a.norm
	}
	if t == nil || s == "" {
		emit(s, -1)
		return
	}
	last := 0
	for i := 0; i < len(s); {
		if !t.first[s[i]] {
			i++
			continue
		}
		k, end := t.longest(s, i)
		if k < 0 {
			i++
			continue
		}
		sp := &t.specs[k]
		start, stop := i, end
		if sp.singleWord && ((start > 0 && endsWithWord(s[:start])) || (stop < len(s) && startsWithWord(s[stop:]))) {
			i = end // HF drops the match and goes on after it
			continue
		}
		if sp.lstrip {
			start = max(leftSpaceStart(s[:start]), last)
		}
		if sp.rstrip {
			stop += rightSpaceLen(s[stop:])
		}
		if start > last {
			emit(s[last:start], -1)
		}
		emit(s[start:stop], int64(sp.id))
		last, i = stop, stop
	}
	if last < len(s) {
		emit(s[last:], -1)
	}
}

func isWordClass(r rune, c uint8) bool {
	g := c & 0xf
	return r == '_' || (g >= cLu && g <= cLo) || g == cM || g == cN
}

func endsWithWord(s string) bool {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i]&0xC0 != 0x80 {
			r, c, _ := at(s, i)
			return isWordClass(r, c)
		}
	}
	return false
}

func startsWithWord(s string) bool {
	if s == "" {
		return false
	}
	r, c, _ := at(s, 0)
	return isWordClass(r, c)
}

// leftSpaceStart is where the trailing white space of s begins.
func leftSpaceStart(s string) int {
	i := len(s)
	for i > 0 {
		j := i - 1
		for j > 0 && s[j]&0xC0 == 0x80 {
			j--
		}
		if _, c, _ := at(s, j); !clsWS(c) {
			break
		}
		i = j
	}
	return i
}

func rightSpaceLen(s string) int { return run(s, 0, clsWS) }

// tokenTrie is a byte trie over added-token patterns for leftmost-longest matching.
type tokenTrie struct {
	first [256]bool
	nodes []trieNode
	specs []addedSpec
}

type trieNode struct {
	edges []trieEdge // sorted by byte
	spec  int32      // index into specs, -1 when no pattern ends here
}

type trieEdge struct {
	b  byte
	to int32
}

func newTokenTrie(specs []addedSpec) *tokenTrie {
	if len(specs) == 0 {
		return nil
	}
	t := &tokenTrie{nodes: []trieNode{{spec: -1}}, specs: specs}
	for k, s := range specs {
		if s.pattern == "" {
			continue
		}
		t.first[s.pattern[0]] = true
		n := int32(0)
		for i := 0; i < len(s.pattern); i++ {
			n = t.child(n, s.pattern[i], true)
		}
		if t.nodes[n].spec < 0 {
			t.nodes[n].spec = int32(k) // first listed wins on identical patterns
		}
	}
	for i := range t.nodes {
		e := t.nodes[i].edges
		sort.Slice(e, func(a, b int) bool { return e[a].b < e[b].b })
	}
	return t
}

func (t *tokenTrie) child(n int32, b byte, create bool) int32 {
	for _, e := range t.nodes[n].edges {
		if e.b == b {
			return e.to
		}
	}
	if !create {
		return -1
	}
	t.nodes = append(t.nodes, trieNode{spec: -1})
	id := int32(len(t.nodes) - 1)
	t.nodes[n].edges = append(t.nodes[n].edges, trieEdge{b, id})
	return id
}

// longest returns the spec index and end of the longest pattern starting at i, or -1.
func (t *tokenTrie) longest(s string, i int) (int, int) {
	best, end := -1, -1
	n := int32(0)
	for j := i; j < len(s); j++ {
		n = t.child(n, s[j], false)
		if n < 0 {
			break
		}
		if k := t.nodes[n].spec; k >= 0 {
			best, end = int(k), j+1
		}
	}
	return best, end
}
