package ingest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuf is a log sink the source's goroutines and the test share.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// zmtpPeer plays a ZMTP 3.0 NULL-mechanism PUB or ROUTER by hand on one accepted connection: greeting, READY,
// the subscriber's SUBSCRIBE, then whatever frame bytes the test gives it. It reports once the
// subscriber closed the connection.
func zmtpPeer(t *testing.T, ln net.Listener, sockType string, frame []byte) <-chan error {
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		greeting := make([]byte, 64)
		copy(greeting, []byte{0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0})
		copy(greeting[12:], "NULL") // mechanism, zero-padded to 20 bytes; as-server 0; filler
		if _, err := c.Write(greeting); err != nil {
			done <- err
			return
		}
		if _, err := io.ReadFull(c, make([]byte, 64)); err != nil {
			done <- fmt.Errorf("peer greeting: %w", err)
			return
		}
		var ready bytes.Buffer
		ready.WriteString("\x05READY\x0bSocket-Type")
		binary.Write(&ready, binary.BigEndian, uint32(len(sockType)))
		ready.WriteString(sockType)
		if _, err := c.Write(append([]byte{0x04, byte(ready.Len())}, ready.Bytes()...)); err != nil {
			done <- err
			return
		}
		hdr := make([]byte, 2)
		if _, err := io.ReadFull(c, hdr); err != nil {
			done <- fmt.Errorf("peer READY header: %w", err)
			return
		}
		if _, err := io.ReadFull(c, make([]byte, hdr[1])); err != nil {
			done <- fmt.Errorf("peer READY body: %w", err)
			return
		}
		// Like a real publisher, answer only once asked: read the SUB's SUBSCRIBE or the DEALER's
		// replay request, one message of short frames.
		for more := true; more; {
			if _, err := io.ReadFull(c, hdr); err != nil {
				done <- fmt.Errorf("peer request header: %w", err)
				return
			}
			more = hdr[0]&0x01 != 0
			if _, err := io.ReadFull(c, make([]byte, hdr[1])); err != nil {
				done <- fmt.Errorf("peer request body: %w", err)
				return
			}
		}
		if _, err := c.Write(frame); err != nil {
			done <- err
			return
		}
		_, err = io.Copy(io.Discard, c) // until the subscriber hangs up
		done <- err
	}()
	return done
}

