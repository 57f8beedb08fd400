package ctk

import (
	"testing"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/vllm"
)

// The operator hints are assembled from the families' parts; these are the texts users saw when
// ctk held them as literals, so a family's part that drifts (or a registry order change) fails here.
func TestEngineHintsText(t *testing.T) {
	for _, c := range []struct{ name, got, want string }{
		{"eventsHint", eventsHint, "enable prefix caching and KV events on the engine (vLLM --kv-events-config '{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\"}'; SGLang --kv-events-config '{\"publisher\":\"zmq\",…}'; TensorRT-LLM kv_cache_config event_buffer_max_size > 0 and enable_block_reuse) and give its publisher addresses as events.zmq, one per data-parallel rank in rank order (TensorRT-LLM: events.drain, with no other consumer draining it)"},
		{"sequenceHint", sequenceHint, "the gateway loses blocks on every gap: raise the publisher's hwm and max_queue_size, configure events.replay (replay_endpoint) so gaps can be refilled, and for TensorRT-LLM make the gateway the only consumer of /kv_cache_events and raise event_buffer_max_size"},
		{"clearHint", clearHint, "the gateway learns of a cache reset only from the engine's event (vLLM and SGLang AllBlocksCleared): check the engine publishes it (events enabled, publisher reachable)"},
		{"templateHint", templateHint, "stage the chat template the engine uses: the engine's tokenizer_config.json chat_template (vLLM and SGLang --chat-template, llama.cpp --chat-template/--jinja override it)"},
		{"blockSizeFlags", blockSizeFlags, "vLLM --block-size, SGLang --page-size, TensorRT-LLM kv_cache_config.tokens_per_block"},
		{"servedModelFlags", servedModelFlags, "vLLM/SGLang --served-model-name"},
		{"lora load", vllm.Family.Display() + " " + vllm.Family.Hint(engines.HintLoRALoad), "vLLM --lora-modules name=path"},
		{"lora serve", vllm.Family.Display() + " " + vllm.Family.Hint(engines.HintLoRAServe), "vLLM --enable-lora --lora-modules"},
	} {
		if c.got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, c.got, c.want)
		}
	}
}
