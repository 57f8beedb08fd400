package gateway

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/exactness"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/ingest"
	"github.com/kvexact/kvexact/gateway/watch"
)

// DefaultResumeAfterBlocks is how many matching blocks the live parity watch must see after a
// restart before KV-exact resumes on the endpoint (Options.ResumeAfterBlocks).
const DefaultResumeAfterBlocks = 16

// restartCauses are the ingest clears that mean the engine's cache (and maybe its configuration)
// started anew: its sequence went backwards (a new process), or it announced a clear. A first
// connect ("start"), a sequence gap and an id-map overflow are the gateway's own bookkeeping.
var restartCauses = map[string]string{
	"regression": "the event sequence went backwards (the engine restarted)",
	"restart":    "the engine reused sequence numbers with other payloads (it restarted)",
	// ingest.Config.ClearUnreplayed: after a reconnect, the replay socket no longer held the last
	// message the gateway had applied.
	"publisher_restart": "after a reconnect the engine's replay socket no longer held the events it had sent (it restarted)",
}

// endpointWatch feeds one endpoint's decoded events to its exactness state: restart detection
// always, and the live parity watch where the rule runs the engine binding (w non-nil).
type endpointWatch struct {
	x         *endpointExact
	log       *slog.Logger
	blockSize int // the rule's: what every full block the engine publishes must hold

	mu sync.Mutex
	w  *watch.Watch

	proc      processIdentity
	reconnect func() // on every reconnect after the first: re-check the process identity
	stopWait  func() // ends the last reconnect's identity wait (nil: none running)
	verify    func() // after a restart: send the verification probes (nil: none can be sent)
	// drop empties the endpoint's inventory at once when a new process is seen before its events
	// (the process identity, /version): the old process's blocks are gone with it, and predicting
	// on them until the new process's first event would give false hits.
	drop func()

	// history marks the ranks still in their first connect's replay: what it holds happened before
	// the gateway was there (a certification's cache clear), so it restarts nothing.
	history   map[int]bool
	seenRanks map[int]bool // ranks whose replay was asked for before

	// clearedAt is when the event stream last cleared the inventory on a new publisher's sign (a
	// restart cause, or a reconnect without replay: nothing of the connection before is applied
	// after it); restartedAt when such a clear last raised the restart evidence. A new process
	// seen on the identity (newProcess) that started before them was already seen on the stream.
	clearedAt, restartedAt time.Time
}

// newEndpointWatch builds the endpoint's watch; hasher is the rule's engine binding (nil for the
// router binding, where only restarts are detected).
func (g *Gateway) newEndpointWatch(x *endpointExact, family string, blockSize int, hasher *hashcore.Hasher, tagged bool) (*endpointWatch, error) {
	ew := &endpointWatch{x: x, log: g.log.With("rule", x.rule, "endpoint", x.name), blockSize: blockSize}
	ew.reconnect = func() {
		go g.awaitProcess(g.ctx, ew)
	}
	ew.verify = func() {
		g.adm.restarted(x.rule, x.name, x.now())
		if g.lproofs.restarted(x.rule, x.name) {
			// The router stops counting the old process's adapter proofs now; the next discovery
			// round probes them again.
			go func() {
				if err := g.reevaluate(x.rule); err != nil {
					g.log.Error("gateway: rule could not be re-evaluated after an engine restart dropped its adapter proofs", "rule", x.rule, "err", err)
				}
			}()
		}
		g.startVerifyProbes(x)
	}
	if hasher != nil {
		w, err := watch.New(watch.Config{Hasher: hasher, Family: family, TaggedExtraKeys: tagged, CheckFirst: g.opts.ParityCheckFirst, SampleEvery: g.opts.ParitySampleEvery})
		if err != nil {
			return nil, err
		}
		ew.w = w
	}
	return ew, nil
}

// trace is the ingest source's Trace hook. It runs on the ingest path: cheap unless an event is
// checked (the watch samples).
func (ew *endpointWatch) trace(t ingest.Trace) {
	switch t.Type {
	case "connect":
		ew.reset()
		if t.Count > 1 && ew.reconnect != nil {
			ew.reconnect()
		}
	case "replay":
		if t.Reason == "requested" {
			ew.setHistory(t.Rank, !ew.connected(t.Rank))
		} else {
			ew.setHistory(t.Rank, false)
		}
	case "clear":
		ew.reset()
		why, ok := restartCauses[t.Reason]
		restart := ok && !ew.inHistory(t.Rank)
		if ok || t.Reason == "reconnect" {
			ew.streamCleared(t.Wall, restart)
		}
		if restart {
			ew.restarted(why)
		}
	case "event":
		if t.Event == nil {
			return
		}
		if t.Event.Kind == engines.AllBlocksCleared {
			ew.reset()
			if !ew.inHistory(t.Rank) {
				ew.restarted("the engine cleared its cache")
			}
			return
		}
		if t.Event.Kind == engines.BlockStored {
			ew.checkGeometry(t.Event)
			if ew.w != nil {
				ew.check(t.Event)
			}
		}
	}
}

