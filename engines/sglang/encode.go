package sglang

import (
	"fmt"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/internal/mpack"
)

// EncodeBatch writes b exactly as SGLang v0.5.18's msgspec encoder does: [ts float64, events,
// attn_dp_rank]; BlockStored with all 7 elements plus the metadata map when a cache_salt is set;
// hashes as signed int64 in the smallest form (negative ones as int64 0xd3, large positive ones as
// uint64 0xcf); bigram events with [t_j, t_j+1] pairs.
func EncodeBatch(b engines.Batch) ([]byte, error) { return AppendBatch(nil, &b) }

// AppendBatch is EncodeBatch appending to dst.
func AppendBatch(dst []byte, b *engines.Batch) ([]byte, error) {
	dst = mpack.AppendArrayLen(dst, 3)
	dst = mpack.AppendFloat64(dst, b.Timestamp)
	dst = mpack.AppendArrayLen(dst, len(b.Events))
	for i := range b.Events {
		e := &b.Events[i]
		switch e.Kind {
		case engines.BlockStored:
			n := 7
			if e.CacheSalt != "" {
				n = 8
			}
			dst = mpack.AppendArrayLen(dst, n)
			dst = mpack.AppendStr(dst, "BlockStored")
			dst = appendHashes(dst, e.BlockHashes)
			if e.HasParent {
				dst = mpack.AppendInt(dst, int64(e.Parent))
			} else {
				dst = mpack.AppendNil(dst)
			}
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
			dst = mpack.AppendInt(dst, int64(e.BlockSize))
			if e.HasLoRAID {
				dst = mpack.AppendInt(dst, e.LoRAID)
			} else {
				dst = mpack.AppendNil(dst)
			}
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
