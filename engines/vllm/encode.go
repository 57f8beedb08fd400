package vllm

import (
	"fmt"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/internal/mpack"
)

// EncodeBatch writes b exactly as vLLM's msgspec encoder does for the releases of layout: the batch
// as [ts float64, events, data_parallel_rank]; map events with the tag first, fields in declaration
// order and None-valued defaulted fields omitted; array events with every field of that release
// (nil for None). Fields the layout's releases did not have are not written.
func EncodeBatch(b engines.Batch, layout Layout) ([]byte, error) {
	return AppendBatch(nil, &b, layout)
}

// AppendBatch is EncodeBatch appending to dst.
func AppendBatch(dst []byte, b *engines.Batch, layout Layout) ([]byte, error) {
	if layout < LayoutArrayMedium || layout > LayoutMap {
		return dst, fmt.Errorf("vllm: invalid layout %d", layout)
	}
	dst = mpack.AppendArrayLen(dst, 3)
	dst = mpack.AppendFloat64(dst, b.Timestamp)
	dst = mpack.AppendArrayLen(dst, len(b.Events))
	var err error
	for i := range b.Events {
		if dst, err = appendEvent(dst, &b.Events[i], layout); err != nil {
			return dst, fmt.Errorf("vllm: events[%d]: %w", i, err)
		}
	}
	if b.HasDPRank {
		dst = mpack.AppendInt(dst, int64(b.DPRank))
	} else {
		dst = mpack.AppendNil(dst)
	}
	return dst, nil
}

func appendEvent(b []byte, e *engines.Event, layout Layout) ([]byte, error) {
	switch e.Kind {
	case engines.BlockStored:
		return appendStored(b, e, layout)
	case engines.BlockRemoved:
		return appendRemoved(b, e, layout)
	case engines.AllBlocksCleared:
		if layout == LayoutMap {
			b = mpack.AppendMapLen(b, 1)
			b = mpack.AppendStr(b, "type")
		} else {
			b = mpack.AppendArrayLen(b, 1)
		}
		return mpack.AppendStr(b, "AllBlocksCleared"), nil
	}
	return b, fmt.Errorf("%s events do not exist in vLLM", e.Kind)
}

func appendHash(b []byte, v uint64, raw []byte) []byte {
	if raw != nil {
		return mpack.AppendBin(b, raw)
	}
	return mpack.AppendUint(b, v)
}

func appendHashes(b []byte, e *engines.Event) ([]byte, error) {
	if e.RawHashes != nil && len(e.RawHashes) != len(e.BlockHashes) {
		return b, fmt.Errorf("block_hashes: %d raw hashes for %d hashes", len(e.RawHashes), len(e.BlockHashes))
	}
	b = mpack.AppendArrayLen(b, len(e.BlockHashes))
	for j, h := range e.BlockHashes {
		var raw []byte
		if e.RawHashes != nil {
			raw = e.RawHashes[j]
		}
		b = appendHash(b, h, raw)
	}
	return b, nil
}

func appendOptStr(b []byte, s string) []byte {
	if s == "" {
		return mpack.AppendNil(b)
	}
	return mpack.AppendStr(b, s)
}

func appendOptInt(b []byte, v int, ok bool) []byte {
	if !ok {
		return mpack.AppendNil(b)
	}
	return mpack.AppendInt(b, int64(v))
}

func appendExtraKeys(b []byte, e *engines.Event) ([]byte, error) {
	if !e.HasExtraKeys {
		return mpack.AppendNil(b), nil
	}
	b = mpack.AppendArrayLen(b, len(e.ExtraKeys))
	var err error
	for j, k := range e.ExtraKeys {
		if k == nil {
			b = mpack.AppendNil(b)
			continue
		}
		if b, err = mpack.AppendAny(b, k); err != nil {
			return b, fmt.Errorf("extra_keys[%d]: %w", j, err)
		}
	}
	return b, nil
}

