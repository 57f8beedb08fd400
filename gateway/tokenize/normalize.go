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
		return n.form.String(s)
	}
	var b strings.Builder
	last := 0
	for i, r := range s[cut:] {
		i += cut
		if r >= nfcOpaqueMin && nfcOpaque[r] {
			b.WriteString(n.form.String(s[last:i]))
			b.WriteRune(r)
			last = i + utf8.RuneLen(r)
		}
	}
	b.WriteString(n.form.String(s[last:]))
	return b.String()
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
