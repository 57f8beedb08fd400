package vllm

import "github.com/kvexact/kvexact/engines"

var hints = map[engines.HintTopic]string{
	engines.HintEventsEnable: `--kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557"}'`,
	engines.HintBlockSize:    "--block-size",
	engines.HintClear:        "AllBlocksCleared",
	engines.HintServedModel:  "--served-model-name",
	engines.HintChatTemplate: "--chat-template",
	engines.HintLoRALoad:     "--lora-modules name=path",
	engines.HintLoRAServe:    "--enable-lora --lora-modules",
}

// Hint is vLLM's part of ctk's operator hints (engines.Hints).
func (family) Hint(t engines.HintTopic) string { return hints[t] }
