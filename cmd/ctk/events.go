package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/ingest"
	"github.com/kvexact/kvexact/gateway/inventory"
)

func init() {
	register("events tail", "print one endpoint's decoded KV-cache events as JSON lines (ZeroMQ or "+drainedEngines+" drain)",
		func(args []string) int {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return eventsTail(ctx, args, os.Stdout, os.Stderr)
		})
}

// repeated is a flag that may be given several times, in order (one per data-parallel rank).
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

var eventsTailUsage = `usage: ctk events tail --family F [--release R] (--zmq ADDR [--replay ADDR])... [--binding engine|router] [--block-size N]
       ctk events tail --family ` + drainedFamilies + ` [--release R] --drain BASE_URL --block-size N
       [--duration D] [--inventory]

Connects (never binds) to one endpoint's event stream: --zmq (and --replay) once per data-parallel
rank, in rank order; --drain is a ` + drainedEngines + ` server's base URL (its /kv_cache_events is drained:
nothing else may poll it meanwhile). Subscribes to every topic, asks for replay from sequence 0 on
connect, and prints every decoded event, gap, reject, replay and queue-drop notice as one JSON line. With
--duration it stops after D (exit 0); with --inventory its last line is the resulting inventory.
`

// eventsTail is "ctk events tail": exit 0 when it ran (for --duration, or until interrupted), 2 for
// bad arguments (the message names the flag), 1 when the source could not run.
func eventsTail(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ctk events tail", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var zmqs, replays repeated
	family := fs.String("family", "", "engine family: "+eventFamilies)
	release := fs.String("release", "", "engine release as tagged (v0.25.1, v0.5.18, 1.2)")
	fs.Var(&zmqs, "zmq", "publisher address of one rank (repeat per rank, in rank order)")
	fs.Var(&replays, "replay", "replay address of one rank (repeat per rank, in rank order)")
	drain := fs.String("drain", "", drainedEngines+" server base URL")
	blockSize := fs.Int("block-size", 0, "tokens per block (router binding, "+drainedFamilies+")")
	binding := fs.String("binding", "", "engine (default for "+publishedFamilies+") or router")
	duration := fs.Duration("duration", 0, "stop after this long (e.g. 14s); 0 runs until interrupted")
	withInv := fs.Bool("inventory", false, "print the resulting inventory as the last line")
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "ctk events tail: "+format+"\n\n%s", append(a, eventsTailUsage)...)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, eventsTailUsage)
			return 2
		}
		return bad("%v", err)
	}
	switch {
	case fs.NArg() > 0:
		return bad("unexpected argument %q", fs.Arg(0))
	case *family == "":
		return bad("--family is required (%s)", eventFamilies)
	case len(zmqs) > 0 && *drain != "":
		return bad("--zmq and --drain exclude each other")
	case len(zmqs) == 0 && *drain == "":
		return bad("give --zmq ADDR (once per rank) or --drain BASE_URL")
	case len(replays) > 0 && len(replays) != len(zmqs):
		return bad("--replay given %d times for %d --zmq ranks: give it once per rank, in rank order", len(replays), len(zmqs))
	case *drain != "" && *blockSize <= 0:
		return bad("--block-size N (the engine's tokens_per_block) is required with --drain")
	case *duration < 0:
		return bad("--duration must not be negative, got %v", *duration)
	}
	cfg := ingest.Config{
		Rule: "ctk", Endpoint: "endpoint",
		Family: *family, Release: *release, Binding: ingest.Binding(*binding), BlockSize: *blockSize,
		Publish: zmqs, Replay: replays, DrainURL: *drain,
	}
	out := &jsonLines{w: stdout}
	cfg.Trace = func(t ingest.Trace) { out.write(traceLine(t)) }
	src, err := ingest.New(cfg)
	if err != nil {
		msg := err.Error()
		for _, f := range []struct{ field, flag string }{
			{"family", "--family"}, {"release", "--release"}, {"binding", "--binding"},
			{"block_size", "--block-size"}, {"drain_url", "--drain"}, {"publish", "--zmq"}, {"replay", "--replay"},
		} {
			if strings.Contains(msg, ": "+f.field) {
				msg = strings.Replace(msg, ": "+f.field, ": "+f.flag+" ("+f.field+")", 1)
				break
			}
		}
		return bad("%s", msg)
	}

	idx := inventory.New(inventory.Config{})
	ep, err := idx.AddEndpoint("endpoint")
	if err != nil {
		fmt.Fprintf(stderr, "ctk events tail: %v\n", err)
		return 1
	}
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	if err := src.Run(ctx, ingest.Into(idx, ep, nil, "ctk", "endpoint", nil)); err != nil {
		fmt.Fprintf(stderr, "ctk events tail: %v\n", err)
		return 1
	}
	if *withInv {
		snap := idx.Snapshot(ep)
		inv := inventoryLine{Type: "inventory", Blocks: len(snap), Keys: make([]keyCount, len(snap))}
		for i, kc := range snap {
			inv.Keys[i] = keyCount{Key: kc.Key, Count: kc.Count}
		}
		out.write(inv)
	}
	return 0
}

