package route

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// Keyer turns a request into the block keys the rule's inventory holds (tokenize, render, hash)
// and the prompt's length in tokens (the engine's hit cap depends on it: Config.HitLimit). A
// failure is a Miss with a human reason, never a guess.
type Keyer interface {
	Keys(ctx context.Context, r *Request) (keys []uint64, tokens int, miss Miss, reason string)
}

// promptKeys is KV-exact's guard ladder up to the keys: a certificate covers the rule, the request
// has a shape keys can be had for, a keyer is configured, it keys the prompt (a LoRA adapter's
// request as its base model), and the prompt fills at least one block. The keys go on d for
// predict-on-route and the token-side check, with the engine's hit cap for this prompt (d.hit).
func (rt *Router) promptKeys(ctx context.Context, req *Request, d *Decision) ([]uint64, Miss, string) {
	if rt.cfg.CertReason != "" {
		return nil, MissNoCertificate, rt.cfg.CertReason
	}
	if m, reason := req.unkeyable(); m != MissNone {
		return nil, m, reason
	}
	if rt.cfg.Keyer == nil {
		return nil, MissTokenizer, "no tokenizer configured for this rule"
	}
	keys, tokens, m, reason := rt.cfg.Keyer.Keys(ctx, rt.adapt(req))
	if m != MissNone {
		return nil, m, reason
	}
	d.Blocks, d.keys, d.hit, d.tokens = len(keys), keys, len(keys), tokens
	if len(keys) == 0 {
		return nil, MissHashes, "the prompt is shorter than one block"
	}
	if rt.cfg.HitLimit != nil {
		if n := rt.cfg.HitLimit(tokens, rt.rule.BlockSize); n < len(keys) {
			d.hit, d.MaxHit = max(n, 0), max(n, 0)
		}
		if d.hit == 0 {
			return nil, MissHashes, "the prompt is one block ending on its boundary: the engine computes its last token, so no block can hit"
		}
	}
	return keys, MissNone, ""
}

// PromptKeyer computes a request's block keys exactly as the engine does: tokenize the prompt with
// the model's tokenizer (chat rendered through its template first, without special tokens, as vLLM
// does), then hash full blocks with the rule's binding, with the request's extra keys (LoRA name,
// cache_salt) where the engine hashes them. A request field the engine's keys depend on and the
// keyer cannot reproduce is a named Miss (docs/request-fields.md), never hashed as if absent. It is
// the Keyer every rule uses; what certification proves is what it computes.
type PromptKeyer struct {
	// Pool holds the staged tokenizers by model slug.
	Pool *tokenize.Pool
	// Hasher computes engine-binding keys (nil for the router binding).
	Hasher *hashcore.Hasher
	// RouterBlockSize, when Hasher is nil, selects the router binding (kvexact-xxh3-v1) at this
	// block size.
	RouterBlockSize int
	// BlockExtras: the engine's events carry per-block extra keys (vLLM: LoRA name in every block,
	// cache_salt in block 0); router keys then hash the same extra-key arrays so that both sides
	// agree.
	BlockExtras bool
	// SaltedRoot: the engine roots a salted request's chain at its cache_salt (SGLang), and its
	// events say so; router keys then carry the salt in block 0's extras, as ingest does.
	SaltedRoot bool
	// TaggedExtras: the engine hashes tagged extra keys (vLLM v0.31.0+); its events still publish
	// them flat, so only engine-binding keys use the tagged form.
	TaggedExtras bool
	// TruncationSide is the side the engine's tokenizer truncates from when truncate_prompt_tokens
	// comes without truncation_side (engines.KeyRules.TruncationSide; "": unknown, a miss).
	TruncationSide string
	// Cache, when set, reuses the keys of an earlier prompt's unchanged id prefix (keycache.go):
	// exact, so the keys are the same with or without it.
	Cache *KeyCache
}

