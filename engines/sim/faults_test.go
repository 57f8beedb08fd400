package sim

import (
	"errors"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
)

func oneRequest(t *testing.T, e *Engine, first int) {
	t.Helper()
	p := make([]int, 20)
	for i := range p {
		p[i] = first + i
	}
	resp, m := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": p, "max_tokens": 1})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %v", resp.StatusCode, m)
	}
}

// TestFaultSwitches: each switch produces the wire effect it claims, seen from a subscriber.
func TestFaultSwitches(t *testing.T) {
	e := startSim(t, "vllm", "v0.25.1", func(c *Config) { s := "0"; c.Seed = &s })
	sub := subscribe(t, e.PublishAddrs()[0], "")
	next := 100
	waitFor(t, 10*time.Second, "subscription", func() bool {
		oneRequest(t, e, next)
		next += 100
		return len(sub.snapshot()) > 0
	})
	waitSeq := func(seq uint64) {
		waitFor(t, 5*time.Second, "live seq", func() bool {
			f := sub.snapshot()
			return len(f) > 0 && f[len(f)-1].seq >= seq
		})
	}

	t.Run("drop_events makes a gap that replay fills", func(t *testing.T) {
		before := e.NextSeq(0)
		if _, err := e.SetFaults(FaultPatch{DropEvents: ptr(2)}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			oneRequest(t, e, next)
			next += 100
		}
		waitSeq(before + 2)
		f := sub.snapshot()
		for _, x := range f {
			if x.seq == before || x.seq == before+1 {
				t.Fatalf("dropped seq %d was delivered live", x.seq)
			}
		}
		got, ok := replay(t, e.ReplayAddrs()[0], before, 5*time.Second)
		if !ok || len(got) < 3 || got[0].seq != before || got[1].seq != before+1 {
			t.Fatalf("replay after the gap: %v %+v", ok, got)
		}
	})

	t.Run("replay_off answers nothing", func(t *testing.T) {
		e.SetFaults(FaultPatch{ReplayOff: ptr(true)})
		if _, ok := replay(t, e.ReplayAddrs()[0], 0, 300*time.Millisecond); ok {
			t.Fatal("replay answered while off")
		}
		e.SetFaults(FaultPatch{ReplayOff: ptr(false)})
		if _, ok := replay(t, e.ReplayAddrs()[0], 0, 5*time.Second); !ok {
			t.Fatal("replay did not come back")
		}
	})

	t.Run("clear announces AllBlocksCleared", func(t *testing.T) {
		if err := e.Quiesce(testCtx(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		seq := e.NextSeq(0)
		resp, _ := post(t, e.URL()+"/sim/clear", "{}")
		if resp.StatusCode != 200 {
			t.Fatalf("clear: %d", resp.StatusCode)
		}
		waitSeq(seq)
		f := sub.snapshot()
		b, err := decodeFor("vllm")(f[len(f)-1].payload)
		if err != nil || len(b.Events) != 1 || b.Events[0].Kind != engines.AllBlocksCleared {
			t.Fatalf("after clear: %+v %v", b, err)
		}
		if len(e.CacheKeys(0)) != 0 {
			t.Fatal("cache not empty after clear")
		}
	})

	t.Run("restart_publisher resets the sequence", func(t *testing.T) {
		for e.NextSeq(0) < 150 { // a long pre-restart sequence, so the reset is unmistakable
			oneRequest(t, e, next)
			next += 100
		}
		if err := e.Quiesce(testCtx(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		waitSeq(e.NextSeq(0) - 1)
		resp, _ := post(t, e.URL()+"/sim/restart_publisher", "")
		if resp.StatusCode != 200 {
			t.Fatalf("restart: %d", resp.StatusCode)
		}
		if e.NextSeq(0) != 0 {
			t.Fatalf("next sequence %d after restart", e.NextSeq(0))
		}
		n := len(sub.snapshot())
		waitFor(t, 10*time.Second, "events after restart", func() bool {
			oneRequest(t, e, next)
			next += 100
			time.Sleep(20 * time.Millisecond)
			return len(sub.snapshot()) > n
		})
		f := sub.snapshot()
		if f[n].seq >= f[n-1].seq {
			t.Fatalf("after restart the sequence went %d → %d", f[n-1].seq, f[n].seq)
		}
		got, ok := replay(t, e.ReplayAddrs()[0], 0, 5*time.Second)
		if !ok || len(got) == 0 || got[0].seq != 0 {
			t.Fatalf("replay of the new incarnation: %v %+v", ok, got[:min(1, len(got))])
		}
	})

	t.Run("status_5xx answers the engine error shape", func(t *testing.T) {
		e.SetFaults(FaultPatch{Status5xx: ptr(1), StatusCode: ptr(500)})
		resp, m := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": "hi"})
		if resp.StatusCode != 500 || m["error"] == nil || resp.Header.Get(ReceiptHeader) != "ep-vllm" {
			t.Fatalf("forced error: %d %v", resp.StatusCode, m)
		}
		resp, _ = post(t, e.URL()+"/v1/completions", map[string]any{"prompt": "hi"})
		if resp.StatusCode != 200 {
			t.Fatalf("the fault did not clear after one request: %d", resp.StatusCode)
		}
	})

	t.Run("delay_ms delays", func(t *testing.T) {
		e.SetFaults(FaultPatch{DelayMS: ptr(150)})
		start := time.Now()
		resp, _ := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 1})
		if resp.StatusCode != 200 || time.Since(start) < 150*time.Millisecond {
			t.Fatalf("delay not applied: %d after %s", resp.StatusCode, time.Since(start))
		}
		e.SetFaults(FaultPatch{DelayMS: ptr(0)})
	})

	t.Run("unhealthy", func(t *testing.T) {
		e.SetFaults(FaultPatch{Unhealthy: ptr(true)})
		resp, err := http.Get(e.URL() + "/health")
		if err != nil || resp.StatusCode != 503 {
			t.Fatalf("health while unhealthy: %v %v", resp, err)
		}
		resp.Body.Close()
		e.SetFaults(FaultPatch{Unhealthy: ptr(false)})
	})

	t.Run("refuse closes the listener", func(t *testing.T) {
		e.SetFaults(FaultPatch{Refuse: ptr(true)})
		c, err := net.DialTimeout("tcp", e.Addr(), time.Second)
		if err == nil {
			c.Close()
			t.Fatal("connection accepted while refusing")
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("want connection refused, got %v", err)
		}
		e.SetFaults(FaultPatch{Refuse: ptr(false)})
		// Refusing dropped every keep-alive connection, as a dead server would; a client's pool may
		// still hold one it has not yet seen closed (its reader notices asynchronously), so the
		// request after the refuse goes on a new connection, as a client reconnecting would.
		fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := fresh.Post(e.URL()+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt":"back","max_tokens":1}`))
		if err != nil {
			t.Fatalf("after refuse: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("after refuse: %d", resp.StatusCode)
		}
	})
}

// TestRefuseViaAdminListener: with a separate admin listener, refuse can be switched off over HTTP
// and refuse_ms ends by itself.
func TestRefuseViaAdminListener(t *testing.T) {
	e := startSim(t, "llamacpp", "b10573", func(c *Config) { c.AdminAddr = "127.0.0.1:0" })
	admin := "http://" + e.AdminAddr()
	resp, m := post(t, admin+"/sim/faults", `{"refuse":true,"refuse_ms":200}`)
	if resp.StatusCode != 200 || m["refuse"] != true {
		t.Fatalf("set refuse: %d %v", resp.StatusCode, m)
	}
	if _, err := http.Get(e.URL() + "/health"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("health while refusing: %v", err)
	}
	waitFor(t, 5*time.Second, "refuse_ms to expire", func() bool {
		r, err := http.Get(e.URL() + "/health")
		if err == nil {
			r.Body.Close()
		}
		return err == nil && r.StatusCode == 200
	})
	resp, _ = post(t, admin+"/sim/faults", `{"status_5xx":-1}`)
	if resp.StatusCode != 400 {
		t.Fatalf("negative count accepted: %d", resp.StatusCode)
	}
}

// TestTRTFaults: dropped events leave an event_id gap in the drain; restart resets event_id with a
// fresh created event; clear removes every block.
func TestTRTFaults(t *testing.T) {
	e := startSim(t, "trtllm", "1.2", func(c *Config) { c.BlockSize = 4 })
	oneRequest(t, e, 100)
	evs := drainAll(t, e.URL())
	last := evs[len(evs)-1].EventID
	e.SetFaults(FaultPatch{DropEvents: ptr(1)})
	oneRequest(t, e, 200)
	oneRequest(t, e, 300)
	evs = drainAll(t, e.URL())
	if len(evs) == 0 || evs[0].EventID != last+2 {
		t.Fatalf("want a gap after event_id %d, got %+v", last, evs)
	}
	if err := e.ClearCache(); err != nil {
		t.Fatal(err)
	}
	evs = drainAll(t, e.URL())
	res := 0
	for _, ev := range evs {
		if ev.Kind != engines.BlockRemoved {
			t.Fatalf("clear produced %s", ev.Kind)
		}
		res += len(ev.BlockHashes)
	}
	if res == 0 || len(e.CacheKeys(0)) != 0 {
		t.Fatalf("clear removed %d blocks, %d left", res, len(e.CacheKeys(0)))
	}
	resp, _ := post(t, e.URL()+"/sim/restart_publisher", "")
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	evs = drainAll(t, e.URL())
	if len(evs) != 1 || evs[0].EventID != 0 || evs[0].Kind != engines.CacheCreated {
		t.Fatalf("after restart: %+v", evs)
	}
}

func ptr[T any](v T) *T { return &v }
