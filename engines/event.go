// Package engines holds what every engine family shares: the normalized KV-cache event that each
// family's wire decoder produces and the event path consumes, the typed reject error those decoders
// return, and the ZeroMQ frame layout vLLM and SGLang share. Wire formats live in the family packages
// (engines/vllm, engines/sglang, engines/trtllm); llama.cpp has none. The Family interface
// (family.go) and its facets, each declared in a file named after it (events.go: what the event
// pipeline asks of a family; routerbinding.go: the router binding's key map and shared binder), are
// what code outside engines/ uses instead of naming a family.
package engines

import (
	"fmt"
	"strconv"
)

// Kind says what an event does to an endpoint's block set.
type Kind uint8

const (
	// BlockStored: the engine now holds the listed blocks (one copy each).
	BlockStored Kind = iota + 1
	// BlockRemoved: the engine dropped one copy of each listed block.
	BlockRemoved
	// AllBlocksCleared: the engine dropped everything (cache reset, restart).
	AllBlocksCleared
	// BlockUpdated: TensorRT-LLM only; a block changed cache level or priority.
	BlockUpdated
	// CacheCreated: TensorRT-LLM only; a block pool (one per attention window) came up.
	CacheCreated
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	case BlockUpdated:
		return "BlockUpdated"
	case CacheCreated:
		return "CacheCreated"
	}
	return "unknown"
}

// MediumGPU is the GPU pool's medium; the lower tiers' media are read by TierOf.
const MediumGPU = "GPU"

// Event is one decoded engine event, normalized across families. Fields a family does not send are
// left at their zero value; the Has* flags tell "absent" from "zero" where that matters.
//
// Slices in an Event returned by a DecodeBatchInto call alias buffers that the next call into the same
// destination reuses; copy what must outlive it.
type Event struct {
	Kind Kind

	// BlockHashes are the engine's block ids in chain order, as unsigned 64-bit values. SGLang's
	// signed int64 keys are reinterpreted bit for bit; vLLM byte-string hashes keep their last 8
	// bytes big-endian (what the engine binding recomputes); RawHashes then holds the full bytes
	// (nil entries for hashes that came as integers; RawHashes itself is nil when none came as
	// bytes). TensorRT-LLM hex-string hashes keep their first 8 bytes big-endian (the engine's own
	// v2_sha256_64 form) and the full bytes in RawHashes.
	BlockHashes []uint64
	RawHashes   [][]byte

	// Parent is the engine id of the block before BlockHashes[0]; HasParent is false at the root.
	// RawParent holds the parent's full bytes when it came as a byte or hex string.
	Parent    uint64
	HasParent bool
	RawParent []byte

	// TokenIDs covers every listed block (vLLM: len ≥ blocks × BlockSize, longer when null blocks
	// were skipped; SGLang: blocks × BlockSize). BlockTokens splits TokenIDs per listed block when the
	// geometry is exact (len(TokenIDs) == len(BlockHashes) × BlockSize) and is nil otherwise, so a
	// router binding never rehashes a block from guessed tokens. TensorRT-LLM blocks carry their own
	// tokens: BlockTokens[i] are block i's tokens (possibly a partial last block) and TokenIDs their
	// concatenation.
	//
	// For SGLang bigram (EAGLE) pages, Bigram is set and TokenIDs holds the first element of each
	// pair followed by the last pair's second element (the pairs are (t[j], t[j+1])); BlockTokens[i]
	// then holds BlockSize+1 tokens, the ones block i's pairs span.
	TokenIDs    []uint32
	BlockTokens [][]uint32
	Bigram      bool
	BlockSize   int

	LoRAID    int64
	HasLoRAID bool
	LoRAName  string
	Medium    string // "" when the engine sent none (treated as GPU)

	// ExtraKeys holds vLLM's per-block extra-key tuples (nil entries for blocks without keys), as
	// decoded from msgpack: string, int64, uint64, []byte, bool, float64 and []any values.
	// HasExtraKeys tells an absent (None) list from an empty one.
	ExtraKeys    [][]any
	HasExtraKeys bool

	GroupIdx    int
	HasGroupIdx bool
	SpecKind    string // vLLM kv_cache_spec_kind, "" when absent
	SlidingWin  int    // vLLM kv_cache_spec_sliding_window, 0 when absent
	Locality    string // vLLM after v0.25.1 (`main`): "LOCAL" / "REMOTE", "" when absent

	CacheSalt string // SGLang BlockStoredWithMetadata; TensorRT-LLM newer builds
	// SessionID is the session of the request whose store the event reports (SGLang from v0.5.21,
	// PR #37482): attribution only, never a hash input, and not an owner of a shared block.
	SessionID string

	// TensorRT-LLM envelope and payload fields.
	EventID       uint64
	WindowSize    int
	HasWindowSize bool
	DPRank        int // attention_dp_rank of the envelope
	HasDPRank     bool
	CacheLevels   []int      // per block (stored) or the new level (updated, when it changed)
	Priorities    []int      // per block (stored)
	BlockExtraIDs [][]uint64 // per block token_extra_id values; nil entries when all are 0
	BlockMMKeys   [][]MMKey  // per block multimodal keys (newer builds); nil when none
	LevelDiff     Diff       // updated: cache_level change
	PriorityDiff  Diff       // updated: priority change
	NumBlocks     []int      // created: blocks per cache level
}

