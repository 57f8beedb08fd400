package sim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/sglang"
	"github.com/kvexact/kvexact/engines/vllm"
)

// TestEventsOff: with NoEvents the engine publishes nothing — no ZeroMQ publisher at all (an empty
// --zmq no longer falls back to the default port) and an always-empty TensorRT-LLM drain.
func TestEventsOff(t *testing.T) {
	for _, fam := range []struct{ family, release string }{{"vllm", "v0.25.1"}, {"sglang", "v0.5.18"}} {
		e := startSim(t, fam.family, fam.release, func(c *Config) { c.NoEvents = true })
		if got := e.PublishAddrs(); len(got) != 0 {
			t.Errorf("%s: NoEvents still publishes on %v", fam.family, got)
		}
		if got := e.ReplayAddrs(); len(got) != 0 {
			t.Errorf("%s: NoEvents still serves replay on %v", fam.family, got)
		}
		oneRequest(t, e, 100)
	}
	e := startSim(t, "trtllm", "1.2", func(c *Config) { c.NoEvents = true })
	oneRequest(t, e, 100)
	if evs := drainAll(t, e.URL()); len(evs) != 0 {
		t.Fatalf("trtllm with events off drained %d events", len(evs))
	}
	on := startSim(t, "trtllm", "1.2", nil)
	oneRequest(t, on, 100)
	if evs := drainAll(t, on.URL()); len(evs) == 0 {
		t.Fatal("trtllm with events on drained nothing: the off test proves nothing")
	}
}

// TestReportVersion: any version string reaches the family's version endpoint.
func TestReportVersion(t *testing.T) {
	for _, c := range []struct{ family, release, path, field string }{
		{"vllm", "v0.25.1", "/version", "version"}, {"sglang", "v0.5.18", "/server_info", "version"}, {"trtllm", "1.2", "/version", "version"},
	} {
		e := startSim(t, c.family, c.release, func(cfg *Config) { cfg.ReportVersion = "9.9.9-unknown" })
		resp, err := http.Get(e.URL() + c.path)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		resp.Body.Close()
		if m[c.field] != "9.9.9-unknown" {
			t.Errorf("%s %s: version %v, want the configured string", c.family, c.path, m[c.field])
		}
	}
}

// TestSkipSeqEvery: the stream keeps skipping sequence numbers (ZeroMQ) and event ids (drain)
// while every message still arrives.
func TestSkipSeqEvery(t *testing.T) {
	e := startSim(t, "vllm", "v0.25.1", func(c *Config) { s := "0"; c.Seed = &s; c.Faults.SkipSeqEvery = 2 })
	sub := subscribe(t, e.PublishAddrs()[0], "")
	time.Sleep(200 * time.Millisecond) // slow joiner
	for i := range 6 {
		oneRequest(t, e, 1000+100*i)
	}
	waitFor(t, 5*time.Second, "6 batches", func() bool { return len(sub.snapshot()) >= 6 })
	fr := sub.snapshot()
	gaps := 0
	for i := 1; i < len(fr); i++ {
		if d := fr[i].seq - fr[i-1].seq; d == 2 {
			gaps++
		} else if d != 1 {
			t.Fatalf("seq %d after %d: only single skips expected", fr[i].seq, fr[i-1].seq)
		}
	}
	if gaps < 2 {
		t.Fatalf("sequence numbers %v: want repeated skips", seqs(fr))
	}

	tr := startSim(t, "trtllm", "1.2", func(c *Config) { c.Faults.SkipSeqEvery = 2 })
	for i := range 4 {
		oneRequest(t, tr, 1000+100*i)
	}
	evs := drainAll(t, tr.URL())
	skips := 0
	for i := 1; i < len(evs); i++ {
		if evs[i].EventID-evs[i-1].EventID == 2 {
			skips++
		}
	}
	if skips < 2 {
		t.Fatalf("trtllm event ids skip %d times in %d events, want repeated skips", skips, len(evs))
	}
}

