// Package sglang is SGLang's KV-event wire: msgspec array_like batches [ts, events, attn_dp_rank]
// whose events are tagged arrays (v0.5.18) or tagged maps (v0.5.21, layout.go) with signed 64-bit
// page hashes.
package sglang

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/internal/mpack"
)

// DecodeBatch decodes one ZMQ payload, its events tagged arrays or tagged maps element by element.
// Hashes of either int family are reinterpreted bit for bit as uint64; absent trailing optional
// fields (pre-v0.5.17 omit_defaults) are accepted, as is the v0.5.18 metadata map carrying
// cache_salt; a map event's unknown keys are skipped. A batch is accepted whole or rejected whole with an
// *engines.DecodeError naming the byte offset and field.
func DecodeBatch(payload []byte) (engines.Batch, error) {
	var b engines.Batch
	err := DecodeBatchInto(&b, payload)
	return b, err
}

// DecodeBatchInto is DecodeBatch reusing dst's slices; what it leaves in dst aliases those buffers
// until the next call.
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

func reject(reason engines.RejectReason, off int, field string, err error) error {
	return &engines.DecodeError{Reason: reason, Offset: off, Field: field, Err: err}
}

func ev(i int, name string) string { return fmt.Sprintf("events[%d].%s", i, name) }

func (d *decoder) batch(dst *engines.Batch) error {
	n, err := d.r.ArrayLen()
	if err != nil {
		return d.fail(err, "batch")
	}
	if n < 2 {
		return reject(engines.ReasonSchemaMismatch, 0, "batch", fmt.Errorf("array of %d, want [ts, events, attn_dp_rank]", n))
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
		*e = engines.Event{BlockHashes: e.BlockHashes[:0], TokenIDs: e.TokenIDs[:0], BlockTokens: e.BlockTokens[:0]}
		if err := d.event(i, e); err != nil {
			return err
		}
	}
	dst.DPRank, dst.HasDPRank = 0, false
	if n >= 3 {
		if !d.r.IsNil() {
			if dst.DPRank, err = d.r.Int32(); err != nil {
				return d.fail(err, "attn_dp_rank")
			}
			dst.HasDPRank = true
		}
		for i := 3; i < n; i++ {
			if err := d.r.Skip(); err != nil {
				return d.fail(err, fmt.Sprintf("batch[%d]", i))
			}
		}
	}
	if d.r.Len() != 0 {
		return reject(engines.ReasonDecodeError, d.r.Offset(), "batch", fmt.Errorf("%d trailing bytes", d.r.Len()))
	}
	return nil
}

func (d *decoder) event(i int, e *engines.Event) error {
	t, err := d.r.Peek()
	if err != nil {
		return d.fail(err, fmt.Sprintf("events[%d]", i))
	}
	switch t {
	case mpack.TypeArray:
		return d.arrayEvent(i, e)
	case mpack.TypeMap:
		return d.mapEvent(i, e)
	}
	return reject(engines.ReasonSchemaMismatch, d.r.Offset(), fmt.Sprintf("events[%d]", i),
		fmt.Errorf("event is a %s; SGLang events are tagged arrays or tagged maps", t))
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

// Positional field names of the array layout, after the tag; "metadata" is v0.5.18's trailing
// {"cache_salt": …} map (BlockStoredWithMetadata).
var (
	storedOrder  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "metadata"}
	removedOrder = []string{"block_hashes", "medium"}
)

// arrayEvent reads a tagged-array event (v0.5.18 and before) through the map layout's field
// decoder, by position; trailing elements of a later release are skipped.
func (d *decoder) arrayEvent(i int, e *engines.Event) error {
	start := d.r.Offset()
	n, err := d.r.ArrayLen()
	if err != nil {
		return d.fail(err, fmt.Sprintf("events[%d]", i))
	}
	if n == 0 {
		return reject(engines.ReasonSchemaMismatch, start, fmt.Sprintf("events[%d]", i), errors.New("empty event array"))
	}
	tagOff := d.r.Offset()
	tag, err := d.r.Str()
	if err != nil {
		return d.fail(err, ev(i, "type"))
	}
	if e.Kind = kindOf(tag); e.Kind == 0 {
		return reject(engines.ReasonUnknownEvent, tagOff, ev(i, "type"), fmt.Errorf("unknown event type %q", tag))
	}
	var order []string
	min := 1
	switch e.Kind {
	case engines.BlockStored:
		order, min = storedOrder, 5
	case engines.BlockRemoved:
		order, min = removedOrder, 2
	}
	if n < min {
		return reject(engines.ReasonSchemaMismatch, start, fmt.Sprintf("events[%d]", i), fmt.Errorf("%s array of %d, want at least %d", e.Kind, n, min))
	}
	for j := 1; j < n; j++ {
		if j-1 < len(order) {
			if _, _, err := d.field(i, e, []byte(order[j-1])); err != nil {
				return err
			}
			continue
		}
		if err := d.r.Skip(); err != nil { // fields of a later release
			return d.fail(err, fmt.Sprintf("events[%d][%d]", i, j))
		}
	}
	if e.Kind == engines.BlockStored {
		splitBlocks(e)
	}
	return nil
}

