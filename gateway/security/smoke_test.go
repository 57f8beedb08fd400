package security

import (
	"testing"
	"time"
)

// The harness itself: a plain completion is relayed.
func TestHarnessServes(t *testing.T) {
	g := start(t, nil)
	out, held := exchange(t, g.client, post("/v1/completions", completionBody(""), "Connection: close\r\n"), 10*time.Second)
	if held || status(out) != "200" || g.engine.hits.Load() != 1 {
		t.Fatalf("held %v, hits %d:\n%s", held, g.engine.hits.Load(), out)
	}
}
