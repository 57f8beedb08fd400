package vllm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/internal/mpack"
)

// DecodeBatch decodes one ZMQ payload: a msgpack [ts, events, data_parallel_rank] whose events may
// be tagged arrays or tagged maps, element by element. A batch is accepted whole or rejected whole
// with an *engines.DecodeError naming the byte offset and field.
func DecodeBatch(payload []byte) (engines.Batch, error) {
	var b engines.Batch
	err := DecodeBatchInto(&b, payload)
	return b, err
}

// DecodeBatchInto is DecodeBatch reusing dst's slices (events, hashes, tokens) to keep the event path
// allocation-free in the steady state. Slices left in dst alias those buffers until the next call.
func DecodeBatchInto(dst *engines.Batch, payload []byte) error {
	d := decoder{r: mpack.NewReader(payload)}
	err := d.batch(dst)
	if err != nil {
		dst.Events = dst.Events[:0]
	}
	return err
}

type decoder struct {
	r mpack.Reader
}

// fail turns a reader error into the typed reject; field is built only on this path.
func (d *decoder) fail(err error, field string) error { return d.r.Reject(err, field) }

func (d *decoder) reject(reason engines.RejectReason, off int, field string, err error) error {
	return &engines.DecodeError{Reason: reason, Offset: off, Field: field, Err: err}
}

func ev(i int, name string) string { return fmt.Sprintf("events[%d].%s", i, name) }

func (d *decoder) batch(dst *engines.Batch) error {
	n, err := d.r.ArrayLen()
	if err != nil {
		return d.fail(err, "batch")
	}
	if n < 2 {
		return d.reject(engines.ReasonSchemaMismatch, 0, "batch", fmt.Errorf("array of %d, want [ts, events, data_parallel_rank]", n))
	}
	if dst.Timestamp, err = d.r.Float(); err != nil {
		return d.fail(err, "ts")
	}
	ne, err := d.r.ArrayLen()
	if err != nil {
		return d.fail(err, "events")
	}
	if cap(dst.Events) >= ne {
		dst.Events = dst.Events[:ne]
	} else {
		dst.Events = append(dst.Events[:cap(dst.Events)], make([]engines.Event, ne-cap(dst.Events))...)
	}
	for i := range dst.Events {
		e := &dst.Events[i]
		reset(e)
		if err := d.event(i, e); err != nil {
			return err
		}
	}
	dst.DPRank, dst.HasDPRank = 0, false
	if n >= 3 {
		if !d.r.IsNil() {
			if dst.DPRank, err = d.r.Int32(); err != nil {
				return d.fail(err, "data_parallel_rank")
			}
			dst.HasDPRank = true
		}
		for i := 3; i < n; i++ { // forward compatibility: later batch fields
			if err := d.r.Skip(); err != nil {
				return d.fail(err, fmt.Sprintf("batch[%d]", i))
			}
		}
	}
	if d.r.Len() != 0 {
		return d.reject(engines.ReasonDecodeError, d.r.Offset(), "batch", fmt.Errorf("%d trailing bytes", d.r.Len()))
	}
	return nil
}

// reset clears e but keeps its slices' capacity.
func reset(e *engines.Event) {
	*e = engines.Event{
		BlockHashes: e.BlockHashes[:0],
		TokenIDs:    e.TokenIDs[:0],
		BlockTokens: e.BlockTokens[:0],
		ExtraKeys:   e.ExtraKeys[:0],
	}
}

func (d *decoder) event(i int, e *engines.Event) error {
	t, err := d.r.Peek()
	if err != nil {
		return d.fail(err, fmt.Sprintf("events[%d]", i))
	}
	switch t {
	case mpack.TypeMap:
		err = d.mapEvent(i, e)
	case mpack.TypeArray:
		err = d.arrayEvent(i, e)
	default:
		return d.reject(engines.ReasonSchemaMismatch, d.r.Offset(), fmt.Sprintf("events[%d]", i),
			fmt.Errorf("event is a %s, want a tagged map or array", t))
	}
	if err != nil {
		return err
	}
	splitBlocks(e)
	return nil
}

func kindOf(tag []byte) engines.Kind {
	switch string(tag) {
	case "BlockStored":
		return engines.BlockStored
	case "BlockRemoved":
		return engines.BlockRemoved
	case "AllBlocksCleared":
		return engines.AllBlocksCleared
	}
	return 0
}

const (
	seenHashes = 1 << iota
	seenParent
	seenTokens
	seenBlockSize
)

