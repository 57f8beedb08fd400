package epp_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/promtest"
)

// mortal stands in front of one engine as its address, so the test can make the endpoint die the
// way a crashed pod does: new connections refused, live ones reset (RST, no orderly close).
type mortal struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

func newMortal(t *testing.T, target string) *mortal {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &mortal{l: l, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(m.kill)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go m.pipe(c)
		}
	}()
	return m
}

func (m *mortal) track(c net.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conns == nil {
		return false
	}
	m.conns[c] = true
	return true
}

func (m *mortal) pipe(c net.Conn) {
	u, err := net.Dial("tcp", m.target)
	if err != nil || !m.track(c) || !m.track(u) {
		c.Close()
		if u != nil {
			u.Close()
		}
		return
	}
	go func() { io.Copy(u, c); u.(*net.TCPConn).CloseWrite() }()
	io.Copy(c, u)
	c.(*net.TCPConn).CloseWrite()
}

// kill refuses new connections and resets every open one.
func (m *mortal) kill() {
	m.l.Close()
	m.mu.Lock()
	defer m.mu.Unlock()
	for c := range m.conns {
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
	m.conns = nil
}

func (m *mortal) url() string { return "http://" + m.l.Addr().String() }

// TestFailoverThroughEnvoy: the endpoint holding a prompt's blocks dies (connections refused and
// reset) while requests sharing that prompt go through Envoy. Envoy works down the picker's
// destination list: a request not yet answered, in flight when the endpoint died, is retried on
// the next address and succeeds; every request after the death succeeds on another endpoint; the
// picker reads the served endpoint from Envoy and counts the failovers. What a client cannot be
// spared: a streamed response that had started from the dead endpoint ends cut off (its
// chunked body ends without the final chunk, no "data: [DONE]"), since Envoy retries nothing once
// response bytes have reached the client.
func TestFailoverThroughEnvoy(t *testing.T) {
	mortals := map[string]*mortal{}
	w := startWorld(t, worldSpec{n: 3,
		sim: func(i int, c *sim.Config) { c.DecodePerToken = 10 * time.Millisecond },
		mod: func(r *rules.Rule) {
			for i := range r.Endpoints {
				m := newMortal(t, strings.TrimPrefix(r.Endpoints[i].Address, "http://"))
				mortals[r.Endpoints[i].Name] = m
				r.Endpoints[i].Address = m.url()
			}
		}})
	base := startEnvoy(t, w.conn.Target())

	prefix := strings.Repeat("Failover document: the blocks live on one endpoint only. ", 20)
	body := func(k, tokens int, stream bool) []byte {
		b, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": fmt.Sprintf("%s Question %d.", prefix, k), "max_tokens": tokens, "stream": stream})
		return b
	}
	first := post(t, base+"/v1/completions", body(0, 2, false))
	if first.status != 200 || first.receipt == "" {
		t.Fatalf("first request: %d receipt %q: %s", first.status, first.receipt, first.body)
	}
	holder := first.receipt
	eventually(t, 10*time.Second, "the prompt's blocks routing to "+holder, func() bool {
		r := w.request(envoyRequest{path: "/v1/completions", body: body(1, 2, false)})
		r.cancel()
		return tierOf(r.decision) == route.TierKVExact && w.byName(r.header) == holder
	})

	type outcome struct {
		status  int
		receipt string
		body    string
		err     error
	}
	do := func(b []byte, started ...chan struct{}) outcome {
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(string(b)))
		if err != nil {
			return outcome{err: err}
		}
		defer resp.Body.Close()
		for _, c := range started {
			close(c)
		}
		raw, err := io.ReadAll(resp.Body)
		return outcome{status: resp.StatusCode, receipt: resp.Header.Get("x-kvexact-endpoint"), body: string(raw), err: err}
	}
	// Two long requests in flight on the holder when it dies: one streamed (its response has
	// started), one not (its response has not).
	streamed, plain, started := make(chan outcome, 1), make(chan outcome, 1), make(chan struct{})
	go func() { streamed <- do(body(2, 300, true), started) }()
	go func() { plain <- do(body(3, 300, false)) }()
	select { // the stream's response has begun: its headers reached the client
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("the streamed request got no response headers")
	}
	time.Sleep(200 * time.Millisecond) // some events on their way, the plain request on the holder too
	mortals[holder].kill()

	s := <-streamed
	if s.status != 200 || s.receipt != holder || s.err == nil || strings.Contains(s.body, "[DONE]") || !strings.Contains(s.body, "data: ") {
		t.Fatalf("the stream started on the dead endpoint: want its events cut off (status 200 from %s, some data, no [DONE], a read error), got %d from %q err %v: %.200q",
			holder, s.status, s.receipt, s.err, s.body)
	}
	t.Logf("the client of the stream in flight sees: status 200, %d bytes of events, then %v", len(s.body), s.err)
	p := <-plain
	if p.err != nil || p.status != 200 || p.receipt == holder || p.receipt == "" {
		t.Fatalf("the unanswered request in flight: want it retried on another endpoint, got %d from %q err %v: %.200q", p.status, p.receipt, p.err, p.body)
	}

	// After the death: every request succeeds, on another endpoint, streamed or not.
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 6; k++ {
				stream := k%2 == 1
				o := do(body(100+10*g+k, 4, stream))
				if o.err != nil || o.status != 200 || o.receipt == holder || o.receipt == "" || (stream && !strings.Contains(o.body, "[DONE]")) {
					errs <- fmt.Sprintf("request %d/%d (stream %v): %d from %q err %v: %.200q", g, k, stream, o.status, o.receipt, o.err, o.body)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if n := promtest.Value(t, w.reg, "kvexact_epp_failovers_total", map[string]string{"rule": "pool"}); n < 1 {
		t.Fatalf("the picker counted %v failovers: it did not read the served endpoint from Envoy", n)
	}
	w.noLeak()
}

// byName is the endpoint name of the first address of a destination list.
func (w *world) byName(dest string) string {
	first, _, _ := strings.Cut(dest, ",")
	for _, e := range w.g.Status().Rules[0].Endpoints {
		if strings.TrimPrefix(e.Address, "http://") == first {
			return e.Name
		}
	}
	return ""
}
