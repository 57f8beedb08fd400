// Package ingest owns the event pipeline: it turns one endpoint's KV-cache event stream into
// inventory updates, the same way for every engine family. An event passes, top to bottom:
//
//	source    zmq.go (one SUB per data-parallel rank, replay DEALER) or drain.go (HTTP drain poller)
//	queue     queue.go (bounded hand-off from the socket reader; full: drop, count)
//	frames    frames.go (multipart layout → sequence, payload)
//	window    window.go (64-message sequence window, checked once per message)
//	decode    decode.go (the family's payload decoder, the rank check)
//	bind      bind.go, residency.go (engine keys as published, or the family's router binder)
//	inventory inventory.go (Into: the inventory update and the blocks gauge)
//
// pipeline.go holds the per-endpoint state the stages share; source.go validates a Config and
// picks the source; snapshot.go and seed.go are an endpoint's snapshot and a source's start from a
// peer's, checked against the engine's replay. What differs between families (transport, decoder, binding rules, router
// binder, residency rule, drain) comes from the family's engines.Events facet through
// engines/registry, so this package names no family. docs/ingest.md states every rule and why.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/kvgroups"
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
	Cause string // for OpClear: start, engine, created, gap, reconnect, publisher_restart, regression, restart, map_overflow
	// Tier is the cache level a store or remove is about (TierGPU unless Config.Tiers); a clear
	// is every tier's.
	Tier engines.Tier
}

// Binding says which keys the inventory holds.
type Binding string

const (
	// BindingEngine: the engine's own 64-bit block ids, as published.
	BindingEngine Binding = engines.BindingEngine
	// BindingRouter: the gateway's kvexact-xxh3-v1 keys, rehashed from the tokens in each event.
	BindingRouter Binding = engines.BindingRouter
)

// DefaultMaxMessageBytes is Config.MaxMessageBytes's default: the drain's response bound, far above
// any engine's event batch.
const DefaultMaxMessageBytes = 64 << 20

// DefaultQueueLimit is Config.QueueLimit's default.
const DefaultQueueLimit = 10_000

// Window is the sequence tolerance of the reference gateway: up to this many missing messages keep
// the inventory, more clear it.
const Window = 64

// Config describes one endpoint's event stream. Zero durations take the defaults noted.
type Config struct {
	Rule     string // metric label
	Endpoint string // metric label and log field

	Family  string // the engine family (engines/registry); it supplies decoder, binding rules, drain
	Release string // as the engine tags it; selects the wire decoder

	Binding   Binding // engine or router; empty takes the family's default
	BlockSize int     // tokens per block: required for the router binding

	// ZeroMQ, one entry per data-parallel rank in rank order. Replay may be empty (no replay) or
	// hold one address per rank ("" for a rank without replay).
	Publish []string
	Replay  []string
	// ReplayGaps asks a rank's replay socket for the messages of a live sequence gap before the
	// message after it is applied (the gateway: no stale block from a lost eviction, no lost
	// store). Off, a gap is judged by the window alone — what ctk wants, since it certifies that
	// the publisher loses nothing.
	ReplayGaps bool
	// ClearUnreplayed clears the endpoint where the sequence shows messages lost that no replay
	// recovered, instead of keeping the inventory through a gap of up to Window: a gap with no
	// replay socket (or whose replay failed or no longer had the messages) clears (cause gap), and
	// so does every reconnect of a rank without a replay socket (cause reconnect: what the
	// publisher did while disconnected is unknown; a restarted publisher that wiped its cache
	// says nothing until its next step), and so does a reconnect whose replay no longer holds the
	// last message applied (cause publisher_restart: the publisher restarted meanwhile). Lost
	// evictions then never leave stale keys; the mirror
	// is rebuilt from the next message on. The gateway sets it; ctk does not, since it certifies
	// that the publisher loses nothing.
	ClearUnreplayed bool
	// ReplayFirst makes a rank with a replay address apply no live message before its first replay
	// completed: when that replay fails the connection is closed and redialed, and the replay asked
	// again, so the inventory is never built from the live stream alone (a replica started after
	// the engine would miss everything stored before). Off, a failed replay fails open: live
	// continues.
	ReplayFirst bool

	// Snapshot, when set, is asked once as the source starts for a peer replica's snapshot of the
	// endpoint (seed.go): loaded only if every rank's replay shows the engine's stream continues
	// from the snapshot's sequences, else discarded and the endpoint rebuilt from replay. Either
	// way each rank is synchronized only by its own completed replay. ZeroMQ families only.
	Snapshot func(context.Context) (*Snapshot, error)

	// HTTP drain families: the server's base URL; the family's drain names the path it polls.
	DrainURL string

	DialBackoffMin time.Duration // 100ms: first wait after a failed dial, doubled up to
	DialBackoffMax time.Duration // 5s
	ReplayTimeout  time.Duration // 15s for one whole replay exchange; fail-open after it
	PollMin        time.Duration // 5ms: drain poll interval after data, ×1.5 per empty answer up to
	PollMax        time.Duration // 20ms
	HTTPTimeout    time.Duration // 30s per drain request
	MaxDrainBytes  int64         // 64 MiB per drain response
	MaxMapped      int           // 4_000_000 engine-id → router-key entries per endpoint; beyond: clear
	// QueueLimit bounds each rank's queue between the socket and the pipeline: 10_000 messages
	// (the engines' default replay buffer, so a whole replay's worth of live traffic fits). A message
	// arriving at a full queue is dropped and counted (queue_full_total); the sequence window then
	// sees the gap and keeps or clears, as for a message lost on the wire.
	QueueLimit int
	// MaxMessageBytes bounds one ZeroMQ message (all its frames) on the SUB and the replay DEALER:
	// 64 MiB (DefaultMaxMessageBytes). A frame header announcing more is refused before zmq4
	// allocates it (the third_party/go-zeromq/zmq4 patch): the connection closes, is counted
	// (rejects_total{reason="message_size"}) and redialed, so a bad peer cannot exhaust memory.
	MaxMessageBytes int64

	// Groups receives the endpoint's KV-cache groups of kinds the inventory does not index
	// (sliding window, Mamba, chunked local) for the engine's hit rule (gateway/kvgroups), under
	// either binding. Nil: their events are skipped (skipped_total{reason="group_kind"}), as before
	// hybrid scoring.
	Groups *kvgroups.Endpoint

	// Tiers indexes the lower tiers' events (vLLM's offloading connector, SGLang HiCache): their
	// updates carry the tier (Update.Tier) for IntoTier to apply. False: every medium but the
	// GPU's is skipped (skipped_total{reason="medium"}).
	Tiers bool

	Metrics *Metrics     // optional
	Logger  *slog.Logger // optional
	Trace   func(Trace)  // optional: every decoded event and every notice (ctk events tail)
}

// Trace is one thing a source saw, for tools that show the stream (ctk events tail). Event is only
// valid during the call.
type Trace struct {
	Type     string // event, gap, duplicate, reject, skip, clear, replay, connect, disconnect, error, drop
	Rank     int
	Seq      uint64
	HasSeq   bool
	Event    *engines.Event
	Reason   string // reject/skip reason, gap decision (kept, cleared), replay outcome, clear cause, drop cause (queue_full)
	Missing  uint64 // gap: messages missing
	Count    int    // skip: events or blocks concerned; replay: batches received; drop: 1 when a run of drops starts, the run's total when it ends
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
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.MaxMapped <= 0 {
		c.MaxMapped = 4_000_000
	}
	if c.QueueLimit <= 0 {
		c.QueueLimit = DefaultQueueLimit
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
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
