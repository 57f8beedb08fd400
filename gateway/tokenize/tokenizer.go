// Package tokenize turns text into the token ids an inference engine computes for it, from the
// model's own tokenizer.json and tokenizer_config.json (the HuggingFace tokenizers format, with
// transformers' BOS/EOS rule on top). It is a pure-Go implementation of the subset the reference
// tokenizers use; anything else is refused at load with the component named. It also owns the
// segment cache, which memoizes the ids of the text between added tokens — exact because each such
// segment is encoded from its own text alone (segment_cache.go) — so a multi-turn prompt pays only for
// its new turn. See docs/tokenizer.md.
package tokenize

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unicode/utf8"
)

// Tokenizer encodes and decodes text for one model. It is immutable after Load and safe for
// concurrent use (WithSegmentCache returns a copy).
type Tokenizer struct {
	dir        string
	cfg        *Config
	jsonSHA    string
	configSHA  string
	added      *addedVocab
	normalizer normalizer // nil: none
	pre        []preStep  // applied in order to every piece
	model      *bpe
	post       postProcessor
	decoder    decoder // nil: concatenate token strings
	// specialIDs marks ids of special added tokens (skipped by Decode when asked).
	specialIDs map[uint32]bool
	// idToToken covers model vocabulary and added tokens.
	idToToken []string
	tokenToID map[string]uint32
	// identity is the two files' digests: the segment cache's key for this tokenizer.
	identity string
	// segmentLocal: every component maps a segment between added tokens to ids from that segment
	// alone, so segs may memoize them (segment_cache.go).
	segmentLocal bool
	segs         *SegmentCache // nil: none
}

// Load reads dir/tokenizer.json and dir/tokenizer_config.json. An unsupported component is an
// error naming it (such a model gets no exact routing).
func Load(dir string) (*Tokenizer, error) {
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	tc, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, err
	}
	t, err := FromBytes(tj, tc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	t.dir = dir
	return t, nil
}

// FromBytes builds a Tokenizer from the contents of tokenizer.json and tokenizer_config.json.
func FromBytes(tokenizerJSON, tokenizerConfig []byte) (*Tokenizer, error) {
	cfg, err := ParseConfig(tokenizerConfig)
	if err != nil {
		return nil, err
	}
	t, err := build(tokenizerJSON, cfg)
	if err != nil {
		return nil, err
	}
	a := sha256.Sum256(tokenizerJSON)
	b := sha256.Sum256(tokenizerConfig)
	t.jsonSHA, t.configSHA = hex.EncodeToString(a[:]), hex.EncodeToString(b[:])
	t.identity = t.jsonSHA + t.configSHA
	t.segmentLocal = tokenizerSegmentLocal(t)
	return t, nil
}

// Config returns the parsed tokenizer_config.json.
func (t *Tokenizer) Config() *Config { return t.cfg }

// Files returns the sha256 digests (hex) of tokenizer.json and tokenizer_config.json as loaded, for
// certificates.
func (t *Tokenizer) Files() (tokenizerJSONSHA256, configSHA256 string) { return t.jsonSHA, t.configSHA }

// Dir is the folder the tokenizer was loaded from ("" when built from bytes).
func (t *Tokenizer) Dir() string { return t.dir }

// TokenID returns the id of a token string (vocabulary or added token), as written in tokenizer.json.
func (t *Tokenizer) TokenID(s string) (uint32, bool) {
	id, ok := t.tokenToID[s]
	return id, ok
}

// Token returns the token string of id, as written in tokenizer.json.
func (t *Tokenizer) Token(id uint32) (string, bool) {
	if int(id) >= len(t.idToToken) || (t.idToToken[id] == "" && !t.hasID(id)) {
		return "", false
	}
	return t.idToToken[id], true
}

func (t *Tokenizer) hasID(id uint32) bool {
	got, ok := t.tokenToID[t.idToToken[id]]
	return ok && got == id
}

// VocabSize is the number of ids (model vocabulary plus added tokens), i.e. one more than the
// largest id.
func (t *Tokenizer) VocabSize() int { return len(t.idToToken) }

// ErrInvalidUTF8 is returned (wrapped, with the byte offset) for text that is not valid UTF-8:
// the reference tokenizer only ever sees valid strings, so there is no answer to match.
var ErrInvalidUTF8 = errors.New("text is not valid UTF-8")

// Encode returns the ids of text. addSpecialTokens applies the post-processor (BOS/EOS as the
// engine would add them); special tokens written in the text are always matched as tokens.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	return t.AppendEncode(nil, text, addSpecialTokens)
}

// AppendEncode is Encode appending to dst, for callers that reuse a buffer.
func (t *Tokenizer) AppendEncode(dst []uint32, text string, addSpecialTokens bool) ([]uint32, error) {
	if !utf8.ValidString(text) {
		off := 0
		for off < len(text) {
			r, n := utf8.DecodeRuneInString(text[off:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			off += n
		}
		return dst, fmt.Errorf("%w at byte offset %d", ErrInvalidUTF8, off)
	}
	if addSpecialTokens {
		dst = t.post.prefix(dst)
	}
	dst = t.encodeText(dst, text)
	if addSpecialTokens {
		dst = t.post.suffix(dst)
	}
	return dst, nil
}

// encodeText runs added-token extraction, normalization, pre-tokenization and the model.
func (t *Tokenizer) encodeText(dst []uint32, text string) []uint32 {
	sc := getScratch()
	sc.tok, sc.dst = t, dst
	t.added.split(text, false, sc.rawSegment)
	dst = sc.dst
	sc.tok, sc.dst = nil, nil
	putScratch(sc)
	return dst
}

// rawSegment receives the segments of the added-token split of the raw text. A text segment's ids
// depend on it alone (segment_cache.go), so they come from the segment cache when t has one.
func (sc *scratch) rawSegment(seg string, id int64) {
	if id >= 0 {
		sc.dst = append(sc.dst, uint32(id))
		return
	}
	c := sc.tok.segs
	if c == nil || len(seg) < c.minBytes {
		sc.encodeSegment(seg)
		return
	}
	k := segmentKey{tokenizer: sc.tok.identity, text: seg}
	if ids, ok := c.get(k); ok {
		sc.dst = append(sc.dst, ids...)
		return
	}
	start := len(sc.dst)
	sc.encodeSegment(seg)
	c.put(k, sc.dst[start:])
}

// encodeSegment appends the ids of one text segment of the raw added-token split.
func (sc *scratch) encodeSegment(seg string) {
	if n := sc.tok.normalizer; n != nil {
		seg = n.normalize(seg)
	}
	sc.tok.added.split(seg, true, sc.normSegment)
}

// normSegment receives the segments of the added-token split of normalized text.
func (sc *scratch) normSegment(seg string, id int64) {
	if id >= 0 {
		sc.dst = append(sc.dst, uint32(id))
		return
	}
	sc.preTokenize(seg, 0)
}

// preTokenize applies pre-tokenizer steps from k on and encodes every resulting piece. The
// per-step callbacks live in the pooled scratch, so a call allocates nothing.
func (sc *scratch) preTokenize(s string, k int) {
	if s == "" {
		return
	}
	t := sc.tok
	if k == len(t.pre) {
		sc.dst = t.model.encode(sc.dst, s, sc)
		return
	}
	for len(sc.emits) <= k {
		next := len(sc.emits) + 1
		sc.emits = append(sc.emits, func(piece string) { sc.preTokenize(piece, next) })
	}
	t.pre[k].split(s, sc, sc.emits[k])
}
