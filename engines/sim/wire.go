package sim

import (
	"fmt"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/sglang"
	"github.com/kvexact/kvexact/engines/trtllm"
	"github.com/kvexact/kvexact/engines/vllm"
)

// encoderFor returns the family's ZeroMQ payload encoder for the release (the project's own wire
// encoders; vLLM's and SGLang's layouts follow the release).
func encoderFor(family, release string) (func(engines.Batch) ([]byte, error), error) {
	switch family {
	case "vllm":
		layout, err := vllm.LayoutForRelease(release)
		if err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
		return func(b engines.Batch) ([]byte, error) { return vllm.EncodeBatch(b, layout) }, nil
	case "sglang":
		layout, err := sglang.LayoutForRelease(release)
		if err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
		return func(b engines.Batch) ([]byte, error) { return sglang.EncodeBatchLayout(b, layout) }, nil
	}
	return nil, fmt.Errorf("sim: family %s publishes no ZeroMQ events", family)
}

// encodeDrain writes a /kv_cache_events response body.
func encodeDrain(evs []engines.Event) ([]byte, error) {
	return trtllm.EncodeDrain(evs)
}
