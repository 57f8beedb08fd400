package ingest

import (
	"context"
	"fmt"
	"github.com/kvexact/kvexact/internal/promtest"
	"net"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/gateway/inventory"
)

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkNoLeak records the goroutines and, at cleanup, waits (with a deadline) for their count to
// come back down: tearing a source down must stop every goroutine and socket it started. zmq4's PUB
// never stops its writer goroutine (pubSocket.Close does not close its pubMWriter), so the test
// publishers' writers are not counted: they belong to the engine side, not to the subscriber.
func checkNoLeak(t *testing.T) {
	t.Helper()
	before := goroutines()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			after := goroutines()
			if len(after) <= len(before) {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("goroutines: %d before, %d after teardown\n%s", len(before), len(after), strings.Join(after, "\n\n"))
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func goroutines() []string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "zmq4.(*pubMWriter).run") {
			continue
		}
		out = append(out, g)
	}
	return out
}

// freePort asks the kernel for an unused 127.0.0.1 TCP port.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// goPub is an engine-side publisher made of real zmq4 sockets: a PUB for live batches and a ROUTER
// answering the replay protocol from its buffer, on 127.0.0.1.
type goPub struct {
	t                  testing.TB
	pubAddr, replayAdr string

	mu     sync.Mutex
	pub    zmq4.Socket
	router zmq4.Socket
	buf    []rec
	gate   chan struct{} // when set, replay answers wait for it to close
	// gateFrom: the gate holds only requests after the first gateFrom answered.
	gateFrom int
	served   int // replay requests answered
	wg       sync.WaitGroup
	cancel   context.CancelFunc
}

type rec struct {
	seq     uint64
	payload []byte
}

func newGoPub(t testing.TB, withReplay bool) *goPub {
	p := &goPub{t: t, pubAddr: fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))}
	if withReplay {
		p.replayAdr = fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	}
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *goPub) start() {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	pub := zmq4.NewPub(ctx, zmq4.WithLogger(quietLogger))
	var err error
	for range 50 { // the previous life's port may take a moment to free
		if err = pub.Listen(p.pubAddr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		p.t.Fatalf("publisher listen %s: %v", p.pubAddr, err)
	}
	p.mu.Lock()
	p.pub = pub
	p.mu.Unlock()
	if p.replayAdr == "" {
		return
	}
	router := zmq4.NewRouter(ctx, zmq4.WithLogger(quietLogger))
	for range 50 {
		if err = router.Listen(p.replayAdr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		p.t.Fatalf("replay listen %s: %v", p.replayAdr, err)
	}
	p.mu.Lock()
	p.router = router
	p.mu.Unlock()
	p.wg.Add(1)
	go p.serve(ctx, router)
}

func (p *goPub) serve(ctx context.Context, router zmq4.Socket) {
	defer p.wg.Done()
	for {
		msg, err := router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		id, start, err := engines.ParseReplayRequest(msg.Frames)
		if err != nil {
			continue
		}
		p.mu.Lock()
		gate := p.gate
		if p.served < p.gateFrom {
			gate = nil
		}
		p.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return
			}
		}
		p.mu.Lock()
		var out []rec
		for _, r := range p.buf {
			if r.seq >= start {
				out = append(out, r)
			}
		}
		p.mu.Unlock()
		for _, r := range out {
			_ = router.SendMulti(zmq4.NewMsgFrom(append([][]byte{id}, engines.ReplayReply(r.seq, r.payload)...)...))
		}
		_ = router.SendMulti(zmq4.NewMsgFrom(append([][]byte{id}, engines.ReplayEnd()...)...))
		p.mu.Lock()
		p.served++
		p.mu.Unlock()
	}
}

func (p *goPub) stop() {
	p.cancel()
	p.mu.Lock()
	pub, router := p.pub, p.router
	p.mu.Unlock()
	drainClosed(pub)
	if router != nil {
		drainClosed(router)
	}
	p.wg.Wait()
}

// restart closes both sockets and binds fresh ones on the same ports with an empty buffer: an
// engine restart, whose sequence starts again at 0.
func (p *goPub) restart() {
	p.stop()
	p.mu.Lock()
	p.buf = nil
	p.served = 0
	p.mu.Unlock()
	p.start()
}

// bounce closes both sockets and binds fresh ones on the same ports, keeping the buffer: the
// connection dropped, the publisher did not restart.
func (p *goPub) bounce() {
	p.stop()
	p.start()
}

// waitSub waits until a subscriber's subscription reached the PUB (the slow-joiner rule).
func (p *goPub) waitSub() {
	p.t.Helper()
	eventually(p.t, 5*time.Second, "subscriber subscribed", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.pub.(zmq4.Topics).Topics()) > 0
	})
}

// publish sends a batch live and keeps it for replay; drop only keeps it (a message the network or
// the high-water mark lost).
func (p *goPub) publish(seq uint64, payload []byte) {
	p.t.Helper()
	p.mu.Lock()
	p.buf = append(p.buf, rec{seq, payload})
	pub := p.pub
	p.mu.Unlock()
	if err := pub.SendMulti(zmq4.NewMsgFrom(engines.LiveFrames("", seq, payload)...)); err != nil {
		p.t.Fatalf("publish seq %d: %v", seq, err)
	}
}

