package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Server serves an http.Handler over HTTP/1.x connections. It is a lean
// replacement for net/http.Server on the gateway's data path: one goroutine
// per connection, pooled buffers, a response writer that frames small answers
// with Content-Length, and a client-disconnect watch that only starts for
// requests that run longer than DisconnectCheckAfter.
//
// Where it deliberately differs from net/http: a request with both
// Transfer-Encoding and Content-Length is refused (400), as is
// Transfer-Encoding in HTTP/1.0, obs-fold, "*" with a method other than
// OPTIONS, authority-form outside CONNECT; CONNECT is answered 501; only
// HTTP/1.0 and 1.1 are served (505 otherwise); up to 4 empty lines before a
// request line are skipped (RFC 9112 §2.2); request trailers are checked and
// dropped; the response writer offers Flush but no Hijack, no response
// trailers and no ReadFrom.
//
// A Server must not be copied after first use.
type Server struct {
	// Handler answers every request (except "OPTIONS *", which the server
	// answers itself). It must not be nil.
	Handler http.Handler

	// ReadHeaderTimeout bounds the time to read a request's line and header
	// fields, counted from when the request's first byte arrived; the wait
	// for that byte is bounded by IdleTimeout, on a new connection too
	// (net/http counts a first request's header time from the accept).
	// 0 means no limit.
	ReadHeaderTimeout time.Duration

	// IdleTimeout is how long a keep-alive connection may wait for the next
	// request (and a new connection for its first byte). 0 means 2 minutes.
	IdleTimeout time.Duration

	// MaxHeaderBytes bounds the request line plus header fields (and,
	// separately, a chunked body's trailer section); larger requests are
	// answered 431. 0 means http.DefaultMaxHeaderBytes (1 MiB).
	MaxHeaderBytes int

	// ErrorBody, when set, renders the body of errors the server answers
	// itself (malformed requests, 431, 501, a handler panic...): it returns
	// the content type and the body. Nil means text/plain
	// "<status> <reason>: <detail>".
	ErrorBody func(status int, detail string) (contentType string, body []byte)

	// DisconnectCheckAfter is how long a handler may run before the server
	// starts watching its connection for the client going away: a read in
	// the background whose EOF or error cancels the request's context. Fast
	// requests never pay for the watch. 0 means 10 ms (a loaded gateway's
	// small requests often take over 1 ms, and a watch costs a goroutine,
	// a read and a deadline poke; 10 ms is nothing next to a generation);
	// negative means watch from the start. The watch starts only once the
	// request body has been read to its end (or there is none).
	//
	// It also bounds how late a keep-alive connection notices input that
	// arrived while its previous handler ran (a pipelined request, a
	// half-close): the wait for the next request does not see it until the
	// connection's timer looks, this long into the wait.
	DisconnectCheckAfter time.Duration

	// BaseContext, when set, returns the base context of the requests
	// accepted on a listener; it must not return nil. Nil means
	// context.Background().
	BaseContext func(net.Listener) context.Context

	// Log receives handler panics (error level) and protocol errors (debug
	// level). Nil means slog.Default().
	Log *slog.Logger

	mu        sync.Mutex
	listeners map[*net.Listener]struct{}
	conns     map[*conn]struct{}
	connGone  chan struct{} // a token each time a connection ends, for Shutdown
	closing   atomic.Bool   // Shutdown or Close was called
}

const (
	bufSize                     = 4 << 10
	defaultIdleTimeout          = 2 * time.Minute
	defaultDisconnectCheckAfter = 10 * time.Millisecond
	// maxDiscard is how much of a request body the handler left unread the
	// server reads and throws away to keep the connection; beyond it the
	// connection is closed instead.
	maxDiscard = 256 << 10
	// lingerTime and lingerBytes bound the read-and-discard after the write
	// side was shut, so that a client still sending sees our answer rather
	// than a reset.
	lingerTime  = 500 * time.Millisecond
	lingerBytes = 4 << 20
)

func (s *Server) logger() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.Default()
}

