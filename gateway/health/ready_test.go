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
	e.SetEventConnected(0, true)
	expect("one of two", EventsUnsynced)
	e.SetEventConnected(1, true)
	expect("both", NotExcluded)
	e.SetEventConnected(1, false)
	expect("one lost", EventsUnsynced)
	e.SetEventConnected(5, true) // no such rank: ignored
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