const (
	seenHashes = 1 << iota
	seenParent
	seenTokens
	seenBlockSize
)

// mapEvent reads a tagged-map event (v0.5.21+): msgspec writes "type" first, but the tag is looked
// for anywhere, and keys are taken by name in any order.
func (d *decoder) mapEvent(i int, e *engines.Event) error {
	start := d.r.Offset()
	n, err := d.r.MapLen()
	if err != nil {
		return d.fail(err, fmt.Sprintf("events[%d]", i))
	}
	body := d.r.Offset()
	tagOff := -1
	for j := 0; j < n && tagOff < 0; j++ {
		k, err := d.r.Str()
		if err != nil {
			return d.fail(err, fmt.Sprintf("events[%d] key %d", i, j))
		}
		if string(k) != "type" {
			if err := d.r.Skip(); err != nil {
				return d.fail(err, ev(i, string(k)))
			}
			continue
		}
		tagOff = d.r.Offset()
		tag, err := d.r.Str()
		if err != nil {
			return d.fail(err, ev(i, "type"))
		}
		if e.Kind = kindOf(tag); e.Kind == 0 {
			return reject(engines.ReasonUnknownEvent, tagOff, ev(i, "type"), fmt.Errorf("unknown event type %q", tag))
		}
	}
	if tagOff < 0 {
		return reject(engines.ReasonSchemaMismatch, start, ev(i, "type"), errors.New("map event without a type tag"))
	}
	d.r.Seek(body)
	seen := 0
	for j := 0; j < n; j++ {
		k, err := d.r.Str()
		if err != nil {
			return d.fail(err, fmt.Sprintf("events[%d] key %d", i, j))
		}
		bit, known, err := d.field(i, e, k)
		if err != nil {
			return err
		}
		seen |= bit
		if !known {
			if err := d.r.Skip(); err != nil { // "type", keys of a later release
				return d.fail(err, ev(i, string(k)))
			}
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
		name := "block_size"
		switch miss & -miss {
		case seenHashes:
			name = "block_hashes"
		case seenParent:
			name = "parent_block_hash"
		case seenTokens:
			name = "token_ids"
		}
		return reject(engines.ReasonSchemaMismatch, start, ev(i, name), fmt.Errorf("%s without required field %s", e.Kind, name))
	}
	if e.Kind == engines.BlockStored {
		splitBlocks(e)
	}
	return nil
}

// field decodes one named field of a map event; known is false for a key the event kind does not
// have (the caller skips its value).
func (d *decoder) field(i int, e *engines.Event, k []byte) (bit int, known bool, err error) {
	if e.Kind == engines.AllBlocksCleared {
		return 0, false, nil
	}
	switch string(k) {
	case "block_hashes":
		return seenHashes, true, d.hashes(i, e)
	case "medium":
		e.Medium, err = d.optStr(i, "medium")
		return 0, true, err
	}
	if e.Kind != engines.BlockStored {
		return 0, false, nil
	}
	switch string(k) {
	case "parent_block_hash":
		e.Parent, e.HasParent = 0, false
		if !d.r.IsNil() {
			if e.Parent, err = d.hash(); err != nil {
				return 0, true, d.fail(err, ev(i, "parent_block_hash"))
			}
			e.HasParent = true
		}
		return seenParent, true, nil
	case "token_ids":
		return seenTokens, true, d.tokens(i, e)
	case "block_size":
		off := d.r.Offset()
		if e.BlockSize, err = d.r.Int32(); err != nil {
			return 0, true, d.fail(err, ev(i, "block_size"))
		}
		if e.BlockSize < 0 {
			return 0, true, reject(engines.ReasonSchemaMismatch, off, ev(i, "block_size"), fmt.Errorf("negative block size %d", e.BlockSize))
		}
		return seenBlockSize, true, nil
	case "lora_id":
		e.LoRAID, e.HasLoRAID = 0, false
		if !d.r.IsNil() {
			if e.LoRAID, err = d.r.Int64(); err != nil {
				return 0, true, d.fail(err, ev(i, "lora_id"))
			}
			e.HasLoRAID = true
		}
		return 0, true, nil
	case "cache_salt":
		e.CacheSalt, err = d.optStr(i, "cache_salt")
		return 0, true, err
	case "session_id":
		e.SessionID, err = d.optStr(i, "session_id")
		return 0, true, err
	case "metadata":
		return 0, true, d.metadata(i, e)
	}
	return 0, false, nil
}

func (d *decoder) hash() (uint64, error) {
	bits, _, err := d.r.Int()
	return bits, err
}

func (d *decoder) hashes(i int, e *engines.Event) error {
	n, err := d.r.ArrayLen()
	if err != nil {
		return d.fail(err, ev(i, "block_hashes"))
	}
	e.BlockHashes = e.BlockHashes[:0]
	for j := 0; j < n; j++ {
		v, err := d.hash()
		if err != nil {
			return d.fail(err, fmt.Sprintf("events[%d].block_hashes[%d]", i, j))
		}
		e.BlockHashes = append(e.BlockHashes, v)
	}
	return nil
}

func (d *decoder) token(i, j, k int) (uint32, error) {
	off := d.r.Offset()
	v, neg, err := d.r.Int()
	if err != nil {
		if k < 0 {
			return 0, d.fail(err, fmt.Sprintf("events[%d].token_ids[%d]", i, j))
		}
		return 0, d.fail(err, fmt.Sprintf("events[%d].token_ids[%d][%d]", i, j, k))
	}
	if neg || v > math.MaxUint32 {
		field := fmt.Sprintf("events[%d].token_ids[%d]", i, j)
		if k >= 0 {
			field += fmt.Sprintf("[%d]", k)
		}
		if neg {
			return 0, reject(engines.ReasonTokenRange, off, field, fmt.Errorf("token id %d outside 0..2^32-1", int64(v)))
		}
		return 0, reject(engines.ReasonTokenRange, off, field, fmt.Errorf("token id %d outside 0..2^32-1", v))
	}
	return uint32(v), nil
}

// tokens reads plain token ids, or EAGLE bigram pairs [[t0,t1],[t1,t2],…] (kept as t0,t1,t2,…).
func (d *decoder) tokens(i int, e *engines.Event) error {
	n, err := d.r.ArrayLen()
	if err != nil {
		return d.fail(err, ev(i, "token_ids"))
	}
	toks := e.TokenIDs[:0]
	if t, _ := d.r.Peek(); n > 0 && t == mpack.TypeArray {
		e.Bigram = true
		for j := 0; j < n; j++ {
			off := d.r.Offset()
			m, err := d.r.ArrayLen()
			if err != nil {
				return d.fail(err, fmt.Sprintf("events[%d].token_ids[%d]", i, j))
			}
			if m != 2 {
				return reject(engines.ReasonSchemaMismatch, off, fmt.Sprintf("events[%d].token_ids[%d]", i, j), fmt.Errorf("bigram of %d elements, want 2", m))
			}
			a, err := d.token(i, j, 0)
			if err != nil {
				return err
			}
			b, err := d.token(i, j, 1)
			if err != nil {
				return err
			}
			if j == 0 {
				toks = append(toks, a)
			} else if a != toks[len(toks)-1] {
				return reject(engines.ReasonTokenRange, off, fmt.Sprintf("events[%d].token_ids[%d][0]", i, j),
					fmt.Errorf("bigram chain broken: %d after pair ending in %d", a, toks[len(toks)-1]))
			}
			toks = append(toks, b)
		}
		e.TokenIDs = toks
		return nil
	}
	toks, done := d.r.Uint32s(toks, n)
	for j := done; j < n; j++ {
		v, err := d.token(i, j, -1)
		if err != nil {
			return err
		}
		toks = append(toks, v)
	}
	e.TokenIDs = toks
	return nil
}

func intern(b []byte) string {
	switch string(b) {
	case "GPU":
		return "GPU"
	case "CPU_PINNED":
		return "CPU_PINNED"
	case "DISK":
		return "DISK"
	case "EXTERNAL":
		return "EXTERNAL"
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

// metadata reads BlockStoredWithMetadata's trailing map (cache_salt); unknown keys are skipped.
func (d *decoder) metadata(i int, e *engines.Event) error {
	if d.r.IsNil() {
		return nil
	}
	n, err := d.r.MapLen()
	if err != nil {
		return d.fail(err, ev(i, "metadata"))
	}
	for j := 0; j < n; j++ {
		k, err := d.r.Str()
		if err != nil {
			return d.fail(err, fmt.Sprintf("events[%d].metadata key %d", i, j))
		}
		if string(k) == "cache_salt" {
			if e.CacheSalt, err = d.optStr(i, "metadata.cache_salt"); err != nil {
				return err
			}
			continue
		}
		if err := d.r.Skip(); err != nil {
			return d.fail(err, ev(i, "metadata."+string(k)))
		}
	}
	return nil
}

// splitBlocks fills BlockTokens when the geometry is exact; see engines.Event.
func splitBlocks(e *engines.Event) {
	nb, bs := len(e.BlockHashes), e.BlockSize
	units := len(e.TokenIDs)
	if e.Bigram {
		units--
	}
	if nb == 0 || bs <= 0 || units != nb*bs {
		return
	}
	extra := 0
	if e.Bigram {
		extra = 1
	}
	for j := 0; j < nb; j++ {
		end := (j+1)*bs + extra
		e.BlockTokens = append(e.BlockTokens, e.TokenIDs[j*bs:end:end])
	}
}
