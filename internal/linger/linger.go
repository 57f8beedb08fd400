// Package linger gives a listener's connections a lingering close: closing sends FIN first and then
// reads and discards what the client is still sending, up to a bound in bytes and time, before the
// socket is closed. Closing a TCP socket with unread data makes the kernel answer with a reset, and
// a reset discards the answer the client has not read yet: a client still uploading a body the
// server refused (413, 415, 408, the admin API's 401) would read "connection reset" instead of the
// status. net/http half-closes and waits 500 ms in a few of these cases (conn.closeWriteAndWait)
// but never reads; nginx's lingering_close does what this package does.
package linger

import (
	"io"
	"net"
	"sync"
	"time"
)

// Bounds limit one lingering close. A client that keeps sending past either is reset.
type Bounds struct {
	// Timeout is the longest a closed connection is drained.
	Timeout time.Duration
	// Bytes is the most that is read and discarded.
	Bytes int64
}

// Listen wraps l so that every accepted connection closes lingering within b. Wrap the TCP
// listener, beneath any TLS: the drain reads the socket, not the TLS records.
func Listen(l net.Listener, b Bounds) net.Listener {
	if b.Timeout <= 0 || b.Bytes <= 0 {
		return l
	}
	return &listener{Listener: l, b: b}
}

type listener struct {
	net.Listener
	b Bounds
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	return &conn{TCPConn: tc, b: l.b}, nil
}

// conn is a TCP connection whose Close lingers. It keeps *net.TCPConn's methods (CloseWrite, which
// net/http's own half-close looks for; ReadFrom and WriteTo).
type conn struct {
	*net.TCPConn
	b    Bounds
	once sync.Once
}

// Close half-closes at once (the client sees the end of the answer) and drains in the background,
// so that whoever closes (a server's handler goroutine, its Shutdown) never waits for the client.
func (c *conn) Close() error {
	c.once.Do(func() {
		if err := c.TCPConn.CloseWrite(); err != nil {
			// Not connected any more (the client reset it, or it was never up): nothing to answer.
			c.TCPConn.Close()
			return
		}
		go c.drain()
	})
	return nil
}

// drain reads until the client closes its side, the bounds are reached or the read fails.
func (c *conn) drain() {
	defer c.TCPConn.Close()
	if c.TCPConn.SetReadDeadline(time.Now().Add(c.b.Timeout)) != nil {
		return
	}
	buf := bufPool.Get().(*[]byte)
	defer bufPool.Put(buf)
	_, _ = io.CopyBuffer(io.Discard, io.LimitReader(readerOnly{c.TCPConn}, c.b.Bytes), *buf)
}

// readerOnly hides TCPConn's WriteTo, so that CopyBuffer reads through the pooled buffer.
type readerOnly struct{ io.Reader }

var bufPool = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}
