package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/trtllm"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/ingest"
	"github.com/kvexact/kvexact/vectors"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

type tailLine struct {
	Type        string   `json:"type"`
	Rank        int      `json:"rank"`
	Seq         *uint64  `json:"seq"`
	Reason      string   `json:"reason"`
	Kind        string   `json:"kind"`
	BlockHashes []uint64 `json:"block_hashes"`
	Blocks      int      `json:"blocks"`
	Keys        []struct {
		Key   uint64 `json:"key"`
		Count int    `json:"count"`
	} `json:"keys"`
}

func parseLines(t *testing.T, out string) []tailLine {
	t.Helper()
	var lines []tailLine
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l tailLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("not a JSON line: %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	if len(lines) == 0 {
		t.Fatal("no output")
	}
	return lines
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "tcp://" + l.Addr().String()
}

func vllmBatch(t *testing.T, ev engines.Event) []byte {
	t.Helper()
	b, err := vllm.EncodeBatch(engines.Batch{Timestamp: 1752345678.25, Events: []engines.Event{ev}, HasDPRank: true}, vllm.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEventsTailZMQ runs the command against a zmq4 PUB + replay ROUTER of our own: three batches
// only replay can deliver, one live batch, then the inventory line.
func TestEventsTailZMQ(t *testing.T) {
	pubAddr, replayAddr := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Listen(pubAddr); err != nil {
		t.Fatal(err)
	}
	router := zmq4.NewRouter(ctx)
	defer router.Close()
	if err := router.Listen(replayAddr); err != nil {
		t.Fatal(err)
	}
	stored := func(keys ...uint64) engines.Event {
		return engines.Event{Kind: engines.BlockStored, BlockHashes: keys, BlockSize: 2, TokenIDs: make([]uint32, 2*len(keys)), Medium: "GPU"}
	}
	buffer := [][]byte{
		vllmBatch(t, stored(1, 2)),
		vllmBatch(t, stored(3)),
		vllmBatch(t, engines.Event{Kind: engines.BlockRemoved, BlockHashes: []uint64{1}, Medium: "GPU"}),
	}
	go func() { // the replay ROUTER: answer every request from the buffer, then the end marker
		for {
			msg, err := router.Recv()
			if err != nil {
				return
			}
			id, start, err := engines.ParseReplayRequest(msg.Frames)
			if err != nil {
				continue
			}
			for seq := start; seq < uint64(len(buffer)); seq++ {
				router.SendMulti(zmq4.NewMsgFrom(append([][]byte{id}, engines.ReplayReply(seq, buffer[seq])...)...))
			}
			router.SendMulti(zmq4.NewMsgFrom(append([][]byte{id}, engines.ReplayEnd()...)...))
		}
	}()

	var stdout, stderr syncBuf
	done := make(chan int, 1)
	go func() {
		done <- eventsTail(context.Background(), []string{"--family", "vllm", "--release", "v0.25.1",
			"--zmq", pubAddr, "--replay", replayAddr, "--duration", "1500ms", "--inventory"}, &stdout, &stderr)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for len(pub.(zmq4.Topics).Topics()) == 0 { // wait for the subscription (slow joiner)
		if time.Now().After(deadline) {
			t.Fatal("no subscription reached the publisher")
		}
		time.Sleep(5 * time.Millisecond)
	}
	live := vllmBatch(t, stored(4))
	if err := pub.SendMulti(zmq4.NewMsgFrom(engines.LiveFrames("", 3, live)...)); err != nil {
		t.Fatal(err)
	}
	if code := <-done; code != 0 {
		t.Fatalf("exit %d, stderr: %s", code, stderr.String())
	}
	lines := parseLines(t, stdout.String())
	var kinds []string
	for _, l := range lines {
		if l.Type == "event" {
			kinds = append(kinds, fmt.Sprintf("%d:%s", *l.Seq, l.Kind))
		}
	}
	if got, want := strings.Join(kinds, " "), "0:BlockStored 1:BlockStored 2:BlockRemoved 3:BlockStored"; got != want {
		t.Errorf("events: %s, want %s\n%s", got, want, stdout.String())
	}
	inv := lines[len(lines)-1]
	if inv.Type != "inventory" || inv.Blocks != 3 || len(inv.Keys) != 3 ||
		inv.Keys[0].Key != 2 || inv.Keys[1].Key != 3 || inv.Keys[2].Key != 4 {
		t.Errorf("inventory line: %+v", inv)
	}
}

// TestEventsTailDrain runs the command against a destructive drain server of ours serving the
// shared TensorRT-LLM startup sample: 3 full blocks indexed under router keys, the partial one not.
func TestEventsTailDrain(t *testing.T) {
	f, err := vectors.LoadSamples(filepath.Join("..", "..", "vectors", "trtllm", "v1.2", "kv-cache-events-samples.json"))
	if err != nil {
		t.Fatal(err)
	}
	body, bs := f.Samples[0].Payload, f.Samples[0].BlockSize
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		b := body
		body = []byte("[]")
		mu.Unlock()
		w.Write(b)
	}))
	defer srv.Close()
	evs, err := trtllm.DecodeDrain(f.Samples[0].Payload)
	if err != nil {
		t.Fatal(err)
	}
	want, err := hashcore.RouterKeys(0, evs[1].TokenIDs[:3*bs], bs, nil, nil)
	if err != nil {
		t.Fatal(err)
	}

	var stdout, stderr syncBuf
	code := eventsTail(context.Background(), []string{"--family", "trtllm", "--release", "1.2", "--drain", srv.URL,
		"--block-size", fmt.Sprint(bs), "--duration", "400ms", "--inventory"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d, stderr: %s", code, stderr.String())
	}
	lines := parseLines(t, stdout.String())
	partial := 0
	for _, l := range lines {
		if l.Type == "skip" && l.Reason == "partial_block" {
			partial++
		}
	}
	if partial != 1 {
		t.Errorf("partial-block skips: %d, want 1\n%s", partial, stdout.String())
	}
	inv := lines[len(lines)-1]
	got := map[uint64]bool{}
	for _, k := range inv.Keys {
		got[k.Key] = k.Count == 1
	}
	if inv.Type != "inventory" || len(inv.Keys) != 3 || !got[want[0]] || !got[want[1]] || !got[want[2]] {
		t.Errorf("inventory line %+v, want keys %v", inv, want)
	}
}

func TestEventsTailBadArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--zmq", "tcp://127.0.0.1:5557"}, "--family"},
		{[]string{"--family", "vllm"}, "--zmq"},
		{[]string{"--family", "vllm", "--zmq", "tcp://127.0.0.1:5557", "--drain", "http://127.0.0.1:8000"}, "--drain"},
		{[]string{"--family", "vllm", "--zmq", "tcp://127.0.0.1:5557", "--zmq", "tcp://127.0.0.1:5558", "--replay", "tcp://127.0.0.1:5600"}, "--replay"},
		{[]string{"--family", "trtllm", "--drain", "http://127.0.0.1:8000"}, "--block-size"},
		{[]string{"--family", "vllm", "--zmq", "tcp://127.0.0.1:5557", "--duration", "soon"}, "-duration"},
		{[]string{"--family", "llamacpp", "--zmq", "tcp://127.0.0.1:5557"}, "--family"},
		{[]string{"--family", "vllm", "--zmq", "tcp://*:5557"}, "--zmq"},
		{[]string{"--family", "vllm", "--release", "v0.9.0", "--zmq", "tcp://127.0.0.1:5557"}, "--release"},
	} {
		var stderr bytes.Buffer
		code := eventsTail(context.Background(), tc.args, io.Discard, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.flag) {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %s", tc.args, code, firstLine(stderr.String()), tc.flag)
		}
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// TestEventsTailDropLine: a run of queue drops (ingest's "drop" trace) prints as one JSON line
// with its type, rank, reason, count and detail.
func TestEventsTailDropLine(t *testing.T) {
	b, err := json.Marshal(traceLine(ingest.Trace{Type: "drop", Rank: 1, Reason: "queue_full", Count: 6,
		Detail: "the run of drops ended: 6 messages dropped", Wall: time.Unix(0, 0)}))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"type":"drop","rank":1,"reason":"queue_full","count":6,"detail":"the run of drops ended: 6 messages dropped","wall":"1970-01-01T00:00:00Z"}`
	if string(b) != want {
		t.Errorf("line\n got %s\nwant %s", b, want)
	}
}
