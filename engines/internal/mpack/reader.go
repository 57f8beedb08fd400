// Package mpack is the small msgpack reader and writer the vLLM and SGLang wire codecs share. It is
// hand-written rather than reflective so that decoding keeps exact integer widths, reports the byte
// offset of every failure, never panics on hostile input, and allocates nothing on the hot path.
package mpack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Type is the msgpack family of the next value.
type Type uint8

const (
	TypeInvalid Type = iota
	TypeNil
	TypeBool
	TypeUint // non-negative integer of any width
	TypeInt  // negative integer of any width
	TypeFloat
	TypeStr
	TypeBin
	TypeArray
	TypeMap
	TypeExt
)

func (t Type) String() string {
	switch t {
	case TypeNil:
		return "nil"
	case TypeBool:
		return "bool"
	case TypeUint:
		return "uint"
	case TypeInt:
		return "negative int"
	case TypeFloat:
		return "float"
	case TypeStr:
		return "str"
	case TypeBin:
		return "bin"
	case TypeArray:
		return "array"
	case TypeMap:
		return "map"
	case TypeExt:
		return "ext"
	}
	return "invalid marker"
}

// ErrTruncated: the payload ends inside a value.
var ErrTruncated = errors.New("truncated")

// Error is a reader failure at a byte offset. Malformed is true for bytes that are not msgpack at
// all (truncation, reserved marker); false when the value is well-formed but of the wrong type.
type Error struct {
	Offset    int
	Malformed bool
	Err       error
}