// TestZMQOversizeFrameClosesConnection: a publisher whose frame header announces 2^40 bytes gets its
// connection closed and counted before anything of that size is allocated; the source keeps running
// and a real publisher at the same address delivers afterwards. Without the zmq4 patch
// (WithMaxMessageSize) zmq4's reader does make([]byte, 1<<40) and the process dies.
func TestZMQOversizeFrameClosesConnection(t *testing.T) {
	checkNoLeak(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "tcp://" + ln.Addr().String()
	const announced = uint64(1) << 40
	frame := []byte{0x02, 0, 0, 0, 0, 0, 0, 0, 0} // long frame, last
	binary.BigEndian.PutUint64(frame[1:], announced)
	peer := zmtpPeer(t, ln, "PUB", frame)

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	logs := &syncBuf{}
	cfg := Config{Family: "vllm", Release: "v0.25.1", Publish: []string{addr},
		Logger: slog.New(slog.NewTextHandler(logs, nil))}
	h := startSource(t, cfg)

	select {
	case err := <-peer:
		if err != nil {
			t.Fatalf("bad peer: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the subscriber did not close the oversize connection\n%s", h.traceLog())
	}
	ln.Close()
	if !waitFor(5*time.Second, func() bool {
		return h.metric("kvexact_ingest_rejects_total", lbl("rank", "0", "reason", "message_size")) == 1 &&
			strings.Contains(logs.String(), "message over the size limit") // counted, then logged
	}) {
		t.Fatalf("message_size rejects: %v, want 1\n%s\n%s", h.metric("kvexact_ingest_rejects_total", lbl("reason", "message_size")), h.traceLog(), logs.String())
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > announced/1024 {
		t.Errorf("allocated %d bytes while refusing a %d-byte frame", grew, announced)
	}
	for _, want := range []string{"message over the size limit", "endpoint=ep0", "rank=0", "addr=" + addr,
		fmt.Sprintf("announced=%d", announced), fmt.Sprintf("max=%d", DefaultMaxMessageBytes)} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	if !strings.Contains(h.traceLog(), "message_size") {
		t.Errorf("no message_size reject traced:\n%s", h.traceLog())
	}

	// The same address, now a real publisher: the source redials and applies its events.
	p := &goPub{t: t, pubAddr: addr}
	p.start()
	t.Cleanup(p.stop)
	p.waitSub()
	p.publish(0, stored(t, 0, 7, 8))
	h.waitKeys(map[uint64]int{7: 1, 8: 1})
}

// TestZMQOversizeMessageTotal: frames each under the bound whose total is over it are refused too.
func TestZMQOversizeMessageTotal(t *testing.T) {
	checkNoLeak(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := "tcp://" + ln.Addr().String()
	// Two frames of 600 and 600 bytes against a 1000-byte bound: the second header is refused.
	var frames bytes.Buffer
	frames.Write([]byte{0x03, 0, 0, 0, 0, 0, 0, 0x02, 0x58}) // long, more: 600 bytes
	frames.Write(make([]byte, 600))
	frames.Write([]byte{0x02, 0, 0, 0, 0, 0, 0, 0x02, 0x58}) // long, last: 600 bytes
	peer := zmtpPeer(t, ln, "PUB", frames.Bytes())
	logs := &syncBuf{}
	h := startSource(t, Config{Family: "vllm", Release: "v0.25.1", Publish: []string{addr}, MaxMessageBytes: 1000,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	select {
	case err := <-peer:
		if err != nil {
			t.Fatalf("bad peer: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the subscriber did not close the oversize connection\n%s", h.traceLog())
	}
	eventually(t, 5*time.Second, "message_size reject counted and logged", func() bool {
		return h.metric("kvexact_ingest_rejects_total", lbl("rank", "0", "reason", "message_size")) == 1 &&
			strings.Contains(logs.String(), "message over the size limit") // counted, then logged
	})
	for _, want := range []string{"frame=1", "announced=600", "total=1200", "max=1000"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

// TestZMQOversizeReplayFrame: the replay DEALER has the same bound; the replay fails open (counted,
// logged) and live events still apply.
func TestZMQOversizeReplayFrame(t *testing.T) {
	checkNoLeak(t)
	p := newGoPub(t, false)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	replay := "tcp://" + ln.Addr().String()
	frame := []byte{0x02, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint64(frame[1:], 1<<40)
	peer := zmtpPeer(t, ln, "ROUTER", frame)
	logs := &syncBuf{}
	cfg := vllmCfg(p)
	cfg.Replay = []string{replay}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	h := startSource(t, cfg)
	select {
	case err := <-peer:
		if err != nil {
			t.Fatalf("bad peer: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the DEALER did not close the oversize connection\n%s", h.traceLog())
	}
	if !waitFor(5*time.Second, func() bool {
		return h.metric("kvexact_ingest_rejects_total", lbl("rank", "0", "reason", "message_size")) == 1 &&
			strings.Contains(logs.String(), "message over the size limit") && // counted, then logged
			h.metric("kvexact_ingest_replays_total", lbl("rank", "0", "outcome", "failed")) == 1
	}) {
		t.Fatalf("message_size rejects %v, failed replays %v, want 1 and 1\n%s\n%s",
			h.metric("kvexact_ingest_rejects_total", lbl("reason", "message_size")),
			h.metric("kvexact_ingest_replays_total", lbl("outcome", "failed")), h.traceLog(), logs.String())
	}
	if want := "addr=" + replay; !strings.Contains(logs.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, logs.String())
	}
	p.waitSub()
	p.publish(0, stored(t, 0, 7))
	h.waitKeys(map[uint64]int{7: 1})
}

func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}
