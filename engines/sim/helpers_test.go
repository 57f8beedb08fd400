package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/sglang"
	"github.com/kvexact/kvexact/engines/trtllm"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

var (
	tokOnce sync.Once
	tokVal  *tokenize.Tokenizer
	tokErr  error
)

// testTokenizer loads llama3 once per test binary (simulators in one process share it).
func testTokenizer(t testing.TB) *tokenize.Tokenizer {
	t.Helper()
	tokOnce.Do(func() {
		dir, err := tokenize.FindModelDir(tokenize.DefaultRoots(), "llama3")
		if err != nil {
			tokErr = err
			return
		}
		tokVal, tokErr = tokenize.Load(dir)
	})
	if tokErr != nil {
		t.Skipf("llama3 tokenizer not available: %v", tokErr)
	}
	return tokVal
}

// startSim starts a fast simulator for tests; mod adjusts the config.
func startSim(t testing.TB, family, release string, mod func(*Config)) *Engine {
	t.Helper()
	c := Config{Family: family, Release: release, Model: "llama3", Tokenizer: testTokenizer(t), ServedModelName: "m",
		Endpoint: "ep-" + family, PrefillPerToken: time.Microsecond, DecodePerToken: time.Microsecond,
		PublishAddr: "tcp://*:0", ReplayAddr: "tcp://*:0", DrainWait: 50 * time.Millisecond}
	if mod != nil {
		mod(&c)
	}
	e, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// post sends a JSON body and decodes the JSON answer (nil when not JSON).
func post(t testing.TB, url string, body any) (*http.Response, map[string]any) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case string:
		rd = bytes.NewBufferString(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, _ := json.Marshal(b)
		rd = bytes.NewReader(raw)
	}
	resp, err := http.Post(url, "application/json", rd)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	_ = dec.Decode(&m)
	return resp, m
}

func usageCached(t testing.TB, m map[string]any) int {
	t.Helper()
	u, _ := m["usage"].(map[string]any)
	d, _ := u["prompt_tokens_details"].(map[string]any)
	n, err := d["cached_tokens"].(json.Number).Int64()
	if err != nil {
		t.Fatalf("no cached_tokens in %v", m)
	}
	return int(n)
}

// frame is one ZeroMQ event message as a subscriber sees it.
type frame struct {
	seq     uint64
	payload []byte
}

// subscriber is a plain zmq4 SUB collecting [topic, seq, payload] messages.
type subscriber struct {
	mu     sync.Mutex
	frames []frame
	sock   zmq4.Socket
	done   chan struct{}
}

func subscribe(t testing.TB, addr, topic string) *subscriber {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &subscriber{sock: zmq4.NewSub(ctx, zmq4.WithAutomaticReconnect(true)), done: make(chan struct{})}
	if err := s.sock.Dial(addr); err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := s.sock.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() {
		defer close(s.done)
		for ctx.Err() == nil {
			msg, err := s.sock.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				time.Sleep(5 * time.Millisecond) // a dropped connection: keep listening (auto-reconnect)
				continue
			}
			if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
				continue
			}
			s.mu.Lock()
			s.frames = append(s.frames, frame{binary.BigEndian.Uint64(msg.Frames[1]), append([]byte(nil), msg.Frames[2]...)})
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); s.sock.Close(); <-s.done })
	return s
}

func (s *subscriber) snapshot() []frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]frame(nil), s.frames...)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// replay asks a ROUTER replay socket for every batch from start with a DEALER; ok is false when no
// answer came within wait.
func replay(t testing.TB, addr string, start uint64, wait time.Duration) (out []frame, ok bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(addr); err != nil {
		t.Fatal(err)
	}
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], start)
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, sb[:])); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := d.Recv()
		if err != nil {
			return out, false
		}
		n := len(msg.Frames)
		if n < 2 {
			continue
		}
		seq, payload := msg.Frames[n-2], msg.Frames[n-1]
		if bytes.Equal(seq, endSeq) {
			return out, true
		}
		out = append(out, frame{binary.BigEndian.Uint64(seq), append([]byte(nil), payload...)})
	}
}

// decodeFor returns the family decoder.
func decodeFor(family string) func([]byte) (engines.Batch, error) {
	if family == "sglang" {
		return sglang.DecodeBatch
	}
	return vllm.DecodeBatch
}

// residency mirrors an endpoint's block set from events: a reference count per key.
type residency map[uint64]int

func (r residency) apply(t testing.TB, ev engines.Event) {
	t.Helper()
	switch ev.Kind {
	case engines.BlockStored:
		for _, h := range ev.BlockHashes {
			r[h]++
		}
	case engines.BlockRemoved:
		for _, h := range ev.BlockHashes {
			if r[h] <= 0 {
				t.Fatalf("removal of %d which is not resident", h)
			}
			r[h]--
			if r[h] == 0 {
				delete(r, h)
			}
		}
	case engines.AllBlocksCleared:
		clear(r)
	}
}

// drainAll polls POST /kv_cache_events until it answers empty.
func drainAll(t testing.TB, base string) []engines.Event {
	t.Helper()
	var all []engines.Event
	for {
		req, err := trtllm.NewDrainRequest(context.Background(), base)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := trtllm.ReadDrainResponse(resp, 0)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			return all
		}
		all = append(all, evs...)
	}
}
