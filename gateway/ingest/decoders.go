package ingest

import (
	"io"
	"log"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/sglang"
	"github.com/kvexact/kvexact/engines/vllm"
)

// quietLogger silences zmq4's own stderr logging; the source logs through slog.
var quietLogger = log.New(io.Discard, "", 0)

// decoderFor picks the ZeroMQ payload decoder of a family and release (nil for trtllm, whose drain
// bodies the drain source decodes). vLLM's decoder reads both event layouts (array ≤ v0.23, map
// ≥ v0.24) whatever the release; the release is still checked so that one without usable events
// (before v0.10.2) is refused up front.
func decoderFor(family, release string) (func(*engines.Batch, []byte) error, error) {
	if release != "" {
		if _, err := contracts.ParseVersion(release); err != nil {
			return nil, cfgErr("release", "%v", err)
		}
	}
	switch family {
	case "vllm":
		if release != "" {
			if _, err := vllm.LayoutForRelease(release); err != nil {
				return nil, cfgErr("release", "%v", err)
			}
		}
		return vllm.DecodeBatchInto, nil
	case "sglang":
		return sglang.DecodeBatchInto, nil
	case "trtllm":
		return nil, nil
	case "llamacpp":
		return nil, cfgErr("family", "llama.cpp publishes no KV-cache events: exact routing is refused, content affinity (chwbl) is the best it gets")
	case "":
		return nil, cfgErr("family", "missing; want vllm, sglang or trtllm")
	}
	return nil, cfgErr("family", "%q: want vllm, sglang or trtllm", family)
}
