package tokenize

import "unicode/utf8"

// Hand-written matchers for the Split regexes of the reference tokenizers. Each takes the text and
// a byte position and returns the end of the match that the regex (leftmost alternative first,
// greedy with backtracking, as Oniguruma runs it) finds starting exactly there, or -1. They classify
// with the Unicode 16.0 tables (unicode16.go) and are several times faster than regexp2; a
// differential test checks them against regexp2 (pattern_test.go).

// Patterns as they appear in tokenizer.json (after JSON unescaping).
const (
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternQwen   = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternO200k  = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// DeepSeek V3's main pattern holds literal CR and LF characters in its classes.
	patternDeepSeek = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
	patternDigits3  = `\p{N}{1,3}`
	patternDigit1   = `\p{N}`
	patternCJK      = "[一-龥぀-ゟ゠-ヿ]+"
)

// knownMatcher returns the hand-written matcher of a pattern, or nil.
func knownMatcher(re string) func(string, int) int {
	switch re {
	case patternLlama3:
		return matchLlama3
	case patternQwen:
		return matchQwen
	case patternO200k:
		return matchO200k
	case patternDeepSeek:
		return matchDeepSeek
	case patternDigits3:
		return matchDigits3
	case patternDigit1:
		return matchDigit1
	case patternCJK:
		return matchCJK
	}
	return nil
}

// at decodes the rune at byte i with its class byte.
func at(s string, i int) (rune, uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return r, charClass(r), n
}

func clsL(c uint8) bool     { g := c & 0xf; return g >= cLu && g <= cLo }
func clsN(c uint8) bool     { return c&0xf == cN }
func clsWS(c uint8) bool    { return c&cWS != 0 }
func clsOther(c uint8) bool { return !clsWS(c) && !clsL(c) && !clsN(c) } // [^\s\p{L}\p{N}]
func clsPS(c uint8) bool    { g := c & 0xf; return g == cP || g == cS }
func clsLM(c uint8) bool    { return clsL(c) || c&0xf == cM }

// o200k's case classes: upper-ish [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and lower-ish [\p{Ll}\p{Lm}\p{Lo}\p{M}].
func clsUpper(c uint8) bool {
	g := c & 0xf
	return g == cLu || g == cLt || g == cLm || g == cLo || g == cM
}
func clsLower(c uint8) bool {
	g := c & 0xf
	return g == cLl || g == cLm || g == cLo || g == cM
}

// run returns the end of the run of runes from i whose class satisfies pred.
func run(s string, i int, pred func(uint8) bool) int {
	for i < len(s) {
		_, c, n := at(s, i)
		if !pred(c) {
			break
		}
		i += n
	}
	return i
}

// contraction matches (?i:'s|'t|'re|'ve|'m|'ll|'d) at i (end or -1). Oniguruma's case folding
// also lets U+017F LATIN SMALL LETTER LONG S stand for s.
func contraction(s string, i int) int {
	if i+1 >= len(s) || s[i] != '\'' {
		return -1
	}
	j := i + 1
	switch s[j] | 0x20 {
	case 's', 't', 'm', 'd':
		return j + 1
	case 'r', 'v':
		if j+1 < len(s) && s[j+1]|0x20 == 'e' {
			return j + 2
		}
	case 'l':
		if j+1 < len(s) && s[j+1]|0x20 == 'l' {
			return j + 2
		}
	}
	if s[j] == 0xC5 && j+1 < len(s) && s[j+1] == 0xBF { // ſ
		return j + 2
	}
	return -1
}

// matchSpace handles the shared tail \s*[\r\n]+|\s+(?!\S)|\s+ at a white-space rune.
func matchSpace(s string, i int) int {
	j, lastNL, lastStart, count := i, -1, i, 0
	for j < len(s) {
		r, c, n := at(s, j)
		if !clsWS(c) {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = j + n
		}
		lastStart = j
		j += n
		count++
	}
	switch {
	case lastNL > 0:
		return lastNL
	case j == len(s) || count == 1:
		return j
	}
	return lastStart
}

func matchLlama3(s string, i int) int { return matchLlamaN(s, i, 3) }
func matchQwen(s string, i int) int   { return matchLlamaN(s, i, 1) }