// unkeyable names request shapes no keyer can reproduce, before any tokenizing.
func (r *Request) unkeyable() (Miss, string) {
	switch {
	case r.PromptEmbeds:
		return MissPromptEmbeds, "prompt_embeds: the engine hashes the embedding tensors, which the gateway does not decode"
	case r.SkipsPrefixCache:
		return MissNoCacheRead, "prompt_logprobs (or skip_reading_prefix_cache): the engine reads no cached block for this request, so no endpoint's cache helps it; 0 cached tokens predicted"
	case r.Batch > 1:
		return MissBatch, strconv.Itoa(r.Batch) + " prompts in one request: no single key sequence to score"
	case r.Prompt == "" && len(r.PromptTokens) == 0 && !r.Chat:
		return MissTextEmpty, "no prompt text in the request"
	}
	return MissNone, ""
}

// Tokens returns the prompt's token ids as the engine computes them (exported for /admin/explain
// and ctk).
func (k *PromptKeyer) Tokens(r *Request) ([]uint32, Miss, string) {
	if m, reason := r.unkeyable(); m != MissNone {
		return nil, m, reason
	}
	var ids []uint32
	switch {
	case len(r.PromptTokens) > 0:
		ids = r.PromptTokens
	case r.Chat:
		tok, err := k.Pool.Get(r.Model)
		if err != nil {
			return nil, MissTokenizer, err.Error()
		}
		req, err := r.ChatRequest, r.ChatError
		if req == nil && err == nil {
			req, err = tokenize.ParseChatRequest(r.Body)
		}
		if err != nil {
			return nil, MissTokenize, err.Error()
		}
		if ids, _, err = tok.EncodeChat(req); err != nil {
			return nil, chatMiss(err), chatReason(err)
		}
	default:
		tok, err := k.Pool.Get(r.Model)
		if err != nil {
			return nil, MissTokenizer, err.Error()
		}
		special := true
		if r.AddSpecialTokens != nil {
			special = *r.AddSpecialTokens
		}
		if ids, err = tok.Encode(r.Prompt, special); err != nil {
			return nil, MissTokenize, err.Error()
		}
		if special && k.tokenizerTruncates(r, len(ids)) {
			// The tokenizer cuts the text's own tokens and adds its special tokens around what
			// is left: what is cut depends on which tokens are special.
			bare, err := tok.Encode(r.Prompt, false)
			if err != nil {
				return nil, MissTokenize, err.Error()
			}
			return truncateAroundSpecial(ids, bare, int(*r.TruncatePromptTokens))
		}
	}
	return k.truncate(ids, r)
}

// tokenizerTruncates reports whether truncate_prompt_tokens cuts a prompt of n tokens on the
// tokenizer's side (no truncation_side in the request, a known default side).
func (k *PromptKeyer) tokenizerTruncates(r *Request, n int) bool {
	t := r.TruncatePromptTokens
	return t != nil && *t >= 0 && *t < int64(n) && r.TruncationSide == "" && k.TruncationSide == "left"
}

// truncateAroundSpecial is a left truncation by the tokenizer (Hugging Face's truncation with
// truncation_side left): with is the text's tokens with the special tokens added, bare without;
// the special tokens stay and count against n, the text keeps its last n − (special tokens).
func truncateAroundSpecial(with, bare []uint32, n int) ([]uint32, Miss, string) {
	k := len(with) - len(bare)
	p := -1
	for i := 0; k >= 0 && i <= k; i++ {
		if slices.Equal(with[i:i+len(bare)], bare) {
			p = i
			break
		}
	}
	switch {
	case p < 0:
		return nil, MissTruncation, "truncate_prompt_tokens: the tokenizer's special tokens do not surround the prompt's own tokens, so its truncation cannot be reproduced"
	case n < k:
		return nil, MissTruncation, fmt.Sprintf("truncate_prompt_tokens %d is below the tokenizer's %d special tokens", n, k)
	}
	out := make([]uint32, 0, n)
	out = append(out, with[:p]...)
	out = append(out, bare[len(bare)-(n-k):]...)
	return append(out, with[p+len(bare):]...), MissNone, ""
}