func (d *decoder) mapEvent(i int, e *engines.Event) error {
	start := d.r.Offset()
	n, err := d.r.MapLen()
	if err != nil {
		return d.fail(err, fmt.Sprintf("events[%d]", i))
	}
	body := d.r.Offset()
	// msgspec writes the tag first; find it anywhere else too.
	tagOff := -1
	for j := 0; j < n; j++ {
		k, err := d.r.Str()
		if err != nil {
			return d.fail(err, fmt.Sprintf("events[%d] key %d", i, j))
		}
		if string(k) == "type" {
			tagOff = d.r.Offset()
			tag, err := d.r.Str()
			if err != nil {
				return d.fail(err, ev(i, "type"))
			}
			if e.Kind = kindOf(tag); e.Kind == 0 {
				return d.reject(engines.ReasonUnknownEvent, tagOff, ev(i, "type"), fmt.Errorf("unknown event type %q", tag))
			}
			break
		}
		if err := d.r.Skip(); err != nil {
			return d.fail(err, ev(i, string(k)))
		}
	}
	if tagOff < 0 {
		return d.reject(engines.ReasonSchemaMismatch, start, ev(i, "type"), errors.New("map event without a type tag"))
	}
	d.r.Seek(body)
	seen := 0
	for j := 0; j < n; j++ {
		k, err := d.r.Str()
		if err != nil {
			return d.fail(err, fmt.Sprintf("events[%d] key %d", i, j))
		}
		if e.Kind == engines.BlockStored || e.Kind == engines.BlockRemoved {
			bit, known, err := d.field(i, e, k)
			if err != nil {
				return err
			}
			seen |= bit
			if known {
				continue
			}
		}
		if err := d.r.Skip(); err != nil { // "type", unknown keys
			return d.fail(err, ev(i, string(k)))
		}
	}
	want := 0
	switch e.Kind {
	case engines.BlockStored:
		want = seenHashes | seenParent | seenTokens | seenBlockSize
	case engines.BlockRemoved:
		want = seenHashes
	}
	if miss := want &^ seen; miss != 0 {
		name := map[int]string{seenHashes: "block_hashes", seenParent: "parent_block_hash", seenTokens: "token_ids", seenBlockSize: "block_size"}[miss&-miss]
		return d.reject(engines.ReasonSchemaMismatch, start, ev(i, name), fmt.Errorf("%s without required field %s", e.Kind, name))
	}
	return nil
}

// field decodes one named field of a stored or removed event. known is false for keys the event
// kind does not have (the caller skips them).
func (d *decoder) field(i int, e *engines.Event, k []byte) (bit int, known bool, err error) {
	stored := e.Kind == engines.BlockStored
	switch string(k) {
	case "block_hashes":
		return seenHashes, true, d.hashes(i, e)
	case "medium":
		e.Medium, err = d.optStr(i, "medium")
		return 0, true, err
	case "group_idx":
		e.GroupIdx, e.HasGroupIdx, err = d.optInt(i, "group_idx")
		return 0, true, err
	case "locality":
		e.Locality, err = d.optStr(i, "locality")
		return 0, true, err
	}
	if !stored {
		return 0, false, nil
	}
	switch string(k) {
	case "parent_block_hash":
		return seenParent, true, d.parent(i, e)
	case "token_ids":
		return seenTokens, true, d.tokens(i, e)
	case "block_size":
		off := d.r.Offset()
		if e.BlockSize, err = d.r.Int32(); err != nil {
			return 0, true, d.fail(err, ev(i, "block_size"))
		}
		if e.BlockSize < 0 {
			return 0, true, d.reject(engines.ReasonSchemaMismatch, off, ev(i, "block_size"), fmt.Errorf("negative block size %d", e.BlockSize))
		}
		return seenBlockSize, true, nil
	case "lora_id":
		if !d.r.IsNil() {
			if e.LoRAID, err = d.r.Int64(); err != nil {
				return 0, true, d.fail(err, ev(i, "lora_id"))
			}
			e.HasLoRAID = true
		}
		return 0, true, nil
	case "lora_name":
		e.LoRAName, err = d.optStr(i, "lora_name")
		return 0, true, err
	case "extra_keys":
		return 0, true, d.extraKeys(i, e)
	case "kv_cache_spec_kind":
		e.SpecKind, err = d.optStr(i, "kv_cache_spec_kind")
		return 0, true, err
	case "kv_cache_spec_sliding_window":
		e.SlidingWin, _, err = d.optInt(i, "kv_cache_spec_sliding_window")
		return 0, true, err
	case "lookahead_token_ids":
		// v0.33+: with EAGLE block drop each hash also covers tokens after its block, which no
		// prompt-side hash can know; such a store must not enter the inventory as ordinary keys.
		off := d.r.Offset()
		if !d.r.IsNil() {
			return 0, true, d.reject(engines.ReasonSchemaMismatch, off, ev(i, "lookahead_token_ids"), errors.New("lookahead-hashed blocks (speculative decoding's lookahead block hashes): keys cover tokens beyond their block; disable them on the engine (speculative_config disable_lookahead_block_hashes) for exact routing"))
		}
		return 0, true, nil
	}
	return 0, false, nil
}

