package tokenize

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// A normalizer rewrites a piece of text before pre-tokenization (after added-token extraction).
type normalizer interface {
	normalize(s string) string
}

// nfcNormalizer is a Unicode normalization form as HF tokenizers applies it. HF's normalization
// tables are an older Unicode version than golang.org/x/text's (17.0): the code points it does not
// know (nfcOpaque, generated from the reference) act there as plain starters that neither reorder,
// decompose nor compose. So the text is cut at them and each part normalized on its own.
type nfcNormalizer struct{ form norm.Form }

// nfcOpaqueMin is the smallest key of nfcOpaque: a quick filter for the common case.
var nfcOpaqueMin = func() rune {
	m := rune(0x10FFFF)
	for r := range nfcOpaque {
		m = min(m, r)
	}
	return m
}()

func (n nfcNormalizer) normalize(s string) string {
	cut := -1
	for i, r := range s {
		if r >= nfcOpaqueMin && nfcOpaque[r] {
			cut = i
			break
		}
	}
	if cut < 0 {
		if n.form.IsNormalString(s) {
			return s
		}
		return n.part(s)
	}
	var b strings.Builder
	last := 0
	for i, r := range s[cut:] {
		i += cut
		if r >= nfcOpaqueMin && nfcOpaque[r] {
			b.WriteString(n.part(s[last:i]))
			b.WriteRune(r)
			last = i + utf8.RuneLen(r)
		}
	}
	b.WriteString(n.part(s[last:]))
	return b.String()
}

// cgj is U+034F COMBINING GRAPHEME JOINER.
const cgj = "\u034f"

// part normalizes text without opaque code points. x/text implements the Stream-Safe Text Format:
// after 30 consecutive non-starters it inserts U+034F, which then blocks reordering and composition.
// HF (unicode-normalization's nfc()) runs the plain algorithm, so where x/text inserted a joiner the
// part is normalized by exactForm instead (rare: only runs of more than 30 combining marks).
func (n nfcNormalizer) part(s string) string {
	out := n.form.String(s)
	if strings.Count(out, cgj) > strings.Count(s, cgj) {
		return exactForm(n.form, s)
	}
	return out
}

// exactForm is the Unicode normalization algorithm (UAX #15) without stream-safe limits: full
// decomposition rune by rune, canonical ordering of every run of non-starters (stable by combining
// class), then, for the composing forms, canonical composition. Per-rune decompositions and pairwise
// compositions come from x/text, which applies no limit to a single rune or a pair.
func exactForm(f norm.Form, s string) string {
	decomp, compose := norm.NFD, false
	switch f {
	case norm.NFC:
		compose = true
	case norm.NFKC:
		decomp, compose = norm.NFKD, true
	case norm.NFKD:
		decomp = norm.NFKD
	}
	var rs []rune
	for _, r := range s {
		rs = append(rs, []rune(decomp.String(string(r)))...)
	}
	ccc := make([]uint8, len(rs))
	for i, r := range rs {
		ccc[i] = norm.NFD.PropertiesString(string(r)).CCC()
	}
	// Canonical ordering: a stable insertion sort inside each run of non-starters.
	for i := 1; i < len(rs); i++ {
		for j := i; j > 0 && ccc[j] != 0 && ccc[j-1] > ccc[j]; j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
			ccc[j], ccc[j-1] = ccc[j-1], ccc[j]
		}
	}
	if !compose {
		return string(rs)
	}
	out := rs[:0:0]
	starter := -1     // index in out of the last starter
	last := uint8(0)  // combining class of the last rune kept after the starter
	adjacent := false // nothing kept between the starter and the current rune
	for i, r := range rs {
		c := ccc[i]
		if starter >= 0 && (adjacent || (last != 0 && last < c)) {
			if p := norm.NFC.String(string(out[starter]) + string(r)); utf8.RuneCountInString(p) == 1 {
				out[starter], _ = utf8.DecodeRuneInString(p)
				continue
			}
		}
		out = append(out, r)
		if c == 0 {
			starter, adjacent, last = len(out)-1, true, 0
		} else {
			adjacent, last = false, c
		}
	}
	return string(out)
}

