package sim

import (
	"fmt"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

// servedTemplate renders chats with another template than its tokenizer folder's: an engine started
// with --chat-template after certification, whose chat prompts the gateway no longer reproduces.
type servedTemplate struct {
	textModel
	ct *tokenize.ChatTemplate
}

func withChatTemplate(tm textModel, src string) (textModel, error) {
	cfg := *tm.Config()
	cfg.ChatTemplate, cfg.ChatTemplates = src, nil
	ct, err := tokenize.NewChatTemplate(&cfg, tokenize.ChatOptions{})
	if err != nil {
		return nil, fmt.Errorf("sim: serveChatTemplate: %w", err)
	}
	return servedTemplate{textModel: tm, ct: ct}, nil
}

func (s servedTemplate) RenderChat(req *tokenize.ChatRequest) (string, error) {
	return s.ct.Render(req)
}

func (s servedTemplate) EncodeChat(req *tokenize.ChatRequest) ([]uint32, string, error) {
	text, err := s.ct.Render(req)
	if err != nil {
		return nil, "", err
	}
	ids, err := s.Encode(text, req.AddSpecialTokens)
	return ids, text, err
}
