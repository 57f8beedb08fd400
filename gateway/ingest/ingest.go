// Package ingest turns one endpoint's KV-cache event stream into inventory updates: a ZeroMQ
// subscriber (vLLM, SGLang; one SUB and one replay DEALER per data-parallel rank) or a TensorRT-LLM
// HTTP drain poller, the 64-event sequence window (small gap keeps, large gap or regression
// clears), replay on every connect de-duplicated by sequence, and the key binding (engine keys as
// published, or router keys rehashed from event tokens). docs/ingest.md states every rule and why.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kvexact/kvexact/engines"
)

// Op says what an Update does to the endpoint's inventory.
type Op uint8

const (
	// OpStore adds one stored copy of each key.
	OpStore Op = iota + 1
	// OpRemove drops one stored copy of each key.
	OpRemove
	// OpClear forgets everything the endpoint holds (all ranks together).
	OpClear
)

func (o Op) String() string {
	switch o {
	case OpStore:
		return "store"
	case OpRemove:
		return "remove"
	case OpClear:
		return "clear"
	}
	return "unknown"
}

// Update is one change to the endpoint's inventory. Keys is only valid during the apply call: the
// source reuses its buffer, so an apply function that keeps keys must copy them.
type Update struct {
	Rank  int
	Op    Op
	Keys  []uint64
	Cause string // for OpClear: start, engine, created, gap, regression, restart, map_overflow
}

// A Source turns one endpoint's event stream into inventory updates. Run blocks until ctx is done
// (then it returns nil) or the source cannot run at all (then it returns why). apply is called from
// one goroutine at a time, in stream order per rank.
type Source interface {
	Run(ctx context.Context, apply func(Update)) error
}

// Binding says which keys the inventory holds.
type Binding string

const (
	// BindingEngine: the engine's own 64-bit block ids, as published.
	BindingEngine Binding = "engine"
	// BindingRouter: the gateway's kvexact-xxh3-v1 keys, rehashed from the tokens in each event.
	BindingRouter Binding = "router"
)

// Window is the sequence tolerance of the reference gateway: up to this many missing messages keep
// the inventory, more clear it.
const Window = 64

// Config describes one endpoint's event stream. Zero durations take the defaults noted.
type Config struct {
	Rule     string // metric label
	Endpoint string // metric label and log field

	Family  string // vllm, sglang, trtllm (llamacpp has no events)
	Release string // as the engine tags it; selects the wire decoder

	Binding   Binding // engine (default for vllm and sglang) or router (always for trtllm)
	BlockSize int     // tokens per block: required for the router binding and for trtllm

	// ZeroMQ, one entry per data-parallel rank in rank order. Replay may be empty (no replay) or
	// hold one address per rank ("" for a rank without replay).
	Publish []string
	Replay  []string

	// TensorRT-LLM: the server's base URL; the source POSTs {DrainURL}/kv_cache_events.
	DrainURL string

	DialBackoffMin time.Duration // 100ms: first wait after a failed dial, doubled up to
	DialBackoffMax time.Duration // 5s
	ReplayTimeout  time.Duration // 15s for one whole replay exchange; fail-open after it
	PollMin        time.Duration // 5ms: drain poll interval after data, ×1.5 per empty answer up to
	PollMax        time.Duration // 20ms
	HTTPTimeout    time.Duration // 30s per drain request
	MaxDrainBytes  int64         // 64 MiB per drain response
	MaxMapped      int           // 4_000_000 engine-id → router-key entries per endpoint; beyond: clear

	Metrics *Metrics     // optional
	Logger  *slog.Logger // optional
	Trace   func(Trace)  // optional: every decoded event and every notice (ctk events tail)
}

// Trace is one thing a source saw, for tools that show the stream (ctk events tail). Event is only
// valid during the call.
type Trace struct {
	Type     string // event, gap, duplicate, reject, skip, clear, replay, connect, disconnect, error
	Rank     int
	Seq      uint64
	HasSeq   bool
	Event    *engines.Event
	Reason   string // reject/skip reason, gap decision (kept, cleared), replay outcome, clear cause
	Missing  uint64 // gap: messages missing
	Count    int    // skip: events or blocks concerned; replay: batches received
	Detail   string
	Addr     string
	Wall     time.Time
	BatchTS  float64
	HasBatch bool
}

