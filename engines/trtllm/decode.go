// Package trtllm is TensorRT-LLM's KV-event wire: the JSON array that POST /kv_cache_events drains
// (1.2 line), the attention-window rule, and event_id continuity per attention-DP rank.
package trtllm

import (
	"fmt"
	"math"

	"github.com/kvexact/kvexact/engines"
)

// DecodeDrain decodes one /kv_cache_events response body: a JSON array of envelopes
// {event_id, data, window_size?, attention_dp_rank?}. Hashes are decoded exactly (bare integers up to
// 2^64-1 or hex strings, never through float64); optional newer fields (mm_keys, cache_salt,
// lora_id, lora_name, hash_algo, …) are accepted and unknown keys ignored. A body is accepted whole
// or rejected whole with an *engines.DecodeError whose Field is the JSON path
// (`$[3].data.blocks[1].block_hash`) and whose Offset is the byte offset in the body.
func DecodeDrain(body []byte) ([]engines.Event, error) {
	s := scanner{b: body}
	var out []engines.Event
	err := s.array(func(i int) error {
		out = append(out, engines.Event{})
		return s.envelope(&out[len(out)-1])
	})
	if err != nil {
		return nil, err
	}
	if s.peek() != 0 {
		return nil, s.syntax("trailing data after the event array")
	}
	return out, nil
}

func (s *scanner) envelope(e *engines.Event) error {
	start := s.off
	var haveID, haveData bool
	err := s.object(func(key string) error {
		var err error
		switch key {
		case "event_id":
			e.EventID, err = s.uint64v()
			haveID = err == nil
		case "data":
			err = s.data(e)
			haveData = err == nil
		case "window_size":
			if !s.null() {
				e.WindowSize, err = s.intv()
				e.HasWindowSize = err == nil
			}
		case "attention_dp_rank":
			if !s.null() {
				e.DPRank, err = s.intv()
				e.HasDPRank = err == nil
			}
		default: // hash_algo, layer_group_id, later additions
			err = s.skip()
		}
		return err
	})
	if err != nil {
		return err
	}
	switch {
	case !haveID:
		return s.errAt(engines.ReasonSchemaMismatch, start, "envelope without event_id")
	case !haveData:
		return s.errAt(engines.ReasonSchemaMismatch, start, "envelope without data")
	}
	return nil
}

// data reads the payload; its "type" may come anywhere, so it is found first.
func (s *scanner) data(e *engines.Event) error {
	start := s.off
	typ := ""
	s.ws()
	body := s.off
	if err := s.object(func(key string) error {
		if key == "type" {
			var err error
			typ, err = s.str()
			return err
		}
		return s.skip()
	}); err != nil {
		return err
	}
	switch typ {
	case "created":
		e.Kind = engines.CacheCreated
	case "stored":
		e.Kind = engines.BlockStored
	case "removed":
		e.Kind = engines.BlockRemoved
	case "updated":
		e.Kind = engines.BlockUpdated
	case "":
		return s.errAt(engines.ReasonSchemaMismatch, start, "data without a type")
	default:
		s.path = append(s.path, pathElem{key: "type"})
		err := s.errAt(engines.ReasonUnknownEvent, start, "unknown event type %q", typ)
		s.path = s.path[:len(s.path)-1]
		return err
	}
	s.off = body
	var seen bool
	var blockLens []int
	err := s.object(func(key string) error {
		switch e.Kind {
		case engines.CacheCreated:
			if key == "num_blocks_per_cache_level" {
				seen = true
				e.NumBlocks = []int{}
				return s.array(func(int) error {
					v, err := s.intv()
					e.NumBlocks = append(e.NumBlocks, v)
					return err
				})
			}
		case engines.BlockStored:
			switch key {
			case "parent_hash":
				if s.null() {
					return nil
				}
				var err error
				e.Parent, e.RawParent, err = s.hash()
				e.HasParent = err == nil
				return err
			case "blocks":
				seen = true
				return s.array(func(j int) error {
					n := len(e.TokenIDs)
					err := s.block(e, j)
					blockLens = append(blockLens, len(e.TokenIDs)-n)
					return err
				})
			case "cache_salt", "lora_id", "lora_name":
				return s.namespace(e, key)
			}
		case engines.BlockRemoved:
			if key == "block_hashes" {
				seen = true
				return s.array(func(j int) error { return s.appendHash(e, j) })
			}
		case engines.BlockUpdated:
			switch key {
			case "block_hash":
				seen = true
				return s.appendHash(e, 0)
			case "cache_level":
				return s.diff(&e.LevelDiff)
			case "priority":
				return s.diff(&e.PriorityDiff)
			}
		}
		return s.skip() // "type" and unknown keys
	})
	if err != nil {
		return err
	}
	if !seen {
		want := map[engines.Kind]string{engines.CacheCreated: "num_blocks_per_cache_level", engines.BlockStored: "blocks",
			engines.BlockRemoved: "block_hashes", engines.BlockUpdated: "block_hash"}[e.Kind]
		return s.errAt(engines.ReasonSchemaMismatch, start, "%s event without %s", typ, want)
	}
	if e.Kind == engines.BlockUpdated && e.LevelDiff.Set {
		e.CacheLevels = []int{e.LevelDiff.New}
	}
	if e.Kind == engines.BlockStored {
		e.BlockTokens = make([][]uint32, len(blockLens))
		off := 0
		for j, n := range blockLens {
			e.BlockTokens[j] = e.TokenIDs[off : off+n : off+n]
			off += n
		}
		if e.BlockExtraIDs != nil {
			for len(e.BlockExtraIDs) < len(blockLens) {
				e.BlockExtraIDs = append(e.BlockExtraIDs, nil)
			}
		}
		if e.BlockMMKeys != nil {
			for len(e.BlockMMKeys) < len(blockLens) {
				e.BlockMMKeys = append(e.BlockMMKeys, nil)
			}
		}
	}
	return nil
}