// truncate applies truncate_prompt_tokens as vLLM's TokenizeParams does. A prompt no longer than
// the limit is unchanged. With truncation_side given, vLLM tokenizes in full and slices ("left"
// keeps the last n, "right" the first n): reproduced. Without it the tokenizer's own truncation runs
// on its own side (the family's TruncationSide; for ids with no special tokens added — token-id
// prompts, chats, add_special_tokens false — a plain slice; text with special tokens goes through
// truncateAroundSpecial). An unknown side, and -1 (max_model_len − max_tokens, which the gateway
// does not know), are a miss.
func (k *PromptKeyer) truncate(ids []uint32, r *Request) ([]uint32, Miss, string) {
	if r.TruncatePromptTokens == nil {
		return ids, MissNone, ""
	}
	n := *r.TruncatePromptTokens
	side := r.TruncationSide
	if side == "" {
		side = k.TruncationSide
	}
	switch {
	case n < 0:
		return nil, MissTruncation, "truncate_prompt_tokens -1 keeps max_model_len - max_tokens tokens, which the gateway does not know"
	case n >= int64(len(ids)):
		return ids, MissNone, ""
	case side == "left":
		return ids[len(ids)-int(n):], MissNone, ""
	case side == "right":
		return ids[:n], MissNone, ""
	}
	return nil, MissTruncation, fmt.Sprintf("truncate_prompt_tokens %d cuts the %d-token prompt on the tokenizer's side, which this engine family's rules do not name (send truncation_side to make it reproducible)", n, len(ids))
}

func chatMiss(err error) Miss {
	switch {
	case errors.Is(err, tokenize.ErrMultimodal):
		return MissMultimodal
	case errors.Is(err, tokenize.ErrRequestTemplate):
		return MissRequestTemplate
	}
	return MissTokenize
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
func (k *PromptKeyer) Keys(_ context.Context, r *Request) ([]uint64, int, Miss, string) {
	ex := &hashcore.Extras{LoRAName: r.LoRAName, CacheSalt: r.CacheSalt}
	// An engine binding that roots a salted chain at the salt separates the namespaces by itself.
	saltedKeys := k.Hasher != nil && k.Hasher.Binding().Algorithm.SaltedRoot()
	switch {
	case ex.LoRAName != "" && !k.BlockExtras:
		return nil, 0, MissLoRA, "the engine's block keys do not include the LoRA adapter (" + ex.LoRAName + "), so base-model blocks would look like hits"
	case ex.LoRAName != "" && k.TaggedExtras && k.Hasher != nil && r.LoRAPath == "":
		return nil, 0, MissLoRA, "the engine hashes the LoRA adapter's path beside its name (" + ex.LoRAName + "), and the adapter has none: set its loraPath, or discover it from /v1/models"
	case ex.CacheSalt != "" && !k.BlockExtras && !k.SaltedRoot && !saltedKeys:
		return nil, 0, MissCacheSalt, "the engine's events do not separate cache_salt namespaces"
	}
	ids, m, reason := k.Tokens(r)
	if m != MissNone {
		return nil, 0, m, reason
	}
	if k.Hasher != nil {
		tex := ex
		if k.TaggedExtras {
			tex = &hashcore.Extras{LoRAName: ex.LoRAName, LoRAPath: r.LoRAPath, CacheSalt: ex.CacheSalt, Tagged: true}
		}
		keys, err := k.Cache.Keys(k.Hasher, ids, tex)
		if err != nil {
			return nil, 0, MissHashes, err.Error()
		}
		return keys, len(ids), MissNone, ""
	}
	// Router keys hash vLLM's one-shot extra keys of what the engine's events carry: LoRA name and
	// cache_salt with block extras, else an SGLang salt in block 0's extras, as ingest's binder does.
	var rex *hashcore.Extras
	switch {
	case k.BlockExtras:
		rex = ex
	case k.SaltedRoot && ex.CacheSalt != "":
		rex = &hashcore.Extras{CacheSalt: ex.CacheSalt}
	}
	h, err := hashcore.New(hashcore.Binding{Algorithm: hashcore.RouterXXH3V1, BlockSize: k.RouterBlockSize}, hashcore.Default())
	if err == nil {
		var keys []uint64
		if keys, err = k.Cache.Keys(h, ids, rex); err == nil {
			return keys, len(ids), MissNone, ""
		}
	}
	return nil, 0, MissHashes, fmt.Sprintf("router keys: %v", err)
}