func (s *Server) idleTimeout() time.Duration {
	if s.IdleTimeout > 0 {
		return s.IdleTimeout
	}
	return defaultIdleTimeout
}

func (s *Server) maxHeaderBytes() int {
	if s.MaxHeaderBytes > 0 {
		return s.MaxHeaderBytes
	}
	return http.DefaultMaxHeaderBytes
}

func (s *Server) disconnectCheckAfter() time.Duration {
	if s.DisconnectCheckAfter == 0 {
		return defaultDisconnectCheckAfter
	}
	return s.DisconnectCheckAfter
}

// Serve accepts connections on l and serves each in its own goroutine. It
// closes l when it returns, and returns http.ErrServerClosed after Shutdown
// or Close.
func (s *Server) Serve(l net.Listener) error {
	defer l.Close()
	if !s.trackListener(&l, true) {
		return http.ErrServerClosed
	}
	defer s.trackListener(&l, false)

	base := context.Background()
	if s.BaseContext != nil {
		if base = s.BaseContext(l); base == nil {
			panic("h1: BaseContext returned a nil context")
		}
	}
	var backoff time.Duration
	for {
		rwc, err := l.Accept()
		if err != nil {
			if s.closing.Load() {
				return http.ErrServerClosed
			}
			// Resource exhaustion (EMFILE and the like) passes; wait and retry.
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.logger().Warn("h1: accept failed; retrying", "err", err, "delay", backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		if c := s.newConn(rwc, base); c != nil {
			go c.serve()
		}
	}
}

// trackListener adds or removes l; adding fails once the server is closing.
func (s *Server) trackListener(l *net.Listener, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !add {
		delete(s.listeners, l)
		return true
	}
	if s.closing.Load() {
		return false
	}
	if s.listeners == nil {
		s.listeners = make(map[*net.Listener]struct{})
	}
	s.listeners[l] = struct{}{}
	return true
}

// Shutdown stops accepting, closes idle connections and lets active requests
// (long streams included) finish; their connections close after the current
// response. It returns when every connection is closed, or ctx.Err() when ctx
// ends first (the remaining connections are left to finish; call Close to
// cut them).
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	s.mu.Lock()
	s.closeListenersLocked()
	if s.connGone == nil {
		s.connGone = make(chan struct{}, 1)
	}
	gone := s.connGone
	s.mu.Unlock()
	for {
		s.mu.Lock()
		for c := range s.conns {
			// An idle connection is between requests: close it now. An
			// active one sees closing after its response and closes itself.
			if c.state.CompareAndSwap(stateIdle, stateClosed) {
				c.rwc.Close()
			}
		}
		n := len(s.conns)
		s.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-gone:
		}
	}
}

// Close closes the listeners and every connection now, and cancels the
// contexts of the requests in flight. It does not wait for handlers to
// return.
func (s *Server) Close() error {
	s.closing.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.closeListenersLocked()
	for c := range s.conns {
		c.state.Store(stateClosed)
		c.rwc.Close()
		c.cancelActive()
	}
	return err
}

func (s *Server) closeListenersLocked() error {
	var first error
	for l := range s.listeners {
		if err := (*l).Close(); err != nil && first == nil && !errors.Is(err, net.ErrClosed) {
			first = err
		}
		delete(s.listeners, l)
	}
	return first
}

// Connection states, for Shutdown.
const (
	stateIdle   int32 = iota // waiting for a request's first byte
	stateActive              // reading, serving or answering a request
	stateClosed              // closed by Shutdown or Close
)

// connBufs are the per-connection buffers, pooled across connections.
type connBufs struct {
	br   *bufio.Reader
	bw   *bufio.Writer
	wbuf []byte // response header fields and the not yet committed body
}

var bufsPool = sync.Pool{New: func() any {
	return &connBufs{
		br:   bufio.NewReaderSize(nil, bufSize),
		bw:   bufio.NewWriterSize(nil, bufSize),
		wbuf: make([]byte, 0, 2*bufSize),
	}
}}

