package trtllm

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/kvexact/kvexact/engines"
)

// scanner is a small JSON reader that keeps 64-bit integers exact (never float64), tracks the JSON
// path of the value being read for error messages, and never panics on hostile input.
type scanner struct {
	b    []byte
	off  int
	path []pathElem
}

type pathElem struct {
	key string // "" for an array index
	idx int
}

const maxDepth = 64

func (s *scanner) pathString() string {
	var sb strings.Builder
	sb.WriteByte('$')
	for _, p := range s.path {
		if p.key != "" {
			sb.WriteByte('.')
			sb.WriteString(p.key)
		} else {
			sb.WriteByte('[')
			sb.WriteString(strconv.Itoa(p.idx))
			sb.WriteByte(']')
		}
	}
	return sb.String()
}

func (s *scanner) errAt(reason engines.RejectReason, off int, format string, args ...any) error {
	return &engines.DecodeError{Reason: reason, Offset: off, Field: s.pathString(), Err: fmt.Errorf(format, args...)}
}

func (s *scanner) syntax(format string, args ...any) error {
	if s.off >= len(s.b) {
		return s.errAt(engines.ReasonDecodeError, s.off, "unexpected end of JSON")
	}
	return s.errAt(engines.ReasonDecodeError, s.off, format, args...)
}

func (s *scanner) ws() {
	for s.off < len(s.b) {
		switch s.b[s.off] {
		case ' ', '\t', '\n', '\r':
			s.off++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	s.ws()
	if s.off >= len(s.b) {
		return 0
	}
	return s.b[s.off]
}

func (s *scanner) kindName() string {
	switch c := s.peek(); {
	case c == '{':
		return "object"
	case c == '[':
		return "array"
	case c == '"':
		return "string"
	case c == 't' || c == 'f':
		return "bool"
	case c == 'n':
		return "null"
	case c == '-' || (c >= '0' && c <= '9'):
		return "number"
	}
	return "invalid value"
}

func (s *scanner) wrongType(want string) error {
	if k := s.kindName(); k != "invalid value" {
		return s.errAt(engines.ReasonSchemaMismatch, s.off, "want %s, got %s", want, k)
	}
	return s.syntax("invalid JSON value")
}

func (s *scanner) literal(lit string) bool {
	if s.peek() == lit[0] && len(s.b)-s.off >= len(lit) && string(s.b[s.off:s.off+len(lit)]) == lit {
		s.off += len(lit)
		return true
	}
	return false
}

// null consumes a null and reports true, or consumes nothing.
func (s *scanner) null() bool { return s.literal("null") }

// object calls fn for each key (the value follows unread; fn must consume it).
func (s *scanner) object(fn func(key string) error) error {
	if s.peek() != '{' {
		return s.wrongType("object")
	}
	if len(s.path) > maxDepth {
		return s.syntax("nesting too deep")
	}
	s.off++
	if s.peek() == '}' {
		s.off++
		return nil
	}
	for {
		if s.peek() != '"' {
			return s.syntax("want object key")
		}
		key, err := s.rawString()
		if err != nil {
			return err
		}
		if s.peek() != ':' {
			return s.syntax("want ':' after key")
		}
		s.off++
		s.path = append(s.path, pathElem{key: key})
		err = fn(key)
		s.path = s.path[:len(s.path)-1]
		if err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.off++
		case '}':
			s.off++
			return nil
		default:
			return s.syntax("want ',' or '}'")
		}
	}
}

// array calls fn for each element index (fn must consume the element).
func (s *scanner) array(fn func(i int) error) error {
	if s.peek() != '[' {
		return s.wrongType("array")
	}
	if len(s.path) > maxDepth {
		return s.syntax("nesting too deep")
	}
	s.off++
	if s.peek() == ']' {
		s.off++
		return nil
	}
	for i := 0; ; i++ {
		s.path = append(s.path, pathElem{idx: i})
		err := fn(i)
		s.path = s.path[:len(s.path)-1]
		if err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.off++
		case ']':
			s.off++
			return nil
		default:
			return s.syntax("want ',' or ']'")
		}
	}
}