func (s *scanner) appendHash(e *engines.Event, j int) error {
	v, raw, err := s.hash()
	if err != nil {
		return err
	}
	if raw != nil && e.RawHashes == nil {
		e.RawHashes = make([][]byte, j, j+1)
	}
	if e.RawHashes != nil {
		e.RawHashes = append(e.RawHashes, raw)
	}
	e.BlockHashes = append(e.BlockHashes, v)
	return nil
}

// namespace reads the optional cache_salt / lora_id / lora_name of newer builds (event or block level).
func (s *scanner) namespace(e *engines.Event, key string) error {
	if s.null() {
		return nil
	}
	var err error
	switch key {
	case "cache_salt":
		var v string
		if v, err = s.str(); err == nil && e.CacheSalt == "" {
			e.CacheSalt = v
		}
	case "lora_id":
		var v int64
		if v, err = s.int64v(); err == nil && !e.HasLoRAID {
			e.LoRAID, e.HasLoRAID = v, true
		}
	case "lora_name":
		var v string
		if v, err = s.str(); err == nil && e.LoRAName == "" {
			e.LoRAName = v
		}
	}
	return err
}

func (s *scanner) block(e *engines.Event, j int) error {
	var haveHash, haveTokens bool
	level, prio := 0, 35
	var extras []uint64
	var mm []engines.MMKey
	start := s.off
	err := s.object(func(key string) error {
		switch key {
		case "block_hash":
			haveHash = true
			return s.appendHash(e, j)
		case "tokens":
			haveTokens = true
			return s.array(func(k int) error { return s.token(e, &extras, k) })
		case "cache_level":
			v, err := s.intv()
			level = v
			return err
		case "priority":
			v, err := s.intv()
			prio = v
			return err
		case "mm_keys":
			if s.null() {
				return nil
			}
			return s.array(func(int) error {
				var k engines.MMKey
				err := s.object(func(key string) error {
					var err error
					switch key {
					case "hash":
						k.Hash, err = s.str()
					case "start_offset":
						k.StartOffset, err = s.int64v()
					default:
						err = s.skip()
					}
					return err
				})
				mm = append(mm, k)
				return err
			})
		case "cache_salt", "lora_id", "lora_name":
			return s.namespace(e, key)
		}
		return s.skip()
	})
	if err != nil {
		return err
	}
	if !haveHash || !haveTokens {
		missing := "block_hash"
		if haveHash {
			missing = "tokens"
		}
		return s.errAt(engines.ReasonSchemaMismatch, start, "stored block without %s", missing)
	}
	e.CacheLevels = append(e.CacheLevels, level)
	e.Priorities = append(e.Priorities, prio)
	if extras != nil {
		for len(e.BlockExtraIDs) < j {
			e.BlockExtraIDs = append(e.BlockExtraIDs, nil)
		}
		e.BlockExtraIDs = append(e.BlockExtraIDs, extras)
	}
	if len(mm) > 0 {
		for len(e.BlockMMKeys) < j {
			e.BlockMMKeys = append(e.BlockMMKeys, nil)
		}
		e.BlockMMKeys = append(e.BlockMMKeys, mm)
	}
	return nil
}

// token reads {"type":"unique_token","token_id":…,"token_extra_id":…}. extras is materialized (one
// entry per token so far) only once a non-zero token_extra_id appears.
func (s *scanner) token(e *engines.Event, extras *[]uint64, k int) error {
	var id, extra uint64
	var have bool
	start := s.off
	err := s.object(func(key string) error {
		var err error
		switch key {
		case "token_id":
			off := s.off
			var neg bool
			id, neg, err = s.integer()
			if err == nil && (neg || id > math.MaxUint32) {
				v := fmt.Sprint(id)
				if neg {
					v = fmt.Sprint(int64(id))
				}
				return s.errAt(engines.ReasonTokenRange, off, "token id %s outside 0..2^32-1", v)
			}
			have = err == nil
		case "token_extra_id":
			extra, err = s.uint64v()
		default:
			err = s.skip()
		}
		return err
	})
	if err != nil {
		return err
	}
	if !have {
		return s.errAt(engines.ReasonSchemaMismatch, start, "token without token_id")
	}
	e.TokenIDs = append(e.TokenIDs, uint32(id))
	if extra != 0 && *extras == nil {
		*extras = make([]uint64, k, k+1)
	}
	if *extras != nil {
		*extras = append(*extras, extra)
	}
	return nil
}

// diff reads an event_diff {"type":"event_diff","new_value":…,"old_value":…} or null.
func (s *scanner) diff(d *engines.Diff) error {
	*d = engines.Diff{}
	if s.null() {
		return nil
	}
	var haveNew bool
	start := s.off
	err := s.object(func(key string) error {
		var err error
		switch key {
		case "new_value":
			d.New, err = s.intv()
			haveNew = err == nil
		case "old_value":
			d.Old, err = s.intv()
		default:
			err = s.skip()
		}
		return err
	})
	if err != nil {
		return err
	}
	if !haveNew {
		return s.errAt(engines.ReasonSchemaMismatch, start, "event_diff without new_value")
	}
	d.Set = true
	return nil
}
