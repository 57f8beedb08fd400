package gateway

import (
	"log/slog"
	"strings"
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