// ErrConfig wraps every configuration error; the message names the field.
var ErrConfig = errors.New("ingest: bad config")

func cfgErr(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...))
}

func (c *Config) defaults() {
	if c.DialBackoffMin <= 0 {
		c.DialBackoffMin = 100 * time.Millisecond
	}
	if c.DialBackoffMax <= 0 {
		c.DialBackoffMax = 5 * time.Second
	}
	if c.DialBackoffMax < c.DialBackoffMin {
		c.DialBackoffMax = c.DialBackoffMin
	}
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = 15 * time.Second
	}
	if c.PollMin <= 0 {
		c.PollMin = 5 * time.Millisecond
	}
	if c.PollMax <= 0 {
		c.PollMax = 20 * time.Millisecond
	}
	if c.PollMax < c.PollMin {
		c.PollMax = c.PollMin
	}
	if c.HTTPTimeout <= 0 {
		c.HTTPTimeout = 30 * time.Second
	}
	if c.MaxDrainBytes <= 0 {
		c.MaxDrainBytes = 64 << 20
	}
	if c.MaxMapped <= 0 {
		c.MaxMapped = 4_000_000
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// New validates cfg and returns the family's source: a ZeroMQ subscriber for vllm and sglang, the
// HTTP drain poller for trtllm.
func New(cfg Config) (Source, error) {
	cfg.defaults()
	decode, err := decoderFor(cfg.Family, cfg.Release)
	if err != nil {
		return nil, err
	}
	switch cfg.Family {
	case "trtllm":
		if cfg.Binding == "" {
			cfg.Binding = BindingRouter
		}
		if cfg.Binding != BindingRouter {
			return nil, cfgErr("binding", "trtllm events carry engine hashes that are not reproducible: only %q is allowed, got %q", BindingRouter, cfg.Binding)
		}
		if cfg.BlockSize <= 0 {
			return nil, cfgErr("block_size", "trtllm needs the engine's tokens_per_block (> 0), got %d", cfg.BlockSize)
		}
		if cfg.DrainURL == "" {
			return nil, cfgErr("drain_url", "trtllm needs the server's base URL")
		}
		if len(cfg.Publish) > 0 || len(cfg.Replay) > 0 {
			return nil, cfgErr("publish", "trtllm 1.2 has no ZeroMQ stream; use drain_url")
		}
		return newDrainSource(cfg)
	default:
		if cfg.Binding == "" {
			cfg.Binding = BindingEngine
		}
		if cfg.Binding != BindingEngine && cfg.Binding != BindingRouter {
			return nil, cfgErr("binding", "want %q or %q, got %q", BindingEngine, BindingRouter, cfg.Binding)
		}
		if cfg.Binding == BindingRouter && cfg.BlockSize <= 0 {
			return nil, cfgErr("block_size", "the router binding needs the rule's block size (> 0), got %d", cfg.BlockSize)
		}
		if cfg.DrainURL != "" {
			return nil, cfgErr("drain_url", "%s publishes over ZeroMQ; use publish", cfg.Family)
		}
		if len(cfg.Publish) == 0 {
			return nil, cfgErr("publish", "need one publish address per data-parallel rank")
		}
		for i, a := range cfg.Publish {
			if err := checkAddr(a); err != nil {
				return nil, cfgErr(fmt.Sprintf("publish[%d]", i), "%v", err)
			}
		}
		if len(cfg.Replay) != 0 && len(cfg.Replay) != len(cfg.Publish) {
			return nil, cfgErr("replay", "%d replay addresses for %d ranks: give one per rank (\"\" for none) or none", len(cfg.Replay), len(cfg.Publish))
		}
		for i, a := range cfg.Replay {
			if a == "" {
				continue
			}
			if err := checkAddr(a); err != nil {
				return nil, cfgErr(fmt.Sprintf("replay[%d]", i), "%v", err)
			}
		}
		return newZMQSource(cfg, decode), nil
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
