package ingest

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/zeebo/xxh3"

	"github.com/kvexact/kvexact/engines"
)

// quietLogger silences zmq4's own stderr logging; the source logs through slog.
var quietLogger = log.New(io.Discard, "", 0)

// zmqSource is the source stage of a ZeroMQ family: one SUB (and one replay DEALER when
// configured) per data-parallel rank, connected to the engine's publishers.
type zmqSource struct {
	cfg    Config
	fam    engines.Family
	decode engines.Decoder
	p      atomic.Pointer[pipeline] // while Run runs: what Snapshot reads
}

func newZMQSource(cfg Config, fam engines.Family, decode engines.Decoder) *zmqSource {
	return &zmqSource{cfg: cfg, fam: fam, decode: decode}
}

// Run subscribes every rank and applies their events until ctx is done. The endpoint starts from an
// empty mirror (one OpClear with cause "start"): what the engine held before is learned from
// replay, or not at all.
func (z *zmqSource) Run(ctx context.Context, apply func(Update)) error {
	p := newPipeline(z.cfg, z.fam, apply)
	p.clear(0, "start")
	rrs := make([]*rankRun, len(z.cfg.Publish))
	for r := range z.cfg.Publish {
		rrs[r] = &rankRun{p: p, rank: r, pub: z.cfg.Publish[r], dec: decoder{decode: z.decode}}
		if r < len(z.cfg.Replay) {
			rrs[r].replay = z.cfg.Replay[r]
		}
	}
	if z.cfg.Snapshot != nil {
		seed(ctx, p, rrs, z.cfg.Snapshot)
	}
	z.p.Store(p)
	defer z.p.Store(nil)
	var wg sync.WaitGroup
	for _, rr := range rrs {
		wg.Go(func() { rr.run(ctx) })
	}
	wg.Wait()
	return nil
}

// rankRun is one rank's subscription: its socket, its sequence window, its decoder.
type rankRun struct {
	p      *pipeline
	rank   int
	pub    string
	replay string
	w      seqWindow
	dec    decoder
	// replayAny and replayTop: whether the last replay exchange returned a batch, and the highest
	// sequence among them.
	replayAny bool
	replayTop uint64
	// seeded: the window starts from a verified snapshot rather than empty; until the rank's first
	// replay completes it is held back like a fresh rank (Config.ReplayFirst).
	seeded bool
}

func (rr *rankRun) log() []any { return []any{"endpoint", rr.p.cfg.Endpoint, "rank", rr.rank} }

// run connects, replays, receives; on a dropped connection it closes the socket and dials a new
// one (with backoff), so one dropped connection never ends the stream.
func (rr *rankRun) run(ctx context.Context) {
	cfg := &rr.p.cfg
	backoff := cfg.DialBackoffMin
	connects := 0
	defer rr.p.lab.connected(rr.rank, false)
	for ctx.Err() == nil {
		sub, err := dialSub(ctx, rr.pub, cfg.DialBackoffMin, cfg.MaxMessageBytes)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			rr.p.trace(Trace{Type: "error", Rank: rr.rank, Addr: rr.pub, Reason: "dial", Detail: err.Error()})
			cfg.Logger.Debug("ingest: dial failed", append(rr.log(), "addr", rr.pub, "err", err)...)
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(backoff*2, cfg.DialBackoffMax)
			continue
		}
		backoff = cfg.DialBackoffMin
		connects++
		if connects > 1 {
			rr.p.lab.reconnect(rr.rank)
		}
		rr.p.lab.connected(rr.rank, true)
		rr.p.trace(Trace{Type: "connect", Rank: rr.rank, Addr: rr.pub, Count: connects})
		if connects > 1 && rr.replay == "" && cfg.ClearUnreplayed {
			rr.p.clear(rr.rank, "reconnect")
			rr.w.Reset()
		}
		cfg.Logger.Info("ingest: subscribed", append(rr.log(), "addr", rr.pub, "connects", connects)...)

		q := startReader(sub, cfg.QueueLimit, rr.p.lab.queue(rr.rank), cfg.Logger.With(rr.log()...),
			func(t Trace) { t.Rank = rr.rank; rr.p.trace(t) })
		err = rr.receive(ctx, q)
		sub.Close()
		q.drainAndWait(sub)
		rr.p.lab.connected(rr.rank, false)
		if ctx.Err() != nil {
			return
		}
		rr.oversize(rr.pub, err)
		rr.p.trace(Trace{Type: "disconnect", Rank: rr.rank, Addr: rr.pub, Detail: errString(err)})
		cfg.Logger.Warn("ingest: event connection lost, redialing", append(rr.log(), "err", err)...)
		if !sleepCtx(ctx, cfg.DialBackoffMin) {
			return
		}
	}
}