// prependNormalizer adds its string in front of any non-empty piece.
type prependNormalizer struct{ prefix string }

func (p prependNormalizer) normalize(s string) string {
	if s == "" {
		return s
	}
	return p.prefix + s
}

type replaceNormalizer struct {
	literal string // when re is nil
	re      *regexp2.Regexp
	content string
}

func (r replaceNormalizer) normalize(s string) string {
	if r.re == nil {
		if !strings.Contains(s, r.literal) {
			return s
		}
		return strings.ReplaceAll(s, r.literal, r.content)
	}
	out, err := r.re.Replace(s, r.content, -1, -1)
	if err != nil { // only a match timeout; none is set
		return s
	}
	return out
}

type sequenceNormalizer []normalizer

func (q sequenceNormalizer) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

// patternJSON is HF's pattern: {"String": "..."} or {"Regex": "..."}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func parsePattern(path string, m json.RawMessage) (literal string, regex string, isRegex bool, err error) {
	var p patternJSON
	if err := json.Unmarshal(m, &p); err != nil {
		return "", "", false, loadError(path, "%v", err)
	}
	switch {
	case p.String != nil:
		return *p.String, "", false, nil
	case p.Regex != nil:
		return "", *p.Regex, true, nil
	}
	return "", "", false, loadError(path, "needs \"String\" or \"Regex\"")
}

// compileRegex compiles an HF (Oniguruma) pattern with regexp2. Character classes then follow Go's
// Unicode tables, not 16.0: the hand-written matchers cover the known patterns (pattern.go).
func compileRegex(path, re string) (*regexp2.Regexp, error) {
	r, err := regexp2.Compile(re, regexp2.None)
	if err != nil {
		return nil, loadError(path, "regex %q: %v", re, err)
	}
	return r, nil
}

func parseNormalizer(path string, m json.RawMessage) (normalizer, error) {
	typ, err := typeOf(path, m)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "NFC":
		return nfcNormalizer{norm.NFC}, nil
	case "NFD":
		return nfcNormalizer{norm.NFD}, nil
	case "NFKC":
		return nfcNormalizer{norm.NFKC}, nil
	case "NFKD":
		return nfcNormalizer{norm.NFKD}, nil
	case "Prepend":
		var p struct {
			Prepend *string `json:"prepend"`
		}
		if err := json.Unmarshal(m, &p); err != nil || p.Prepend == nil {
			return nil, loadError(path+".prepend", "missing or not a string")
		}
		return prependNormalizer{*p.Prepend}, nil
	case "Replace":
		var p struct {
			Pattern json.RawMessage `json:"pattern"`
			Content *string         `json:"content"`
		}
		if err := json.Unmarshal(m, &p); err != nil || p.Content == nil {
			return nil, loadError(path+".content", "missing or not a string")
		}
		lit, re, isRe, err := parsePattern(path+".pattern", p.Pattern)
		if err != nil {
			return nil, err
		}
		if !isRe {
			if lit == "" {
				return nil, loadError(path+".pattern.String", "empty pattern")
			}
			return replaceNormalizer{literal: lit, content: *p.Content}, nil
		}
		r, err := compileRegex(path+".pattern.Regex", re)
		if err != nil {
			return nil, err
		}
		// HF's replacement is literal: escape regexp2's substitution syntax.
		return replaceNormalizer{re: r, content: strings.ReplaceAll(*p.Content, "$", "$$")}, nil
	case "Sequence":
		var p struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(m, &p); err != nil {
			return nil, loadError(path+".normalizers", "%v", err)
		}
		var seq sequenceNormalizer
		for i, sub := range p.Normalizers {
			n, err := parseNormalizer(fmt.Sprintf("%s.normalizers[%d]", path, i), sub)
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		switch len(seq) {
		case 0:
			return nil, nil
		case 1:
			return seq[0], nil
		}
		return seq, nil
	}
	return nil, unsupported(path, typ)
}