func (e *Error) Error() string { return fmt.Sprintf("byte %d: %v", e.Offset, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

// MaxDepth bounds nesting in Skip and Any so hostile input cannot exhaust the stack.
const MaxDepth = 64

// Reader walks a msgpack buffer. Methods return *Error on failure and leave the offset at the start
// of the offending value.
type Reader struct {
	b   []byte
	off int
}

// NewReader starts reading at the beginning of b.
func NewReader(b []byte) Reader { return Reader{b: b} }

// Reset restarts the reader on b.
func (r *Reader) Reset(b []byte) { r.b, r.off = b, 0 }

// Offset is the byte offset of the next value.
func (r *Reader) Offset() int { return r.off }

// Seek moves to an offset previously returned by Offset.
func (r *Reader) Seek(off int) { r.off = off }

// Len is the number of unread bytes.
func (r *Reader) Len() int { return len(r.b) - r.off }

func (r *Reader) truncated() error { return &Error{Offset: r.off, Malformed: true, Err: ErrTruncated} }

func (r *Reader) wrongType(want string) error {
	t, err := r.Peek()
	if err != nil {
		return err
	}
	return &Error{Offset: r.off, Err: fmt.Errorf("want %s, got %s", want, t)}
}

// Peek returns the type of the next value without consuming it.
func (r *Reader) Peek() (Type, error) {
	if r.off >= len(r.b) {
		return TypeInvalid, r.truncated()
	}
	c := r.b[r.off]
	switch {
	case c <= 0x7f, c == 0xcc, c == 0xcd, c == 0xce, c == 0xcf:
		return TypeUint, nil
	case c >= 0xe0:
		return TypeInt, nil
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		return TypeMap, nil
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		return TypeArray, nil
	case c >= 0xa0 && c <= 0xbf, c == 0xd9, c == 0xda, c == 0xdb:
		return TypeStr, nil
	case c == 0xc0:
		return TypeNil, nil
	case c == 0xc2, c == 0xc3:
		return TypeBool, nil
	case c == 0xc4, c == 0xc5, c == 0xc6:
		return TypeBin, nil
	case c == 0xca, c == 0xcb:
		return TypeFloat, nil
	case c == 0xd0, c == 0xd1, c == 0xd2, c == 0xd3:
		// Signed markers may carry non-negative values; report by value.
		n, ok := r.sizeOf(c)
		if !ok || r.off+1+n > len(r.b) {
			return TypeInt, nil
		}
		if r.signedAt(c) >= 0 {
			return TypeUint, nil
		}
		return TypeInt, nil
	case c >= 0xc7 && c <= 0xc9, c >= 0xd4 && c <= 0xd8:
		return TypeExt, nil
	}
	return TypeInvalid, &Error{Offset: r.off, Malformed: true, Err: fmt.Errorf("reserved marker 0x%02x", c)}
}

func (r *Reader) sizeOf(c byte) (int, bool) {
	switch c {
	case 0xcc, 0xd0:
		return 1, true
	case 0xcd, 0xd1:
		return 2, true
	case 0xce, 0xd2:
		return 4, true
	case 0xcf, 0xd3:
		return 8, true
	}
	return 0, false
}

func (r *Reader) signedAt(c byte) int64 {
	p := r.b[r.off+1:]
	switch c {
	case 0xd0:
		return int64(int8(p[0]))
	case 0xd1:
		return int64(int16(binary.BigEndian.Uint16(p)))
	case 0xd2:
		return int64(int32(binary.BigEndian.Uint32(p)))
	}
	return int64(binary.BigEndian.Uint64(p))
}

// IsNil consumes a nil and reports true, or consumes nothing and reports false.
func (r *Reader) IsNil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// Int reads any msgpack integer. It returns the raw 64 bits and whether the value is negative; a
// non-negative value is exact as uint64, a negative one as int64(bits).
func (r *Reader) Int() (bits uint64, neg bool, err error) {
	if r.off >= len(r.b) {
		return 0, false, r.truncated()
	}
	c := r.b[r.off]
	if c <= 0x7f {
		r.off++
		return uint64(c), false, nil
	}
	if c >= 0xe0 {
		r.off++
		return uint64(int64(int8(c))), true, nil
	}
	n, ok := r.sizeOf(c)
	if !ok {
		return 0, false, r.wrongType("int")
	}
	if r.off+1+n > len(r.b) {
		return 0, false, r.truncated()
	}
	p := r.b[r.off+1 : r.off+1+n]
	var v uint64
	switch c {
	case 0xcc:
		v = uint64(p[0])
	case 0xcd:
		v = uint64(binary.BigEndian.Uint16(p))
	case 0xce:
		v = uint64(binary.BigEndian.Uint32(p))
	case 0xcf:
		v = binary.BigEndian.Uint64(p)
	default:
		s := r.signedAt(c)
		r.off += 1 + n
		return uint64(s), s < 0, nil
	}
	r.off += 1 + n
	return v, false, nil
}

// Uint64 reads a non-negative integer of any width.
func (r *Reader) Uint64() (uint64, error) {
	start := r.off
	v, neg, err := r.Int()
	if err != nil {
		return 0, err
	}
	if neg {
		r.off = start
		return 0, &Error{Offset: start, Err: fmt.Errorf("negative value %d", int64(v))}
	}
	return v, nil
}

// Int64 reads an integer of any width that fits in int64.
func (r *Reader) Int64() (int64, error) {
	start := r.off
	v, neg, err := r.Int()
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		r.off = start
		return 0, &Error{Offset: start, Err: fmt.Errorf("value %d overflows int64", v)}
	}
	return int64(v), nil
}

// Int32 reads an integer that fits in int32 (block sizes, ranks, indices).
func (r *Reader) Int32() (int, error) {
	start := r.off
	v, err := r.Int64()
	if err != nil {
		return 0, err
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		r.off = start
		return 0, &Error{Offset: start, Err: fmt.Errorf("value %d out of int32 range", v)}
	}
	return int(v), nil
}

// Float reads a float32, float64 or integer as float64.
func (r *Reader) Float() (float64, error) {
	if r.off >= len(r.b) {
		return 0, r.truncated()
	}
	switch r.b[r.off] {
	case 0xcb:
		if r.off+9 > len(r.b) {
			return 0, r.truncated()
		}
		v := math.Float64frombits(binary.BigEndian.Uint64(r.b[r.off+1:]))
		r.off += 9
		return v, nil
	case 0xca:
		if r.off+5 > len(r.b) {
			return 0, r.truncated()
		}
		v := math.Float32frombits(binary.BigEndian.Uint32(r.b[r.off+1:]))
		r.off += 5
		return float64(v), nil
	}
	t, err := r.Peek()
	if err != nil {
		return 0, err
	}
	if t == TypeUint || t == TypeInt {
		v, neg, err := r.Int()
		if err != nil {
			return 0, err
		}
		if neg {
			return float64(int64(v)), nil
		}
		return float64(v), nil
	}
	return 0, r.wrongType("float")
}

// lenHeader decodes a container or string header of the given fix range and 8/16/32-bit markers.
func (r *Reader) lenHeader(fixLo, fixHi byte, m8, m16, m32 int, want string) (int, error) {
	if r.off >= len(r.b) {
		return 0, r.truncated()
	}
	c := r.b[r.off]
	var n, hdr int
	switch {
	case c >= fixLo && c <= fixHi:
		n, hdr = int(c-fixLo), 1
	case m8 >= 0 && int(c) == m8:
		if r.off+2 > len(r.b) {
			return 0, r.truncated()
		}
		n, hdr = int(r.b[r.off+1]), 2
	case int(c) == m16:
		if r.off+3 > len(r.b) {
			return 0, r.truncated()
		}
		n, hdr = int(binary.BigEndian.Uint16(r.b[r.off+1:])), 3
	case int(c) == m32:
		if r.off+5 > len(r.b) {
			return 0, r.truncated()
		}
		n, hdr = int(binary.BigEndian.Uint32(r.b[r.off+1:])), 5
	default:
		return 0, r.wrongType(want)
	}
	r.off += hdr
	return n, nil
}

// ArrayLen reads an array header. The length is checked against the bytes left (every element
// takes at least one byte), so a hostile header cannot make a caller over-allocate.
func (r *Reader) ArrayLen() (int, error) {
	start := r.off
	n, err := r.lenHeader(0x90, 0x9f, -1, 0xdc, 0xdd, "array")
	if err != nil {
		return 0, err
	}
	if n > len(r.b)-r.off {
		r.off = start
		return 0, &Error{Offset: start, Malformed: true, Err: fmt.Errorf("array of %d elements: %w", n, ErrTruncated)}
	}
	return n, nil
}

// MapLen reads a map header (number of key/value pairs), checked like ArrayLen.
func (r *Reader) MapLen() (int, error) {
	start := r.off
	n, err := r.lenHeader(0x80, 0x8f, -1, 0xde, 0xdf, "map")
	if err != nil {
		return 0, err
	}
	if 2*n > len(r.b)-r.off {
		r.off = start
		return 0, &Error{Offset: start, Malformed: true, Err: fmt.Errorf("map of %d pairs: %w", n, ErrTruncated)}
	}
	return n, nil
}

func (r *Reader) body(start, n int) ([]byte, error) {
	if n > len(r.b)-r.off {
		r.off = start
		return nil, &Error{Offset: start, Malformed: true, Err: fmt.Errorf("%d-byte body: %w", n, ErrTruncated)}
	}
	p := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return p, nil
}

// Str reads a string and returns its bytes, aliasing the buffer.
func (r *Reader) Str() ([]byte, error) {
	start := r.off
	n, err := r.lenHeader(0xa0, 0xbf, 0xd9, 0xda, 0xdb, "str")
	if err != nil {
		return nil, err
	}
	return r.body(start, n)
}

// Bin reads a byte string, aliasing the buffer.
func (r *Reader) Bin() ([]byte, error) {
	start := r.off
	n, err := r.lenHeader(0xff, 0x00, 0xc4, 0xc5, 0xc6, "bin") // no fix form: empty fix range
	if err != nil {
		return nil, err
	}
	return r.body(start, n)
}

// Skip consumes one value of any type.
func (r *Reader) Skip() error { return r.skip(0) }

func (r *Reader) skip(depth int) error {
	if depth > MaxDepth {
		return &Error{Offset: r.off, Malformed: true, Err: errors.New("nesting too deep")}
	}
	t, err := r.Peek()
	if err != nil {
		return err
	}
	start := r.off
	switch t {
	case TypeNil, TypeBool:
		r.off++
	case TypeUint, TypeInt:
		_, _, err = r.Int()
	case TypeFloat:
		_, err = r.Float()
	case TypeStr:
		_, err = r.Str()
	case TypeBin:
		_, err = r.Bin()
	case TypeArray:
		var n int
		if n, err = r.ArrayLen(); err == nil {
			for i := 0; i < n && err == nil; i++ {
				err = r.skip(depth + 1)
			}
		}
	case TypeMap:
		var n int
		if n, err = r.MapLen(); err == nil {
			for i := 0; i < 2*n && err == nil; i++ {
				err = r.skip(depth + 1)
			}
		}
	case TypeExt:
		err = r.skipExt()
	}
	if err != nil {
		var me *Error
		if errors.As(err, &me) && me.Offset == start && !me.Malformed {
			me.Malformed = true
		}
	}
	return err
}

func (r *Reader) skipExt() error {
	start := r.off
	c := r.b[r.off]
	var n, hdr int
	switch c {
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		n, hdr = 1<<(c-0xd4), 2
	case 0xc7:
		if r.off+2 > len(r.b) {
			return r.truncated()
		}
		n, hdr = int(r.b[r.off+1]), 3
	case 0xc8:
		if r.off+3 > len(r.b) {
			return r.truncated()
		}
		n, hdr = int(binary.BigEndian.Uint16(r.b[r.off+1:])), 4
	case 0xc9:
		if r.off+5 > len(r.b) {
			return r.truncated()
		}
		n, hdr = int(binary.BigEndian.Uint32(r.b[r.off+1:])), 6
	}
	if hdr > len(r.b)-r.off || n > len(r.b)-r.off-hdr {
		return &Error{Offset: start, Malformed: true, Err: ErrTruncated}
	}
	r.off += hdr + n
	return nil
}

// Any decodes one value into Go values: nil, bool, uint64 (non-negative ints), int64 (negative
// ints), float64, string, []byte (copied) and []any. Maps and extensions are refused: the wire
// values it serves (vLLM extra keys) are tuples of scalars.
func (r *Reader) Any() (any, error) { return r.any(0) }

func (r *Reader) any(depth int) (any, error) {
	if depth > MaxDepth {
		return nil, &Error{Offset: r.off, Malformed: true, Err: errors.New("nesting too deep")}
	}
	t, err := r.Peek()
	if err != nil {
		return nil, err
	}
	switch t {
	case TypeNil:
		r.off++
		return nil, nil
	case TypeBool:
		v := r.b[r.off] == 0xc3
		r.off++
		return v, nil
	case TypeUint:
		v, _, err := r.Int()
		return v, err
	case TypeInt:
		v, _, err := r.Int()
		return int64(v), err
	case TypeFloat:
		return r.Float()
	case TypeStr:
		s, err := r.Str()
		return string(s), err
	case TypeBin:
		b, err := r.Bin()
		if err != nil {
			return nil, err
		}
		return append([]byte{}, b...), nil
	case TypeArray:
		n, err := r.ArrayLen()
		if err != nil {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = r.any(depth + 1); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, &Error{Offset: r.off, Err: fmt.Errorf("unsupported %s value", t)}
}

// Uint32s appends the next n values while they are unsigned integers of at most 32 bits (fixint,
// uint8/16/32 forms) — the tight loop token arrays need. It returns the index of the first value it
// did not take (n when all were taken), leaving the reader on that value for the caller to report.
func (r *Reader) Uint32s(dst []uint32, n int) ([]uint32, int) {
	b, off := r.b, r.off
	for j := 0; j < n; j++ {
		if off >= len(b) {
			r.off = off
			return dst, j
		}
		c := b[off]
		switch {
		case c <= 0x7f:
			dst = append(dst, uint32(c))
			off++
		case c == 0xce && off+5 <= len(b):
			dst = append(dst, binary.BigEndian.Uint32(b[off+1:]))
			off += 5
		case c == 0xcd && off+3 <= len(b):
			dst = append(dst, uint32(binary.BigEndian.Uint16(b[off+1:])))
			off += 3
		case c == 0xcc && off+2 <= len(b):
			dst = append(dst, uint32(b[off+1]))
			off += 2
		default:
			r.off = off
			return dst, j
		}
	}
	r.off = off
	return dst, n
}