// oversize counts, traces and logs a connection closed because its peer announced a message over
// Config.MaxMessageBytes; other errors pass.
func (rr *rankRun) oversize(addr string, err error) {
	var se *zmq4.MessageSizeError
	if !errors.As(err, &se) {
		return
	}
	rr.p.lab.reject(rr.rank, reasonMessageSize)
	rr.p.trace(Trace{Type: "reject", Rank: rr.rank, Addr: addr, Reason: reasonMessageSize, Detail: se.Error()})
	rr.p.cfg.Logger.Warn("ingest: message over the size limit, connection closed",
		append(rr.log(), "addr", addr, "frame", se.Frame, "announced", se.Size, "total", se.Total, "max", se.Max)...)
}

// reasonMessageSize is the reject reason of a message over Config.MaxMessageBytes.
const reasonMessageSize = "message_size"

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// receive asks for replay (when configured) and then handles live messages until the connection
// drops or ctx is done.
func (rr *rankRun) receive(ctx context.Context, q *msgQueue) error {
	if rr.replay != "" {
		last, had := rr.w.last, rr.w.has
		ok, cleared := rr.resync(ctx, rr.w.ResumeFrom())
		if !ok && (!had || rr.seeded) && rr.p.cfg.ReplayFirst {
			return errFirstReplay
		}
		rr.seeded = rr.seeded && !ok
		if ok && !cleared && had && rr.p.cfg.ClearUnreplayed && (!rr.replayAny || rr.replayTop < last) {
			// The publisher no longer holds the last message it sent this rank: it restarted
			// while the subscription was down (and maybe wiped its cache without a word), and
			// its next live message may be far off.
			rr.p.lab.gap(rr.rank, "cleared")
			rr.p.trace(Trace{Type: "gap", Rank: rr.rank, Reason: "cleared", Detail: "publisher_restart"})
			rr.p.clear(rr.rank, "publisher_restart")
			rr.w.Reset()
		}
	}
	for {
		msg, err := q.next(ctx)
		if err != nil {
			return err
		}
		if seq, payload, ok := rr.liveFrame(msg); ok {
			rr.live(ctx, seq, payload)
		}
	}
}

// live takes one live message through the window, the decoder and the binder. A regression or
// restart with a replay address first clears, then asks for replay from 0 (the restarted
// publisher's whole buffer), then judges the message again against the replayed state: it is
// normally one of the replayed ones and is dropped as a duplicate.
func (rr *rankRun) live(ctx context.Context, seq uint64, payload []byte) {
	digest := maphash.Bytes(rr.p.seed, payload)
	v, missing := rr.w.Check(seq, digest, false)
	if rr.replay != "" && (v == Regression || v == Restart) {
		rr.p.lab.gap(rr.rank, "cleared")
		rr.p.trace(Trace{Type: "gap", Rank: rr.rank, Seq: seq, HasSeq: true, Reason: "cleared", Detail: v.String()})
		rr.p.clear(rr.rank, v.String())
		rr.w.Reset()
		rr.resync(ctx, 0)
		v, missing = rr.w.Check(seq, digest, false)
	}
	if rr.replay != "" && rr.p.cfg.ReplayGaps && (v == GapKept || v == GapCleared) {
		// Messages were lost on the wire (a PUB high-water mark, a slow subscriber): their stores
		// and evictions are in the publisher's replay buffer. Ask for them before this message is
		// applied, so no block the engine evicted meanwhile stays as a stale key, and none it
		// stored is missed; then judge the message again. If the buffer no longer has them the
		// gap stands and is kept or cleared as before.
		rr.p.lab.gap(rr.rank, "replayed")
		rr.p.trace(Trace{Type: "gap", Rank: rr.rank, Seq: seq, HasSeq: true, Missing: missing, Reason: "replayed"})
		rr.resync(ctx, rr.w.last+1)
		v, missing = rr.w.Check(seq, digest, false)
	}
	if rr.p.admit(rr.rank, &rr.w, seq, digest, v, missing, false) {
		rr.apply(seq, payload)
	}
}

// apply decodes an admitted message and binds its batch.
func (rr *rankRun) apply(seq uint64, payload []byte) {
	if b, ok := rr.dec.run(rr.p, rr.rank, seq, payload); ok {
		rr.p.batch(rr.rank, seq, xxh3.Hash(payload), b)
	}
}

// errFirstReplay closes a connection whose first replay failed (Config.ReplayFirst).
var errFirstReplay = errors.New("first replay failed: redialing before applying live messages")

// errRestart aborts a replay whose overlap shows the publisher restarted.
var errRestart = errors.New("replay overlap differs from applied messages: publisher restarted")

