package route

import "github.com/kvexact/kvexact/gateway/tokenize"

// Request is what the tiers need to know about one client request.
type Request struct {
	// Model is the requested model name.
	Model string
	// Chat is true for /v1/chat/completions.
	Chat bool
	// Body is the raw JSON body (chat rendering needs it verbatim).
	Body []byte
	// Prompt is a completions prompt given as text ("" otherwise).
	Prompt string
	// PromptTokens is a completions prompt given as token ids.
	PromptTokens []uint32
	// AffinityText is the text content affinity hashes (prompt, or the messages' text).
	AffinityText string
	// ConversationID is the client's X-Conversation-Id header.
	ConversationID string
	// User is the body's user field.
	User string
	// AddSpecialTokens is the body's add_special_tokens (nil: the endpoint's default — true for
	// completions, false for chat).
	AddSpecialTokens *bool
	// CacheSalt is the body's cache_salt ("" when absent); vLLM and SGLang hash it into block keys.
	CacheSalt string
	// LoRAName is set when the requested model is a LoRA adapter the rule serves (vLLM hashes it).
	// The router sets it from the rule's adapters; Model then names the base model.
	LoRAName string
	// LoRAPath is the adapter's path on the engine (rules.Adapter.LoRAPath; "" unknown), which vLLM
	// v0.31.0+ hashes beside LoRAName.
	LoRAPath string
	// ChatRequest is the chat body as the proxy parsed it, once (nil: the keyer parses Body);
	// ChatError, when set, says why the body is not a chat request the engine accepts.
	ChatRequest *tokenize.ChatRequest
	ChatError   error
	// Batch is the number of prompts of a completions request (0 or 1: a single prompt).
	Batch int
	// TruncatePromptTokens and TruncationSide are the body's truncate_prompt_tokens (nil: absent)
	// and truncation_side ("" when absent): the engine keeps that many prompt tokens.
	TruncatePromptTokens *int64
	TruncationSide       string
	// PromptEmbeds is true when the request carries prompt_embeds (hashed from tensors the gateway
	// does not decode).
	PromptEmbeds bool
	// SkipsPrefixCache is true when the engine will read no cached block for the request: vLLM's
	// skip_reading_prefix_cache, which prompt_logprobs turns on (cached positions would have no
	// prompt logprobs). KV-exact then predicts 0 cached tokens.
	SkipsPrefixCache bool
	// RanksUnpinned: the caller cannot send the request to a chosen data-parallel rank (the
	// picker's P/D path, where the prefill leg is the decode endpoint's sidecar's), so KV-exact
	// scores a data-parallel endpoint by what every rank holds.
	RanksUnpinned bool
}

// sessionKey is X-Conversation-Id, else user.
func (r *Request) sessionKey() string {
	if r.ConversationID != "" {
		return r.ConversationID
	}
	return r.User
}
