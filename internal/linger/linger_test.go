package linger

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// serve accepts one connection on a lingering listener, writes answer and closes at once, as a
// server refusing an upload does.
func serve(t *testing.T, b Bounds) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ll := Listen(l, b)
	t.Cleanup(func() { ll.Close() })
	go func() {
		c, err := ll.Accept()
		if err != nil {
			return
		}
		_, _ = io.WriteString(c, "answer")
		c.Close()
	}()
	return l.Addr().String()
}

// send writes n bytes after the server has closed, then reads what the server wrote and how the
// connection ended.
func send(t *testing.T, addr string, n int) (string, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	time.Sleep(50 * time.Millisecond) // the server has answered and closed
	if _, err := c.Write([]byte(strings.Repeat("x", n))); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c) // the answer, then the FIN sent at Close
	if err != nil {
		return string(b), err
	}
	// After the drain the socket is either closed cleanly (a read says EOF again) or reset (a read
	// says so).
	time.Sleep(200 * time.Millisecond)
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		return string(b), err
	}
	return string(b), nil
}

// The byte bound: a client sending exactly Bytes after the close is drained and reads the answer
// and a clean end; one that keeps sending past it is reset long before the time bound.
func TestBytesBound(t *testing.T) {
	b := Bounds{Timeout: 5 * time.Second, Bytes: 64 << 10}
	got, err := send(t, serve(t, b), int(b.Bytes))
	if err != nil || got != "answer" {
		t.Fatalf("at the bound: %q, %v; want the answer and a clean end", got, err)
	}
	c, err := net.Dial("tcp", serve(t, b))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	piece := []byte(strings.Repeat("x", 16<<10))
	for time.Since(start) < b.Timeout {
		if _, err := c.Write(piece); err != nil {
			if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
				t.Fatalf("past the bound: %v; want a reset", err)
			}
			return
		}
	}
	t.Fatalf("a client sending past %d bytes was drained until the time bound", b.Bytes)
}

// The time bound: a client that keeps sending (less than Bytes) is reset once Timeout has passed.
func TestTimeBound(t *testing.T) {
	b := Bounds{Timeout: 300 * time.Millisecond, Bytes: 1 << 30}
	c, err := net.Dial("tcp", serve(t, b))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	for time.Since(start) < 5*time.Second {
		if _, err := c.Write([]byte("x")); err != nil {
			if since := time.Since(start); since < b.Timeout {
				t.Fatalf("reset after %v, before the %v bound", since, b.Timeout)
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("a client sending forever was drained past 5 s (bound 300ms)")
}

// Without bounds the listener is returned as it is.
func TestZeroBoundsOff(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if Listen(l, Bounds{}) != l || Listen(l, Bounds{Timeout: time.Second}) != l {
		t.Fatal("zero bounds must leave the listener alone")
	}
}
