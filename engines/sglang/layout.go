package sglang

import (
	"fmt"

	"github.com/kvexact/kvexact/contracts"
)

// Layout is the event encoding of an SGLang release range. Decoding accepts both layouts, event by
// event, whatever the release (a mixed fleet during a rollout is one stream per engine, but a router
// must not care which); the Layout steers the encoder (the simulator, the samples' re-encoding).
type Layout uint8

const (
	// LayoutArray: v0.5.18 and before, tagged arrays [tag, block_hashes, parent_block_hash,
	// token_ids, block_size, lora_id, medium] plus, for a salted store, a trailing
	// {"cache_salt": …} map (BlockStoredWithMetadata).
	LayoutArray Layout = iota + 1
	// LayoutMap: from v0.5.21 (sgl-project/sglang PR #37482), tagged maps {"type": tag, …} with
	// cache_salt and session_id as optional fields of BlockStored, None-valued defaulted fields
	// omitted. The batch stays the array [ts, events, attn_dp_rank].
	LayoutMap
)

func (l Layout) String() string {
	switch l {
	case LayoutArray:
		return "array-v0.5.18"
	case LayoutMap:
		return "map-v0.5.21"
	}
	return "invalid"
}

// WireSchema is the contract's wireSchema name of the layout.
func (l Layout) WireSchema() string {
	if l == LayoutMap {
		return "sglang-kv-tagged-map-v2"
	}
	return "sglang-kv-tagged-array-rank-v1"
}

// firstMapRelease is the first release known to publish tagged maps. PR #37482 was merged between
// v0.5.19 (2026-09-07, before the merge) and v0.5.21; whether v0.5.20 (2026-09-18) carries it is not
// established (docs/reference/sglang-trtllm-releases.md), and no contract pins v0.5.19 or v0.5.20.
const firstMapRelease = "v0.5.21"

// LayoutForRelease maps an SGLang tag ("v0.5.18", "0.5.21", "v0.5.21.post1", "v0.5.22rc0") to its
// event layout.
func LayoutForRelease(tag string) (Layout, error) {
	v, err := contracts.ParseVersion(tag)
	if err != nil {
		return 0, fmt.Errorf("sglang release: %w", err)
	}
	first, _ := contracts.ParseVersion(firstMapRelease)
	if v.Compare(first) < 0 {
		return LayoutArray, nil
	}
	return LayoutMap, nil
}
