// kvexact addition (not in ardanlabs/jinja v1.12.0): Python's str semantics for the string filters
// and methods chat templates use, so that a template renders as jinja2 on CPython renders it.

package jinja

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

// fullCase holds the code points whose full (SpecialCasing) upper or title mapping is more than one
// code point, e.g. ß → "SS" / "Ss", ﬁ → "FI" / "Fi", ŉ → "ʼN". CPython's str.upper/title/capitalize
// use the full mappings; Go's unicode package has only the simple ones. Built once from x/text's
// case tables.
var fullCase struct {
	once         sync.Once
	upper, title map[rune]string
}

func loadFullCase() {
	fullCase.upper, fullCase.title = map[rune]string{}, map[rune]string{}
	up, ti := cases.Upper(language.Und), cases.Title(language.Und, cases.NoLower)
	for r := rune(0x80); r <= 0xFFFF; r++ {
		if !unicode.IsLetter(r) && !unicode.IsMark(r) {
			continue
		}
		s := string(r)
		if u := up.String(s); utf8.RuneCountInString(u) > 1 {
			fullCase.upper[r] = u
		}
		if t := ti.String(s); utf8.RuneCountInString(t) > 1 {
			fullCase.title[r] = t
		}
	}
}

func pyUpperRune(b *strings.Builder, r rune) {
	if r >= 0x80 {
		fullCase.once.Do(loadFullCase)
		if s, ok := fullCase.upper[r]; ok {
			b.WriteString(s)
			return
		}
	}
	b.WriteRune(unicode.ToUpper(r))
}

func pyTitleRune(b *strings.Builder, r rune) {
	if r >= 0x80 {
		fullCase.once.Do(loadFullCase)
		if s, ok := fullCase.title[r]; ok {
			b.WriteString(s)
			return
		}
	}
	b.WriteRune(unicode.ToTitle(r))
}

// pyLowerAt writes the lowercase of rs[i] as CPython's lower_ucs4 does: İ becomes "i̇" (its full
// mapping) and Σ becomes ς at the end of a word (the Final_Sigma condition), σ elsewhere.
func pyLowerAt(b *strings.Builder, rs []rune, i int) {
	switch r := rs[i]; r {
	case 'İ':
		b.WriteString("i\u0307")
	case 'Σ':
		if finalSigma(rs, i) {
			b.WriteRune('ς')
		} else {
			b.WriteRune('σ')
		}
	default:
		b.WriteRune(unicode.ToLower(r))
	}
}

// finalSigma: a cased letter precedes rs[i] and none follows (case-ignorable runes skipped).
func finalSigma(rs []rune, i int) bool {
	j := i - 1
	for j >= 0 && caseIgnorable(rs[j]) {
		j--
	}
	if j < 0 || !cased(rs[j]) {
		return false
	}
	j = i + 1
	for j < len(rs) && caseIgnorable(rs[j]) {
		j++
	}
	return j == len(rs) || !cased(rs[j])
}

// cased is Unicode's Cased property (CPython's _PyUnicode_IsCased).
func cased(r rune) bool {
	return unicode.In(r, unicode.Lu, unicode.Ll, unicode.Lt, unicode.Other_Uppercase, unicode.Other_Lowercase)
}

// caseIgnorable is Unicode's Case_Ignorable property: Mn, Me, Cf, Lm, Sk and the Word_Break
// MidLetter, MidNumLet and Single_Quote characters.
func caseIgnorable(r rune) bool {
	switch r {
	case '\'', '.', ':', '\u00b7', '\u0387', '\u05f4', '\u2018', '\u2019', '\u2024', '\u2027', '\ufe13', '\ufe52', '\ufe55', '\uff07', '\uff0e', '\uff1a':
		return true
	}
	return unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf, unicode.Lm, unicode.Sk)
}

// pyUpper is str.upper.
func pyUpper(s string) string {
	if isASCII(s) {
		return strings.ToUpper(s)
	}
	var b strings.Builder
	for _, r := range s {
		pyUpperRune(&b, r)
	}
	return b.String()
}

