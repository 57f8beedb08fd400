package sim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

// textModel is what the simulator needs from a tokenizer.
type textModel interface {
	Encode(text string, addSpecialTokens bool) ([]uint32, error)
	Decode(ids []uint32, skipSpecialTokens bool) (string, error)
	EncodeChat(req *tokenize.ChatRequest) ([]uint32, string, error)
	RenderChat(req *tokenize.ChatRequest) (string, error)
	VocabSize() int
	Token(id uint32) (string, bool)
	Config() *tokenize.Config
}

// loadText resolves model to a tokenizer folder: a folder holding tokenizer.json, or a model slug
// under the tokenizer roots (tokenize.DefaultRoots).
func loadText(model string, tok *tokenize.Tokenizer) (textModel, error) {
	if tok != nil {
		return tok, nil
	}
	if model == "" {
		return nil, fmt.Errorf("sim: model: required (a tokenizer folder or a model slug such as llama3)")
	}
	dir := model
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		d, ferr := tokenize.FindModelDir(tokenize.DefaultRoots(), tokenize.FolderFor(model))
		if ferr != nil {
			return nil, fmt.Errorf("sim: model %q: %w", model, ferr)
		}
		dir = d
	}
	t, err := tokenize.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("sim: model %q: %w", model, err)
	}
	return t, nil
}

// llamaSlot is one llama.cpp server slot: it keeps its last prompt (and generated tokens) as its
// KV cache, which the next request assigned to it reuses up to the common prefix.
type llamaSlot struct {
	id       int
	busy     bool
	cache    []uint32
	lastUsed time.Time
	task     uint64
	nCtx     int
}

// slotPromptSimilarity is llama.cpp's --slot-prompt-similarity default.
const slotPromptSimilarity = 0.10

func commonPrefix(a, b []uint32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// pickSlot chooses an idle slot as llama.cpp does: the one whose cached prompt best matches (above
// the similarity threshold), else the least recently used.
func (r *rank) pickSlot(prompt []uint32) *llamaSlot {
	var best *llamaSlot
	bestSim := 0.0
	for _, s := range r.llama {
		if s.busy || len(s.cache) == 0 || len(prompt) == 0 {
			continue
		}
		sim := float64(commonPrefix(s.cache, prompt)) / float64(len(prompt))
		if sim > slotPromptSimilarity && sim > bestSim {
			best, bestSim = s, sim
		}
	}
	if best != nil {
		return best
	}
	for _, s := range r.llama {
		if s.busy {
			continue
		}
		if best == nil || s.lastUsed.Before(best.lastUsed) {
			best = s
		}
	}
	return best
}

// generateLlama runs one request on a llama.cpp slot: reuse is the common prefix with the slot's
// cache (at least one token is always evaluated), no events.
func (r *rank) generateLlama(ctx context.Context, q *genReq) (*genRes, error) {
	e := r.e
	r.waiting.Add(1)
	select {
	case r.slots <- struct{}{}:
	case <-ctx.Done():
		r.waiting.Add(-1)
		return nil, ctx.Err()
	}
	r.waiting.Add(-1)
	r.running.Add(1)
	r.mu.Lock()
	slot := r.pickSlot(q.prompt)
	slot.busy = true
	slot.task = e.reqID.Add(1)
	reuse := commonPrefix(slot.cache, q.prompt)
	if reuse >= len(q.prompt) && reuse > 0 {
		reuse = len(q.prompt) - 1
	}
	r.mu.Unlock()
	tokens := append([]uint32(nil), q.prompt...)
	defer func() {
		r.mu.Lock()
		slot.busy = false
		slot.cache = tokens
		slot.lastUsed = time.Now()
		r.broadcastLocked()
		r.mu.Unlock()
		r.running.Add(-1)
		<-r.slots
	}()
	r.requests.Add(1)
	r.promptTokens.Add(uint64(len(q.prompt)))
	r.queriedTokensL.Add(uint64(len(q.prompt)))
	r.cachedTokens.Add(uint64(reuse))
	res := &genRes{rank: r.idx, cached: reuse, finish: "length"}
	if err := sleepCtx(ctx, time.Duration(len(q.prompt)-reuse)*e.cfg.PrefillPerToken); err != nil {
		tokens = tokens[:reuse]
		return res, err
	}
	if q.onPrefilled != nil {
		q.onPrefilled(reuse)
	}
	h := promptHash(q.prompt)
	for i := 0; i < q.maxTokens; i++ {
		if i > 0 {
			if err := sleepCtx(ctx, e.cfg.DecodePerToken); err != nil {
				return res, err
			}
		}
		tok := e.words[(h+uint64(i))%uint64(len(e.words))]
		res.output = append(res.output, tok)
		tokens = append(tokens, tok)
		r.genTokens.Add(1)
		if q.onToken != nil {
			q.onToken(i, tok)
		}
	}
	return res, nil
}

func (e *Engine) clearLlama() {
	for _, r := range e.ranks {
		r.mu.Lock()
		r.eraseIdleSlotsLocked()
		r.mu.Unlock()
	}
}

// clearLlamaLocked is clearLlama with every rank's lock already held.
func (e *Engine) clearLlamaLocked() {
	for _, r := range e.ranks {
		r.eraseIdleSlotsLocked()
	}
}

func (r *rank) eraseIdleSlotsLocked() {
	for _, s := range r.llama {
		if !s.busy {
			s.cache = nil
		}
	}
}
