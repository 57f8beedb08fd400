// Package vllm is vLLM's KV-event wire: the msgpack batch its ZmqEventPublisher sends, in both the
// tagged-array event layout (v0.10.2 … v0.23.x) and the tagged-map layout (v0.24.0+).
package vllm

import (
	"fmt"
	"strconv"
	"strings"
)

// Layout is the event encoding of a vLLM release range. The array layouts grew one field set at a
// time (engine-contracts-vllm.md §4.5); decoding accepts all of them whatever the Layout, which only
// steers the encoder.
type Layout uint8

const (
	// LayoutArrayMedium: v0.10.2–v0.13.x, BlockStored [hashes, parent, tokens, block_size, lora_id,
	// medium]; BlockRemoved [hashes, medium].
	LayoutArrayMedium Layout = iota + 1
	// LayoutArrayLoRAName: v0.14.0–v0.16.x, BlockStored + lora_name.
	LayoutArrayLoRAName
	// LayoutArrayExtraKeys: v0.17.0–v0.19.x, BlockStored + extra_keys.
	LayoutArrayExtraKeys
	// LayoutArrayGroupIdx: v0.20.0–v0.21.x, BlockStored and BlockRemoved + group_idx.
	LayoutArrayGroupIdx
	// LayoutArraySpecKind: v0.22.0–v0.23.x, BlockStored + kv_cache_spec_kind, kv_cache_spec_sliding_window.
	LayoutArraySpecKind
	// LayoutMap: v0.24.0+, tagged maps with None-valued defaulted fields omitted.
	LayoutMap
)

func (l Layout) String() string {
	switch l {
	case LayoutArrayMedium:
		return "array-v0.10.2"
	case LayoutArrayLoRAName:
		return "array-v0.14"
	case LayoutArrayExtraKeys:
		return "array-v0.17"
	case LayoutArrayGroupIdx:
		return "array-v0.20"
	case LayoutArraySpecKind:
		return "array-v0.22"
	case LayoutMap:
		return "map-v0.24"
	}
	return "invalid"
}

// storedFields is the number of BlockStored fields after the tag in an array layout.
func (l Layout) storedFields() int {
	switch l {
	case LayoutArrayMedium:
		return 6
	case LayoutArrayLoRAName:
		return 7
	case LayoutArrayExtraKeys:
		return 8
	case LayoutArrayGroupIdx:
		return 9
	}
	return 11
}

// removedFields is the number of BlockRemoved fields after the tag in an array layout.
func (l Layout) removedFields() int {
	if l >= LayoutArrayGroupIdx {
		return 3
	}
	return 2
}

// LayoutForRelease maps a vLLM tag ("v0.25.1", "0.23.0", "v0.26.0rc1", "v0.11.0.post1") to its
// event layout. Releases before v0.10.2 are refused: their block hashes were Python hash() values
// (possibly negative or 256-bit), which no engine binding can reproduce.
func LayoutForRelease(tag string) (Layout, error) {
	v, err := parseRelease(tag)
	if err != nil {
		return 0, err
	}
	switch {
	case less(v, [3]int{0, 9, 2}):
		return 0, fmt.Errorf("vllm release %q: KV events start at v0.9.2", tag)
	case less(v, [3]int{0, 10, 2}):
		return 0, fmt.Errorf("vllm release %q: block hashes before v0.10.2 are Python hash() values; unsupported", tag)
	case less(v, [3]int{0, 14, 0}):
		return LayoutArrayMedium, nil
	case less(v, [3]int{0, 17, 0}):
		return LayoutArrayLoRAName, nil
	case less(v, [3]int{0, 20, 0}):
		return LayoutArrayExtraKeys, nil
	case less(v, [3]int{0, 22, 0}):
		return LayoutArrayGroupIdx, nil
	case less(v, [3]int{0, 24, 0}):
		return LayoutArraySpecKind, nil
	}
	return LayoutMap, nil
}

func less(a, b [3]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

func parseRelease(tag string) ([3]int, error) {
	var v [3]int
	s := strings.TrimPrefix(strings.TrimSpace(tag), "v")
	parts := strings.Split(s, ".")
	if len(parts) < 2 {
		return v, fmt.Errorf("vllm release %q: want vMAJOR.MINOR[.PATCH]", tag)
	}
	for i := 0; i < 3 && i < len(parts); i++ {
		p := parts[i]
		j := 0
		for j < len(p) && p[j] >= '0' && p[j] <= '9' {
			j++
		}
		if j == 0 {
			if i == 2 {
				break // "v0.26.post1"-style suffix: patch 0
			}
			return v, fmt.Errorf("vllm release %q: part %d is not a number", tag, i+1)
		}
		n, err := strconv.Atoi(p[:j])
		if err != nil {
			return v, fmt.Errorf("vllm release %q: %w", tag, err)
		}
		v[i] = n
	}
	return v, nil
}
