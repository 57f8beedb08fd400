package hashcore

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"unicode/utf8"
)

// ExtraKeys returns vLLM's per-block extra keys for the full blocks of a prompt of numTokens tokens,
// exactly as vLLM builds them when it hashes a prompt (one shot, threading the multimodal index from
// item 0): one entry per full block, nil when the block has none, else a flat array of
//
//	LoRA name (string, every block), one []any{identifier string, offset-blockStart int64} per
//	overlapping multimodal item, cache_salt (string, block 0 only), SHA-256 of the block's prompt
//	embedding rows ([]byte).
//
// This is also what vLLM's BlockStored.extra_keys carries, and the vectors' extra_keys field.
func ExtraKeys(ex *Extras, numTokens, blockSize int) ([][]any, error) {
	if blockSize < 1 || blockSize > MaxBlockSize {
		return nil, fmt.Errorf("hashcore: block size %d out of range 1..%d", blockSize, MaxBlockSize)
	}
	if numTokens < 0 {
		return nil, fmt.Errorf("hashcore: negative token count %d", numTokens)
	}
	n := numTokens / blockSize
	if err := ex.validate(); err != nil {
		return nil, err
	}
	return ex.blockRange(0, n, blockSize, false), nil
}

// none reports whether ex gives no block an extra key.
func (ex *Extras) none() bool {
	return ex == nil || (ex.LoRAName == "" && ex.CacheSalt == "" && len(ex.MM) == 0 && ex.PromptEmbeds == nil)
}

// validate rejects extras vLLM could not have produced.
func (ex *Extras) validate() error {
	if ex == nil {
		return nil
	}
	if !utf8.ValidString(ex.LoRAName) {
		return fmt.Errorf("hashcore: LoRA name %q is not valid UTF-8", ex.LoRAName)
	}
	if !utf8.ValidString(ex.CacheSalt) {
		return fmt.Errorf("hashcore: cache_salt %q is not valid UTF-8", ex.CacheSalt)
	}
	for i, m := range ex.MM {
		if !utf8.ValidString(m.Identifier) {
			return fmt.Errorf("hashcore: mm item [%d] identifier %q is not valid UTF-8", i, m.Identifier)
		}
		if m.Offset < 0 || m.Length < 0 {
			return fmt.Errorf("hashcore: mm item [%d] %q: negative offset %d or length %d", i, m.Identifier, m.Offset, m.Length)
		}
		if i > 0 && m.Offset < ex.MM[i-1].Offset {
			return fmt.Errorf("hashcore: mm item [%d] %q: offset %d before the previous item's %d (items must be sorted by offset)", i, m.Identifier, m.Offset, ex.MM[i-1].Offset)
		}
	}
	return nil
}

// blockRange computes extra keys for blocks [first, last) in ONE vLLM request_block_hasher call:
// the multimodal index starts at 0 when first == 0, else at -1 (only the last item: vLLM's
// decode-time quirk), and is threaded from block to block. tagged is the released v0.31.0 layout
// (Binding.TaggedExtraKeys): each key a tuple led by its kind — ("mm", identifier, offset),
// ("cache_salt", salt), ("prompt_embeds", digest); LoRA's ("lora", name, path) needs the adapter's
// path, which Extras does not carry (checkExtras refuses a LoRA name under that layout).
func (ex *Extras) blockRange(first, last, blockSize int, tagged bool) [][]any {
	if last <= first {
		return nil
	}
	out := make([][]any, last-first)
	if ex.none() {
		return out
	}
	mmIdx := 0
	if first > 0 {
		mmIdx = -1
	}
	for b := first; b < last; b++ {
		start, end := b*blockSize, (b+1)*blockSize
		var keys []any
		if ex.LoRAName != "" {
			keys = append(keys, ex.LoRAName)
		}
		var mm []any
		mm, mmIdx = ex.mmKeys(start, end, mmIdx)
		if tagged {
			for _, k := range mm {
				keys = append(keys, append([]any{"mm"}, k.([]any)...))
			}
		} else {
			keys = append(keys, mm...)
		}
		if start == 0 && ex.CacheSalt != "" {
			if tagged {
				keys = append(keys, []any{"cache_salt", ex.CacheSalt})
			} else {
				keys = append(keys, ex.CacheSalt)
			}
		}
		if ex.PromptEmbeds != nil {
			if tagged {
				keys = append(keys, []any{"prompt_embeds", ex.embedsKey(start, end)})
			} else {
				keys = append(keys, ex.embedsKey(start, end))
			}
		}
		if len(keys) > 0 {
			out[b-first] = keys
		}
	}
	return out
}

