package health

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestBreakerTransportFailuresOpenAndHeal(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	b := NewBreaker(BreakerConfig{FailureThreshold: 3, OpenFor: 30 * time.Second, HalfOpenRequests: 2, OriginErrorThreshold: 3}, c.now)
	for i := 0; i < 2; i++ {
		if !b.Acquire() {
			t.Fatal("closed breaker refused")
		}
		b.Report(TransportFailure, 0)
	}
	if b.State() != Closed {
		t.Fatalf("opened after 2 of 3 failures")
	}
	b.Acquire()
	b.Report(TransportFailure, 0)
	if b.State() != Open || b.Available() || b.Acquire() {
		t.Fatalf("not open after 3 failures: %v", b.State())
	}
	c.t = c.t.Add(29 * time.Second)
	if b.State() != Open {
		t.Fatal("half-open too early")
	}
	c.t = c.t.Add(time.Second)
	if b.State() != HalfOpen {
		t.Fatalf("not half-open after OpenFor: %v", b.State())
	}
	// Two trials admitted, a third refused.
	if !b.Acquire() || !b.Acquire() || b.Acquire() {
		t.Fatal("half-open trial accounting wrong")
	}
	b.Report(Success, 200)
	if b.State() != Closed {
		t.Fatalf("a successful trial did not close it: %v", b.State())
	}
	if b.Opens() != 1 {
		t.Fatalf("opens = %d", b.Opens())
	}
}

func TestBreakerHalfOpenFailureReopens(t *testing.T) {
	c := &clock{t: time.Unix(0, 0)}
	b := NewBreaker(BreakerConfig{FailureThreshold: 1, OpenFor: time.Second, HalfOpenRequests: 3, OriginErrorThreshold: 3}, c.now)
	b.Acquire()
	b.Report(TransportFailure, 0)
	c.t = c.t.Add(time.Second)
	b.Acquire()
	b.Report(TransportFailure, 0)
	if b.State() != Open || b.Opens() != 2 {
		t.Fatalf("failed trial did not reopen: %v opens=%d", b.State(), b.Opens())
	}
}

func TestBreakerOriginStreak(t *testing.T) {
	b := NewBreaker(BreakerConfig{FailureThreshold: 5, OpenFor: time.Minute, HalfOpenRequests: 1, OriginErrorThreshold: 3}, nil)
	seq := []struct {
		status int
		want   State
	}{
		{500, Closed}, {503, Closed}, {404, Closed}, // 4xx neither advances nor resets
		{502, Open},
	}
	for i, s := range seq {
		b.Acquire()
		b.Report(Success, s.status)
		if got := b.State(); got != s.want {
			t.Fatalf("step %d (status %d): state %v, want %v", i, s.status, got, s.want)
		}
	}
	b2 := NewBreaker(BreakerConfig{FailureThreshold: 5, OpenFor: time.Minute, OriginErrorThreshold: 3}, nil)
	for _, st := range []int{500, 500, 200, 500, 500} { // a 2xx resets the streak
		b2.Acquire()
		b2.Report(Success, st)
	}
	if b2.State() != Closed {
		t.Fatal("2xx did not reset the origin streak")
	}
	b3 := NewBreaker(BreakerConfig{FailureThreshold: 5, OpenFor: time.Minute, OriginErrorThreshold: 0}, nil)
	for i := 0; i < 10; i++ {
		b3.Acquire()
		b3.Report(Success, 500)
	}
	if b3.State() != Closed {
		t.Fatal("OriginErrorThreshold 0 should disable the origin streak")
	}
}

func TestBreakerCanceledIsNeutral(t *testing.T) {
	b := NewBreaker(BreakerConfig{FailureThreshold: 1, OriginErrorThreshold: 1}, nil)
	for i := 0; i < 5; i++ {
		b.Acquire()
		b.Report(Canceled, 0)
	}
	if b.State() != Closed {
		t.Fatal("client cancellations opened the breaker")
	}
}

func TestProberMarksDownAndUp(t *testing.T) {
	var fail atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			t.Errorf("probe path %s", r.URL.Path)
		}
		if fail.Load() {
			w.WriteHeader(503)
		}
	}))
	defer srv.Close()
	e := NewEndpoint("e", srv.URL, BreakerConfig{})
	p := &Prober{Fall: 2, Rise: 1, Timeout: time.Second}
	ctx := context.Background()
	p.Once(ctx, []*Endpoint{e})
	if e.Excluded() != NotExcluded {
		t.Fatalf("healthy endpoint excluded: %s", e.Excluded())
	}
	fail.Store(true)
	p.Once(ctx, []*Endpoint{e})
	if e.Excluded() != NotExcluded {
		t.Fatal("marked down after one failure with Fall=2")
	}
	p.Once(ctx, []*Endpoint{e})
	if e.Excluded() != ProbeDown {
		t.Fatalf("not down after two failures: %q", e.Excluded())
	}
	fail.Store(false)
	p.Once(ctx, []*Endpoint{e})
	if e.Excluded() != NotExcluded {
		t.Fatal("not back up after a success")
	}
	// A refused connection counts as a failure.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	dead := NewEndpoint("dead", "http://"+addr, BreakerConfig{})
	p.Once(ctx, []*Endpoint{dead})
	p.Once(ctx, []*Endpoint{dead})
	if dead.Excluded() != ProbeDown {
		t.Fatal("refused endpoint not marked down")
	}
}

func TestOperatorStates(t *testing.T) {
	e := NewEndpoint("e", "http://127.0.0.1:1", BreakerConfig{})
	e.SetDraining(true)
	if e.Excluded() != Draining {
		t.Fatal("draining not excluded")
	}
	e.SetAdminDown(true)
	if e.Excluded() != AdminDown {
		t.Fatal("admin down must win")
	}
	e.SetAdminDown(false)
	e.SetDraining(false)
	if e.Excluded() != NotExcluded {
		t.Fatal("not restored")
	}
}
