package gateway

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/exactness"
	"github.com/kvexact/kvexact/gateway/ingest"
	"github.com/kvexact/kvexact/gateway/route"
)

// TestHistoryIsNoRestart: a cache clear replayed on the first connect happened before the gateway
// was there (ctk certify clears every engine) and restarts nothing; a clear after it, or replayed on
// a reconnect, makes the endpoint unverified; a gap does not.
func TestHistoryIsNoRestart(t *testing.T) {
	x := newEndpointExact("r", &route.Endpoint{Name: "e0"}, exactness.Config{}, true, "certified (engine)", time.Now, nil, nil)
	g := &Gateway{log: slog.New(slog.DiscardHandler)}
	ew, err := g.newEndpointWatch(x, "vllm", 16, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	ew.reconnect = nil
	cleared := &engines.Event{Kind: engines.AllBlocksCleared}
	ew.trace(ingest.Trace{Type: "connect", Count: 1})
	ew.trace(ingest.Trace{Type: "replay", Reason: "requested"})
	ew.trace(ingest.Trace{Type: "event", Event: cleared})
	if x.held(exactness.Restart) {
		t.Fatal("a clear from the first replay (history) made the endpoint unverified")
	}
	ew.trace(ingest.Trace{Type: "replay", Reason: "completed"})
	ew.trace(ingest.Trace{Type: "clear", Reason: "gap"})
	if x.held(exactness.Restart) {
		t.Fatal("a sequence gap made the endpoint unverified")
	}
	ew.trace(ingest.Trace{Type: "event", Event: cleared})
	if !x.held(exactness.Restart) || x.ep.Fenced() == "" {
		t.Fatal("a live clear did not make the endpoint unverified")
	}
	x.apply(exactness.Evidence{Type: exactness.Certified})
	ew.trace(ingest.Trace{Type: "connect", Count: 2})
	ew.trace(ingest.Trace{Type: "replay", Reason: "requested"})
	ew.trace(ingest.Trace{Type: "clear", Reason: "regression"})
	if !x.held(exactness.Restart) {
		t.Fatal("a regression replayed on a reconnect did not make the endpoint unverified")
	}
}

// TestNewProcessSeenOnStreamFirst: an engine's event sockets answer before its HTTP server (vLLM
// binds its publisher while its API server still starts), so on a restart the event stream shows
// the new process first: the reconnect's replay no longer holds the last message applied, the
// inventory is cleared and the restart evidence raised, and the new process's blocks are learned.
// When the identity (process_start_time_seconds) shows the same process later, at the next
// re-probe, it must not drop those blocks, nor raise the restart a second time. A new process the
// stream did not show (its sequence continued, or it published nothing yet) still drops the
// inventory and is a restart.
func TestNewProcessSeenOnStreamFirst(t *testing.T) {
	var start atomic.Int64
	start.Store(time.Now().Add(-time.Hour).UnixMicro())
	var up atomic.Bool
	up.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %f\n", float64(start.Load())/1e6)
	}))
	defer srv.Close()
	x, g, ew, drops := identityWatch(t, srv.URL)
	ctx := t.Context()
	ew.trace(ingest.Trace{Type: "connect", Count: 1})
	ew.trace(ingest.Trace{Type: "replay", Reason: "requested"})
	ew.trace(ingest.Trace{Type: "replay", Reason: "completed"})
	g.probeProcess(ctx, ew) // the process as the rule starts
	if *drops != 0 || x.restarts != 0 {
		t.Fatalf("first identity read: %d drops, %d restarts", *drops, x.restarts)
	}

	// The engine restarts: its HTTP server is not up yet when the stream reconnects and the
	// replay shows the new publisher.
	up.Store(false)
	start.Store(time.Now().Add(-time.Second).UnixMicro())
	ew.trace(ingest.Trace{Type: "connect", Count: 2})
	g.probeProcess(ctx, ew) // the reconnect's identity check: nothing to read yet
	ew.trace(ingest.Trace{Type: "replay", Reason: "requested"})
	ew.trace(ingest.Trace{Type: "clear", Reason: "publisher_restart"})
	ew.trace(ingest.Trace{Type: "replay", Reason: "completed"})
	if x.restarts != 1 || !x.held(exactness.Restart) {
		t.Fatalf("the stream's restart: %d restarts, held %v", x.restarts, x.held(exactness.Restart))
	}
	// The new process's blocks are learned; its verification lifts the hold.
	x.apply(exactness.Evidence{Type: exactness.Certified})
	up.Store(true)
	g.probeProcess(ctx, ew) // the next re-probe reads the new process's start time
	if *drops != 0 {
		t.Fatal("the identity dropped the inventory the stream had rebuilt from the new process")
	}
	if x.restarts != 1 || x.held(exactness.Restart) {
		t.Fatalf("the identity raised the stream's restart again: %d restarts, held %v", x.restarts, x.held(exactness.Restart))
	}

	// A new process the stream did not show: dropped and unverified.
	time.Sleep(10 * time.Millisecond)
	start.Store(time.Now().UnixMicro())
	g.probeProcess(ctx, ew)
	if *drops != 1 || x.restarts != 2 || !x.held(exactness.Restart) {
		t.Fatalf("a new process seen only on its identity: %d drops, %d restarts, held %v", *drops, x.restarts, x.held(exactness.Restart))
	}

	// A reconnect without replay clears the inventory but raises no restart: a new process seen
	// after it keeps the inventory (nothing of the old connection is in it) and is a restart.
	x.apply(exactness.Evidence{Type: exactness.Certified})
	time.Sleep(10 * time.Millisecond)
	start.Store(time.Now().UnixMicro())
	time.Sleep(10 * time.Millisecond)
	ew.trace(ingest.Trace{Type: "connect", Count: 3})
	ew.trace(ingest.Trace{Type: "clear", Reason: "reconnect"})
	g.probeProcess(ctx, ew)
	if *drops != 1 || x.restarts != 3 || !x.held(exactness.Restart) {
		t.Fatalf("a new process after a reconnect's clear: %d drops, %d restarts, held %v", *drops, x.restarts, x.held(exactness.Restart))
	}
}

