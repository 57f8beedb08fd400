package ctk

import (
	"fmt"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/sglang"
	"github.com/kvexact/kvexact/engines/vllm"
)

// decodeReplayed decodes one replayed ZeroMQ payload of family.
//
// Pending (issue 18): this becomes the family's event decoder facet (engines.Events' EventDecoder,
// the ingest work), after which this file goes and the family-name test's pending entry for it
// with it.
func decodeReplayed(family string, payload []byte) (engines.Batch, error) {
	switch family {
	case "vllm":
		return vllm.DecodeBatch(payload)
	case "sglang":
		return sglang.DecodeBatch(payload)
	}
	return engines.Batch{}, fmt.Errorf("no ZeroMQ decoder for %s", family)
}