// Positional field names of the array layouts, after the tag.
var (
	storedOrder  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedOrder = []string{"block_hashes", "medium", "group_idx"}
)

func (d *decoder) arrayEvent(i int, e *engines.Event) error {
	start := d.r.Offset()
	n, err := d.r.ArrayLen()
	if err != nil {
		return d.fail(err, fmt.Sprintf("events[%d]", i))
	}
	if n == 0 {
		return d.reject(engines.ReasonSchemaMismatch, start, fmt.Sprintf("events[%d]", i), errors.New("empty event array"))
	}
	tagOff := d.r.Offset()
	tag, err := d.r.Str()
	if err != nil {
		return d.fail(err, ev(i, "type"))
	}
	if e.Kind = kindOf(tag); e.Kind == 0 {
		return d.reject(engines.ReasonUnknownEvent, tagOff, ev(i, "type"), fmt.Errorf("unknown event type %q", tag))
	}
	var order []string
	switch e.Kind {
	case engines.BlockStored:
		order = storedOrder
		if n < 5 {
			return d.reject(engines.ReasonSchemaMismatch, start, fmt.Sprintf("events[%d]", i), fmt.Errorf("BlockStored array of %d, want at least 5", n))
		}
	case engines.BlockRemoved:
		order = removedOrder
		if n < 2 {
			return d.reject(engines.ReasonSchemaMismatch, start, fmt.Sprintf("events[%d]", i), fmt.Errorf("BlockRemoved array of %d, want at least 2", n))
		}
	}
	for j := 1; j < n; j++ {
		if j-1 < len(order) {
			if _, _, err := d.field(i, e, []byte(order[j-1])); err != nil {
				return err
			}
			continue
		}
		if err := d.r.Skip(); err != nil { // trailing fields of a later release
			return d.fail(err, fmt.Sprintf("events[%d][%d]", i, j))
		}
	}
	return nil
}

// intern returns the usual wire strings without allocating.
func intern(b []byte) string {
	switch string(b) {
	case "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	case "full_attention":
		return "full_attention"
	case "sliding_window":
		return "sliding_window"
	case "mla_attention":
		return "mla_attention"
	case "LOCAL":
		return "LOCAL"
	case "REMOTE":
		return "REMOTE"
	}
	return string(b)
}

func (d *decoder) optStr(i int, name string) (string, error) {
	if d.r.IsNil() {
		return "", nil
	}
	s, err := d.r.Str()
	if err != nil {
		return "", d.fail(err, ev(i, name))
	}
	return intern(s), nil
}

func (d *decoder) optInt(i int, name string) (int, bool, error) {
	if d.r.IsNil() {
		return 0, false, nil
	}
	v, err := d.r.Int32()
	if err != nil {
		return 0, false, d.fail(err, ev(i, name))
	}
	return v, true, nil
}

// hash64 is vLLM's maybe_convert_block_hash applied to bytes: the last 8 bytes, big-endian.
func hash64(p []byte) uint64 {
	if len(p) >= 8 {
		return binary.BigEndian.Uint64(p[len(p)-8:])
	}
	var v uint64
	for _, c := range p {
		v = v<<8 | uint64(c)
	}
	return v
}

func (d *decoder) oneHash(field string) (uint64, []byte, error) {
	t, err := d.r.Peek()
	if err != nil {
		return 0, nil, d.fail(err, field)
	}
	switch t {
	case mpack.TypeUint:
		v, err := d.r.Uint64()
		if err != nil {
			return 0, nil, d.fail(err, field)
		}
		return v, nil, nil
	case mpack.TypeBin:
		p, err := d.r.Bin()
		if err != nil {
			return 0, nil, d.fail(err, field)
		}
		return hash64(p), append([]byte(nil), p...), nil
	case mpack.TypeInt:
		return 0, nil, d.reject(engines.ReasonSchemaMismatch, d.r.Offset(), field,
			errors.New("negative block hash (vLLM ≤ v0.10.1.1 Python hash(); unsupported)"))
	}
	return 0, nil, d.reject(engines.ReasonSchemaMismatch, d.r.Offset(), field, fmt.Errorf("block hash is a %s, want int or bin", t))
}

