package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
)

// msgQueue is the bounded hand-off from one rank's socket reader goroutine to the rank's pipeline,
// so that live messages arriving during a replay wait their turn and zmq4's small internal queue
// never blocks its connection readers.
//
// Backpressure rule: the reader never waits. A message arriving while limit messages wait is
// dropped and counted (kvexact_ingest_queue_full_total). The pipeline's sequence window then sees
// the gap as it would see one lost on the wire: up to Window missing keeps the inventory, more
// clears it. Waiting instead would only move the loss to the engine's high-water mark, where
// nothing counts it, and stall the connection.
type msgQueue struct {
	mu     sync.Mutex
	items  []zmq4.Msg
	limit  int
	err    error
	notify chan struct{}
	done   chan struct{}
	m      queueMetrics
	// onDrop hears each run of drops (the trace's "drop" lines): its first message, and once a
	// message is queued again or the reader stops, how many the run dropped. Nil: nobody listens.
	onDrop func(Trace)
}

// queueMetrics are one rank's queue series; nil fields (no registry) count nothing.
type queueMetrics struct {
	full  prometheus.Counter
	depth prometheus.Gauge
}

func (m queueMetrics) setDepth(n int) {
	if m.depth != nil {
		m.depth.Set(float64(n))
	}
}

// startReader starts the goroutine that receives from sock into a queue of at most limit messages;
// onDrop (optional) hears each run of drops.
func startReader(sock zmq4.Socket, limit int, m queueMetrics, logger *slog.Logger, onDrop func(Trace)) *msgQueue {
	q := &msgQueue{limit: limit, notify: make(chan struct{}, 1), done: make(chan struct{}), m: m, onDrop: onDrop}
	go func() {
		defer close(q.done)
		run := 0 // messages dropped in the current run of drops: logged and traced once per run
		for {
			msg, err := sock.Recv()
			q.mu.Lock()
			dropped := false
			switch {
			case err != nil:
				q.err = err
			case len(q.items) >= q.limit:
				dropped = true
			default:
				q.items = append(q.items, msg)
				q.m.setDepth(len(q.items))
			}
			q.mu.Unlock()
			if dropped {
				if q.m.full != nil {
					q.m.full.Inc()
				}
				if run++; run == 1 {
					logger.Warn("ingest: event queue full, dropping messages until it drains", "limit", q.limit)
					q.drop(1, fmt.Sprintf("queue full at its limit of %d messages: dropping until it drains", q.limit))
				}
				continue
			}
			if run > 0 {
				q.drop(run, fmt.Sprintf("the run of drops ended: %d messages dropped", run))
				run = 0
			}
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

// drop traces a run of drops.
func (q *msgQueue) drop(n int, detail string) {
	if q.onDrop != nil {
		q.onDrop(Trace{Type: "drop", Reason: "queue_full", Count: n, Detail: detail})
	}
}

// next returns the oldest queued message; once the queue is empty, the reader's error.
func (q *msgQueue) next(ctx context.Context) (zmq4.Msg, error) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			m := q.items[0]
			q.items[0] = zmq4.Msg{}
			q.items = q.items[1:]
			q.m.setDepth(len(q.items))
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

// drainAndWait waits for the reader goroutine of a closed socket to finish; what it left queued
// goes with the connection.
func (q *msgQueue) drainAndWait(sock zmq4.Socket) {
	<-q.done
	drainClosed(sock)
	q.m.setDepth(0)
}