// connected reports (and records) that a rank has been live before: only a rank's first replay is
// history.
func (ew *endpointWatch) connected(rank int) bool {
	ew.mu.Lock()
	defer ew.mu.Unlock()
	if ew.seenRanks == nil {
		ew.seenRanks = map[int]bool{}
	}
	was := ew.seenRanks[rank]
	ew.seenRanks[rank] = true
	return was
}

func (ew *endpointWatch) setHistory(rank int, on bool) {
	ew.mu.Lock()
	defer ew.mu.Unlock()
	if ew.history == nil {
		ew.history = map[int]bool{}
	}
	ew.history[rank] = on
}

func (ew *endpointWatch) inHistory(rank int) bool {
	ew.mu.Lock()
	defer ew.mu.Unlock()
	return ew.history[rank]
}

// streamCleared records a clear of the event stream on a new publisher's sign, at (zero: now);
// restart says it raised the restart evidence.
func (ew *endpointWatch) streamCleared(at time.Time, restart bool) {
	if at.IsZero() {
		at = time.Now()
	}
	ew.mu.Lock()
	defer ew.mu.Unlock()
	ew.clearedAt = at
	if restart {
		ew.restartedAt = at
	}
}

// seenOnStream says, for a process that started at start (Unix seconds, the engine's clock; 0 not
// known), whether the event stream cleared the inventory on a new publisher's sign since, and
// whether that clear raised the restart evidence: then the inventory holds nothing of an older
// process, and the restart's verification is already this process's.
func (ew *endpointWatch) seenOnStream(start float64) (cleared, restarted bool) {
	if start <= 0 {
		return false, false
	}
	ew.mu.Lock()
	defer ew.mu.Unlock()
	after := func(t time.Time) bool { return !t.IsZero() && float64(t.UnixMicro())/1e6 >= start }
	return after(ew.clearedAt), after(ew.restartedAt)
}

func (ew *endpointWatch) reset() {
	if ew.w == nil {
		return
	}
	ew.mu.Lock()
	ew.w.Reset()
	ew.mu.Unlock()
}

// restarted is a restart's evidence: the endpoint is unverified until its new process is, and
// the verification probes start (the evidence for the template and tokenizer legs).
func (ew *endpointWatch) restarted(why string) {
	x := ew.x
	x.mu.Lock()
	x.restarts++
	x.applyLocked(exactness.Evidence{Type: exactness.Restarted, Detail: why})
	x.mu.Unlock()
	if ew.verify != nil {
		ew.verify()
	}
}

// checkGeometry compares the block size a stored event shows with the rule's: the event's own
// block_size where the engine sends one, else its per-block token lists (TensorRT-LLM), where a
// block longer than the rule's, or a short one before the last, means another tokens_per_block.
// The router binding would otherwise drop every such block as partial and see nothing, silently.
func (ew *endpointWatch) checkGeometry(ev *engines.Event) {
	bs := ew.blockSize
	if bs <= 0 || ev.Bigram || ev.SlidingWin > 0 || ev.HasGroupIdx && ev.GroupIdx != 0 {
		return // not the full-attention geometry the rule's block_size names
	}
	seen := 0
	switch {
	case ev.BlockSize > 0 && ev.BlockSize != bs:
		seen = ev.BlockSize
	default:
		for i, b := range ev.BlockTokens {
			if len(b) > bs || len(b) < bs && i < len(ev.BlockTokens)-1 {
				seen = len(b)
				break
			}
		}
	}
	if seen == 0 {
		return
	}
	ew.x.apply(exactness.Evidence{Type: exactness.GeometryMismatched,
		Detail: fmt.Sprintf("the engine publishes blocks of %d tokens, the rule's block_size is %d (the engine's tokens_per_block or block size changed; set the rule's block_size to the engine's and re-certify, or restart the engine with %d)", seen, bs, bs)})
}

func (ew *endpointWatch) check(ev *engines.Event) {
	ew.mu.Lock()
	o := ew.w.Event(ev)
	ew.mu.Unlock()
	if o.Checked == 0 && o.Unchecked == 0 {
		return
	}
	x := ew.x
	x.mu.Lock()
	defer x.mu.Unlock()
	x.parity.CheckedBlocks += uint64(o.Checked)
	x.parity.MatchedBlocks += uint64(o.Matched)
	x.parity.UncheckedBlock += uint64(o.Unchecked)
	if o.Checked > 0 {
		x.parity.LastCheck = x.now()
	}
	if o.Mismatch != nil {
		x.parity.Mismatches++
		x.parity.LastMismatch = o.Mismatch.Error()
		x.applyLocked(exactness.Evidence{Type: exactness.ParityMismatched, Detail: fmt.Sprintf("the engine's published block keys do not match the rule's binding (%s leg): %s", o.Mismatch.Leg, o.Mismatch.Detail)})
		return
	}
	if o.Matched > 0 {
		x.applyLocked(exactness.Evidence{Type: exactness.ParityMatched, Blocks: o.Matched})
	}
}
