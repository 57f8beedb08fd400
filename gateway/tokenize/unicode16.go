package tokenize

import "sync"

//go:generate go run ./internal/ucdgen

// Character classes of the pre-tokenizer patterns, as the reference tokenizer (HF tokenizers 0.23.2,
// Oniguruma) sees them: Unicode 16.0, not Go's own tables (another version). One byte per code
// point: the general-category group in the low 4 bits, white space (Oniguruma's \s) in bit 4.
const (
	cNone uint8 = iota
	cLu
	cLl
	cLt
	cLm
	cLo
	cM
	cN
	cP
	cS
	cWS uint8 = 0x10
)

type classRange struct {
	lo, hi uint32
	f      uint8
}

// The two-level table is built on first use from classRanges: 4352 blocks of 256 code points,
// identical blocks shared.
var (
	classOnce   sync.Once
	classIndex  [0x110000 >> 8]uint16
	classBlocks []uint8
)

func buildClassTable() {
	flat := make([]uint8, 0x110000)
	for _, r := range classRanges {
		for c := r.lo; c <= r.hi; c++ {
			flat[c] = r.f
		}
	}
	seen := map[string]uint16{}
	for blk := 0; blk < len(classIndex); blk++ {
		b := flat[blk<<8 : (blk+1)<<8]
		k := string(b)
		idx, ok := seen[k]
		if !ok {
			idx = uint16(len(classBlocks) >> 8)
			classBlocks = append(classBlocks, b...)
			seen[k] = idx
		}
		classIndex[blk] = idx
	}
}

// asciiClass is the class byte of the ASCII code points, precomputed for the hot path.
var asciiClass = func() (t [128]uint8) {
	for c := 0; c < 128; c++ {
		switch {
		case c >= 'A' && c <= 'Z':
			t[c] = cLu
		case c >= 'a' && c <= 'z':
			t[c] = cLl
		case c >= '0' && c <= '9':
			t[c] = cN
		case c == ' ' || (c >= 9 && c <= 13):
			t[c] = cWS
		case c < 32 || c == 127:
			t[c] = cNone
		case c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '`' || c == '|' || c == '~':
			t[c] = cS
		default:
			t[c] = cP
		}
	}
	return
}()

// charClass returns the class byte of r (0 for invalid runes).
func charClass(r rune) uint8 {
	if r < 128 {
		if r < 0 {
			return cNone
		}
		return asciiClass[r]
	}
	if r >= 0x110000 {
		return cNone
	}
	classOnce.Do(buildClassTable)
	return classBlocks[int(classIndex[r>>8])<<8|int(r&0xff)]
}

func isLetterClass(f uint8) bool { g := f & 0xf; return g >= cLu && g <= cLo }