func seqs(fr []frame) []uint64 {
	out := make([]uint64, len(fr))
	for i, f := range fr {
		out[i] = f.seq
	}
	return out
}

// TestRequestFieldTypes: a field of the wrong type is a 400 naming the field, as the engines'
// pydantic models answer; SGLang refuses roles it does not know, vLLM takes custom roles.
func TestRequestFieldTypes(t *testing.T) {
	cases := []struct {
		family, release, path string
		body                  string
		status                int
		field                 string
	}{
		{"vllm", "v0.25.1", "/v1/completions", `{"prompt":"hi","temperature":"hot"}`, 400, "temperature"},
		{"vllm", "v0.25.1", "/v1/completions", `{"prompt":"hi","top_k":1.5}`, 400, "top_k"},
		{"vllm", "v0.25.1", "/v1/completions", `{"prompt":"hi","stop":[1,2]}`, 400, "stop"},
		{"vllm", "v0.25.1", "/v1/chat/completions", `{"messages":[{"content":"hi"}]}`, 400, "messages.0.role"},
		{"vllm", "v0.25.1", "/v1/chat/completions", `{"messages":[{"role":7,"content":"hi"}]}`, 400, "messages.0.role"},
		{"vllm", "v0.25.1", "/v1/chat/completions", `{"messages":[{"role":"user","content":5}]}`, 400, "messages.0.content"},
		{"vllm", "v0.25.1", "/v1/chat/completions", `{"messages":[{"role":"narrator","content":"hi"}],"max_tokens":1}`, 200, ""},
		{"vllm", "v0.25.1", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"logprobs":3}`, 400, "logprobs"},
		{"vllm", "v0.25.1", "/v1/completions", `{"prompt":"hi","temperature":0.5,"top_k":5,"stop":["x"],"logprobs":2,"max_tokens":1}`, 200, ""},
		{"sglang", "v0.5.18", "/v1/chat/completions", `{"messages":[{"role":"narrator","content":"hi"}]}`, 400, "messages.0.role"},
		{"sglang", "v0.5.18", "/v1/chat/completions", `{"messages":[{"role":"User","content":"hi"}],"max_tokens":1}`, 200, ""},
		{"trtllm", "1.2", "/v1/completions", `{"prompt":"hi","temperature":"hot"}`, 400, "temperature"},
	}
	engines := map[string]*Engine{}
	for _, c := range cases {
		e := engines[c.family]
		if e == nil {
			e = startSim(t, c.family, c.release, nil)
			engines[c.family] = e
		}
		resp, err := http.Post(e.URL()+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s %s: status %d, want %d (%s)", c.family, c.body, resp.StatusCode, c.status, raw)
			continue
		}
		if c.field != "" && !strings.Contains(string(raw), c.field+":") {
			t.Errorf("%s %s: the message does not name %s: %s", c.family, c.body, c.field, raw)
		}
	}
}

// TestAdminRoutesGated: vLLM mounts POST /reset_prefix_cache only in dev mode; SGLang always
// serves /flush_cache (its http_server registers it unconditionally).
func TestAdminRoutesGated(t *testing.T) {
	for _, dev := range []bool{false, true} {
		e := startSim(t, "vllm", "v0.25.1", func(c *Config) { c.DevMode = dev })
		resp, _ := post(t, e.URL()+"/reset_prefix_cache", "")
		want := http.StatusNotFound
		if dev {
			want = http.StatusOK
		}
		if resp.StatusCode != want {
			t.Errorf("vLLM dev mode %v: /reset_prefix_cache answered %d, want %d", dev, resp.StatusCode, want)
		}
	}
	e := startSim(t, "sglang", "v0.5.18", nil)
	resp, _ := post(t, e.URL()+"/flush_cache", "")
	if resp.StatusCode != http.StatusOK {
		t.Errorf("SGLang /flush_cache answered %d", resp.StatusCode)
	}
}

// TestResetWhileOnlyWaiting: a request queued with no request running and no block held is the
// boundary where the engines differ. vLLM resets (BlockPool.reset_prefix_cache refuses only
// while blocks are in use, and a waiting request holds none): 200 {"success": true}, and the
// waiting request, once scheduled, finds its prompt no longer cached. SGLang refuses
// (Scheduler.flush_cache wants is_fully_idle, which a waiting request denies): 400, and the
// prompt is still cached.
func TestResetWhileOnlyWaiting(t *testing.T) {
	for _, c := range []struct {
		family, release, path string
		status                int
		body                  string
		reset                 bool
	}{
		{"vllm", "v0.31.0", "/reset_prefix_cache", http.StatusOK, `{"success":true}`, true},
		{"sglang", "v0.5.23", "/flush_cache", http.StatusBadRequest, "Flush cache failed.\n", false},
	} {
		t.Run(c.family, func(t *testing.T) {
			e := startSim(t, c.family, c.release, func(cfg *Config) { cfg.DevMode, cfg.MaxConcurrency = true, 1 })
			prompt := make([]int, 200)
			for i := range prompt {
				prompt[i] = 1000 + i
			}
			body := map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1}
			if resp, m := post(t, e.URL()+"/v1/completions", body); resp.StatusCode != http.StatusOK || usageCached(t, m) != 0 {
				t.Fatalf("the first request: %d, %v", resp.StatusCode, m)
			}

			// Taking the rank's only scheduler slot queues the next request while nothing runs
			// and no block is held: a request the scheduler has not taken yet.
			rk := e.ranks[0]
			rk.slots <- struct{}{}
			released := false
			release := func() {
				if !released {
					released = true
					<-rk.slots
				}
			}
			defer release()
			type answer struct {
				status int
				m      map[string]any
				err    error
			}
			done := make(chan answer, 1)
			go func() {
				raw, _ := json.Marshal(body)
				resp, err := http.Post(e.URL()+"/v1/completions", "application/json", strings.NewReader(string(raw)))
				if err != nil {
					done <- answer{err: err}
					return
				}
				defer resp.Body.Close()
				var m map[string]any
				dec := json.NewDecoder(resp.Body)
				dec.UseNumber()
				err = dec.Decode(&m)
				done <- answer{resp.StatusCode, m, err}
			}()
			waitFor(t, 5*time.Second, "the request to wait", func() bool { return rk.waiting.Load() == 1 })
			rk.mu.Lock()
			running, used, reserved := rk.running.Load(), rk.cache.used, rk.cache.reserved
			rk.mu.Unlock()
			if running != 0 || used != 0 || reserved != 0 {
				t.Fatalf("not a waiting-only engine: %d running, %d blocks held, %d reserved", running, used, reserved)
			}

			resp, raw := postReset(t, e.URL()+c.path)
			if resp.StatusCode != c.status || strings.TrimSpace(string(raw)) != strings.TrimSpace(c.body) {
				t.Errorf("reset with a request only waiting answered %d %q, want %d %q", resp.StatusCode, raw, c.status, c.body)
			}

			release()
			a := <-done
			if a.err != nil || a.status != http.StatusOK {
				t.Fatalf("the waiting request: %d, %v, %v", a.status, a.m, a.err)
			}
			if got := usageCached(t, a.m); (got == 0) != c.reset {
				t.Errorf("the waiting request found %d tokens cached; reset %v", got, c.reset)
			}
		})
	}
}

// TestResetRefusedWhileRunning: a cache reset while a request runs is refused as the engines
// refuse it — vLLM 200 {"success": false}, SGLang 400 "Flush cache failed." without a
// Content-Type — and each family's prober reads that as a *engines.ClearRefusedError naming the
// URL; once the request is gone the same clear succeeds.
func TestResetRefusedWhileRunning(t *testing.T) {
	for _, c := range []struct {
		family, release, path string
		status                int
		body                  string
		prober                func(base string) engines.Prober
	}{
		{"vllm", "v0.31.0", "/reset_prefix_cache", http.StatusOK, `{"success":false}`, func(b string) engines.Prober { return vllm.NewProber(b, nil) }},
		{"sglang", "v0.5.23", "/flush_cache", http.StatusBadRequest, "Flush cache failed.\n", func(b string) engines.Prober { return sglang.NewProber(b, nil) }},
	} {
		t.Run(c.family, func(t *testing.T) {
			e := startSim(t, c.family, c.release, func(cfg *Config) { cfg.DevMode, cfg.DecodePerToken = true, 5*time.Millisecond })
			ctx, cancel := context.WithCancel(testCtx(t, 30*time.Second))
			done := make(chan struct{})
			go func() {
				defer close(done)
				body := `{"model":"m","prompt":"a request that decodes long enough to hold its blocks","max_tokens":4000}`
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
			waitFor(t, 5*time.Second, "the request to run", func() bool { return e.ranks[0].running.Load() > 0 })

			resp, raw := postReset(t, e.URL()+c.path)
			if resp.StatusCode != c.status || strings.TrimSpace(string(raw)) != strings.TrimSpace(c.body) {
				t.Errorf("refused reset answered %d %q, want %d %q", resp.StatusCode, raw, c.status, c.body)
			}
			if c.family == "sglang" && resp.Header.Get("Content-Type") != "" {
				t.Errorf("refused flush has Content-Type %q; SGLang's bare Response has none", resp.Header.Get("Content-Type"))
			}

			err := c.prober(e.URL()).Clear(ctx)
			var re *engines.ClearRefusedError
			if !errors.As(err, &re) {
				t.Fatalf("the prober's clear while a request runs: %v (%T), want a *engines.ClearRefusedError", err, err)
			}
			if re.URL != e.URL()+c.path || !strings.Contains(err.Error(), e.URL()+c.path) || !strings.Contains(err.Error(), "busy") {
				t.Errorf("the refusal does not name the URL and that the engine was busy: %v", err)
			}

			cancel()
			<-done
			waitFor(t, 5*time.Second, "the engine to be idle", func() bool {
				return e.ranks[0].running.Load() == 0 && e.ranks[0].waiting.Load() == 0
			})
			if err := c.prober(e.URL()).Clear(testCtx(t, 5*time.Second)); err != nil {
				t.Errorf("the clear once idle: %v", err)
			}
		})
	}
}

// postReset POSTs a cache reset to url and returns the answer with its body read.
func postReset(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, raw
}

// TestResetRefusedWhileOnlyReserved: the boundary of vLLM's refusal inside one step. A request the
// scheduler has admitted holds its blocks in vLLM from that instant (the scheduler allocates them
// when it schedules the request); the simulator promises them (reserved) and allocates them as the
// request grows, so a request admitted with no prefix hit holds no block yet. The reset is refused
// all the same, and is granted once the promise is given back.
func TestResetRefusedWhileOnlyReserved(t *testing.T) {
	e := startSim(t, "vllm", "v0.31.0", func(cfg *Config) { cfg.DevMode = true })
	rk := e.ranks[0]
	s := &seq{keys: []uint64{1, 2, 3}}
	rk.mu.Lock()
	admitted := rk.cache.admit(s, 48, 64)
	used, reserved := rk.cache.used, rk.cache.reserved
	rk.mu.Unlock()
	if !admitted || used != 0 || reserved == 0 {
		t.Fatalf("not a reserved-only engine: admitted %v, %d blocks held, %d reserved", admitted, used, reserved)
	}
	if err := e.ClearCache(); !errors.Is(err, ErrBusy) {
		t.Errorf("reset with blocks only reserved: %v, want ErrBusy", err)
	}
	rk.mu.Lock()
	rk.cache.release(s)
	rk.mu.Unlock()
	if err := e.ClearCache(); err != nil {
		t.Errorf("reset once the reservation is given back: %v", err)
	}
}
