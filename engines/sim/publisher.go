package sim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"

	"github.com/kvexact/kvexact/engines"
)

// endSeq is the replay end marker: (-1).to_bytes(8, "big", signed=True).
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

type replayEntry struct {
	seq     uint64
	payload []byte
}

// publisher is one rank's ZeroMQ event stream, as vLLM's and SGLang's ZmqEventPublisher: a PUB
// socket sending [topic, seq u64 BE, payload] with seq from 0 per publisher incarnation, a replay
// ring of the last batches, and an optional ROUTER answering [identity, "", start_seq] with every
// buffered batch from start_seq, then the end marker.
type publisher struct {
	rank     int
	encode   func(engines.Batch) ([]byte, error)
	topic    []byte
	pubEP    string // as configured for this rank (port already offset)
	bind     bool
	replayEP string
	faults   *faultBox
	log      *slog.Logger
	queue    chan engines.Batch
	ringCap  int
	hwm      int // PUB send high-water mark in messages (0: unbounded)

	mu      sync.Mutex // guards the incarnation below and the ring
	pub     zmq4.Socket
	router  zmq4.Socket
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	seq     uint64
	ring    []replayEntry
	pubAddr string // resolved, dialable
	repAddr string

	queued   atomic.Uint64 // batches ever enqueued
	handled  atomic.Uint64 // batches ever handled (sent, dropped or failed)
	restarts atomic.Uint64
}

// isBindable is the engines' rule: bind a wildcard host (or ipc/inproc), dial anything else.
func isBindable(family, ep string) bool {
	if strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://") {
		return true
	}
	if strings.Contains(ep, "*") || strings.Contains(ep, "::") {
		return true
	}
	return family == "sglang" && strings.Contains(ep, "0.0.0.0")
}

// splitTCP splits tcp://host:port.
func splitTCP(ep string) (host string, port int, err error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", 0, fmt.Errorf("endpoint %q: only tcp:// endpoints are supported", ep)
	}
	h, p, err := net.SplitHostPort(rest)
	if err != nil {
		return "", 0, fmt.Errorf("endpoint %q: %w", ep, err)
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("endpoint %q: bad port %q", ep, p)
	}
	return h, port, nil
}

func joinTCP(host string, port int) string {
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// dialable turns a bound endpoint into one a local subscriber can dial.
func dialable(host string, port int) string {
	if host == "*" || host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return joinTCP(host, port)
}

// freePorts finds a base port b on host such that b..b+n-1 are all free, avoiding the ports in
// avoid (so a rank's PUB and replay ports never collide).
func freePorts(host string, n int, avoid map[int]bool) (int, error) {
	if host == "*" || host == "" || host == "::" {
		host = "0.0.0.0"
	}
	for try := 0; try < 200; try++ {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, err
		}
		base := l.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{l}
		ok := !avoid[base]
		for i := 1; ok && i < n; i++ {
			if avoid[base+i] || base+i > 65535 {
				ok = false
				break
			}
			li, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(base+i)))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, li)
		}
		for _, x := range ls {
			x.Close()
		}
		if ok {
			return base, nil
		}
	}
	return 0, errors.New("no run of free ports found")
}

func newPublisher(rank int, family string, encode func(engines.Batch) ([]byte, error), topic string,
	pubEP, replayEP string, ringCap int, faults *faultBox, log *slog.Logger) *publisher {
	p := &publisher{rank: rank, encode: encode, topic: []byte(topic), pubEP: pubEP, bind: isBindable(family, pubEP),
		replayEP: replayEP, faults: faults, log: log, queue: make(chan engines.Batch, 4096), ringCap: ringCap}
	return p
}