// resync asks the rank's replay socket for every buffered batch from start and applies them,
// de-duplicated by sequence against what was applied. If the overlap shows a restarted publisher
// it clears and asks again from 0, once. Failures are counted and fail open (live continues) unless
// Config.ReplayFirst holds a fresh rank back. ok says the exchange completed, cleared that it
// cleared on the way.
func (rr *rankRun) resync(ctx context.Context, start uint64) (ok, cleared bool) {
	for attempt := 0; attempt < 2; attempt++ {
		n, err := rr.replayOnce(ctx, start)
		if errors.Is(err, errRestart) && attempt == 0 {
			rr.p.lab.gap(rr.rank, "cleared")
			rr.p.trace(Trace{Type: "gap", Rank: rr.rank, Reason: "cleared", Detail: "restart"})
			rr.p.clear(rr.rank, "restart")
			rr.w.Reset()
			start, cleared = 0, true
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return false, cleared
			}
			rr.oversize(rr.replay, err)
			rr.p.lab.replay(rr.rank, "failed")
			rr.p.trace(Trace{Type: "replay", Rank: rr.rank, Reason: "failed", Count: n, Seq: start, HasSeq: true,
				Addr: rr.replay, Detail: err.Error()})
			rr.p.cfg.Logger.Warn("ingest: replay failed", append(rr.log(), "err", err)...)
			return false, cleared
		}
		rr.p.lab.replay(rr.rank, "completed")
		rr.p.trace(Trace{Type: "replay", Rank: rr.rank, Reason: "completed", Count: n, Seq: start, HasSeq: true,
			Addr: rr.replay})
		return true, cleared
	}
	return false, cleared
}

// replayOnce runs one DEALER exchange: send ["", start], apply replies until the end marker.
func (rr *rankRun) replayOnce(ctx context.Context, start uint64) (int, error) {
	rr.p.lab.replay(rr.rank, "requested")
	rr.p.trace(Trace{Type: "replay", Rank: rr.rank, Reason: "requested", Seq: start, HasSeq: true, Addr: rr.replay})
	rctx, cancel := context.WithTimeout(ctx, rr.p.cfg.ReplayTimeout)
	defer cancel()
	d := zmq4.NewDealer(rctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(rr.p.cfg.ReplayTimeout),
		zmq4.WithLogger(quietLogger), zmq4.WithMaxMessageSize(rr.p.cfg.MaxMessageBytes))
	defer drainClosed(d)
	if err := d.Dial(rr.replay); err != nil {
		return 0, fmt.Errorf("replay dial %s: %w", rr.replay, err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(engines.ReplayRequest(start)...)); err != nil {
		return 0, fmt.Errorf("replay request to %s: %w", rr.replay, err)
	}
	n := 0
	rr.replayAny, rr.replayTop = false, 0
	fresh := start == 0 && !rr.w.has
	for {
		msg, err := d.Recv()
		if err != nil {
			return n, fmt.Errorf("replay from %s after %d batches: %w", rr.replay, n, err)
		}
		seq, payload, end, ok := rr.replayFrame(msg)
		if !ok {
			continue
		}
		if end {
			return n, nil
		}
		n++
		if !rr.replayAny || seq > rr.replayTop {
			rr.replayAny, rr.replayTop = true, seq
		}
		if fresh && n == 1 && seq > 0 {
			// The publisher's buffer no longer holds its first batches: what they stored and the
			// engine still caches is invisible to this mirror (misses, never false hits).
			rr.p.lab.replay(rr.rank, "truncated")
			rr.p.trace(Trace{Type: "replay", Rank: rr.rank, Reason: "truncated", Seq: seq, HasSeq: true, Addr: rr.replay})
			rr.p.cfg.Logger.Warn("ingest: replay history truncated: blocks stored before the replay buffer's first batch are unknown until evicted or stored again",
				append(rr.log(), "first_seq", seq)...)
		}
		digest := maphash.Bytes(rr.p.seed, payload)
		v, missing := rr.w.Check(seq, digest, true)
		if v == Restart {
			return n, errRestart
		}
		if rr.p.admit(rr.rank, &rr.w, seq, digest, v, missing, true) {
			rr.apply(seq, payload)
		}
	}
}

// dialSub makes one SUB connected to addr and subscribed to every topic. It dials once (the caller
// owns the backoff); zmq4's own redial is off because a fresh socket per connection gives an exact
// "connected" moment for replay. A message over maxMsg bytes closes the connection.
func dialSub(ctx context.Context, addr string, timeout time.Duration, maxMsg int64) (zmq4.Socket, error) {
	sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(max(timeout, time.Second)),
		zmq4.WithLogger(quietLogger), zmq4.WithMaxMessageSize(maxMsg))
	if err := sub.Dial(addr); err != nil {
		drainClosed(sub)
		return nil, err
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		drainClosed(sub)
		return nil, fmt.Errorf("subscribe on %s: %w", addr, err)
	}
	return sub, nil
}

// drainClosed closes a socket and empties zmq4's internal receive queue: a connection reader blocked
// on a full queue would otherwise outlive the socket.
func drainClosed(s zmq4.Socket) {
	s.Close()
	for range 64 {
		if _, err := s.Recv(); err != nil {
			// Recv on a closed socket picks at random between "closed" and a queued message;
			// several "closed" answers in a row mean the queue is empty.
			continue
		}
	}
}
