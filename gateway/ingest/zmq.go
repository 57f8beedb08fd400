package ingest

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvexact/kvexact/engines"
)

// zmqSource subscribes to one endpoint's ZeroMQ publishers, one SUB (and one replay DEALER when
// configured) per data-parallel rank.
type zmqSource struct {
	cfg    Config
	decode func(*engines.Batch, []byte) error
}

func newZMQSource(cfg Config, decode func(*engines.Batch, []byte) error) *zmqSource {
	return &zmqSource{cfg: cfg, decode: decode}
}

// Run subscribes every rank and applies their events until ctx is done. The endpoint starts from an
// empty mirror (one OpClear with cause "start"): what the engine held before is learned from
// replay, or not at all.
func (z *zmqSource) Run(ctx context.Context, apply func(Update)) error {
	s := newStream(z.cfg, apply)
	s.clear(0, "start")
	var wg sync.WaitGroup
	for r := range z.cfg.Publish {
		rr := &rankRun{z: z, s: s, rank: r, pub: z.cfg.Publish[r]}
		if r < len(z.cfg.Replay) {
			rr.replay = z.cfg.Replay[r]
		}
		wg.Go(func() { rr.run(ctx) })
	}
	wg.Wait()
	return nil
}

// rankRun is one rank's subscription: its socket, its sequence window, its decode buffer.
type rankRun struct {
	z      *zmqSource
	s      *stream
	rank   int
	pub    string
	replay string
	w      seqWindow
	batch  engines.Batch
}

func (rr *rankRun) log() []any { return []any{"endpoint", rr.s.cfg.Endpoint, "rank", rr.rank} }

// run connects, replays, receives; on a dropped connection it closes the socket and dials a new
// one (with backoff), so one dropped connection never ends the stream.
func (rr *rankRun) run(ctx context.Context) {
	cfg := &rr.s.cfg
	backoff := cfg.DialBackoffMin
	connects := 0
	defer rr.s.lab.connected(rr.rank, false)
	for ctx.Err() == nil {
		sub, err := dialSub(ctx, rr.pub, cfg.DialBackoffMin)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			rr.s.trace(Trace{Type: "error", Rank: rr.rank, Addr: rr.pub, Reason: "dial", Detail: err.Error()})
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
			rr.s.lab.reconnect(rr.rank)
		}
		rr.s.lab.connected(rr.rank, true)
		rr.s.trace(Trace{Type: "connect", Rank: rr.rank, Addr: rr.pub, Count: connects})
		cfg.Logger.Info("ingest: subscribed", append(rr.log(), "addr", rr.pub, "connects", connects)...)

		q := startReader(sub)
		err = rr.receive(ctx, q)
		sub.Close()
		q.drainAndWait(sub)
		rr.s.lab.connected(rr.rank, false)
		if ctx.Err() != nil {
			return
		}
		rr.s.trace(Trace{Type: "disconnect", Rank: rr.rank, Addr: rr.pub, Detail: errString(err)})
		cfg.Logger.Info("ingest: connection lost, redialing", append(rr.log(), "err", err)...)
		if !sleepCtx(ctx, cfg.DialBackoffMin) {
			return
		}
	}
}

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
		rr.resync(ctx, rr.w.ResumeFrom())
	}
	for {
		msg, err := q.next(ctx)
		if err != nil {
			return err
		}
		_, seq, payload, err := engines.ParseFrames(msg.Frames)
		if err != nil {
			rr.s.reject(rr.rank, 0, false, err)
			continue
		}
		rr.live(ctx, seq, payload)
	}
}

// live handles one live message. A regression or restart with a replay address first clears,
// then asks for replay from 0 (the restarted publisher's whole buffer), then handles the message
// again: it is normally one of the replayed ones and is dropped as a duplicate.
func (rr *rankRun) live(ctx context.Context, seq uint64, payload []byte) {
	digest := maphash.Bytes(rr.s.seed, payload)
	if rr.replay != "" {
		if v, _ := rr.w.Check(seq, digest, false); v == Regression || v == Restart {
			rr.s.lab.gap(rr.rank, "cleared")
			rr.s.trace(Trace{Type: "gap", Rank: rr.rank, Seq: seq, HasSeq: true, Reason: "cleared", Detail: v.String()})
			rr.s.clear(rr.rank, v.String())
			rr.w.Reset()
			rr.resync(ctx, 0)
		}
	}
	if _, ok := rr.s.sequence(rr.rank, &rr.w, seq, digest, false); !ok {
		return
	}
	rr.apply(seq, payload)
}

func (rr *rankRun) apply(seq uint64, payload []byte) {
	if err := rr.z.decode(&rr.batch, payload); err != nil {
		rr.s.reject(rr.rank, seq, true, err)
		return
	}
	rr.s.batch(rr.rank, seq, &rr.batch)
}

// errRestart aborts a replay whose overlap shows the publisher restarted.
var errRestart = errors.New("replay overlap differs from applied messages: publisher restarted")

