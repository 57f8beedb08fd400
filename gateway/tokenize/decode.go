package tokenize

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// The GPT-2 byte-level alphabet: printable bytes stand for themselves, the other 68 bytes are
// mapped to U+0100 onwards, so every byte has a visible character.
var (
	byteToChar [256]rune
	charToByte = map[rune]byte{}
)

func init() {
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToChar[b] = rune(b)
		} else {
			byteToChar[b] = rune(256 + n)
			n++
		}
		charToByte[byteToChar[b]] = byte(b)
	}
}

// byteLevelDecode appends the raw bytes a byte-level token stands for; false when a character is
// outside the alphabet.
func byteLevelDecode(dst []byte, tok string) ([]byte, bool) {
	for _, r := range tok {
		b, ok := charToByte[r]
		if !ok {
			return dst, false
		}
		dst = append(dst, b)
	}
	return dst, true
}

// A decoder turns token strings back into text (HF decoders, decode_chain semantics).
type decoder interface {
	decodeChain(tokens []string) []string
}

type byteLevelDecoder struct{}

func (byteLevelDecoder) decodeChain(tokens []string) []string {
	var buf []byte
	for _, t := range tokens {
		var ok bool
		n := len(buf)
		if buf, ok = byteLevelDecode(buf, t); !ok {
			buf = append(buf[:n], t...)
		}
	}
	return []string{strings.ToValidUTF8(string(buf), "\uFFFD")}
}

type replaceDecoder struct{ from, to string }

func (d replaceDecoder) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		out[i] = strings.ReplaceAll(t, d.from, d.to)
	}
	return out
}

// byteFallbackDecoder turns runs of <0xNN> tokens into text (U+FFFD per byte when invalid UTF-8).
type byteFallbackDecoder struct{}

func parseByteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	var v byte
	for _, c := range []byte(t[3:5]) {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | (c - '0')
		case c >= 'A' && c <= 'F':
			v = v<<4 | (c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return v, true
}

func (byteFallbackDecoder) decodeChain(tokens []string) []string {
	var out []string
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range tokens {
		if b, ok := parseByteToken(t); ok {
			pending = append(pending, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

type fuseDecoder struct{}

func (fuseDecoder) decodeChain(tokens []string) []string { return []string{strings.Join(tokens, "")} }

// stripDecoder removes up to start leading and stop trailing occurrences of content from each token.
type stripDecoder struct {
	content     string
	start, stop int
}

func (d stripDecoder) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		for k := 0; k < d.start && strings.HasPrefix(t, d.content); k++ {
			t = t[len(d.content):]
		}
		for k := 0; k < d.stop && strings.HasSuffix(t, d.content); k++ {
			t = t[:len(t)-len(d.content)]
		}
		out[i] = t
	}
	return out
}

type sequenceDecoder []decoder

func (q sequenceDecoder) decodeChain(tokens []string) []string {
	for _, d := range q {
		tokens = d.decodeChain(tokens)
	}
	return tokens
}

func parseDecoder(path string, m json.RawMessage) (decoder, error) {
	typ, err := typeOf(path, m)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "ByteLevel":
		return byteLevelDecoder{}, nil
	case "ByteFallback":
		return byteFallbackDecoder{}, nil
	case "Fuse":
		return fuseDecoder{}, nil
	case "Replace":
		var p struct {
			Pattern json.RawMessage `json:"pattern"`
			Content *string         `json:"content"`
		}
		if err := json.Unmarshal(m, &p); err != nil || p.Content == nil {
			return nil, loadError(path+".content", "missing or not a string")
		}
		lit, _, isRe, err := parsePattern(path+".pattern", p.Pattern)
		if err != nil {
			return nil, err
		}
		if isRe || lit == "" {
			return nil, loadError(path+".pattern", "only a non-empty String pattern is supported")
		}
		return replaceDecoder{lit, *p.Content}, nil
	case "Strip":
		var p struct {
			Content *string `json:"content"`
			Start   int     `json:"start"`
			Stop    int     `json:"stop"`
		}
		if err := json.Unmarshal(m, &p); err != nil || p.Content == nil {
			return nil, loadError(path, "needs \"content\", \"start\", \"stop\"")
		}
		return stripDecoder{*p.Content, p.Start, p.Stop}, nil
	case "Sequence":
		var p struct {
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := json.Unmarshal(m, &p); err != nil {
			return nil, loadError(path+".decoders", "%v", err)
		}
		var seq sequenceDecoder
		for i, sub := range p.Decoders {
			d, err := parseDecoder(fmt.Sprintf("%s.decoders[%d]", path, i), sub)
			if err != nil {
				return nil, err
			}
			seq = append(seq, d)
		}
		return seq, nil
	}
	return nil, unsupported(path, typ)
}

// Decode returns the text of ids (HF tokenizers' decode: no transformers clean-up of spaces).
// skipSpecialTokens drops special added tokens. An id outside the vocabulary is an error naming
// its index.
func (t *Tokenizer) Decode(ids []uint32, skipSpecialTokens bool) (string, error) {
	tokens := make([]string, 0, len(ids))
	for i, id := range ids {
		tok, ok := t.Token(id)
		if !ok {
			return "", fmt.Errorf("decode: ids[%d] = %d is not in the vocabulary (size %d)", i, id, len(t.idToToken))
		}
		if skipSpecialTokens && t.specialIDs[id] {
			continue
		}
		tokens = append(tokens, tok)
	}
	if t.decoder != nil {
		tokens = t.decoder.decodeChain(tokens)
	}
	return strings.Join(tokens, ""), nil
}
