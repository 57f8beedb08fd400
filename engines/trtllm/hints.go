package trtllm

import "github.com/kvexact/kvexact/engines"

var hints = map[engines.HintTopic]string{
	engines.HintEventsEnable:  "kv_cache_config event_buffer_max_size > 0 and enable_block_reuse",
	engines.HintEventsAddress: "events.drain, with no other consumer draining it",
	engines.HintBlockSize:     "kv_cache_config.tokens_per_block",
	engines.HintSequence:      "make the gateway the only consumer of /kv_cache_events and raise event_buffer_max_size",
}

// Hint is TensorRT-LLM's part of ctk's operator hints (engines.Hints).
func (family) Hint(t engines.HintTopic) string { return hints[t] }