// pyLower is str.lower.
func pyLower(s string) string {
	if isASCII(s) {
		return strings.ToLower(s)
	}
	rs := []rune(s)
	var b strings.Builder
	for i := range rs {
		pyLowerAt(&b, rs, i)
	}
	return b.String()
}

// pyTitle is str.title: a rune after a cased rune is lowercased, any other is titlecased.
func pyTitle(s string) string {
	rs := []rune(s)
	var b strings.Builder
	prevCased := false
	for i, r := range rs {
		if prevCased {
			pyLowerAt(&b, rs, i)
		} else {
			pyTitleRune(&b, r)
		}
		prevCased = cased(r)
	}
	return b.String()
}

// pyCapitalize is str.capitalize (Python ≥ 3.8): the first rune titlecased, the rest lowercased.
func pyCapitalize(s string) string {
	rs := []rune(s)
	var b strings.Builder
	for i, r := range rs {
		if i == 0 {
			pyTitleRune(&b, r)
		} else {
			pyLowerAt(&b, rs, i)
		}
	}
	return b.String()
}

// jinjaTitle is jinja2's title filter: the text is split at runs of "-", whitespace, "(", "{", "["
// and "<" (re.split(r"([-\s\(\{\[\<]+)")), and each piece becomes piece[0].upper() +
// piece[1:].lower() — so apostrophes and underscores do not start words, unlike str.title.
func jinjaTitle(s string) string {
	sep := func(r rune) bool {
		return r == '-' || r == '(' || r == '{' || r == '[' || r == '<' || pythonWhitespace(r)
	}
	var b strings.Builder
	rs := []rune(s)
	for i := 0; i < len(rs); {
		j := i + 1
		isSep := sep(rs[i])
		for j < len(rs) && sep(rs[j]) == isSep {
			j++
		}
		piece := rs[i:j]
		pyUpperRune(&b, piece[0])
		rest := piece[1:]
		for k := range rest {
			pyLowerAt(&b, rest, k)
		}
		i = j
	}
	return b.String()
}

// pyCenter is str.center(width) with spaces.
func pyCenter(s string, width int) string {
	n := utf8.RuneCountInString(s)
	marg := width - n
	if marg <= 0 {
		return s
	}
	left := marg/2 + (marg & width & 1)
	return strings.Repeat(" ", left) + s + strings.Repeat(" ", marg-left)
}

// jinjaTruncate is jinja2's truncate filter (leeway defaults to the policy's 5).
func jinjaTruncate(s string, length int, killwords bool, end string, leeway int) (string, error) {
	rs := []rune(s)
	endLen := utf8.RuneCountInString(end)
	if length < endLen {
		return "", fmt.Errorf("truncate: expected length >= %d, got %d", endLen, length)
	}
	if leeway < 0 {
		return "", fmt.Errorf("truncate: expected leeway >= 0, got %d", leeway)
	}
	if len(rs) <= length+leeway {
		return s, nil
	}
	head := string(rs[:length-endLen])
	if killwords {
		return head + end, nil
	}
	if k := strings.LastIndex(head, " "); k >= 0 {
		head = head[:k]
	}
	return head + end, nil
}

