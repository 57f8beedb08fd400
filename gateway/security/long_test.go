package security

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/rules"
)

// The many-connection cases (make security): hundreds of hostile clients at once, each bounded by
// a deadline, so that together they cannot hold the gateway's connections, goroutines or memory.

// holdAll opens n connections, sends each send(i), and reports how many the gateway still holds
// open after within: each is read until the gateway closes it.
func holdAll(t *testing.T, addr string, n int, within time.Duration, send func(i int) string) (stillOpen int) {
	t.Helper()
	var open atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(within)
	for i := range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Errorf("connection %d: %v", i, err)
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			_ = c.SetDeadline(deadline)
			if _, err := io.WriteString(c, send(i)); err != nil {
				return
			}
			if _, err := io.Copy(io.Discard, c); isTimeout(err) {
				open.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(open.Load())
}

// 300 unauthenticated admin uploads that declare 1000 bytes and send one: all answered and closed
// within the read deadline (bodyTimeout 1s), none held.
func TestLongAdminSlowBodies(t *testing.T) {
	long(t)
	g := start(t, func(c *rules.Config) {
		c.Server.ReadHeaderTimeout = rules.Duration(time.Second)
		c.Server.BodyTimeout = rules.Duration(time.Second)
	})
	if n := holdAll(t, g.admin, 300, 12*time.Second, func(int) string {
		return "POST /admin/rules HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000\r\n\r\n{"
	}); n > 0 {
		t.Fatalf("%d of 300 admin connections still open at 12 s (deadlines 1 s)", n)
	}
}

// 1,500 slowloris clients (half a request head each) on the client listener: all closed by the
// header deadline (readHeaderTimeout 2s); the gateway serves a normal request meanwhile.
func TestLongSlowloris(t *testing.T) {
	long(t)
	g := start(t, func(c *rules.Config) { c.Server.ReadHeaderTimeout = rules.Duration(2 * time.Second) })
	done := make(chan int)
	go func() {
		done <- holdAll(t, g.client, 1500, 20*time.Second, func(int) string { return "POST /v1/completions HTTP/1.1\r\nHost: gw\r\n" })
	}()
	time.Sleep(500 * time.Millisecond)
	stillServes(t, g)
	if n := <-done; n > 0 {
		t.Fatalf("%d of 1500 slowloris connections still open at 20 s (header deadline 2 s)", n)
	}
}

// 500 clients sending their bodies one byte a second: each answered 408 at the body deadline.
func TestLongSlowBodies(t *testing.T) {
	long(t)
	g := start(t, func(c *rules.Config) { c.Server.BodyTimeout = rules.Duration(2 * time.Second) })
	if n := holdAll(t, g.client, 500, 15*time.Second, func(int) string {
		return "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
	}); n > 0 {
		t.Fatalf("%d of 500 slow-body connections still open at 15 s (body deadline 2 s)", n)
	}
}

// 64 streaming completions whose clients never read: all cut at the write deadline (2s), the
// engine's streams released with them.
func TestLongStreamsNobodyReads(t *testing.T) {
	long(t)
	g := start(t, func(c *rules.Config) { c.Server.WriteTimeout = rules.Duration(2 * time.Second) })
	var released atomic.Int64
	event := "data: " + fmt.Sprintf("%0*d", 16<<10, 0) + "\n\n"
	g.engine.set(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for {
			if _, err := io.WriteString(w, event); err != nil || rc.Flush() != nil {
				break
			}
		}
		released.Add(1)
	})
	var conns []net.Conn
	for range 64 {
		c := dial(t, g.client, 60*time.Second)
		if _, err := io.WriteString(c, post("/v1/completions", completionBody(`,"stream":true`))); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	deadline := time.Now().Add(30 * time.Second)
	for released.Load() < 64 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 64 unread streams still relayed at 30 s (write deadline 2 s)", 64-released.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := g.metric("kvexact_proxy_client_errors_total", map[string]string{"kind": "write_timeout"}); got != 64 {
		t.Fatalf("write_timeout counted %v, want 64", got)
	}
}
