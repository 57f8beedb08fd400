package gateway

import (
	"log/slog"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/ingest"
	"github.com/kvexact/kvexact/gateway/route"
)

// TestHistoryIsNoRestart: a cache clear replayed on the first connect happened before the gateway
// was there (ctk certify clears every engine) and restarts nothing; a clear after it, or replayed on
// a reconnect, makes the endpoint unverified; a gap does not.
func TestHistoryIsNoRestart(t *testing.T) {
	x := newEndpointExact("r", &route.Endpoint{Name: "e0"}, true, "certified (engine)", time.Now, nil)
	g := &Gateway{log: slog.New(slog.DiscardHandler)}
	ew, err := g.newEndpointWatch(x, "vllm", nil)
	if err != nil {
		t.Fatal(err)
	}
	ew.reconnect = nil
	cleared := &engines.Event{Kind: engines.AllBlocksCleared}
	ew.trace(ingest.Trace{Type: "connect", Count: 1})
	ew.trace(ingest.Trace{Type: "replay", Reason: "requested"})
	ew.trace(ingest.Trace{Type: "event", Event: cleared})
	if x.held(holdRestart) {
		t.Fatal("a clear from the first replay (history) made the endpoint unverified")
	}
	ew.trace(ingest.Trace{Type: "replay", Reason: "completed"})
	ew.trace(ingest.Trace{Type: "clear", Reason: "gap"})
	if x.held(holdRestart) {
		t.Fatal("a sequence gap made the endpoint unverified")
	}
	ew.trace(ingest.Trace{Type: "event", Event: cleared})
	if !x.held(holdRestart) || x.ep.Fenced() == "" {
		t.Fatal("a live clear did not make the endpoint unverified")
	}
	x.release(holdRestart)
	ew.trace(ingest.Trace{Type: "connect", Count: 2})
	ew.trace(ingest.Trace{Type: "replay", Reason: "requested"})
	ew.trace(ingest.Trace{Type: "clear", Reason: "regression"})
	if !x.held(holdRestart) {
		t.Fatal("a regression replayed on a reconnect did not make the endpoint unverified")
	}
}