type conn struct {
	srv        *Server
	rwc        net.Conn
	remoteAddr string
	ctx        context.Context // base context plus the local address
	bufs       *connBufs
	br         *bufio.Reader
	bw         *bufio.Writer
	state      atomic.Int32
	peerGone   atomic.Bool // the disconnect watch saw EOF or an error
	// baseCancelable: ctx can end on its own (a BaseContext that does), so its requests' contexts
	// can be canceled without exchange.cancel (see watchUpstream).
	baseCancelable bool
	linger         bool // unread input remains: shut the write side and drain before closing
	// rc waits for readability without reading (flushThenAwait); nil when rwc has no descriptor.
	rc           syscall.RawConn
	waitFn       func(uintptr) bool // c.waitStep, made once
	pendingFlush bool               // the previous response is still in bw (finish left it to awaitRequest)
	waitPhase    int                // waitStep's progress: 0 not called, 1 flushed and waiting, 2 woken, 3 closing
	waitErr      error              // the flush's error inside waitStep
	// rdl is the read deadline last set (zero: none). Setting one is a runtime timer update, so
	// the serving goroutine skips sets that would not change it meaningfully (setReadDeadline);
	// the disconnect watch clears it under mu before its read, and stopWatch poisons it.
	rdl time.Time

	// mu guards the fields below, shared with the disconnect watch and Close.
	mu           sync.Mutex
	active       *exchange // the request being served, nil between requests
	watch        watchState
	watchTimer   *time.Timer   // created on first use
	timerPending bool          // watchTimer is scheduled
	reqStart     time.Time     // when the active request's handler started
	watchDone    chan struct{} // one token per watch run
	idleSince    time.Time     // serving goroutine only: when awaitRequest began
	waiting      bool          // in flushThenAwait's wait (see checkWaitingLocked)
	waitStart    time.Time
	waitChecked  bool // the timer looked at this wait's input already
	poked        bool // it found input pending and ended the wait
}

func (s *Server) newConn(rwc net.Conn, base context.Context) *conn {
	c := &conn{
		srv:        s,
		rwc:        rwc,
		remoteAddr: rwc.RemoteAddr().String(),
		ctx:        context.WithValue(base, http.LocalAddrContextKey, rwc.LocalAddr()),
		watchDone:  make(chan struct{}, 1),
	}
	c.baseCancelable = base.Done() != nil
	if sc, ok := rwc.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			c.rc, c.waitFn = rc, c.waitStep
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		rwc.Close()
		return nil
	}
	if s.conns == nil {
		s.conns = make(map[*conn]struct{})
	}
	s.conns[c] = struct{}{}
	return c
}

func (c *conn) serve() {
	c.bufs = bufsPool.Get().(*connBufs)
	c.br, c.bw = c.bufs.br, c.bufs.bw
	c.br.Reset(c.rwc)
	c.bw.Reset(c.rwc)
	defer c.close()
	for {
		if !c.awaitRequest() {
			return
		}
		if !c.serveOne() {
			return
		}
	}
}

// goIdle marks the connection idle between requests once the previous response is out, and
// reports false when the server is closing (the connection then closes).
func (c *conn) goIdle() bool {
	c.state.Store(stateIdle)
	return !c.srv.closing.Load() // pairs with Shutdown's CAS on the state
}

// awaitRequest waits (up to the idle timeout) for the next request's first
// byte, then arms the header timeout, counted from that byte. It reports
// false when the connection should close instead.
func (c *conn) awaitRequest() bool {
	if c.br.Buffered() == 0 {
		now := time.Now()
		c.idleSince = now // flushThenAwait's wait starts now too: one clock read for both
		want := now.Add(c.srv.idleTimeout())
		// An idle deadline a recent request set is kept: closing an idle connection up to a
		// second early is harmless, and keep-alive clients would otherwise pay a timer update
		// for every request.
		if c.rdl.IsZero() || c.rdl.After(want) || want.Sub(c.rdl) > time.Second {
			c.setReadDeadline(want)
		}
		if c.pendingFlush && c.rc != nil {
			if !c.flushThenAwait() {
				return false
			}
		} else if !c.flushPending() || !c.goIdle() {
			return false
		}
		if _, err := c.br.Peek(1); err != nil {
			return false
		}
	} else if !c.flushPending() || !c.goIdle() {
		return false
	}
	if !c.state.CompareAndSwap(stateIdle, stateActive) {
		return false // Shutdown closed us while idle
	}
	// A header block already in the buffer parses without reading: no header deadline needed.
	// (Without ReadHeaderTimeout the idle deadline bounds a slow header instead.)
	if rht := c.srv.ReadHeaderTimeout; rht > 0 && !headerBuffered(c.br) {
		c.setReadDeadline(time.Now().Add(rht))
	}
	return true
}