// jsonLines serializes JSON lines from the source's goroutines (one per rank).
type jsonLines struct {
	mu sync.Mutex
	w  io.Writer
}

func (j *jsonLines) write(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"type": "error", "detail": err.Error()})
	}
	j.mu.Lock()
	j.w.Write(append(b, '\n'))
	j.mu.Unlock()
}

// inventoryLine is the last line with --inventory: the endpoint's resident keys (all ranks
// together) as unsigned 64-bit decimal numbers, sorted, with their copy counts.
type inventoryLine struct {
	Type   string     `json:"type"`
	Blocks int        `json:"blocks"`
	Keys   []keyCount `json:"keys"`
}

type keyCount struct {
	Key   uint64 `json:"key"`
	Count int    `json:"count"`
}

// eventLine is one trace as printed: the notice fields, and for events the decoded event.
type eventLine struct {
	Type    string  `json:"type"`
	Rank    int     `json:"rank"`
	Seq     *uint64 `json:"seq,omitempty"`
	Reason  string  `json:"reason,omitempty"`
	Missing uint64  `json:"missing,omitempty"`
	Count   int     `json:"count,omitempty"`
	Detail  string  `json:"detail,omitempty"`
	Addr    string  `json:"addr,omitempty"`
	Wall    string  `json:"wall"`
	BatchTS float64 `json:"batch_ts,omitempty"`

	Kind        string   `json:"kind,omitempty"`
	BlockHashes []uint64 `json:"block_hashes,omitempty"`
	Parent      *uint64  `json:"parent,omitempty"`
	TokenIDs    []uint32 `json:"token_ids,omitempty"`
	BlockTokenN []int    `json:"block_token_counts,omitempty"`
	BlockSize   int      `json:"block_size,omitempty"`
	Bigram      bool     `json:"bigram,omitempty"`
	Medium      string   `json:"medium,omitempty"`
	LoRAName    string   `json:"lora_name,omitempty"`
	LoRAID      *int64   `json:"lora_id,omitempty"`
	ExtraKeys   [][]any  `json:"extra_keys,omitempty"`
	GroupIdx    *int     `json:"group_idx,omitempty"`
	SpecKind    string   `json:"kv_cache_spec_kind,omitempty"`
	SlidingWin  int      `json:"sliding_window,omitempty"`
	CacheSalt   string   `json:"cache_salt,omitempty"`
	WindowSize  *int     `json:"window_size,omitempty"`
	DPRank      *int     `json:"attention_dp_rank,omitempty"`
	CacheLevels []int    `json:"cache_levels,omitempty"`
	NumBlocks   []int    `json:"num_blocks_per_cache_level,omitempty"`
}

func traceLine(t ingest.Trace) eventLine {
	l := eventLine{Type: t.Type, Rank: t.Rank, Reason: t.Reason, Missing: t.Missing, Count: t.Count,
		Detail: t.Detail, Addr: t.Addr, Wall: t.Wall.UTC().Format(time.RFC3339Nano)}
	if t.HasSeq {
		seq := t.Seq
		l.Seq = &seq
	}
	if t.HasBatch {
		l.BatchTS = t.BatchTS
	}
	ev := t.Event
	if ev == nil {
		return l
	}
	// Printed (marshalled) before the trace call returns, so the event's reused slices are safe.
	l.Kind = ev.Kind.String()
	l.BlockHashes = ev.BlockHashes
	if ev.HasParent {
		p := ev.Parent
		l.Parent = &p
	}
	l.TokenIDs = ev.TokenIDs
	if ev.Kind == engines.BlockStored {
		// Tokens per block: shows TensorRT-LLM's partial blocks (not indexed).
		for _, bt := range ev.BlockTokens {
			l.BlockTokenN = append(l.BlockTokenN, len(bt))
		}
	}
	l.BlockSize, l.Bigram, l.Medium, l.LoRAName = ev.BlockSize, ev.Bigram, ev.Medium, ev.LoRAName
	if ev.HasLoRAID {
		id := ev.LoRAID
		l.LoRAID = &id
	}
	l.ExtraKeys = ev.ExtraKeys
	if ev.HasGroupIdx {
		g := ev.GroupIdx
		l.GroupIdx = &g
	}
	l.SpecKind, l.SlidingWin, l.CacheSalt = ev.SpecKind, ev.SlidingWin, ev.CacheSalt
	if ev.HasWindowSize {
		w := ev.WindowSize
		l.WindowSize = &w
	}
	if ev.HasDPRank {
		r := ev.DPRank
		l.DPRank = &r
	}
	l.CacheLevels, l.NumBlocks = ev.CacheLevels, ev.NumBlocks
	return l
}
