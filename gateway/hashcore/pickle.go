package hashcore

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// A pickler writes the subset of pickle protocol 5 that vLLM's block pre-images use, byte for byte
// as CPython's C pickler (pickle.dumps(obj, protocol=5)) does:
//
//	PROTO 5, one FRAME (0x95 + u64le length) around the body when it is ≥ 4 bytes, STOP inside it;
//	bytes: SHORT_BINBYTES (< 256) / BINBYTES, then MEMOIZE;
//	str:   SHORT_BINUNICODE (< 256 UTF-8 bytes) / BINUNICODE, then MEMOIZE;
//	int:   BININT1 0..255, BININT2 256..65535, BININT other int32, LONG1 beyond;
//	tuple: EMPTY_TUPLE (no memo); 1..3 items: items + TUPLE1/2/3 + MEMOIZE;
//	       more: MARK + items + TUPLE + MEMOIZE;
//	None:  NONE.
//
// Memo caveat: CPython memoizes by object identity, so a str object that occurs twice in one
// pre-image is written the second time as BINGET. In vLLM the strings of one block (LoRA name, mm
// identifiers, cache_salt) are distinct objects even when equal — except CPython's cached singletons:
// the empty string and one-character strings with a code point below 256. The pickler models exactly
// that: such strings are memoized by value and repeated as BINGET; every other string is written in
// full each time. (Equal multi-character strings that ARE the same object in a real engine — not
// produced by vLLM's hashers — would hash differently there; nothing here can see object identity.)
//
// A pre-image whose body reaches 64 KiB would make CPython split frames (and write ≥ 64 KiB objects
// outside frames); no vector pins that layout, so the pickler refuses it with an error instead of
// guessing. A 4096-token block of the largest ids is about 28 KiB, so only huge extra keys get there.
type pickler struct {
	body       []byte
	memo       int            // next memo index
	singletons map[string]int // memo index of cached-singleton strings already written
}

const (
	opProto          = 0x80
	opFrame          = 0x95
	opStop           = '.'
	opMark           = '('
	opTuple          = 't'
	opEmptyTuple     = ')'
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opNone           = 'N'
	opBinInt         = 'J'
	opBinInt1        = 'K'
	opBinInt2        = 'M'
	opLong1          = 0x8a
	opShortBinBytes  = 'C'
	opBinBytes       = 'B'
	opShortBinUnicod = 0x8c
	opBinUnicode     = 'X'
	opMemoize        = 0x94
	opBinGet         = 'h'
	opLongBinGet     = 'j'

	frameSizeTarget = 64 * 1024
	frameSizeMin    = 4
)

func newPickler() *pickler { return &pickler{} }

func (p *pickler) memoize() {
	p.body = append(p.body, opMemoize)
	p.memo++
}

func (p *pickler) mark() { p.body = append(p.body, opMark) }

func (p *pickler) none() { p.body = append(p.body, opNone) }

// tupleEnd closes a tuple of n already-written items (the MARK, when n > 3, was written first).
func (p *pickler) tupleEnd(n int) {
	switch n {
	case 0:
		p.body = append(p.body, opEmptyTuple)
		return
	case 1:
		p.body = append(p.body, opTuple1)
	case 2:
		p.body = append(p.body, opTuple2)
	case 3:
		p.body = append(p.body, opTuple3)
	default:
		p.body = append(p.body, opTuple)
	}
	p.memoize()
}

func (p *pickler) int(v int64) {
	switch {
	case v >= 0 && v <= 0xff:
		p.body = append(p.body, opBinInt1, byte(v))
	case v >= 0 && v <= 0xffff:
		p.body = append(p.body, opBinInt2)
		p.body = binary.LittleEndian.AppendUint16(p.body, uint16(v))
	case v >= -1<<31 && v < 1<<31:
		p.body = append(p.body, opBinInt)
		p.body = binary.LittleEndian.AppendUint32(p.body, uint32(int32(v)))
	default:
		enc := encodeLong(v)
		p.body = append(p.body, opLong1, byte(len(enc)))
		p.body = append(p.body, enc...)
	}
}

// encodeLong is Python's pickle.encode_long: little-endian two's complement, the fewest bytes that
// keep the sign.
func encodeLong(v int64) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(v))
	n := 8
	for n > 1 {
		top, next := b[n-1], b[n-2]
		if (v >= 0 && top == 0x00 && next&0x80 == 0) || (v < 0 && top == 0xff && next&0x80 != 0) {
			n--
			continue
		}
		break
	}
	return append([]byte(nil), b[:n]...)
}

func (p *pickler) bytes(v []byte) error {
	if len(v) >= frameSizeTarget {
		return fmt.Errorf("pickle: %d-byte bytes object needs framing outside the frame, not reproduced", len(v))
	}
	if len(v) < 256 {
		p.body = append(p.body, opShortBinBytes, byte(len(v)))
	} else {
		p.body = append(p.body, opBinBytes)
		p.body = binary.LittleEndian.AppendUint32(p.body, uint32(len(v)))
	}
	p.body = append(p.body, v...)
	p.memoize()
	return nil
}

// isSingleton reports whether CPython returns a cached, shared object for s.
func isSingleton(s string) bool {
	if s == "" {
		return true
	}
	r, n := utf8.DecodeRuneInString(s)
	return n == len(s) && r != utf8.RuneError && r < 256
}

func (p *pickler) str(s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("pickle: string %q is not valid UTF-8", s)
	}
	if len(s) >= frameSizeTarget {
		return fmt.Errorf("pickle: %d-byte string needs framing outside the frame, not reproduced", len(s))
	}
	if isSingleton(s) {
		if idx, ok := p.singletons[s]; ok {
			if idx < 256 {
				p.body = append(p.body, opBinGet, byte(idx))
			} else {
				p.body = append(p.body, opLongBinGet)
				p.body = binary.LittleEndian.AppendUint32(p.body, uint32(idx))
			}
			return nil
		}
		if p.singletons == nil {
			p.singletons = map[string]int{}
		}
		p.singletons[s] = p.memo
	}
	if len(s) < 256 {
		p.body = append(p.body, opShortBinUnicod, byte(len(s)))
	} else {
		p.body = append(p.body, opBinUnicode)
		p.body = binary.LittleEndian.AppendUint32(p.body, uint32(len(s)))
	}
	p.body = append(p.body, s...)
	p.memoize()
	return nil
}

// value writes a normalized extra-key value (string, []byte, int64, []any as a tuple).
func (p *pickler) value(v any) error {
	switch x := v.(type) {
	case string:
		return p.str(x)
	case []byte:
		return p.bytes(x)
	case int64:
		p.int(x)
		return nil
	case []any:
		if len(x) > 3 {
			p.mark()
		}
		for _, e := range x {
			if err := p.value(e); err != nil {
				return err
			}
		}
		p.tupleEnd(len(x))
		return nil
	}
	return fmt.Errorf("pickle: unsupported value %T", v)
}

// finish appends STOP and returns PROTO 5 + the framed body.
func (p *pickler) finish() ([]byte, error) {
	p.body = append(p.body, opStop)
	if len(p.body) >= frameSizeTarget {
		return nil, fmt.Errorf("pickle: %d-byte pre-image would be split into several frames, not reproduced", len(p.body))
	}
	out := make([]byte, 0, 11+len(p.body))
	out = append(out, opProto, 5)
	if len(p.body) >= frameSizeMin {
		out = append(out, opFrame)
		out = binary.LittleEndian.AppendUint64(out, uint64(len(p.body)))
	}
	return append(out, p.body...), nil
}