// MMKey is a TensorRT-LLM multimodal key carried by a stored block of newer builds.
type MMKey struct {
	Hash        string
	StartOffset int64
}

// Diff is a TensorRT-LLM event_diff; Set is false when the engine sent null (the value did not change).
type Diff struct {
	Old, New int
	Set      bool
}

// Batch is one published message's worth of events.
type Batch struct {
	Timestamp float64
	Events    []Event
	DPRank    int
	HasDPRank bool
}

// RejectReason classifies a payload the gateway refused; it is the `reason` label of the wire-reject
// counter, so the set is small and stable.
type RejectReason string

const (
	// ReasonDecodeError: the bytes are not a well-formed encoding (truncated, bad marker, bad JSON).
	ReasonDecodeError RejectReason = "decode_error"
	// ReasonSchemaMismatch: well-formed, but a value has the wrong type or shape for its field, or a
	// required field is missing.
	ReasonSchemaMismatch RejectReason = "schema_mismatch"
	// ReasonUnknownEvent: an event tag this decoder does not know.
	ReasonUnknownEvent RejectReason = "unknown_event"
	// ReasonTokenRange: a token id outside 0..2^32-1 (or an inconsistent bigram pair chain).
	ReasonTokenRange RejectReason = "token_range"
	// ReasonRankMismatch: the batch names a data-parallel rank other than the socket's.
	ReasonRankMismatch RejectReason = "rank_mismatch"
	// ReasonFrame: the ZeroMQ multipart message does not have the contract's frame layout.
	ReasonFrame RejectReason = "frame_error"
)

// DecodeError is every decoder's reject: why, where (byte offset into the payload, -1 when not
// applicable) and which field (a path such as `events[0].token_ids[3]` or `$[3].data.blocks[1].block_hash`).
type DecodeError struct {
	Reason RejectReason
	Offset int
	Field  string
	Err    error
}

func (e *DecodeError) Error() string {
	s := string(e.Reason)
	if e.Offset >= 0 {
		s += " at byte " + strconv.Itoa(e.Offset)
	}
	if e.Field != "" {
		s += " in " + e.Field
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *DecodeError) Unwrap() error { return e.Err }

// CheckRank rejects a batch stamped with another data-parallel rank than the socket it arrived on
// (each rank publishes on its own port, so a mismatch means a mis-wired endpoint list).
func CheckRank(b *Batch, want int) error {
	if b.HasDPRank && b.DPRank != want {
		return &DecodeError{Reason: ReasonRankMismatch, Offset: -1, Field: "data_parallel_rank",
			Err: fmt.Errorf("batch rank %d on the socket of rank %d", b.DPRank, want)}
	}
	return nil
}