// number returns the literal of a JSON number.
func (s *scanner) number() ([]byte, error) {
	c := s.peek()
	if c != '-' && (c < '0' || c > '9') {
		return nil, s.wrongType("number")
	}
	start := s.off
	if s.b[s.off] == '-' {
		s.off++
	}
	digits := s.off
	for s.off < len(s.b) && s.b[s.off] >= '0' && s.b[s.off] <= '9' {
		s.off++
	}
	if s.off == digits {
		return nil, s.syntax("malformed number")
	}
	if s.b[digits] == '0' && s.off-digits > 1 {
		s.off = start
		return nil, s.syntax("leading zero in number")
	}
	if s.off < len(s.b) && (s.b[s.off] == '.' || s.b[s.off] == 'e' || s.b[s.off] == 'E') {
		// A fraction or exponent: valid JSON, but never an integer field.
		for s.off < len(s.b) && strings.IndexByte("+-.eE0123456789", s.b[s.off]) >= 0 {
			s.off++
		}
		if _, err := strconv.ParseFloat(string(s.b[start:s.off]), 64); err != nil && !errors.Is(err, strconv.ErrRange) {
			s.off = start
			return nil, s.syntax("malformed number")
		}
	}
	return s.b[start:s.off], nil
}

// integer reads a JSON integer exactly. Non-negative values are exact up to 2^64-1; negative ones
// down to -2^63 (returned as their two's-complement bits, neg set).
func (s *scanner) integer() (bits uint64, neg bool, err error) {
	start := s.off
	lit, err := s.number()
	if err != nil {
		return 0, false, err
	}
	if lit[0] == '-' {
		v, err := strconv.ParseInt(string(lit), 10, 64)
		if err != nil {
			return 0, false, s.errAt(engines.ReasonSchemaMismatch, start, "%s is not a 64-bit integer", lit)
		}
		return uint64(v), true, nil
	}
	var v uint64
	for _, c := range lit {
		if c < '0' || c > '9' {
			return 0, false, s.errAt(engines.ReasonSchemaMismatch, start, "%s is not an integer", lit)
		}
		d := uint64(c - '0')
		if v > (math.MaxUint64-d)/10 {
			return 0, false, s.errAt(engines.ReasonSchemaMismatch, start, "%s overflows uint64", lit)
		}
		v = v*10 + d
	}
	return v, false, nil
}

func (s *scanner) int64v() (int64, error) {
	start := s.off
	v, neg, err := s.integer()
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, s.errAt(engines.ReasonSchemaMismatch, start, "%d overflows int64", v)
	}
	return int64(v), nil
}

func (s *scanner) intv() (int, error) {
	start := s.off
	v, err := s.int64v()
	if err != nil {
		return 0, err
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, s.errAt(engines.ReasonSchemaMismatch, start, "%d out of range", v)
	}
	return int(v), nil
}

func (s *scanner) uint64v() (uint64, error) {
	start := s.off
	v, neg, err := s.integer()
	if err != nil {
		return 0, err
	}
	if neg {
		return 0, s.errAt(engines.ReasonSchemaMismatch, start, "negative value %d", int64(v))
	}
	return v, nil
}

// hash reads a 64-bit block hash: a bare integer (exact up to 2^64-1; a negative int64, as some
// relays re-serialize it, is taken bit for bit) or a hex string (newer builds' v2_sha256): its first
// 8 bytes big-endian, or the whole value when shorter; raw then holds the bytes.
func (s *scanner) hash() (v uint64, raw []byte, err error) {
	if s.peek() == '"' {
		start := s.off
		str, err := s.rawString()
		if err != nil {
			return 0, nil, err
		}
		h := strings.TrimPrefix(strings.TrimPrefix(str, "0x"), "0X")
		if len(h)%2 == 1 {
			h = "0" + h
		}
		raw, err := hex.DecodeString(h)
		if err != nil || len(raw) == 0 {
			return 0, nil, s.errAt(engines.ReasonSchemaMismatch, start, "hash string %q is not hex", str)
		}
		n := min(len(raw), 8)
		for _, c := range raw[:n] {
			v = v<<8 | uint64(c)
		}
		return v, raw, nil
	}
	if c := s.peek(); c != '-' && (c < '0' || c > '9') {
		return 0, nil, s.wrongType("integer or hex string hash")
	}
	v, _, err = s.integer()
	return v, nil, err
}

