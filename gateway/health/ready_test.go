package health

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestReadyAndStateChangeLog: Ready is Excluded, then every event rank connected; each change of
// Excluded writes exactly one line (WARN excluded with the reason, INFO back), none while nothing
// changes.
func TestReadyAndStateChangeLog(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	e := NewEndpoint("e0", "http://127.0.0.1:1", BreakerConfig{FailureThreshold: 2, OpenFor: time.Second})
	e.Breaker.now = c.now
	var buf bytes.Buffer
	e.SetLog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})))
	lines := func() []string {
		s := strings.TrimSpace(buf.String())
		buf.Reset()
		if s == "" {
			return nil
		}
		return strings.Split(s, "\n")
	}
	expect := func(step string, ready Reason, want ...string) {
		t.Helper()
		if got := e.Ready(); got != ready {
			t.Fatalf("%s: Ready %q, want %q", step, got, ready)
		}
		got := lines()
		if len(got) != len(want) {
			t.Fatalf("%s: log %q, want %d lines with %q", step, got, len(want), want)
		}
		for i := range want {
			if !strings.Contains(got[i], want[i]) {
				t.Fatalf("%s: log line %q lacks %q", step, got[i], want[i])
			}
		}
	}
	expect("fresh", NotExcluded)

	e.Breaker.Acquire()
	e.Breaker.Report(TransportFailure, 0)
	expect("one failure", NotExcluded, "level=WARN msg=\"endpoint unreachable")
	e.Breaker.Acquire()
	e.Breaker.Report(Success, 200)
	expect("answered again", NotExcluded, "level=INFO msg=\"endpoint back in rotation\" was=unreachable")
	e.Breaker.Acquire()
	e.Breaker.Report(TransportFailure, 0)
	expect("failing again", NotExcluded, "endpoint unreachable")
	e.Breaker.Acquire()
	e.Breaker.Report(TransportFailure, 0)
	expect("breaker opens", BreakerOpen, "level=WARN msg=\"endpoint excluded from routing\" reason=breaker_open was=unreachable")
	e.Breaker.Report(TransportFailure, 0)
	e.note()
	expect("still open", BreakerOpen)

	e.SetAdminDown(true)
	expect("admin down", AdminDown, "reason=admin_down was=breaker_open")
	e.SetAdminDown(false)
	expect("admin up, breaker still open", BreakerOpen, "reason=breaker_open was=admin_down")

	c.t = c.t.Add(time.Second) // OpenFor runs out: half-open admits trials
	expect("open for runs out, unnoticed", NotExcluded)
	e.note() // what each probe round does
	expect("noticed", NotExcluded, "level=INFO msg=\"endpoint back in rotation\" was=breaker_open breaker=half-open")

	e.SetEventRanks(2)
	expect("two ranks, none connected", EventsUnsynced)
	e.SetEventState(0, EventsSynced)
	expect("one of two", EventsUnsynced)
	e.SetEventState(1, EventsSynced)
	expect("both", NotExcluded)
	e.SetEventState(1, EventsDown)
	expect("one lost", EventsUnsynced)
	e.SetEventState(5, EventsSynced) // no such rank: ignored
	expect("unknown rank", EventsUnsynced)
	e.SetEventRanks(1) // rank 1 gone; rank 0 stays connected
	expect("one rank", NotExcluded)
	e.SetEventRanks(0)
	expect("no events", NotExcluded)

	e.SetDraining(true)
	expect("draining", Draining, "reason=draining")
	e.SetDraining(false)
	expect("drained", NotExcluded, "endpoint back in rotation")
}

// TestEventSyncStates: a rank that is connected but still replaying is not ready
// (events_syncing); a lost one is events_unsynced, which wins over syncing; EverSynced turns true
// only once every rank has been synchronized, stays true after a loss, and a newly declared rank
// turns it false until that rank is synchronized too.
func TestEventSyncStates(t *testing.T) {
	e := NewEndpoint("e0", "http://127.0.0.1:1", BreakerConfig{FailureThreshold: 1, OpenFor: time.Second})
	check := func(step string, ready Reason, ever, now bool) {
		t.Helper()
		if got := e.Ready(); got != ready {
			t.Fatalf("%s: Ready %q, want %q", step, got, ready)
		}
		if got := e.EverSynced(); got != ever {
			t.Fatalf("%s: EverSynced %v, want %v", step, got, ever)
		}
		if got := e.EventsSynchronized(); got != now {
			t.Fatalf("%s: EventsSynchronized %v, want %v", step, got, now)
		}
	}
	check("no events", NotExcluded, true, true)
	e.SetEventRanks(2)
	check("declared", EventsUnsynced, false, false)
	e.SetEventState(0, EventsReplaying)
	e.SetEventState(1, EventsReplaying)
	check("both replaying", EventsSyncing, false, false)
	e.SetEventState(0, EventsSynced)
	check("one replayed", EventsSyncing, false, false)
	e.SetEventState(1, EventsDown)
	check("one replayed, one lost", EventsUnsynced, false, false)
	e.SetEventState(1, EventsSynced)
	check("both synced", NotExcluded, true, true)
	e.SetEventState(1, EventsDown)
	check("lost after sync", EventsUnsynced, true, false)
	e.SetEventState(1, EventsReplaying)
	check("replaying after the loss", EventsSyncing, true, false)
	e.SetEventState(1, EventsSynced)
	check("resynced", NotExcluded, true, true)
	e.SetEventRanks(3)
	check("a third rank", EventsUnsynced, false, false)
	e.SetEventState(2, EventsSynced)
	check("third synced", NotExcluded, true, true)
	e.SetEventRanks(1)
	check("back to one", NotExcluded, true, true)
}
