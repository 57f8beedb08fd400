package sglang

import (
	"fmt"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/internal/mpack"
)

// EncodeBatch writes b exactly as SGLang v0.5.18's msgspec encoder does: [ts float64, events,
// attn_dp_rank]; BlockStored with all 7 elements plus the metadata map when a cache_salt is set;
// hashes as signed int64 in the smallest form (negative ones as int64 0xd3, large positive ones as
// uint64 0xcf); bigram events with [t_j, t_j+1] pairs. EncodeBatchLayout writes another layout.
func EncodeBatch(b engines.Batch) ([]byte, error) { return AppendBatch(nil, &b) }

// AppendBatch is EncodeBatch appending to dst.
func AppendBatch(dst []byte, b *engines.Batch) ([]byte, error) {
	return AppendBatchLayout(dst, b, LayoutArray)
}

// EncodeBatchLayout writes b in the layout of a release (LayoutForRelease). LayoutMap is msgspec's
// encoding of v0.5.21's tagged structs (array_like=False, omit_defaults=True): a map per event with
// the tag "type" first, then the fields in declaration order (block_hashes, parent_block_hash,
// token_ids, block_size, lora_id always; medium, cache_salt, session_id only when set).
func EncodeBatchLayout(b engines.Batch, l Layout) ([]byte, error) {
	return AppendBatchLayout(nil, &b, l)
}

// AppendBatchLayout is EncodeBatchLayout appending to dst.
func AppendBatchLayout(dst []byte, b *engines.Batch, l Layout) ([]byte, error) {
	dst = mpack.AppendArrayLen(dst, 3)
	dst = mpack.AppendFloat64(dst, b.Timestamp)
	dst = mpack.AppendArrayLen(dst, len(b.Events))
	for i := range b.Events {
		e := &b.Events[i]
		if l == LayoutMap {
			var err error
			if dst, err = appendMapEvent(dst, i, e); err != nil {
				return dst, err
			}
			continue
		}
		switch e.Kind {
		case engines.BlockStored:
			n := 7
			if e.CacheSalt != "" {
				n = 8
			}
			dst = mpack.AppendArrayLen(dst, n)
			dst = mpack.AppendStr(dst, "BlockStored")
			dst = appendStoredBody(dst, e, nil)
			dst = appendOptStr(dst, e.Medium)
			if e.CacheSalt != "" {
				dst = mpack.AppendMapLen(dst, 1)
				dst = mpack.AppendStr(dst, "cache_salt")
				dst = mpack.AppendStr(dst, e.CacheSalt)
			}
		case engines.BlockRemoved:
			dst = mpack.AppendArrayLen(dst, 3)
			dst = mpack.AppendStr(dst, "BlockRemoved")
			dst = appendHashes(dst, e.BlockHashes)
			dst = appendOptStr(dst, e.Medium)
		case engines.AllBlocksCleared:
			dst = mpack.AppendArrayLen(dst, 1)
			dst = mpack.AppendStr(dst, "AllBlocksCleared")
		default:
			return dst, fmt.Errorf("sglang: events[%d]: %s events do not exist in SGLang", i, e.Kind)
		}
	}
	if b.HasDPRank {
		dst = mpack.AppendInt(dst, int64(b.DPRank))
	} else {
		dst = mpack.AppendNil(dst)
	}
	return dst, nil
}

// appendStoredBody writes BlockStored's five required fields, each preceded by its key when key is
// set (the map layout) and bare otherwise (the array layout).
func appendStoredBody(dst []byte, e *engines.Event, key func([]byte, string) []byte) []byte {
	if key == nil {
		key = func(b []byte, _ string) []byte { return b }
	}
	dst = appendHashes(key(dst, "block_hashes"), e.BlockHashes)
	dst = key(dst, "parent_block_hash")
	if e.HasParent {
		dst = mpack.AppendInt(dst, int64(e.Parent))
	} else {
		dst = mpack.AppendNil(dst)
	}
	dst = key(dst, "token_ids")
	if e.Bigram && len(e.TokenIDs) > 0 {
		dst = mpack.AppendArrayLen(dst, len(e.TokenIDs)-1)
		for j := 0; j+1 < len(e.TokenIDs); j++ {
			dst = mpack.AppendArrayLen(dst, 2)
			dst = mpack.AppendUint(dst, uint64(e.TokenIDs[j]))
			dst = mpack.AppendUint(dst, uint64(e.TokenIDs[j+1]))
		}
	} else {
		dst = mpack.AppendArrayLen(dst, len(e.TokenIDs))
		for _, t := range e.TokenIDs {
			dst = mpack.AppendUint(dst, uint64(t))
		}
	}
	dst = mpack.AppendInt(key(dst, "block_size"), int64(e.BlockSize))
	dst = key(dst, "lora_id")
	if e.HasLoRAID {
		dst = mpack.AppendInt(dst, e.LoRAID)
	} else {
		dst = mpack.AppendNil(dst)
	}
	return dst
}

func appendKey(b []byte, k string) []byte { return mpack.AppendStr(b, k) }

// appendMapEvent writes one event of the map layout.
func appendMapEvent(dst []byte, i int, e *engines.Event) ([]byte, error) {
	opt := func(b []byte, k, v string) []byte {
		if v == "" {
			return b
		}
		return mpack.AppendStr(mpack.AppendStr(b, k), v)
	}
	set := func(v string) int {
		if v == "" {
			return 0
		}
		return 1
	}
	switch e.Kind {
	case engines.BlockStored:
		dst = mpack.AppendMapLen(dst, 6+set(e.Medium)+set(e.CacheSalt)+set(e.SessionID))
		dst = mpack.AppendStr(mpack.AppendStr(dst, "type"), "BlockStored")
		dst = appendStoredBody(dst, e, appendKey)
		dst = opt(dst, "medium", e.Medium)
		dst = opt(dst, "cache_salt", e.CacheSalt)
		dst = opt(dst, "session_id", e.SessionID)
	case engines.BlockRemoved:
		dst = mpack.AppendMapLen(dst, 2+set(e.Medium))
		dst = mpack.AppendStr(mpack.AppendStr(dst, "type"), "BlockRemoved")
		dst = appendHashes(mpack.AppendStr(dst, "block_hashes"), e.BlockHashes)
		dst = opt(dst, "medium", e.Medium)
	case engines.AllBlocksCleared:
		dst = mpack.AppendMapLen(dst, 1)
		dst = mpack.AppendStr(mpack.AppendStr(dst, "type"), "AllBlocksCleared")
	default:
		return dst, fmt.Errorf("sglang: events[%d]: %s events do not exist in SGLang", i, e.Kind)
	}
	return dst, nil
}

func appendHashes(b []byte, hs []uint64) []byte {
	b = mpack.AppendArrayLen(b, len(hs))
	for _, h := range hs {
		b = mpack.AppendInt(b, int64(h))
	}
	return b
}

func appendOptStr(b []byte, s string) []byte {
	if s == "" {
		return mpack.AppendNil(b)
	}
	return mpack.AppendStr(b, s)
}
