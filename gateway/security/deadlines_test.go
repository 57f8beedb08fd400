package security

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/rules"
)

// streamForever is an engine that streams SSE events of 16 KiB until its client (the gateway)
// goes; ended is closed then.
func streamForever(ended chan struct{}) http.HandlerFunc {
	event := "data: " + strings.Repeat("x", 16<<10) + "\n\n"
	var once atomic.Bool
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for {
			if _, err := io.WriteString(w, event); err != nil {
				break
			}
			if rc.Flush() != nil {
				break
			}
		}
		if once.CompareAndSwap(false, true) {
			close(ended)
		}
	}
}

// A client that asks for a stream and never reads it is cut once one write to it makes no progress
// within server.writeTimeout: the gateway lets go of the client connection and of the engine's
// stream (counted as write_timeout), rather than holding both for as long as the client wants.
func TestClientThatStopsReadingIsCut(t *testing.T) {
	g := start(t, func(c *rules.Config) { c.Server.WriteTimeout = rules.Duration(300 * time.Millisecond) })
	ended := make(chan struct{})
	g.engine.set(streamForever(ended))
	c := dial(t, g.client, 30*time.Second)
	if _, err := io.WriteString(c, post("/v1/completions", completionBody(`,"stream":true`))); err != nil {
		t.Fatal(err)
	}
	// Never read: the socket buffers fill, the gateway's writes stop making progress.
	select {
	case <-ended:
	case <-time.After(15 * time.Second):
		t.Fatal("the gateway still relays to a client that has not read for 15 s (writeTimeout 300ms)")
	}
	deadline := time.Now().Add(5 * time.Second)
	for g.metric("kvexact_proxy_client_errors_total", map[string]string{"kind": "write_timeout"}) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("kvexact_proxy_client_errors_total{kind=write_timeout} did not count the cut")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An engine that stalls mid-stream (headers and one event sent, then silence) is dropped after
// upstream.idleTimeout: the client gets the event, an error event naming the stall, and a cut
// connection — never a stream that looks complete, and never an open-ended wait.
func TestStalledEngineMidStream(t *testing.T) {
	g := start(t, func(c *rules.Config) { c.Rules[0].Upstream.IdleTimeout = rules.Duration(300 * time.Millisecond) })
	released := make(chan struct{})
	g.engine.set(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"text":"a"}]}`+"\n\n")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done(): // the gateway dropped the stalled stream
			close(released)
		case <-time.After(30 * time.Second):
		}
	})
	client := &http.Client{Timeout: 15 * time.Second}
	resp, err := client.Post("http://"+g.client+"/v1/completions", "application/json", strings.NewReader(completionBody(`,"stream":true`)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil || strings.Contains(err.Error(), "Client.Timeout") {
		t.Fatalf("the stream ended with %v (want a cut connection: unexpected EOF):\n%s", err, body)
	}
	if !strings.Contains(string(body), `"text":"a"`) || !strings.Contains(string(body), `"code":"upstream_died"`) || !strings.Contains(string(body), "upstream.idleTimeout") {
		t.Fatalf("want the event, then an error event naming upstream.idleTimeout:\n%s", body)
	}
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		t.Fatal("the gateway kept the stalled engine stream open")
	}
}

// The same bound holds a non-streaming answer whose body stalls halfway: the client reads a
// truncated body (the connection cut), never a complete-looking one.
func TestStalledEngineMidBody(t *testing.T) {
	g := start(t, func(c *rules.Config) { c.Rules[0].Upstream.IdleTimeout = rules.Duration(300 * time.Millisecond) })
	g.engine.set(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "1000")
		_, _ = io.WriteString(w, `{"id":"x","choices":[`)
		_ = http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(30 * time.Second):
		}
	})
	client := &http.Client{Timeout: 15 * time.Second}
	resp, err := client.Post("http://"+g.client+"/v1/completions", "application/json", strings.NewReader(completionBody("")))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil || strings.Contains(err.Error(), "Client.Timeout") {
		t.Fatalf("status %d, body end %v (want a cut connection):\n%s", resp.StatusCode, err, body)
	}
	if got := fmt.Sprint(len(body)); got == "1000" {
		t.Fatal("a truncated body was framed as complete")
	}
}
