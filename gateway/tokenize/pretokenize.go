package tokenize

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// A preStep splits a piece of normalized text into smaller pieces, in order.
type preStep interface {
	split(s string, sc *scratch, emit func(string))
}

// A finder reports the non-overlapping matches of a Split pattern in s, left to right, as byte
// ranges (never empty).
type finder interface {
	find(s string, yield func(start, end int))
}

// Split behaviours (HF SplitDelimiterBehavior).
const (
	behaviorRemoved = iota
	behaviorIsolated
	behaviorMergedWithPrevious
	behaviorMergedWithNext
	behaviorContiguous
)

var behaviorNames = map[string]int{
	"Removed": behaviorRemoved, "Isolated": behaviorIsolated, "MergedWithPrevious": behaviorMergedWithPrevious,
	"MergedWithNext": behaviorMergedWithNext, "Contiguous": behaviorContiguous,
}

type splitStep struct {
	find     finder
	behavior int
	invert   bool
}

type segment struct {
	start, end int
	match      bool
}

func (p *splitStep) split(s string, _ *scratch, emit func(string)) {
	if p.behavior == behaviorIsolated && !p.invert {
		last := 0
		p.find.find(s, func(a, b int) {
			if a > last {
				emit(s[last:a])
			}
			emit(s[a:b])
			last = b
		})
		if last < len(s) {
			emit(s[last:])
		}
		return
	}
	var buf [16]segment
	segs := buf[:0]
	last := 0
	p.find.find(s, func(a, b int) {
		if a > last {
			segs = append(segs, segment{last, a, p.invert})
		}
		segs = append(segs, segment{a, b, !p.invert})
		last = b
	})
	if last < len(s) {
		segs = append(segs, segment{last, len(s), p.invert})
	}
	var out []segment
	switch p.behavior {
	case behaviorIsolated:
		out = segs
	case behaviorRemoved:
		for _, g := range segs {
			if !g.match {
				out = append(out, g)
			}
		}
	case behaviorMergedWithPrevious:
		prev := false
		for _, g := range segs {
			if g.match && !prev && len(out) > 0 {
				out[len(out)-1].end = g.end
			} else {
				out = append(out, g)
			}
			prev = g.match
		}
	case behaviorMergedWithNext:
		prev := false
		for i := len(segs) - 1; i >= 0; i-- {
			g := segs[i]
			if g.match && !prev && len(out) > 0 {
				out[len(out)-1].start = g.start
			} else {
				out = append(out, g)
			}
			prev = g.match
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	case behaviorContiguous:
		prev := false
		for _, g := range segs {
			if g.match == prev && len(out) > 0 {
				out[len(out)-1].end = g.end
			} else {
				out = append(out, g)
			}
			prev = g.match
		}
	}
	for _, g := range out {
		if g.end > g.start {
			emit(s[g.start:g.end])
		}
	}
}

// literalFinder finds non-overlapping occurrences of a fixed string.
type literalFinder struct{ lit string }

func (f literalFinder) find(s string, yield func(int, int)) {
	for off := 0; off < len(s); {
		i := strings.Index(s[off:], f.lit)
		if i < 0 {
			return
		}
		yield(off+i, off+i+len(f.lit))
		off += i + len(f.lit)
	}
}

// matcherFinder drives an anchored matcher (a hand-written pattern) over s: at each position the
// match starting there, else one rune further — the leftmost-first semantics of the regex.
type matcherFinder struct{ match func(s string, i int) int }

func (f matcherFinder) find(s string, yield func(int, int)) {
	for i := 0; i < len(s); {
		if e := f.match(s, i); e > i {
			yield(i, e)
			i = e
			continue
		}
		if s[i] < utf8.RuneSelf {
			i++
		} else {
			_, n := utf8.DecodeRuneInString(s[i:])
			i += n
		}
	}
}

// regexFinder runs a pattern with regexp2 (Go's Unicode tables; see compileRegex).
type regexFinder struct{ re *regexp2.Regexp }

func (f regexFinder) find(s string, yield func(int, int)) {
	m, err := f.re.FindStringMatch(s)
	if err != nil || m == nil {
		return
	}
	// regexp2 reports rune indices; walk the string once to turn them into byte offsets.
	pos, runeIdx := 0, 0
	toByte := func(ri int) int {
		for runeIdx < ri && pos < len(s) {
			_, n := utf8.DecodeRuneInString(s[pos:])
			pos += n
			runeIdx++
		}
		return pos
	}
	for m != nil {
		if m.Length > 0 {
			a := toByte(m.Index)
			b := toByte(m.Index + m.Length)
			yield(a, b)
		}
		m, err = f.re.FindNextMatch(m)
		if err != nil {
			return
		}
	}
}

// byteLevelStep is the ByteLevel pre-tokenizer's splitting part (the byte-to-char mapping is
// folded into the model's vocabulary, see bpe.go).
type byteLevelStep struct {
	addPrefixSpace bool
	regex          finder // GPT-2 pattern when use_regex
}

func (b *byteLevelStep) split(s string, sc *scratch, emit func(string)) {
	if b.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if b.regex == nil {
		emit(s)
		return
	}
	(&splitStep{find: b.regex, behavior: behaviorIsolated}).split(s, sc, emit)
}

// gpt2Pattern is the ByteLevel pre-tokenizer's built-in regex (use_regex: true).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

func parsePreTokenizer(path string, m json.RawMessage, byteLevel *bool) ([]preStep, error) {
	typ, err := typeOf(path, m)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "Sequence":
		var p struct {
			Pretokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(m, &p); err != nil {
			return nil, loadError(path+".pretokenizers", "%v", err)
		}
		var steps []preStep
		for i, sub := range p.Pretokenizers {
			s, err := parsePreTokenizer(fmt.Sprintf("%s.pretokenizers[%d]", path, i), sub, byteLevel)
			if err != nil {
				return nil, err
			}
			steps = append(steps, s...)
		}
		return steps, nil
	case "Split":
		var p struct {
			Pattern  json.RawMessage `json:"pattern"`
			Behavior string          `json:"behavior"`
			Invert   bool            `json:"invert"`
		}
		if err := json.Unmarshal(m, &p); err != nil {
			return nil, loadError(path, "%v", err)
		}
		beh, ok := behaviorNames[p.Behavior]
		if !ok {
			return nil, loadError(path+".behavior", "%q is not supported (want one of %s)", p.Behavior, strings.Join(sortedKeys(behaviorNames), ", "))
		}
		lit, re, isRe, err := parsePattern(path+".pattern", p.Pattern)
		if err != nil {
			return nil, err
		}
		var f finder
		if !isRe {
			if lit == "" {
				return nil, loadError(path+".pattern.String", "empty pattern")
			}
			f = literalFinder{lit}
		} else if mf := knownMatcher(re); mf != nil {
			f = matcherFinder{mf}
		} else {
			r, err := compileRegex(path+".pattern.Regex", re)
			if err != nil {
				return nil, err
			}
			f = regexFinder{r}
		}
		return []preStep{&splitStep{find: f, behavior: beh, invert: p.Invert}}, nil
	case "ByteLevel":
		var p struct {
			AddPrefixSpace bool  `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}
		if err := json.Unmarshal(m, &p); err != nil {
			return nil, loadError(path, "%v", err)
		}
		*byteLevel = true
		useRegex := p.UseRegex == nil || *p.UseRegex // HF default: true
		st := &byteLevelStep{addPrefixSpace: p.AddPrefixSpace}
		if useRegex {
			r, err := compileRegex(path, gpt2Pattern)
			if err != nil {
				return nil, err
			}
			st.regex = regexFinder{r}
		}
		if !st.addPrefixSpace && st.regex == nil {
			return nil, nil // mapping only: folded into the vocabulary
		}
		return []preStep{st}, nil
	}
	return nil, unsupported(path, typ)
}