// setReadDeadline sets the connection's read deadline and remembers it.
func (c *conn) setReadDeadline(t time.Time) {
	c.rwc.SetReadDeadline(t)
	c.rdl = t
}

// headerBuffered reports whether br holds a complete request head (up to the empty line).
func headerBuffered(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.Contains(b, []byte("\r\n\r\n")) || bytes.Contains(b, []byte("\n\n"))
}

func (c *conn) close() {
	c.mu.Lock()
	if c.watchTimer != nil {
		c.watchTimer.Stop()
	}
	c.mu.Unlock()
	if c.linger {
		c.bw.Flush()
		lingerClose(c.rwc)
	}
	c.rwc.Close()
	c.br.Reset(nil)
	c.bw.Reset(nil)
	if cap(c.bufs.wbuf) > 4*bufSize { // a handler grew it: do not pool the big one
		c.bufs.wbuf = make([]byte, 0, 2*bufSize)
	}
	bufsPool.Put(c.bufs)
	c.bufs, c.br, c.bw = nil, nil, nil

	s := c.srv
	s.mu.Lock()
	delete(s.conns, c)
	gone := s.connGone
	s.mu.Unlock()
	if gone != nil {
		select {
		case gone <- struct{}{}:
		default:
		}
	}
}

// lingerClose shuts the write side and reads what the client still sends
// (bounded in time and bytes), so that closing with unread input does not
// reset the connection before the client read our answer.
func lingerClose(rwc net.Conn) {
	if cw, ok := rwc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	rwc.SetReadDeadline(time.Now().Add(lingerTime))
	io.CopyN(io.Discard, rwc, lingerBytes)
}

// cancelActive cancels the context of the request being served, if any.
func (c *conn) cancelActive() {
	c.mu.Lock()
	ex := c.active
	c.mu.Unlock()
	if ex != nil {
		ex.cancel()
	}
}

// answerError writes an error response the server itself produces (before
// any handler ran) and marks the connection to close.
func (c *conn) answerError(status int, detail string) {
	if log := c.srv.logger(); log.Enabled(context.Background(), slog.LevelDebug) {
		log.Debug("h1: rejected request", "remote", c.remoteAddr, "status", status, "detail", detail)
	}
	c.bw.Write(appendErrorResponse(c.bw.AvailableBuffer(), c.srv.ErrorBody, status, detail))
	c.bw.Flush()
	c.linger = true
}

// appendErrorResponse renders a complete response with Connection: close.
func appendErrorResponse(b []byte, render func(int, string) (string, []byte), status int, detail string) []byte {
	var ctype string
	var body []byte
	if render != nil {
		ctype, body = render(status, detail)
	} else {
		ctype = "text/plain; charset=utf-8"
		body = []byte(itoa(status) + " " + statusText(status) + ": " + detail)
	}
	b = appendStatusLine(b, status)
	if render == nil {
		// The detail may quote request bytes: never let a browser sniff it.
		b = append(b, "X-Content-Type-Options: nosniff\r\n"...)
	}
	if ctype != "" && !hasCRLF(ctype) {
		b = append(b, "Content-Type: "...)
		b = append(b, ctype...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "Content-Length: "...)
	b = appendInt(b, int64(len(body)))
	b = append(b, "\r\nDate: "...)
	b = appendDate(b)
	b = append(b, "\r\nConnection: close\r\n\r\n"...)
	return append(b, body...)
}