func (p *goPub) drop(seq uint64, payload []byte) {
	p.mu.Lock()
	p.buf = append(p.buf, rec{seq, payload})
	p.mu.Unlock()
}

// keep leaves in the replay buffer only the messages keep accepts: an engine whose buffer has
// moved on, or lost a message.
func (p *goPub) keep(keep func(seq uint64) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.buf[:0]
	for _, r := range p.buf {
		if keep(r.seq) {
			out = append(out, r)
		}
	}
	p.buf = out
}

func (p *goPub) servedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.served
}

// stored encodes a vLLM v0.25 batch storing keys (engine ids) on rank.
func stored(t testing.TB, rank int, keys ...uint64) []byte {
	t.Helper()
	ev := engines.Event{Kind: engines.BlockStored, BlockHashes: keys, BlockSize: 4, Medium: "GPU",
		TokenIDs: make([]uint32, 4*len(keys)), HasGroupIdx: true, SpecKind: "full_attention"}
	return encode(t, rank, ev)
}

func removed(t testing.TB, rank int, keys ...uint64) []byte {
	t.Helper()
	return encode(t, rank, engines.Event{Kind: engines.BlockRemoved, BlockHashes: keys, Medium: "GPU", HasGroupIdx: true})
}

func cleared(t testing.TB, rank int) []byte {
	t.Helper()
	return encode(t, rank, engines.Event{Kind: engines.AllBlocksCleared})
}

func encode(t testing.TB, rank int, evs ...engines.Event) []byte {
	t.Helper()
	b, err := vllm.EncodeBatch(engines.Batch{Timestamp: float64(time.Now().UnixNano()) / 1e9, Events: evs,
		DPRank: rank, HasDPRank: true}, vllm.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// harness runs one source into a real inventory with metrics and a trace log.
type harness struct {
	t      *testing.T
	idx    *inventory.Index
	ep     inventory.EndpointID
	reg    *prometheus.Registry
	m      *Metrics
	cancel context.CancelFunc
	done   chan error
	src    Source

	mu     sync.Mutex
	traces []Trace
}

func startSource(t *testing.T, cfg Config) *harness {
	t.Helper()
	h := &harness{t: t, idx: inventory.New(inventory.Config{}), reg: prometheus.NewRegistry(), done: make(chan error, 1)}
	var err error
	if h.ep, err = h.idx.AddEndpoint("ep0"); err != nil {
		t.Fatal(err)
	}
	if h.m, err = NewMetrics(h.reg); err != nil {
		t.Fatal(err)
	}
	if cfg.Rule == "" {
		cfg.Rule = "r1"
	}
	cfg.Endpoint = "ep0"
	cfg.Metrics = h.m
	cfg.Trace = func(tr Trace) {
		tr.Event = nil
		h.mu.Lock()
		h.traces = append(h.traces, tr)
		h.mu.Unlock()
	}
	if cfg.DialBackoffMax == 0 {
		cfg.DialBackoffMax = 200 * time.Millisecond
	}
	if cfg.ReplayTimeout == 0 {
		cfg.ReplayTimeout = 5 * time.Second
	}
	src, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.src = src
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- src.Run(ctx, Into(h.idx, h.ep, h.m, cfg.Rule, "ep0", nil)) }()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		h.t.Error("Run did not return within 10s of cancel")
	}
}

// keys is the endpoint's inventory as key → copy count.
func (h *harness) keys() map[uint64]int {
	out := map[uint64]int{}
	for _, kc := range h.idx.Snapshot(h.ep) {
		out[kc.Key] = kc.Count
	}
	return out
}

func (h *harness) waitKeys(want map[uint64]int) {
	h.t.Helper()
	var got map[uint64]int
	ok := false
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if got = h.keys(); equalCounts(got, want) {
			ok = true
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !ok {
		h.t.Fatalf("inventory: got %v, want %v\ntraces:\n%s", fmtCounts(got), fmtCounts(want), h.traceLog())
	}
}

func (h *harness) traceLog() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for _, t := range h.traces {
		fmt.Fprintf(&b, "  %s rank=%d seq=%d/%v reason=%s missing=%d count=%d %s\n", t.Type, t.Rank, t.Seq, t.HasSeq, t.Reason, t.Missing, t.Count, t.Detail)
	}
	return b.String()
}

func (h *harness) countTraces(typ, reason string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, t := range h.traces {
		if t.Type == typ && (reason == "" || t.Reason == reason) {
			n++
		}
	}
	return n
}

func equalCounts(a, b map[uint64]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func fmtCounts(m map[uint64]int) string {
	ks := make([]uint64, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	var b strings.Builder
	b.WriteString("{")
	for i, k := range ks {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%d:%d", k, m[k])
	}
	b.WriteString("}")
	return b.String()
}

// metric reads one series' value (counter, gauge, or histogram sample count) from the registry.
func (h *harness) metric(name string, lv map[string]string) float64 {
	h.t.Helper()
	return promtest.Value(h.t, h.reg, name, lv)
}

func itoa(i int) string { return strconv.Itoa(i) }
