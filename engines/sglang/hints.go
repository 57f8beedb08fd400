package sglang

import "github.com/kvexact/kvexact/engines"

var hints = map[engines.HintTopic]string{
	engines.HintEventsEnable: `--kv-events-config '{"publisher":"zmq",…}'`,
	engines.HintBlockSize:    "--page-size",
	engines.HintClear:        "AllBlocksCleared",
	engines.HintServedModel:  "--served-model-name",
	engines.HintChatTemplate: "--chat-template",
}

// Hint is SGLang's part of ctk's operator hints (engines.Hints).
func (family) Hint(t engines.HintTopic) string { return hints[t] }
