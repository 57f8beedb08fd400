package vllmpool

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStartRetriesTakenPort: an engine whose picked port was taken before it bound it ("Address
// already in use" in its log) is started again on new ports, up to portAttempts times; with ports
// the caller chose there is nothing to pick again, so the first failure is returned. The stand-in
// interpreter fails its first two starts that way and serves /health on its --port on the third.
func TestStartRetriesTakenPort(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3 for the stand-in engine: apt-get install -y python3")
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "python")
	count := filepath.Join(dir, "starts")
	if err := os.WriteFile(script, []byte(`#!/bin/sh
n=$(cat "`+count+`" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "`+count+`"
if [ "$n" -le "${FAILS:-2}" ]; then echo "zmq.error.ZMQError: Address already in use (addr='tcp://*:1')"; exit 1; fi
while [ "$1" != "--port" ]; do shift; done
exec /usr/bin/python3 -c '
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()' "$2"
`), 0o755); err != nil {
		t.Fatal(err)
	}
	env := &Env{Root: dir, Python: script}
	start := func(s Spec) (*Engine, error) {
		os.Remove(count)
		s.Name, s.Model = "e", filepath.Join(dir, "model")
		return env.Start(context.Background(), s, 20*time.Second)
	}
	e, err := start(Spec{})
	if err != nil {
		t.Fatalf("picked ports: %v", err)
	}
	e.Stop()
	if b, _ := os.ReadFile(count); strings.TrimSpace(string(b)) != "3" {
		t.Fatalf("%s starts, want 3 (two taken ports, then up)", b)
	}
	t.Setenv("FAILS", "3")
	if _, err := start(Spec{}); !errors.Is(err, errPortTaken) {
		t.Fatalf("three taken ports: %v, want the port error after portAttempts starts", err)
	}
	if b, _ := os.ReadFile(count); strings.TrimSpace(string(b)) != "3" {
		t.Fatalf("%s starts, want portAttempts = 3", b)
	}
	if _, err := start(Spec{Port: 40001, EventsPort: 40002, ReplayPort: 40003}); !errors.Is(err, errPortTaken) {
		t.Fatalf("fixed ports: %v", err)
	}
	if b, _ := os.ReadFile(count); strings.TrimSpace(string(b)) != "1" {
		t.Fatalf("fixed ports: %s starts, want 1 (nothing to pick again)", b)
	}
}