// matchLlamaN is the llama3 / qwen pattern with \p{N}{1,maxDigits}.
func matchLlamaN(s string, i, maxDigits int) int {
	r, c, n := at(s, i)
	if r == '\'' {
		if e := contraction(s, i); e > 0 {
			return e
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if clsL(c) {
		return run(s, i+n, clsL)
	}
	if r != '\r' && r != '\n' && !clsN(c) && i+n < len(s) {
		if _, c2, _ := at(s, i+n); clsL(c2) {
			return run(s, i+n, clsL)
		}
	}
	// \p{N}{1,maxDigits}
	if clsN(c) {
		j := i + n
		for k := 1; k < maxDigits && j < len(s); k++ {
			_, c2, m := at(s, j)
			if !clsN(c2) {
				break
			}
			j += m
		}
		return j
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	if r == ' ' && i+1 < len(s) {
		if _, c2, _ := at(s, i+1); clsOther(c2) {
			return newlines(s, run(s, i+1, clsOther), false)
		}
	}
	if clsOther(c) {
		return newlines(s, run(s, i, clsOther), false)
	}
	if clsWS(c) {
		return matchSpace(s, i)
	}
	return -1
}

// newlines extends over [\r\n]* (or [\r\n/]* with slash).
func newlines(s string, i int, slash bool) int {
	for i < len(s) && (s[i] == '\r' || s[i] == '\n' || (slash && s[i] == '/')) {
		i++
	}
	return i
}

// matchO200k is gpt-oss's (o200k) pattern.
func matchO200k(s string, i int) int {
	r, c, n := at(s, i)
	prefixOK := r != '\r' && r != '\n' && !clsL(c) && !clsN(c)
	starts := [2]int{i, i}
	ns := 1
	if prefixOK {
		starts[0], ns = i+n, 2
	}
	// [^\r\n\p{L}\p{N}]?[U]*[Lw]+ contraction?
	for _, k := range starts[:ns] {
		a, lastLw := k, -1
		for a < len(s) {
			_, c2, m := at(s, a)
			if !clsUpper(c2) {
				break
			}
			if clsLower(c2) {
				lastLw = a
			}
			a += m
		}
		t := -1
		if a < len(s) {
			if _, c2, _ := at(s, a); clsLower(c2) {
				t = a
			}
		}
		if t < 0 {
			t = lastLw
		}
		if t >= 0 {
			b := run(s, t, clsLower)
			if e := contraction(s, b); e > 0 {
				return e
			}
			return b
		}
	}
	// [^\r\n\p{L}\p{N}]?[U]+[Lw]* contraction?
	for _, k := range starts[:ns] {
		if k >= len(s) {
			continue
		}
		if _, c2, _ := at(s, k); clsUpper(c2) {
			b := run(s, run(s, k, clsUpper), clsLower)
			if e := contraction(s, b); e > 0 {
				return e
			}
			return b
		}
	}
	if clsN(c) {
		j := i + n
		for k := 1; k < 3 && j < len(s); k++ {
			_, c2, m := at(s, j)
			if !clsN(c2) {
				break
			}
			j += m
		}
		return j
	}
	if r == ' ' && i+1 < len(s) {
		if _, c2, _ := at(s, i+1); clsOther(c2) {
			return newlines(s, run(s, i+1, clsOther), true)
		}
	}
	if clsOther(c) {
		return newlines(s, run(s, i, clsOther), true)
	}
	if clsWS(c) {
		return matchSpace(s, i)
	}
	return -1
}

func isASCIIPunct(b byte) bool {
	return (b >= 0x21 && b <= 0x2F) || (b >= 0x3A && b <= 0x40) || (b >= 0x5B && b <= 0x60) || (b >= 0x7B && b <= 0x7E)
}

func isASCIILetter(b byte) bool { b |= 0x20; return b >= 'a' && b <= 'z' }

// matchDeepSeek is DeepSeek V3's main pattern.
func matchDeepSeek(s string, i int) int {
	// [ASCII punct][A-Za-z]+
	if isASCIIPunct(s[i]) && i+1 < len(s) && isASCIILetter(s[i+1]) {
		j := i + 1
		for j < len(s) && isASCIILetter(s[j]) {
			j++
		}
		return j
	}
	r, c, n := at(s, i)
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if r != '\r' && r != '\n' && !clsL(c) && !clsPS(c) && i+n < len(s) {
		if _, c2, _ := at(s, i+n); clsLM(c2) {
			return run(s, i+n, clsLM)
		}
	}
	if clsLM(c) {
		return run(s, i, clsLM)
	}
	// ' ?[\p{P}\p{S}]+[\r\n]*'
	if r == ' ' && i+1 < len(s) {
		if _, c2, _ := at(s, i+1); clsPS(c2) {
			return newlines(s, run(s, i+1, clsPS), false)
		}
	}
	if clsPS(c) {
		return newlines(s, run(s, i, clsPS), false)
	}
	if clsWS(c) {
		return matchSpace(s, i)
	}
	return -1
}

func matchDigits3(s string, i int) int {
	j := i
	for k := 0; k < 3 && j < len(s); k++ {
		_, c, n := at(s, j)
		if !clsN(c) {
			break
		}
		j += n
	}
	if j == i {
		return -1
	}
	return j
}

func matchDigit1(s string, i int) int {
	if _, c, n := at(s, i); clsN(c) {
		return i + n
	}
	return -1
}

func isCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FA5) || (r >= 0x3040 && r <= 0x309F) || (r >= 0x30A0 && r <= 0x30FF)
}

func matchCJK(s string, i int) int {
	j := i
	for j < len(s) && s[j] >= 0xE3 { // every code point in the ranges is 3 bytes starting E3..E9
		r, n := utf8.DecodeRuneInString(s[j:])
		if !isCJK(r) {
			break
		}
		j += n
	}
	if j == i {
		return -1
	}
	return j
}