func TestVersionChangeIsARestart(t *testing.T) {
	var p processIdentity
	if p.checkVersion("0.25.1") != "" || p.checkVersion("0.25.1") != "" || p.checkVersion("") != "" {
		t.Fatal("first or unchanged version reported as a change")
	}
	if why := p.checkVersion("0.25.2"); why == "" {
		t.Fatal("a changed /version went unnoticed")
	}
}

func TestScanGauge(t *testing.T) {
	body := "# HELP x\nprocess_start_time_seconds_total 3\nprocess_start_time_seconds 1.7961193e+09\nother 1\n"
	if v, ok := scanGauge(strings.NewReader(body), processStartMetric); !ok || v != 1.7961193e9 {
		t.Fatalf("scanGauge = %v %v", v, ok)
	}
	if _, ok := scanGauge(strings.NewReader("other 1\n"), processStartMetric); ok {
		t.Fatal("absent metric found")
	}
}

// TestSeenOnStreamClockBoundary pins the identity check's clock boundary: a new process keeps the
// inventory only when the stream's restart clear came at or after the process start. A clear at
// exactly the start (the metric's microseconds) keeps it, one microsecond before drops it, and a
// start the engine does not state (0: a /version change on an engine without
// process_start_time_seconds) drops it whatever the stream saw.
func TestSeenOnStreamClockBoundary(t *testing.T) {
	oldStart := time.Now().Add(-time.Hour).UnixMicro()
	newStart := time.Now().Add(-time.Second).UnixMicro()
	for _, c := range []struct {
		name        string
		clearAt     int64 // Unix microseconds of the stream's restart clear
		start       int64 // the new process's start (0: not stated)
		wantDrops   int
		wantRestart bool
	}{
		{"a clear at exactly the start keeps the inventory", newStart, newStart, 0, false},
		{"a clear one microsecond before the start drops it", newStart - 1, newStart, 1, true},
		{"a start not stated drops it", time.Now().UnixMicro(), 0, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var start atomic.Int64
			start.Store(oldStart)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				us := start.Load()
				if us == 0 {
					return // no process collector
				}
				fmt.Fprintf(w, "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %d.%06d\n", us/1e6, us%1e6)
			}))
			defer srv.Close()
			x, g, ew, drops := identityWatch(t, srv.URL)
			if c.start == 0 {
				ew.proc.checkVersion("0.31.0")
			} else {
				g.probeProcess(t.Context(), ew) // the old process
			}

			ew.streamCleared(time.UnixMicro(c.clearAt), true)
			if c.start == 0 {
				start.Store(0)
				ew.newProcess(ew.proc.checkVersion("0.31.1")) // as the re-probe reads a new /version
			} else {
				start.Store(c.start)
				g.probeProcess(t.Context(), ew)
			}
			if got := ew.proc.started(); got != float64(c.start)/1e6 {
				t.Fatalf("the identity read start %f, want %f", got, float64(c.start)/1e6)
			}
			if *drops != c.wantDrops || (x.restarts == 1) != c.wantRestart || x.held(exactness.Restart) != c.wantRestart {
				t.Fatalf("%d drops, %d restarts, held %v; want %d drops, restart %v", *drops, x.restarts, x.held(exactness.Restart), c.wantDrops, c.wantRestart)
			}
		})
	}
}

