package tokenize

// ChatTemplate returns the tokenizer's compiled chat templates (default ChatOptions), compiled once.
func (t *Tokenizer) ChatTemplate() (*ChatTemplate, error) { return ChatTemplateFor(t.Config()) }

// RenderChat renders a chat request to the prompt text vLLM builds for it.
func (t *Tokenizer) RenderChat(req *ChatRequest) (string, error) {
	ct, err := t.ChatTemplate()
	if err != nil {
		return "", err
	}
	return ct.Render(req)
}

// EncodeChat renders a chat request and encodes the text as vLLM does: add_special_tokens is the
// request's value, false by default, because the template writes BOS itself.
func (t *Tokenizer) EncodeChat(req *ChatRequest) ([]uint32, string, error) {
	text, err := t.RenderChat(req)
	if err != nil {
		return nil, "", err
	}
	// Sized for about 4 bytes a token: growing from nil copies a 100k-token prompt's ids 17 times.
	ids, err := t.AppendEncode(make([]uint32, 0, len(text)/4+64), text, req.AddSpecialTokens)
	if err != nil {
		return nil, text, err
	}
	return ids, text, nil
}

// LoadForCheck is the RefLoader backed by Load.
func LoadForCheck(dir string) (RefTokenizer, error) {
	t, err := Load(dir)
	if err != nil {
		return nil, err
	}
	return t, nil
}
