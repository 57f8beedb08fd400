package mpack

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The Append functions write the forms msgspec (and python-msgpack with use_bin_type=True) choose:
// the smallest integer form (unsigned forms for non-negative values, signed forms for negative
// ones), float64 for floats, fix/8/16/32 string and container headers by length, bin for bytes.

// AppendNil appends nil.
func AppendNil(b []byte) []byte { return append(b, 0xc0) }

// AppendBool appends true or false.
func AppendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 0xc3)
	}
	return append(b, 0xc2)
}

// AppendUint appends a non-negative integer in its smallest form.
func AppendUint(b []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

// AppendInt appends a signed integer in its smallest form.
func AppendInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return AppendUint(b, uint64(v))
	case v >= -32:
		return append(b, byte(int8(v)))
	case v >= math.MinInt8:
		return append(b, 0xd0, byte(int8(v)))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(int16(v)))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(int32(v)))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
}

// AppendFloat64 appends a float64 (0xcb).
func AppendFloat64(b []byte, v float64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(v))
}

func appendLen(b []byte, n int, fix byte, fixMax int, m8, m16, m32 byte) []byte {
	switch {
	case n <= fixMax:
		return append(b, fix|byte(n))
	case m8 != 0 && n <= math.MaxUint8:
		return append(b, m8, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, m16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, m32), uint32(n))
}

// AppendArrayLen appends an array header.
func AppendArrayLen(b []byte, n int) []byte { return appendLen(b, n, 0x90, 15, 0, 0xdc, 0xdd) }

// AppendMapLen appends a map header (n pairs).
func AppendMapLen(b []byte, n int) []byte { return appendLen(b, n, 0x80, 15, 0, 0xde, 0xdf) }

// AppendStr appends a UTF-8 string.
func AppendStr(b []byte, s string) []byte {
	return append(appendLen(b, len(s), 0xa0, 31, 0xd9, 0xda, 0xdb), s...)
}

// AppendBin appends a byte string.
func AppendBin(b []byte, p []byte) []byte {
	if len(p) <= math.MaxUint8 {
		b = append(b, 0xc4, byte(len(p)))
	} else if len(p) <= math.MaxUint16 {
		b = binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(len(p)))
	} else {
		b = binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(len(p)))
	}
	return append(b, p...)
}

// AppendAny appends the Go values Reader.Any produces (and the usual integer kinds).
func AppendAny(b []byte, v any) ([]byte, error) { return appendAny(b, v, 0) }

func appendAny(b []byte, v any, depth int) ([]byte, error) {
	if depth > MaxDepth {
		return b, fmt.Errorf("nesting deeper than %d", MaxDepth)
	}
	switch x := v.(type) {
	case nil:
		return AppendNil(b), nil
	case bool:
		return AppendBool(b, x), nil
	case int:
		return AppendInt(b, int64(x)), nil
	case int32:
		return AppendInt(b, int64(x)), nil
	case int64:
		return AppendInt(b, x), nil
	case uint32:
		return AppendUint(b, uint64(x)), nil
	case uint64:
		return AppendUint(b, x), nil
	case float64:
		return AppendFloat64(b, x), nil
	case string:
		return AppendStr(b, x), nil
	case []byte:
		return AppendBin(b, x), nil
	case []any:
		b = AppendArrayLen(b, len(x))
		var err error
		for i, e := range x {
			if b, err = appendAny(b, e, depth+1); err != nil {
				return b, fmt.Errorf("[%d]: %w", i, err)
			}
		}
		return b, nil
	}
	return b, fmt.Errorf("unsupported type %T", v)
}