func (s *scanner) str() (string, error) {
	if s.peek() != '"' {
		return "", s.wrongType("string")
	}
	return s.rawString()
}

// rawString reads a string at the current offset (which holds '"').
func (s *scanner) rawString() (string, error) {
	s.ws()
	start := s.off
	s.off++
	i := s.off
	for i < len(s.b) && s.b[i] != '"' && s.b[i] != '\\' && s.b[i] >= 0x20 {
		i++
	}
	if i < len(s.b) && s.b[i] == '"' {
		if !utf8.Valid(s.b[s.off:i]) {
			return "", s.errAt(engines.ReasonDecodeError, start, "invalid UTF-8 in string")
		}
		out := string(s.b[s.off:i])
		s.off = i + 1
		return out, nil
	}
	var sb strings.Builder
	sb.Write(s.b[s.off:i])
	s.off = i
	for {
		if s.off >= len(s.b) {
			return "", s.syntax("unterminated string")
		}
		c := s.b[s.off]
		switch {
		case c == '"':
			s.off++
			if !utf8.ValidString(sb.String()) {
				return "", s.errAt(engines.ReasonDecodeError, start, "invalid UTF-8 in string")
			}
			return sb.String(), nil
		case c < 0x20:
			return "", s.syntax("control character in string")
		case c != '\\':
			sb.WriteByte(c)
			s.off++
			continue
		}
		if s.off+1 >= len(s.b) {
			s.off = len(s.b)
			return "", s.syntax("unterminated escape")
		}
		e := s.b[s.off+1]
		s.off += 2
		switch e {
		case '"', '\\', '/':
			sb.WriteByte(e)
		case 'b':
			sb.WriteByte('\b')
		case 'f':
			sb.WriteByte('\f')
		case 'n':
			sb.WriteByte('\n')
		case 'r':
			sb.WriteByte('\r')
		case 't':
			sb.WriteByte('\t')
		case 'u':
			r, ok := s.hex4()
			if !ok {
				return "", s.syntax("bad \\u escape")
			}
			if utf16.IsSurrogate(r) {
				save := s.off
				if s.off+1 < len(s.b) && s.b[s.off] == '\\' && s.b[s.off+1] == 'u' {
					s.off += 2
					if r2, ok := s.hex4(); ok {
						if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
							sb.WriteRune(d)
							continue
						}
					}
				}
				s.off = save
				r = utf8.RuneError
			}
			sb.WriteRune(r)
		default:
			s.off -= 2
			return "", s.syntax("bad escape")
		}
	}
}

func (s *scanner) hex4() (rune, bool) {
	if s.off+4 > len(s.b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(s.b[s.off:s.off+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	s.off += 4
	return rune(v), true
}

// skip consumes any value.
func (s *scanner) skip() error {
	switch c := s.peek(); {
	case c == '{':
		return s.object(func(string) error { return s.skip() })
	case c == '[':
		return s.array(func(int) error { return s.skip() })
	case c == '"':
		_, err := s.rawString()
		return err
	case c == 't':
		if s.literal("true") {
			return nil
		}
	case c == 'f':
		if s.literal("false") {
			return nil
		}
	case c == 'n':
		if s.null() {
			return nil
		}
	case c == '-' || (c >= '0' && c <= '9'):
		_, err := s.number()
		return err
	}
	return s.syntax("invalid JSON value")
}