// resync asks the rank's replay socket for every buffered batch from start and applies them,
// de-duplicated by sequence against what was applied. If the overlap shows a restarted publisher
// it clears and asks again from 0, once. Failures are counted and fail open (live continues).
func (rr *rankRun) resync(ctx context.Context, start uint64) {
	for attempt := 0; attempt < 2; attempt++ {
		n, err := rr.replayOnce(ctx, start)
		if errors.Is(err, errRestart) && attempt == 0 {
			rr.s.lab.gap(rr.rank, "cleared")
			rr.s.trace(Trace{Type: "gap", Rank: rr.rank, Reason: "cleared", Detail: "restart"})
			rr.s.clear(rr.rank, "restart")
			rr.w.Reset()
			start = 0
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			rr.s.lab.replay(rr.rank, "failed")
			rr.s.trace(Trace{Type: "replay", Rank: rr.rank, Reason: "failed", Count: n, Seq: start, HasSeq: true,
				Addr: rr.replay, Detail: err.Error()})
			rr.s.cfg.Logger.Warn("ingest: replay failed, continuing live", append(rr.log(), "err", err)...)
			return
		}
		rr.s.lab.replay(rr.rank, "completed")
		rr.s.trace(Trace{Type: "replay", Rank: rr.rank, Reason: "completed", Count: n, Seq: start, HasSeq: true,
			Addr: rr.replay})
		return
	}
}

// replayOnce runs one DEALER exchange: send ["", start], apply replies until the end marker.
func (rr *rankRun) replayOnce(ctx context.Context, start uint64) (int, error) {
	rr.s.lab.replay(rr.rank, "requested")
	rr.s.trace(Trace{Type: "replay", Rank: rr.rank, Reason: "requested", Seq: start, HasSeq: true, Addr: rr.replay})
	rctx, cancel := context.WithTimeout(ctx, rr.s.cfg.ReplayTimeout)
	defer cancel()
	d := zmq4.NewDealer(rctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(rr.s.cfg.ReplayTimeout),
		zmq4.WithLogger(quietLogger))
	defer drainClosed(d)
	if err := d.Dial(rr.replay); err != nil {
		return 0, fmt.Errorf("replay dial %s: %w", rr.replay, err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(engines.ReplayRequest(start)...)); err != nil {
		return 0, fmt.Errorf("replay request to %s: %w", rr.replay, err)
	}
	n := 0
	for {
		msg, err := d.Recv()
		if err != nil {
			return n, fmt.Errorf("replay from %s after %d batches: %w", rr.replay, n, err)
		}
		seq, payload, end, err := engines.ParseReplayReply(msg.Frames)
		if err != nil {
			rr.s.reject(rr.rank, 0, false, err)
			continue
		}
		if end {
			return n, nil
		}
		n++
		digest := maphash.Bytes(rr.s.seed, payload)
		if v, _ := rr.w.Check(seq, digest, true); v == Restart {
			return n, errRestart
		}
		if _, ok := rr.s.sequence(rr.rank, &rr.w, seq, digest, true); !ok {
			continue
		}
		rr.apply(seq, payload)
	}
}

// dialSub makes one SUB connected to addr and subscribed to every topic. It dials once (the caller
// owns the backoff); zmq4's own redial is off because a fresh socket per connection gives an exact
// "connected" moment for replay.
func dialSub(ctx context.Context, addr string, timeout time.Duration) (zmq4.Socket, error) {
	sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(max(timeout, time.Second)),
		zmq4.WithLogger(quietLogger))
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

// msgQueue is an unbounded hand-off from the socket reader goroutine to the rank's handler, so that
// live messages arriving during a replay are buffered (and zmq4's small internal queue never
// blocks its connection readers).
type msgQueue struct {
	mu     sync.Mutex
	items  []zmq4.Msg
	err    error
	notify chan struct{}
	done   chan struct{}
}

func startReader(sock zmq4.Socket) *msgQueue {
	q := &msgQueue{notify: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(q.done)
		for {
			msg, err := sock.Recv()
			q.mu.Lock()
			if err != nil {
				q.err = err
			} else {
				q.items = append(q.items, msg)
			}
			q.mu.Unlock()
			select {
			case q.notify <- struct{}{}:
			default:
			}
			if err != nil {
				return
			}
		}
	}()
	return q
}

func (q *msgQueue) next(ctx context.Context) (zmq4.Msg, error) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			m := q.items[0]
			q.items[0] = zmq4.Msg{}
			q.items = q.items[1:]
			q.mu.Unlock()
			return m, nil
		}
		err := q.err
		q.mu.Unlock()
		if err != nil {
			return zmq4.Msg{}, err
		}
		select {
		case <-ctx.Done():
			return zmq4.Msg{}, ctx.Err()
		case <-q.notify:
		}
	}
}

// drainAndWait waits for the reader goroutine of a closed socket to finish.
func (q *msgQueue) drainAndWait(sock zmq4.Socket) {
	<-q.done
	drainClosed(sock)
}