// appendStored writes the fields in declaration order; key is called before each field in the map
// layout and counts the fields in the array layout.
func appendStored(b []byte, e *engines.Event, layout Layout) ([]byte, error) {
	mapped := layout == LayoutMap
	if mapped {
		n := 8
		if e.HasExtraKeys {
			n++
		}
		if e.HasGroupIdx {
			n++
		}
		if e.SpecKind != "" {
			n++
		}
		if e.SlidingWin != 0 {
			n++
		}
		if e.Locality != "" {
			n++
		}
		b = mpack.AppendMapLen(b, n)
		b = mpack.AppendStr(b, "type")
	} else {
		b = mpack.AppendArrayLen(b, 1+layout.storedFields())
	}
	b = mpack.AppendStr(b, "BlockStored")
	key := func(k string) {
		if mapped {
			b = mpack.AppendStr(b, k)
		}
	}
	var err error
	key("block_hashes")
	if b, err = appendHashes(b, e); err != nil {
		return b, err
	}
	key("parent_block_hash")
	if e.HasParent {
		b = appendHash(b, e.Parent, e.RawParent)
	} else {
		b = mpack.AppendNil(b)
	}
	key("token_ids")
	b = mpack.AppendArrayLen(b, len(e.TokenIDs))
	for _, t := range e.TokenIDs {
		b = mpack.AppendUint(b, uint64(t))
	}
	key("block_size")
	b = mpack.AppendInt(b, int64(e.BlockSize))
	key("lora_id")
	if e.HasLoRAID {
		b = mpack.AppendInt(b, e.LoRAID)
	} else {
		b = mpack.AppendNil(b)
	}
	key("medium")
	b = appendOptStr(b, e.Medium)
	if layout >= LayoutArrayLoRAName {
		key("lora_name")
		b = appendOptStr(b, e.LoRAName)
	}
	if layout >= LayoutArrayExtraKeys && (!mapped || e.HasExtraKeys) {
		key("extra_keys")
		if b, err = appendExtraKeys(b, e); err != nil {
			return b, err
		}
	}
	if layout >= LayoutArrayGroupIdx && (!mapped || e.HasGroupIdx) {
		key("group_idx")
		b = appendOptInt(b, e.GroupIdx, e.HasGroupIdx)
	}
	if layout >= LayoutArraySpecKind {
		if !mapped || e.SpecKind != "" {
			key("kv_cache_spec_kind")
			b = appendOptStr(b, e.SpecKind)
		}
		if !mapped || e.SlidingWin != 0 {
			key("kv_cache_spec_sliding_window")
			b = appendOptInt(b, e.SlidingWin, e.SlidingWin != 0)
		}
	}
	if mapped && e.Locality != "" {
		key("locality")
		b = mpack.AppendStr(b, e.Locality)
	}
	return b, nil
}

func appendRemoved(b []byte, e *engines.Event, layout Layout) ([]byte, error) {
	mapped := layout == LayoutMap
	if mapped {
		n := 3
		if e.HasGroupIdx {
			n++
		}
		if e.Locality != "" {
			n++
		}
		b = mpack.AppendMapLen(b, n)
		b = mpack.AppendStr(b, "type")
		b = mpack.AppendStr(b, "BlockRemoved")
		b = mpack.AppendStr(b, "block_hashes")
	} else {
		b = mpack.AppendArrayLen(b, 1+layout.removedFields())
		b = mpack.AppendStr(b, "BlockRemoved")
	}
	var err error
	if b, err = appendHashes(b, e); err != nil {
		return b, err
	}
	if mapped {
		b = mpack.AppendStr(b, "medium")
	}
	b = appendOptStr(b, e.Medium)
	if layout >= LayoutArrayGroupIdx && (!mapped || e.HasGroupIdx) {
		if mapped {
			b = mpack.AppendStr(b, "group_idx")
		}
		b = appendOptInt(b, e.GroupIdx, e.HasGroupIdx)
	}
	if mapped && e.Locality != "" {
		b = mpack.AppendStr(b, "locality")
		b = mpack.AppendStr(b, e.Locality)
	}
	return b, nil
}