// pyPercent is Python's printf-style formatting (str % args), as jinja2's format filter applies
// it, for the conversions templates use: %s %r %d %i %f %e %g %x %o %c and %%, with flags, width and
// precision, and %(name)s against a mapping. Anything else is an error (the render then fails
// rather than printing something Python would not).
func pyPercent(format string, args []Value, named map[string]Value) (string, error) {
	var b strings.Builder
	next := 0
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(format) {
			return "", fmt.Errorf("format: incomplete format")
		}
		var arg Value
		haveArg := false
		if format[i] == '(' {
			end := strings.IndexByte(format[i:], ')')
			if end < 0 || named == nil {
				return "", fmt.Errorf("format: %%(name) needs a mapping argument")
			}
			v, ok := named[format[i+1:i+end]]
			if !ok {
				return "", fmt.Errorf("format: key %q not given", format[i+1:i+end])
			}
			arg, haveArg = v, true
			i += end + 1
		}
		start := i
		for i < len(format) && strings.IndexByte("#0- +", format[i]) >= 0 {
			i++
		}
		flags := format[start:i]
		wstart := i
		for i < len(format) && format[i] >= '0' && format[i] <= '9' {
			i++
		}
		width, _ := strconv.Atoi(format[wstart:i])
		prec := -1
		if i < len(format) && format[i] == '.' {
			i++
			pstart := i
			for i < len(format) && format[i] >= '0' && format[i] <= '9' {
				i++
			}
			prec, _ = strconv.Atoi(format[pstart:i])
		}
		if i >= len(format) {
			return "", fmt.Errorf("format: incomplete format")
		}
		verb := format[i]
		if verb == '%' {
			b.WriteByte('%')
			continue
		}
		if !haveArg {
			if next >= len(args) {
				return "", fmt.Errorf("format: not enough arguments for format string")
			}
			arg = args[next]
			next++
		}
		var s string
		switch verb {
		case 's':
			s = printValue(arg)
			if prec >= 0 && utf8.RuneCountInString(s) > prec {
				s = string([]rune(s)[:prec])
			}
		case 'r':
			s = arg.String()
		case 'd', 'i':
			if arg.IsBigInt() {
				s = arg.String()
				break
			}
			if !arg.IsNumber() && !arg.IsBool() {
				return "", fmt.Errorf("format: %%%c format: a real number is required, not %s", verb, pyTypeName(arg))
			}
			s = strconv.FormatInt(toInt64(arg), 10)
			if strings.Contains(flags, "+") && !strings.HasPrefix(s, "-") {
				s = "+" + s
			} else if strings.Contains(flags, " ") && !strings.HasPrefix(s, "-") {
				s = " " + s
			}
		case 'f', 'F', 'e', 'E', 'g', 'G', 'x', 'X', 'o', 'c':
			gf := "%" + flags
			if prec >= 0 {
				gf += "." + strconv.Itoa(prec)
			}
			switch {
			case verb == 'c':
				if arg.IsString() && utf8.RuneCountInString(arg.AsString()) == 1 {
					s = arg.AsString()
				} else if arg.IsInt() {
					s = string(rune(arg.AsInt()))
				} else {
					return "", fmt.Errorf("format: %%c requires an int or a single character")
				}
			case verb == 'x' || verb == 'X' || verb == 'o':
				if !arg.IsInt() && !arg.IsBool() {
					return "", fmt.Errorf("format: %%%c format: an integer is required, not %s", verb, pyTypeName(arg))
				}
				s = fmt.Sprintf(gf+string(verb), toInt64(arg))
			default:
				if !arg.IsNumber() && !arg.IsBool() {
					return "", fmt.Errorf("format: must be real number, not %s", pyTypeName(arg))
				}
				f := toFloat64(arg)
				if prec < 0 {
					gf += ".6"
				}
				s = fmt.Sprintf(gf+string(verb), f)
			}
		default:
			return "", fmt.Errorf("format: unsupported format character %q", verb)
		}
		if n := utf8.RuneCountInString(s); n < width {
			pad := strings.Repeat(" ", width-n)
			switch {
			case strings.Contains(flags, "-"):
				s += pad
			case strings.Contains(flags, "0") && strings.IndexByte("dieEfFgGxXo", verb) >= 0:
				sign := ""
				if strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") || strings.HasPrefix(s, " ") {
					sign, s = s[:1], s[1:]
				}
				s = sign + strings.Repeat("0", width-n) + s
			default:
				s = pad + s
			}
		}
		b.WriteString(s)
	}
	if named == nil && next < len(args) {
		return "", fmt.Errorf("format: not all arguments converted during string formatting")
	}
	return b.String(), nil
}

func pyTypeName(v Value) string {
	switch v.kind {
	case KindNone:
		return "NoneType"
	case KindBool:
		return "bool"
	case KindInt:
		return "int"
	case KindFloat:
		return "float"
	case KindString:
		return "str"
	case KindList:
		return "list"
	case KindDict:
		return "dict"
	}
	return "object"
}
