package hashcore

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// A pickler writes the subset of pickle protocol 5 that vLLM's block pre-images use, byte for byte
// as CPython's C pickler (pickle.dumps(obj, protocol=5)) does:
//
//	PROTO 5, then the body cut into frames (FRAME 0x95 + u64le length), STOP inside the last one;
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
// Framing follows CPython's C pickler (checked against CPython 3.11 on large random objects): the
// first write after PROTO opens a frame; at the start of every object's save, a frame that has
// reached 64 KiB is closed; a str or bytes payload of 64 KiB or more closes the open frame and is
// written, opcode header included, outside any frame; a frame shorter than 4 bytes is written
// without a FRAME header. A 4096-token block of the largest ids is about 28 KiB, so only huge extra
// keys reach a second frame.
type pickler struct {
	out        []byte
	frameStart int  // offset of the open frame's reserved header, -1 when none is open
	framing    bool // false only while a large payload is written outside frames
	memo       int  // next memo index
	singletons map[string]int
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

func newPickler() *pickler {
	return &pickler{out: []byte{opProto, 5}, frameStart: -1, framing: true}
}

const frameHeaderSize = 9

// write appends framed output, opening a frame when none is open.
func (p *pickler) write(b ...byte) {
	if p.framing && p.frameStart < 0 {
		p.frameStart = len(p.out)
		p.out = append(p.out, make([]byte, frameHeaderSize)...)
	}
	p.out = append(p.out, b...)
}

// commitFrame closes the open frame: its header is filled in, or removed when the frame is shorter
// than frameSizeMin.
func (p *pickler) commitFrame() {
	if p.frameStart < 0 {
		return
	}
	n := len(p.out) - p.frameStart - frameHeaderSize
	if n >= frameSizeMin {
		p.out[p.frameStart] = opFrame
		binary.LittleEndian.PutUint64(p.out[p.frameStart+1:], uint64(n))
	} else {
		copy(p.out[p.frameStart:], p.out[p.frameStart+frameHeaderSize:])
		p.out = p.out[:len(p.out)-frameHeaderSize]
	}
	p.frameStart = -1
}

// boundary runs at the start of every object's save: a full frame is closed there.
func (p *pickler) boundary() {
	if p.frameStart >= 0 && len(p.out)-p.frameStart-frameHeaderSize >= frameSizeTarget {
		p.commitFrame()
	}
}

// payload writes an opcode header and a str/bytes payload; 64 KiB or more goes outside frames.
func (p *pickler) payload(header, data []byte) {
	if len(data) < frameSizeTarget {
		p.write(header...)
		p.write(data...)
		return
	}
	p.commitFrame()
	p.framing = false
	p.write(header...)
	p.write(data...)
	p.framing = true
}

func (p *pickler) memoize() {
	p.write(opMemoize)
	p.memo++
}

// mark starts a tuple of more than three items (the tuple's own save boundary comes first).
func (p *pickler) mark() {
	p.boundary()
	p.write(opMark)
}

func (p *pickler) none() {
	p.boundary()
	p.write(opNone)
}

// tupleEnd closes a tuple of n already-written items (the MARK, when n > 3, was written first).
func (p *pickler) tupleEnd(n int) {
	switch n {
	case 0:
		p.write(opEmptyTuple)
		return
	case 1:
		p.write(opTuple1)
	case 2:
		p.write(opTuple2)
	case 3:
		p.write(opTuple3)
	default:
		p.write(opTuple)
	}
	p.memoize()
}

func (p *pickler) int(v int64) {
	p.boundary()
	switch {
	case v >= 0 && v <= 0xff:
		p.write(opBinInt1, byte(v))
	case v >= 0 && v <= 0xffff:
		p.write(binary.LittleEndian.AppendUint16([]byte{opBinInt2}, uint16(v))...)
	case v >= -1<<31 && v < 1<<31:
		p.write(binary.LittleEndian.AppendUint32([]byte{opBinInt}, uint32(int32(v)))...)
	default:
		enc := encodeLong(v)
		p.write(append([]byte{opLong1, byte(len(enc))}, enc...)...)
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
	p.boundary()
	if uint64(len(v)) > 1<<32-1 {
		return fmt.Errorf("pickle: %d-byte bytes object is too large", len(v))
	}
	if len(v) < 256 {
		p.payload([]byte{opShortBinBytes, byte(len(v))}, v)
	} else {
		p.payload(binary.LittleEndian.AppendUint32([]byte{opBinBytes}, uint32(len(v))), v)
	}
	p.memoize()
	return nil
}

// isSingleton reports whether CPython returns a cached, shared object for s, or whether s is one of
// the tag constants of vLLM's tagged extra keys ("mm" twice in one block is one code constant). A
// user string equal to a tag constant (a LoRA named "mm") would be a distinct object in the engine:
// that block would hash differently there (docs/reference/vllm-releases.md §10).
func isSingleton(s string) bool {
	switch s {
	case "", "mm", "lora", "cache_salt", "prompt_embeds":
		return true
	}
	r, n := utf8.DecodeRuneInString(s)
	return n == len(s) && r != utf8.RuneError && r < 256
}

func (p *pickler) str(s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("pickle: string %q is not valid UTF-8", s)
	}
	if uint64(len(s)) > 1<<32-1 {
		return fmt.Errorf("pickle: %d-byte string is too large", len(s))
	}
	p.boundary()
	if isSingleton(s) {
		if idx, ok := p.singletons[s]; ok {
			if idx < 256 {
				p.write(opBinGet, byte(idx))
			} else {
				p.write(binary.LittleEndian.AppendUint32([]byte{opLongBinGet}, uint32(idx))...)
			}
			return nil
		}
		if p.singletons == nil {
			p.singletons = map[string]int{}
		}
		p.singletons[s] = p.memo
	}
	if len(s) < 256 {
		p.payload([]byte{opShortBinUnicod, byte(len(s))}, []byte(s))
	} else {
		p.payload(binary.LittleEndian.AppendUint32([]byte{opBinUnicode}, uint32(len(s))), []byte(s))
	}
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
		} else {
			p.boundary()
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

// finish appends STOP, closes the last frame and returns the whole pickle.
func (p *pickler) finish() ([]byte, error) {
	p.write(opStop)
	p.commitFrame()
	return p.out, nil
}
