package h1

import (
	"context"
	"errors"
	"net/http"
	"os"
	"syscall"
	"time"
)

// serveOne reads one request, runs the handler and completes the response.
// It reports whether the connection can serve another request.
func (c *conn) serveOne() bool {
	// The request is assembled on the stack and copied once by WithContext,
	// the only way to give it a context.
	var tmpl http.Request
	ex := &exchange{c: c}
	if err := readRequest(c.br, c.srv.maxHeaderBytes(), &tmpl, &ex.info); err != nil {
		var re *requestError
		if errors.As(err, &re) {
			c.answerError(re.status, re.detail)
		}
		return false
	}
	// A body that is not all in the buffer may take its time: no deadline while the handler
	// reads it. (The disconnect watch clears the deadline itself when it starts.)
	if !c.rdl.IsZero() && (ex.info.bodyKind == bodyChunked || ex.info.bodyKind == bodyLength && tmpl.ContentLength > int64(c.br.Buffered())) {
		c.setReadDeadline(time.Time{})
	}
	tmpl.RemoteAddr = c.remoteAddr
	if ex.info.bodyKind == bodyNone {
		tmpl.Body = http.NoBody
		ex.bodyEOF = true
	} else {
		ex.body.init(c.br, ex.info.bodyKind, tmpl.ContentLength, c.srv.maxHeaderBytes())
		ex.body.ex = ex
		tmpl.Body = &ex.body
	}
	ctx, cancel := context.WithCancel(c.ctx)
	ex.ctx = requestContext{Context: ctx, ex: ex}
	ex.cancelCtx = cancel
	ex.req = tmpl.WithContext(&ex.ctx)

	h := c.srv.Handler
	if ex.info.optionsStar {
		h = optionsStar
	}
	c.startWatch(ex)
	p := run(h, ex, ex.req)
	c.stopWatch()
	ex.done.Store(true)
	ex.cancel()
	keep := false
	if p != nil {
		ex.abort(p)
	} else {
		keep = ex.finish()
	}
	c.mu.Lock()
	c.active = nil
	c.mu.Unlock()
	return keep
}

// requestContext is a request's context: a context.WithCancel of the connection's context that
// also knows its exchange, so that a Transport exchange running under it (same package) can have
// the server interrupt its upstream connection on cancellation, instead of registering a
// context.AfterFunc per request (an allocation, a map entry and a removal each time).
type requestContext struct {
	context.Context
	ex *exchange
}

// cancel cancels the request's context and interrupts the upstream connection registered with
// watchUpstream, if any.
func (ex *exchange) cancel() {
	ex.upMu.Lock()
	ex.canceled = true
	up := ex.upstream
	ex.upstream = nil
	ex.upMu.Unlock()
	ex.cancelCtx()
	if up != nil {
		up.interrupt()
	}
}

// watchUpstream registers cc to be interrupted when the request is canceled. It reports false
// when it cannot stand in for context.AfterFunc: the request is already canceled, another upstream
// exchange is registered, or the context can also be canceled from above (a BaseContext that ends),
// which this watch would not see.
func (ex *exchange) watchUpstream(cc *clientConn) bool {
	if ex.c.baseCancelable {
		return false
	}
	ex.upMu.Lock()
	defer ex.upMu.Unlock()
	if ex.canceled || ex.upstream != nil {
		return false
	}
	ex.upstream = cc
	return true
}

// unwatchUpstream ends watchUpstream's registration; false means cancel already took it (and
// interrupted cc), like a context.AfterFunc stop that comes too late.
func (ex *exchange) unwatchUpstream(cc *clientConn) bool {
	ex.upMu.Lock()
	defer ex.upMu.Unlock()
	if ex.upstream != cc {
		return false
	}
	ex.upstream = nil
	return true
}

// run calls the handler and returns what it panicked with, if anything.
func run(h http.Handler, w http.ResponseWriter, r *http.Request) (p any) {
	defer func() { p = recover() }()
	h.ServeHTTP(w, r)
	return nil
}

// optionsStar answers "OPTIONS *" (RFC 9110 §9.3.7), as net/http does.
var optionsStar = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusOK)
})

// The disconnect watch. A request that runs past DisconnectCheckAfter gets
// one background read on its connection (a Peek into the connection's
// bufio.Reader, so bytes of a pipelined request are kept, not lost); EOF or
// an error cancels the request's context.
//
// The timer is one per connection and is not reset per request: resetting a
// timer to fire earlier than everything else pending wakes the runtime's
// network poller, which cost more than the rest of a small request. Instead
// each request records its start, and a firing timer re-arms itself for the
// remaining time of the request then running, or lapses between requests.
//
// The timer has a second job between requests: flushThenAwait's wait cannot see
// input that arrived while the handler ran, so the timer looks for it once
// (checkWaitingLocked).
type watchState uint8

const (
	watchOff     watchState = iota
	watchArmed              // a request runs; its watch is due at reqStart+d
	watchPending            // due, but the request body is not read yet
	watchRunning            // the background read is under way
)

// watchStopDeadline is a read deadline that interrupts a blocked read at once.
var watchStopDeadline = time.Unix(1, 0)

func (c *conn) startWatch(ex *exchange) {
	d := c.srv.disconnectCheckAfter()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.active = ex
	c.watch = watchArmed
	if d < 0 {
		c.fireLocked()
		return
	}
	c.reqStart = time.Now()
	c.armLocked(d) // a pending timer fires within d and re-arms for this request
}

