package hashcore

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// msgpackAppend appends v as MessagePack the way msgspec.msgpack.Encoder writes the values a vLLM
// pre-image holds (the reference for the C core's msgpack writer): nil as nil (0xc0); integers in
// their shortest form (positive fixint, uint8/16/32/64, negative fixint, int8/16/32/64); strings as
// fixstr/str8/str16/str32 (UTF-8); bytes as bin8/bin16/bin32; tuples and lists alike as
// fixarray/array16/array32. Anything else is an error naming its type.
func msgpackAppend(b []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(b, 0xc0), nil
	case string:
		if !utf8.ValidString(x) {
			return nil, fmt.Errorf("string %q is not valid UTF-8", x)
		}
		n := len(x)
		switch {
		case n < 32:
			b = append(b, 0xa0|byte(n))
		case n <= 0xff:
			b = append(b, 0xd9, byte(n))
		case n <= 0xffff:
			b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
		default:
			b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
		}
		return append(b, x...), nil
	case []byte:
		n := len(x)
		switch {
		case n <= 0xff:
			b = append(b, 0xc4, byte(n))
		case n <= 0xffff:
			b = binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(n))
		default:
			b = binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(n))
		}
		return append(b, x...), nil
	case uint32:
		return msgpackUint(b, uint64(x)), nil
	case int64:
		if x >= 0 {
			return msgpackUint(b, uint64(x)), nil
		}
		switch {
		case x >= -32:
			return append(b, byte(x)), nil // negative fixint 0xe0..0xff
		case x >= -128:
			return append(b, 0xd0, byte(x)), nil
		case x >= -32768:
			return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(x)), nil
		case x >= -1<<31:
			return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(x)), nil
		}
		return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(x)), nil
	case []uint32:
		b = msgpackArrayHead(b, len(x))
		for _, t := range x {
			b = msgpackUint(b, uint64(t))
		}
		return b, nil
	case []any:
		b = msgpackArrayHead(b, len(x))
		var err error
		for i, e := range x {
			if b, err = msgpackAppend(b, e); err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
		}
		return b, nil
	}
	return nil, fmt.Errorf("msgpack: unsupported type %T", v)
}

func msgpackUint(b []byte, v uint64) []byte {
	switch {
	case v < 0x80:
		return append(b, byte(v))
	case v <= 0xff:
		return append(b, 0xcc, byte(v))
	case v <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

func msgpackArrayHead(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
}