// start opens the sockets and the send and replay loops (one incarnation).
func (p *publisher) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	pub := zmq4.NewPub(ctx)
	if p.hwm > 0 {
		// Past the high-water mark the engine drops messages silently, as libzmq's PUB does: a
		// subscriber that stalls sees a sequence gap, never back-pressure.
		if err := pub.SetOption(zmq4.OptionHWM, p.hwm); err != nil {
			cancel()
			return fmt.Errorf("rank %d publish hwm %d: %w", p.rank, p.hwm, err)
		}
	}
	host, port, err := splitTCP(p.pubEP)
	if err != nil {
		cancel()
		return err
	}
	if p.bind {
		if err := pub.Listen(p.pubEP); err != nil {
			cancel()
			return fmt.Errorf("rank %d publish %s: %w", p.rank, p.pubEP, err)
		}
		if a, ok := pub.Addr().(*net.TCPAddr); ok {
			port = a.Port
		}
		p.pubAddr = dialable(host, port)
	} else {
		// The engine dials out to a listening subscriber; libzmq connects in the background.
		p.pubAddr = p.pubEP
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			if err := pub.Dial(p.pubEP); err != nil && ctx.Err() == nil {
				p.log.Warn("kv events: dial failed", "rank", p.rank, "endpoint", p.pubEP, "err", err)
			}
		}()
	}
	var router zmq4.Socket
	if p.replayEP != "" {
		router = zmq4.NewRouter(ctx)
		if err := router.Listen(p.replayEP); err != nil {
			cancel()
			pub.Close()
			return fmt.Errorf("rank %d replay %s: %w", p.rank, p.replayEP, err)
		}
		rh, rp, _ := splitTCP(p.replayEP)
		if a, ok := router.Addr().(*net.TCPAddr); ok {
			rp = a.Port
		}
		p.repAddr = dialable(rh, rp)
	}
	p.pub, p.router, p.cancel = pub, router, cancel
	p.seq = 0
	p.ring = p.ring[:0]
	p.wg.Add(1)
	go p.sendLoop(ctx, pub)
	if router != nil {
		p.wg.Add(1)
		go p.replayLoop(ctx, router)
	}
	return nil
}

// stop closes the current incarnation.
func (p *publisher) stop() {
	p.mu.Lock()
	cancel, pub, router := p.cancel, p.pub, p.router
	p.cancel, p.pub, p.router = nil, nil, nil
	p.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	if pub != nil {
		pub.Close()
	}
	if router != nil {
		router.Close()
	}
	p.wg.Wait()
}

// restart is a publisher restart: new sockets on the same addresses, sequence from 0, empty ring.
func (p *publisher) restart() error {
	p.stop()
	p.restarts.Add(1)
	return p.start()
}

// publish queues a batch; it blocks while the queue is full, as vLLM's scheduler does.
func (p *publisher) publish(b engines.Batch) {
	p.queued.Add(1)
	p.queue <- b
}

func (p *publisher) sendLoop(ctx context.Context, pub zmq4.Socket) {
	defer p.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case b := <-p.queue:
			p.send(pub, b)
		}
	}
}

func (p *publisher) send(pub zmq4.Socket, b engines.Batch) {
	defer p.handled.Add(1)
	payload, err := p.encode(b)
	if err != nil {
		p.log.Error("kv events: encode failed", "rank", p.rank, "err", err)
		return
	}
	p.mu.Lock()
	if p.faults.takeSkip() {
		p.seq++
	}
	seq := p.seq
	p.seq++
	if len(p.ring) >= p.ringCap {
		copy(p.ring, p.ring[1:])
		p.ring = p.ring[:len(p.ring)-1]
	}
	p.ring = append(p.ring, replayEntry{seq: seq, payload: payload})
	p.mu.Unlock()
	if p.faults.takeDrop() {
		return
	}
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], seq)
	if err := pub.SendMulti(zmq4.NewMsgFrom(p.topic, sb[:], payload)); err != nil {
		p.log.Debug("kv events: send failed", "rank", p.rank, "err", err)
	}
}

func (p *publisher) replayLoop(ctx context.Context, router zmq4.Socket) {
	defer p.wg.Done()
	for {
		msg, err := router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 0 || len(msg.Frames[2]) != 8 {
			p.log.Debug("kv events: replay request with unexpected frames ignored", "rank", p.rank, "frames", len(msg.Frames))
			continue
		}
		if p.faults.get().ReplayOff {
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		var out []replayEntry
		for _, e := range p.ring {
			if e.seq >= start {
				out = append(out, e)
			}
		}
		p.mu.Unlock()
		for _, e := range out {
			var sb [8]byte
			binary.BigEndian.PutUint64(sb[:], e.seq)
			if err := router.Send(zmq4.NewMsgFrom(id, []byte{}, sb[:], e.payload)); err != nil {
				break
			}
		}
		_ = router.Send(zmq4.NewMsgFrom(id, []byte{}, endSeq, []byte{}))
	}
}

// nextSeq is the sequence number the next batch will get.
func (p *publisher) nextSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// addrs returns the dialable publish and replay endpoints of the current incarnation.
func (p *publisher) addrs() (pub, replay string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pubAddr, p.repAddr
}

// flushed waits until every batch queued so far has been handled.
func (p *publisher) flushed(ctx context.Context) error {
	want := p.queued.Load()
	for p.handled.Load() < want {
		if err := ctx.Err(); err != nil {
			return err
		}
		waitBriefly(ctx)
	}
	return nil
}