// identityWatch is an endpoint's watch on a vLLM engine at url, its reconnects and verification off
// and its inventory drops counted in *drops.
func identityWatch(t *testing.T, url string) (*endpointExact, *Gateway, *endpointWatch, *int) {
	t.Helper()
	x := newEndpointExact("r", &route.Endpoint{Name: "e0", Address: url}, exactness.Config{}, true, "certified (engine)", time.Now, nil, nil)
	g := &Gateway{log: slog.New(slog.DiscardHandler)}
	ew, err := g.newEndpointWatch(x, "vllm", 16, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	ew.reconnect, ew.verify = nil, nil
	drops := new(int)
	ew.drop = func() { *drops++ }
	return x, g, ew, drops
}

// TestReconnectIdentityWaitsForHTTP: on a restart the event stream reconnects before the engine's
// HTTP server answers, and the reconnect's clear carries no restart sign. The reconnect's identity
// check keeps reading /metrics until it answers, then sees the new process and raises the restart
// with no periodic re-probe; a newer reconnect ends the older wait.
func TestReconnectIdentityWaitsForHTTP(t *testing.T) {
	var start atomic.Int64
	start.Store(time.Now().Add(-time.Hour).UnixMicro())
	var up atomic.Bool
	up.Store(true)
	var reads atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reads.Add(1)
		if !up.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %f\n", float64(start.Load())/1e6)
	}))
	defer srv.Close()
	x, g, ew, _ := identityWatch(t, srv.URL)
	g.probeProcess(t.Context(), ew) // the process as the rule starts
	restarts := func() uint64 { x.mu.Lock(); defer x.mu.Unlock(); return x.restarts }

	up.Store(false)
	start.Store(time.Now().UnixMicro())
	older := make(chan struct{})
	go func() { g.awaitProcess(t.Context(), ew); close(older) }()
	for deadline := time.Now().Add(10 * time.Second); reads.Load() < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the identity wait read /metrics %d times in 10s while the engine started; it must retry", reads.Load()-1)
		}
	}
	if n := restarts(); n != 0 {
		t.Fatalf("%d restarts before the engine's HTTP server answered", n)
	}
	newer := make(chan struct{})
	go func() { g.awaitProcess(t.Context(), ew); close(newer) }()
	select {
	case <-older:
	case <-time.After(10 * time.Second):
		t.Fatal("a newer reconnect did not end the older identity wait")
	}
	up.Store(true)
	select {
	case <-newer:
	case <-time.After(10 * time.Second):
		t.Fatal("the identity wait did not end once /metrics answered")
	}
	if n := restarts(); n != 1 || !x.held(exactness.Restart) {
		t.Fatalf("the new process seen once /metrics answered: %d restarts, held %v", n, x.held(exactness.Restart))
	}
}
