package trtllm

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/kvexact/kvexact/engines"
)

// EncodeDrain writes events as a TensorRT-LLM 1.2 server answers POST /kv_cache_events: the
// KVCacheEventSerializer layout, compact separators, UTF-8 (Starlette's json.dumps(ensure_ascii=False,
// separators=(",", ":"))). Optional newer fields (mm_keys, cache_salt, lora_*) are written only when
// set; hashes that came as hex strings are written back as hex strings.
func EncodeDrain(events []engines.Event) ([]byte, error) { return AppendDrain(nil, events) }

// AppendDrain is EncodeDrain appending to dst.
func AppendDrain(dst []byte, events []engines.Event) ([]byte, error) {
	b := append(dst, '[')
	var err error
	for i := range events {
		if i > 0 {
			b = append(b, ',')
		}
		if b, err = appendEnvelope(b, &events[i]); err != nil {
			return b, fmt.Errorf("trtllm: events[%d]: %w", i, err)
		}
	}
	return append(b, ']'), nil
}

func appendEnvelope(b []byte, e *engines.Event) ([]byte, error) {
	b = append(b, `{"event_id":`...)
	b = strconv.AppendUint(b, e.EventID, 10)
	b = append(b, `,"data":`...)
	var err error
	if b, err = appendData(b, e); err != nil {
		return b, err
	}
	if e.HasWindowSize {
		b = append(b, `,"window_size":`...)
		b = strconv.AppendInt(b, int64(e.WindowSize), 10)
	}
	if e.HasDPRank {
		b = append(b, `,"attention_dp_rank":`...)
		b = strconv.AppendInt(b, int64(e.DPRank), 10)
	}
	return append(b, '}'), nil
}

func appendHash(b []byte, v uint64, raw []byte) []byte {
	if raw != nil {
		b = append(b, '"')
		b = hex.AppendEncode(b, raw)
		return append(b, '"')
	}
	return strconv.AppendUint(b, v, 10)
}

func rawAt(raw [][]byte, j int) []byte {
	if j < len(raw) {
		return raw[j]
	}
	return nil
}

func appendData(b []byte, e *engines.Event) ([]byte, error) {
	switch e.Kind {
	case engines.CacheCreated:
		b = append(b, `{"type":"created","num_blocks_per_cache_level":[`...)
		for j, n := range e.NumBlocks {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(n), 10)
		}
		return append(b, "]}"...), nil
	case engines.BlockStored:
		if len(e.BlockTokens) != len(e.BlockHashes) || len(e.CacheLevels) != len(e.BlockHashes) || len(e.Priorities) != len(e.BlockHashes) {
			return b, fmt.Errorf("stored event with %d hashes, %d token blocks, %d cache levels, %d priorities",
				len(e.BlockHashes), len(e.BlockTokens), len(e.CacheLevels), len(e.Priorities))
		}
		b = append(b, `{"type":"stored","parent_hash":`...)
		if e.HasParent {
			b = appendHash(b, e.Parent, e.RawParent)
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `,"blocks":[`...)
		for j, h := range e.BlockHashes {
			if j > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"type":"stored_block","block_hash":`...)
			b = appendHash(b, h, rawAt(e.RawHashes, j))
			b = append(b, `,"tokens":[`...)
			var extras []uint64
			if j < len(e.BlockExtraIDs) {
				extras = e.BlockExtraIDs[j]
			}
			if extras != nil && len(extras) != len(e.BlockTokens[j]) {
				return b, fmt.Errorf("blocks[%d]: %d extra ids for %d tokens", j, len(extras), len(e.BlockTokens[j]))
			}
			for k, t := range e.BlockTokens[j] {
				if k > 0 {
					b = append(b, ',')
				}
				b = append(b, `{"type":"unique_token","token_id":`...)
				b = strconv.AppendUint(b, uint64(t), 10)
				b = append(b, `,"token_extra_id":`...)
				var x uint64
				if extras != nil {
					x = extras[k]
				}
				b = strconv.AppendUint(b, x, 10)
				b = append(b, '}')
			}
			b = append(b, `],"cache_level":`...)
			b = strconv.AppendInt(b, int64(e.CacheLevels[j]), 10)
			b = append(b, `,"priority":`...)
			b = strconv.AppendInt(b, int64(e.Priorities[j]), 10)
			if j < len(e.BlockMMKeys) && len(e.BlockMMKeys[j]) > 0 {
				b = append(b, `,"mm_keys":[`...)
				for k, m := range e.BlockMMKeys[j] {
					if k > 0 {
						b = append(b, ',')
					}
					b = append(b, `{"type":"mm_key","hash":`...)
					b = appendString(b, m.Hash)
					b = append(b, `,"start_offset":`...)
					b = strconv.AppendInt(b, m.StartOffset, 10)
					b = append(b, '}')
				}
				b = append(b, ']')
			}
			if e.CacheSalt != "" {
				b = append(b, `,"cache_salt":`...)
				b = appendString(b, e.CacheSalt)
			}
			if e.HasLoRAID {
				b = append(b, `,"lora_id":`...)
				b = strconv.AppendInt(b, e.LoRAID, 10)
			}
			if e.LoRAName != "" {
				b = append(b, `,"lora_name":`...)
				b = appendString(b, e.LoRAName)
			}
			b = append(b, '}')
		}
		return append(b, "]}"...), nil
	case engines.BlockRemoved:
		b = append(b, `{"type":"removed","block_hashes":[`...)
		for j, h := range e.BlockHashes {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendHash(b, h, rawAt(e.RawHashes, j))
		}
		return append(b, "]}"...), nil
	case engines.BlockUpdated:
		if len(e.BlockHashes) != 1 {
			return b, fmt.Errorf("updated event with %d hashes, want 1", len(e.BlockHashes))
		}
		b = append(b, `{"type":"updated","block_hash":`...)
		b = appendHash(b, e.BlockHashes[0], rawAt(e.RawHashes, 0))
		b = append(b, `,"cache_level":`...)
		b = appendDiff(b, e.LevelDiff)
		b = append(b, `,"priority":`...)
		b = appendDiff(b, e.PriorityDiff)
		return append(b, '}'), nil
	}
	return b, fmt.Errorf("%s events do not exist in TensorRT-LLM", e.Kind)
}

func appendDiff(b []byte, d engines.Diff) []byte {
	if !d.Set {
		return append(b, "null"...)
	}
	b = append(b, `{"type":"event_diff","new_value":`...)
	b = strconv.AppendInt(b, int64(d.New), 10)
	b = append(b, `,"old_value":`...)
	b = strconv.AppendInt(b, int64(d.Old), 10)
	return append(b, '}')
}

// appendString writes s as Python's json.dumps(ensure_ascii=False) does: UTF-8 kept, only '"', '\\'
// and control characters escaped.
func appendString(b []byte, s string) []byte {
	const hexd = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x80 {
			r, n := utf8.DecodeRuneInString(s[i:])
			b = utf8.AppendRune(b, r) // invalid bytes become U+FFFD
			i += n
			continue
		}
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		default:
			if c < 0x20 {
				b = append(b, '\\', 'u', '0', '0', hexd[c>>4], hexd[c&0xf])
			} else {
				b = append(b, c)
			}
		}
		i++
	}
	return append(b, '"')
}
