package trtllm

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/hashcore"
)

// TensorRT-LLM's event facet: events come from the destructive HTTP drain, and their block hashes
// are not reproducible outside the engine, so only the router binding exists.

func (family) EventTransport() engines.Transport { return engines.TransportDrain }

// EventDecoder: the drain decodes its own bodies (DecodeDrain); there is no ZeroMQ payload.
func (family) EventDecoder(string) (engines.Decoder, error) { return nil, nil }

func (family) CheckEventConfig(c *engines.EventConfig) error {
	if c.Binding == "" {
		c.Binding = engines.BindingRouter
	}
	if c.Binding != engines.BindingRouter {
		return &engines.ConfigError{Field: "binding", Msg: fmt.Sprintf("trtllm events carry engine hashes that are not reproducible: only %q is allowed, got %q", engines.BindingRouter, c.Binding)}
	}
	if c.BlockSize <= 0 {
		return &engines.ConfigError{Field: "block_size", Msg: fmt.Sprintf("trtllm needs the engine's tokens_per_block (> 0), got %d", c.BlockSize)}
	}
	if c.DrainURL == "" {
		return &engines.ConfigError{Field: "drain_url", Msg: "trtllm needs the server's base URL"}
	}
	if len(c.Publish) > 0 || len(c.Replay) > 0 {
		return &engines.ConfigError{Field: "publish", Msg: "trtllm 1.2 has no ZeroMQ stream; use drain_url"}
	}
	return nil
}

// EventResidency: every stored copy counts. The router binder keeps its own per-engine-id copy
// counts, and TensorRT-LLM does not re-emit stores of reused blocks.
func (family) EventResidency(string) string { return contracts.ResidencyCopies }

func (family) RouterBinder(blockSize int) engines.RouterBinder {
	return &routerBinder{blockSize: blockSize}
}

func (family) EventDrain(base string) engines.Drain {
	base = strings.TrimRight(base, "/")
	return drain{base: base, url: base + DrainPath}
}

// drain polls one server's /kv_cache_events.
type drain struct{ base, url string }

func (d drain) URL() string { return d.url }

func (d drain) Poll(ctx context.Context, c *http.Client, limit int64) ([]engines.Event, error) {
	req, err := NewDrainRequest(ctx, d.base)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return ReadDrainResponse(resp, limit)
}

func (drain) NewFilter() engines.EventFilter { return &windowFilter{} }

// windowFilter is WindowFilter as the pipeline's EventFilter: events of sliding-window pools are
// skipped with reason "window".
type windowFilter struct{ WindowFilter }

func (f *windowFilter) Keep(ev *engines.Event) (bool, string, string) {
	if f.WindowFilter.Keep(ev) {
		return true, "", ""
	}
	return false, "window", fmt.Sprintf("window_size %d", ev.WindowSize)
}

// routerBinder is TensorRT-LLM's router binding: stored blocks are rehashed from their own token
// lists, a partial block (fewer than tokens_per_block tokens) and everything after it in the event
// are not indexed and their later removal is suppressed, cache level 0 is GPU.
type routerBinder struct {
	blockSize int
	tokens    []uint32
	keys      []uint64
}

func (b *routerBinder) Bind(rank int, ev *engines.Event, m *engines.KeyMap, out engines.BindOutput) {
	rk := m.Rank(rank)
	switch ev.Kind {
	case engines.BlockStored:
		b.stored(rank, ev, m, rk, out)
	case engines.BlockRemoved:
		m.Remove(rank, ev.BlockHashes, out)
		out.Applied(rank, "BlockRemoved")
	case engines.BlockUpdated:
		b.updated(rank, ev, rk, out)
	default:
		out.Skip(rank, "kind", 1)
	}
}

func (b *routerBinder) stored(rank int, ev *engines.Event, m *engines.KeyMap, rk *engines.RankKeys, out engines.BindOutput) {
	if ev.CacheSalt != "" || ev.HasLoRAID || ev.LoRAName != "" {
		// Tokens alone cannot tell a salted or LoRA namespace apart; the prompt side would hash
		// them as plain text. Not indexed, and its blocks' removals are suppressed.
		for _, h := range ev.BlockHashes {
			rk.Suppress(h)
		}
		out.Skip(rank, "namespaced", 1)
		return
	}
	parent, ok := m.Parent(rank, ev)
	if !ok {
		if rk.Suppressed(ev.Parent) {
			// Below an unindexed block: the whole subtree stays unindexed, removals suppressed.
			for _, h := range ev.BlockHashes {
				rk.Suppress(h)
			}
			out.Skip(rank, "partial_block", len(ev.BlockHashes))
		} else {
			out.Skip(rank, "unknown_parent", 1)
		}
		return
	}
	full := len(ev.BlockHashes)
	if len(ev.BlockTokens) < full {
		full = len(ev.BlockTokens)
	}
	namespaced := false
	for i := 0; i < full; i++ {
		if len(ev.BlockTokens[i]) != b.blockSize {
			full = i
			break
		}
		if (i < len(ev.BlockExtraIDs) && ev.BlockExtraIDs[i] != nil) || (i < len(ev.BlockMMKeys) && len(ev.BlockMMKeys[i]) > 0) {
			// token_extra_id or multimodal keys: the tokens alone are not the block's identity.
			full, namespaced = i, true
			break
		}
	}
	for _, h := range ev.BlockHashes[full:] {
		rk.Suppress(h)
	}
	if namespaced {
		out.Skip(rank, "namespaced", len(ev.BlockHashes)-full)
	} else {
		out.Skip(rank, "partial_block", len(ev.BlockHashes)-full)
	}
	if full == 0 {
		out.Applied(rank, "BlockStored")
		return
	}
	b.tokens = b.tokens[:0]
	for _, t := range ev.BlockTokens[:full] {
		b.tokens = append(b.tokens, t...)
	}
	keys, err := hashcore.RouterKeys(parent, b.tokens, b.blockSize, nil, b.keys[:0])
	if err != nil {
		out.Skip(rank, "hash_error", 1)
		return
	}
	b.keys = keys
	n := 0
	for i, h := range ev.BlockHashes[:full] {
		onGPU := i >= len(ev.CacheLevels) || ev.CacheLevels[i] == 0
		rk.Put(h, keys[i], onGPU)
		if onGPU {
			keys[n] = keys[i]
			n++
		}
	}
	if n > 0 {
		out.Store(rank, keys[:n])
	}
	out.Applied(rank, "BlockStored")
	out.Grew(rank)
}

// updated: only a cache-level change matters: 0 (GPU) is resident, anything else (host) is not.
func (b *routerBinder) updated(rank int, ev *engines.Event, rk *engines.RankKeys, out engines.BindOutput) {
	if len(ev.CacheLevels) == 0 || len(ev.BlockHashes) == 0 {
		out.Applied(rank, "BlockUpdated")
		return
	}
	h := ev.BlockHashes[0]
	e, ok := rk.Get(h)
	if !ok {
		if rk.Suppressed(h) {
			out.Skip(rank, "partial_block", 1)
		} else {
			out.Skip(rank, "unknown_block", 1)
		}
		return
	}
	onGPU := ev.CacheLevels[0] == 0
	if onGPU != e.GPU {
		e.GPU = onGPU
		rk.Set(h, e)
		b.keys = append(b.keys[:0], e.Key)
		if onGPU {
			out.Store(rank, b.keys)
		} else {
			out.Remove(rank, b.keys)
		}
	}
	out.Applied(rank, "BlockUpdated")
}