func (d *decoder) hashes(i int, e *engines.Event) error {
	n, err := d.r.ArrayLen()
	if err != nil {
		return d.fail(err, ev(i, "block_hashes"))
	}
	e.BlockHashes = e.BlockHashes[:0]
	e.RawHashes = nil
	for j := 0; j < n; j++ {
		v, raw, err := d.oneHash("")
		if err != nil {
			de := err.(*engines.DecodeError)
			de.Field = fmt.Sprintf("events[%d].block_hashes[%d]", i, j)
			return de
		}
		if raw != nil {
			if e.RawHashes == nil {
				e.RawHashes = make([][]byte, n)
			}
			e.RawHashes[j] = raw
		}
		e.BlockHashes = append(e.BlockHashes, v)
	}
	return nil
}

func (d *decoder) parent(i int, e *engines.Event) error {
	if d.r.IsNil() {
		e.HasParent, e.Parent, e.RawParent = false, 0, nil
		return nil
	}
	v, raw, err := d.oneHash("")
	if err != nil {
		de := err.(*engines.DecodeError)
		de.Field = ev(i, "parent_block_hash")
		return de
	}
	e.Parent, e.RawParent, e.HasParent = v, raw, true
	return nil
}

func (d *decoder) tokens(i int, e *engines.Event) error {
	n, err := d.r.ArrayLen()
	if err != nil {
		return d.fail(err, ev(i, "token_ids"))
	}
	toks := e.TokenIDs[:0]
	if cap(toks) < n {
		toks = make([]uint32, 0, n)
	}
	toks, done := d.r.Uint32s(toks, n)
	for j := done; j < n; j++ {
		off := d.r.Offset()
		v, neg, err := d.r.Int()
		if err != nil {
			return d.fail(err, fmt.Sprintf("events[%d].token_ids[%d]", i, j))
		}
		if neg || v > math.MaxUint32 {
			if neg {
				return d.reject(engines.ReasonTokenRange, off, fmt.Sprintf("events[%d].token_ids[%d]", i, j), fmt.Errorf("token id %d outside 0..2^32-1", int64(v)))
			}
			return d.reject(engines.ReasonTokenRange, off, fmt.Sprintf("events[%d].token_ids[%d]", i, j), fmt.Errorf("token id %d outside 0..2^32-1", v))
		}
		toks = append(toks, uint32(v))
	}
	e.TokenIDs = toks
	return nil
}

func (d *decoder) extraKeys(i int, e *engines.Event) error {
	if d.r.IsNil() {
		e.ExtraKeys, e.HasExtraKeys = e.ExtraKeys[:0], false
		return nil
	}
	n, err := d.r.ArrayLen()
	if err != nil {
		return d.fail(err, ev(i, "extra_keys"))
	}
	keys := e.ExtraKeys[:0]
	for j := 0; j < n; j++ {
		field := func() string { return fmt.Sprintf("events[%d].extra_keys[%d]", i, j) }
		if d.r.IsNil() {
			keys = append(keys, nil)
			continue
		}
		if t, err := d.r.Peek(); err != nil {
			return d.fail(err, field())
		} else if t != mpack.TypeArray {
			return d.reject(engines.ReasonSchemaMismatch, d.r.Offset(), field(), fmt.Errorf("extra key is a %s, want a tuple or nil", t))
		}
		v, err := d.r.Any()
		if err != nil {
			return d.fail(err, field())
		}
		keys = append(keys, v.([]any))
	}
	e.ExtraKeys, e.HasExtraKeys = keys, true
	return nil
}

// splitBlocks fills BlockTokens when the geometry is exact; see engines.Event.
func splitBlocks(e *engines.Event) {
	e.BlockTokens = e.BlockTokens[:0]
	nb, bs := len(e.BlockHashes), e.BlockSize
	if e.Kind != engines.BlockStored || nb == 0 || bs <= 0 || len(e.TokenIDs) != nb*bs {
		return
	}
	for j := 0; j < nb; j++ {
		e.BlockTokens = append(e.BlockTokens, e.TokenIDs[j*bs:(j+1)*bs:(j+1)*bs])
	}
}