// fire runs on the timer's goroutine.
func (c *conn) fire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timerPending = false
	if c.checkWaitingLocked() {
		return // between requests, in flushThenAwait's wait
	}
	if c.watch != watchArmed {
		return // between requests, or this request's watch already started
	}
	if left := c.srv.disconnectCheckAfter() - time.Since(c.reqStart); left > 0 {
		c.timerPending = true // a later request than the one the timer was set for
		c.watchTimer.Reset(left)
		return
	}
	c.fireLocked()
}

// fireLocked starts the background read if the request body is done, or
// leaves it to bodyDone.
func (c *conn) fireLocked() {
	ex := c.active
	if !ex.bodyEOF {
		c.watch = watchPending
		return
	}
	c.startWatchReadLocked(ex)
}

// startWatchReadLocked starts the background read, without a deadline: a stream may outlive any
// idle deadline and must stay watched. stopWatch, which changes the state under mu after this,
// interrupts the read with a past deadline.
func (c *conn) startWatchReadLocked(ex *exchange) {
	c.watch = watchRunning
	if !c.rdl.IsZero() {
		c.setReadDeadline(time.Time{})
	}
	go c.watchRead(ex)
}

// bodyDone is called when the request body was read to its end.
func (c *conn) bodyDone(ex *exchange) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ex.bodyEOF = true
	if c.watch == watchPending && c.active == ex {
		c.startWatchReadLocked(ex)
	}
}

func (c *conn) watchRead(ex *exchange) {
	// The handler does not touch br any more (its body is done), and the
	// serving goroutine waits in stopWatch before it reads again.
	_, err := c.br.Peek(1)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		c.peerGone.Store(true)
		ex.cancel()
	}
	c.watchDone <- struct{}{}
}

// stopWatch ends the watch of the current request and waits for its read.
// The read deadline it leaves is reset by the next awaitRequest. A pending
// timer is left to lapse.
func (c *conn) stopWatch() {
	c.mu.Lock()
	st := c.watch
	c.watch = watchOff
	c.mu.Unlock()
	if st == watchRunning {
		c.setReadDeadline(watchStopDeadline)
		<-c.watchDone
	}
}

// flushPending sends the previous response if awaitRequest was left to flush it.
func (c *conn) flushPending() bool {
	if !c.pendingFlush {
		return true
	}
	c.pendingFlush = false
	return c.bw.Flush() == nil
}

// flushThenAwait sends the previous response and waits until the next request can be read, so
// that the read that follows finds it: a read attempted at once, as net.Conn does, fails with
// EAGAIN and parks on nearly every keep-alive request — a wasted system call each time.
//
// The flush runs inside RawConn.Read's callback. RawConn.Read forgets earlier readiness before its
// first callback; a client that waits for our answer sends its next request after the flush, so
// that readiness is seen. What could have come before — a pipelined request or a close that
// arrived while the handler ran — would wait unseen: the watch timer covers that case (fire calls
// checkWaitingLocked), which looks once, disconnectCheckAfter into the wait, whether input is pending,
// and ends the wait if so. Such input is served late by up to that delay, never lost.
func (c *conn) flushThenAwait() bool {
	c.waitPhase = 0
	err := c.rc.Read(c.waitFn)
	c.mu.Lock()
	poked := c.poked
	c.waiting, c.poked = false, false
	c.mu.Unlock()
	switch {
	case c.waitPhase == 0: // RawConn.Read failed before calling back: flush the plain way
		return c.flushPending() && c.goIdle()
	case c.waitErr != nil || c.waitPhase == 3: // the flush failed, or the server is closing
		return false
	case err != nil && !poked:
		return false // idle timeout, or Shutdown/Close closed us
	case poked:
		c.rwc.SetReadDeadline(c.rdl) // undo the poke's past deadline
	}
	return true
}

// waitStep is flushThenAwait's RawConn.Read callback.
func (c *conn) waitStep(uintptr) bool {
	switch c.waitPhase {
	case 0:
		c.waitPhase, c.pendingFlush = 1, false
		if c.waitErr = c.bw.Flush(); c.waitErr != nil {
			return true
		}
		if !c.goIdle() {
			c.waitPhase = 3
			return true
		}
		c.mu.Lock()
		c.waiting, c.waitChecked, c.waitStart = true, false, c.idleSince
		c.armLocked(c.srv.disconnectCheckAfter())
		c.mu.Unlock()
		return false
	default:
		c.waitPhase = 2
		return true
	}
}

// checkWaitingLocked is the watch timer's look at a connection in flushThenAwait's wait: once per
// wait, after disconnectCheckAfter, it peeks whether input is pending and, if so, ends the wait
// with a past read deadline (flushThenAwait undoes it). It reports whether the timer fired for
// such a wait (and has nothing else to do).
func (c *conn) checkWaitingLocked() bool {
	if !c.waiting || c.waitChecked {
		return false
	}
	d := c.srv.disconnectCheckAfter()
	if left := d - time.Since(c.waitStart); left > 0 {
		c.armLocked(left)
		return true
	}
	c.waitChecked = true
	pending := false
	c.rc.Control(func(fd uintptr) {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		pending = err != syscall.EAGAIN // data, EOF (n == 0) or an error: for the reader to see
	})
	if pending {
		c.poked = true
		c.rwc.SetReadDeadline(watchStopDeadline)
	}
	return true
}

// armLocked makes sure the watch timer fires within d.
func (c *conn) armLocked(d time.Duration) {
	if d < 0 {
		d = 0
	}
	switch {
	case c.timerPending:
	case c.watchTimer == nil:
		c.timerPending = true
		c.watchTimer = time.AfterFunc(d, c.fire)
	default:
		c.timerPending = true
		c.watchTimer.Reset(d)
	}
}