// mmKeys mirrors vLLM's multimodal extra-key walk for one block [start, end), returning the keys and
// the next item index. An item is "passed" when start >= offset+length; it is keyed while
// end > offset; the index moves on when the block holds the item's end.
func (ex *Extras) mmKeys(start, end, idx int) ([]any, int) {
	mm := ex.MM
	if len(mm) == 0 {
		return nil, idx
	}
	if last := mm[len(mm)-1]; last.Offset+last.Length <= start {
		return nil, idx
	}
	if idx < 0 {
		idx += len(mm)
	}
	var keys []any
	for idx < len(mm) {
		m := mm[idx]
		if end <= m.Offset {
			break
		}
		if start >= m.Offset+m.Length {
			idx++
			continue
		}
		keys = append(keys, []any{m.Identifier, int64(m.Offset - start)})
		if end >= m.Offset+m.Length {
			idx++
		} else {
			break
		}
	}
	return keys, idx
}

// embedsKey is SHA-256 over the raw bytes of prompt-embedding rows [start, end) (clipped to the rows
// present: blocks past the prompt hash fewer rows, possibly none, as vLLM's tensor slice does).
func (ex *Extras) embedsKey(start, end int) []byte {
	h := sha256.New()
	for r := start; r < end && r < len(ex.PromptEmbeds); r++ {
		h.Write(ex.PromptEmbeds[r])
	}
	return h.Sum(nil)
}

// Extra-key item tags of the packed encoding (see the seam comment in hashcore.go).
const (
	tagStr   = 0x01
	tagBytes = 0x02
	tagInt   = 0x03
	tagTuple = 0x04
)

// packExtras encodes n blocks' extra keys in the compact typed form the C core reads. It returns nil
// when no block has extras.
func packExtras(extras [][]any, n int) ([]byte, error) {
	has := false
	for _, e := range extras {
		if len(e) > 0 {
			has = true
			break
		}
	}
	if !has {
		return nil, nil
	}
	var buf []byte
	for b := 0; b < n; b++ {
		var e []any
		if b < len(extras) {
			e = extras[b]
		}
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(e)))
		for i, v := range e {
			var err error
			if buf, err = packItem(buf, v); err != nil {
				return nil, fmt.Errorf("hashcore: extra keys of block %d, item %d: %w", b, i, err)
			}
		}
	}
	return buf, nil
}

func packItem(buf []byte, v any) ([]byte, error) {
	v, err := normalizeExtra(v)
	if err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case string:
		buf = append(buf, tagStr)
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(x)))
		return append(buf, x...), nil
	case []byte:
		buf = append(buf, tagBytes)
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(x)))
		return append(buf, x...), nil
	case int64:
		buf = append(buf, tagInt)
		return binary.LittleEndian.AppendUint64(buf, uint64(x)), nil
	case []any:
		buf = append(buf, tagTuple)
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(x)))
		for _, e := range x {
			if buf, err = packItem(buf, e); err != nil {
				return nil, err
			}
		}
		return buf, nil
	}
	return nil, fmt.Errorf("unsupported extra-key value %T", v)
}

// normalizeExtra maps the value types decoders produce (JSON, msgpack) onto the four the hash core
// serializes: string, []byte, int64 and []any. Integers must fit in int64.
func normalizeExtra(v any) (any, error) {
	switch x := v.(type) {
	case string:
		if !utf8.ValidString(x) {
			return nil, fmt.Errorf("extra-key string %q is not valid UTF-8", x)
		}
		return x, nil
	case []byte, []any:
		return x, nil
	case int:
		return int64(x), nil
	case int8:
		return int64(x), nil
	case int16:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case int64:
		return x, nil
	case uint8:
		return int64(x), nil
	case uint16:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case uint:
		if uint64(x) > math.MaxInt64 {
			return nil, fmt.Errorf("extra-key integer %d does not fit in int64", x)
		}
		return int64(x), nil
	case uint64:
		if x > math.MaxInt64 {
			return nil, fmt.Errorf("extra-key integer %d does not fit in int64", x)
		}
		return int64(x), nil
	case nil:
		return nil, fmt.Errorf("extra-key value is null (only str, bytes, int and arrays occur)")
	}
	return nil, fmt.Errorf("unsupported extra-key value of type %T (want string, []byte, integer or []any)", v)
}
