package route

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// PromptKeyer computes a request's block keys exactly as the engine does: tokenize the prompt with
// the model's tokenizer (chat rendered through its template first, without special tokens, as vLLM
// does), then hash full blocks with the rule's binding. It is the Keyer every rule uses; what
// certification proves is what it computes.
type PromptKeyer struct {
	// Pool holds the staged tokenizers by model slug.
	Pool *tokenize.Pool
	// Hasher computes engine-binding keys (nil for the router binding).
	Hasher *hashcore.Hasher
	// RouterBlockSize, when Hasher is nil, selects the router binding (kvexact-xxh3-v1) at this
	// block size.
	RouterBlockSize int
	// VLLMExtras: the engine is vLLM, whose events carry per-block extra keys; router keys then hash
	// the same extra-key arrays so that both sides agree.
	VLLMExtras bool
}

// Tokens returns the prompt's token ids (exported for /admin/explain and ctk).
func (k *PromptKeyer) Tokens(r *Request) ([]uint32, Miss, string) {
	if len(r.PromptTokens) > 0 {
		return r.PromptTokens, MissNone, ""
	}
	tok, err := k.Pool.Get(r.Model)
	if err != nil {
		return nil, MissTokenizer, err.Error()
	}
	if r.Chat {
		req, err := tokenize.ParseChatRequest(r.Body)
		if err != nil {
			return nil, MissTokenize, err.Error()
		}
		ids, _, err := tok.EncodeChat(req)
		if err != nil {
			return nil, MissTokenize, chatReason(err)
		}
		return ids, MissNone, ""
	}
	if r.Prompt == "" {
		return nil, MissTextEmpty, "empty prompt"
	}
	special := true
	if r.AddSpecialTokens != nil {
		special = *r.AddSpecialTokens
	}
	ids, err := tok.Encode(r.Prompt, special)
	if err != nil {
		return nil, MissTokenize, err.Error()
	}
	return ids, MissNone, ""
}

func chatReason(err error) string {
	switch {
	case errors.Is(err, tokenize.ErrNoJinjaPath):
		return "the engine renders this model's chat without Jinja: " + err.Error()
	case errors.Is(err, tokenize.ErrUnsupportedChat):
		return "chat request not reproducible exactly: " + err.Error()
	}
	return err.Error()
}

// Keys implements Keyer.
func (k *PromptKeyer) Keys(_ context.Context, r *Request) ([]uint64, Miss, string) {
	ids, m, reason := k.Tokens(r)
	if m != MissNone {
		return nil, m, reason
	}
	ex := &hashcore.Extras{LoRAName: r.LoRAName, CacheSalt: r.CacheSalt}
	if k.Hasher != nil {
		keys, err := k.Hasher.Keys(ids, ex, nil)
		if err != nil {
			return nil, MissHashes, err.Error()
		}
		return keys, MissNone, ""
	}
	var extras [][]any
	if k.VLLMExtras && (ex.LoRAName != "" || ex.CacheSalt != "") {
		var err error
		if extras, err = hashcore.ExtraKeys(ex, len(ids), k.RouterBlockSize); err != nil {
			return nil, MissHashes, err.Error()
		}
	}
	keys, err := hashcore.RouterKeys(0, ids, k.RouterBlockSize, extras, nil)
	if err != nil {
		return nil, MissHashes, fmt.Sprintf("router keys: %v", err)
	}
	return keys, MissNone, ""
}
