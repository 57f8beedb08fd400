package llamacpp

import "github.com/kvexact/kvexact/engines"

var hints = map[engines.HintTopic]string{
	engines.HintChatTemplate: "--chat-template/--jinja",
}

// Hint is llama.cpp's part of ctk's operator hints (engines.Hints).
func (family) Hint(t engines.HintTopic) string { return hints[t] }
