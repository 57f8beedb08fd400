package ingest

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/trtllm"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/vectors"
)

// trtBodies reads the shared TensorRT-LLM drain samples through the one sample loader: each body
// as the engine sent it (its body_text), byte for byte.
func trtBodies(t testing.TB) (map[string][]byte, int) {
	t.Helper()
	f, err := vectors.LoadSamples(sampleFile(t, "trtllm/v1.2/kv-cache-events-samples.json"))
	if err != nil {
		t.Fatal(err)
	}
	tpb := 0
	for _, s := range f.Samples {
		tpb = s.BlockSize
	}
	return f.Payloads(), tpb
}

// drainServer is a destructive /kv_cache_events of our own on 127.0.0.1: each POST takes the next
// queued body (every event is handed out once), or answers [] after a short wait, like an idle
// TensorRT-LLM server.
type drainServer struct {
	*httptest.Server
	queue chan []byte
	mu    sync.Mutex
	polls int
}

func newDrainServer(t *testing.T) *drainServer {
	d := &drainServer{queue: make(chan []byte, 16)}
	d.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != trtllm.DrainPath {
			http.Error(w, "want POST "+trtllm.DrainPath, http.StatusNotFound)
			return
		}
		d.mu.Lock()
		d.polls++
		d.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		select {
		case b := <-d.queue:
			w.Write(b)
		case <-time.After(20 * time.Millisecond):
			w.Write([]byte("[]"))
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(d.Close)
	return d
}

// decodeEvents decodes a body for the test's own expectations.
func decodeEvents(t testing.TB, body []byte) []engines.Event {
	t.Helper()
	evs, err := trtllm.DecodeDrain(body)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// chain is the router keys of full blocks hashed in order from parent.
func chain(t testing.TB, parent uint64, blockSize int, blocks ...[]uint32) []uint64 {
	t.Helper()
	var toks []uint32
	for _, b := range blocks {
		if len(b) != blockSize {
			t.Fatalf("test expects full blocks, got %d tokens", len(b))
		}
		toks = append(toks, b...)
	}
	keys, err := hashcore.RouterKeys(parent, toks, blockSize, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func setOf(keys ...uint64) map[uint64]int {
	m := map[uint64]int{}
	for _, k := range keys {
		m[k]++
	}
	return m
}

func startDrain(t *testing.T, srv *drainServer, bs int) *harness {
	return startSource(t, Config{Family: "trtllm", Release: "1.2", DrainURL: srv.URL, BlockSize: bs,
		PollMin: 2 * time.Millisecond, PollMax: 10 * time.Millisecond, DialBackoffMin: 10 * time.Millisecond})
}

// TestDrainSamplesInOrder serves every shared sample body, in file order, to one source and checks
// the inventory after each: partial blocks not indexed and their removal suppressed, a GPU→host
// update leaving residency, a restart (event_id back to 0) clearing, the VSWA window filter keeping
// only the global window, per-rank event_id tracking.
func TestDrainSamplesInOrder(t *testing.T) {
	checkNoLeak(t)
	bodies, bs := trtBodies(t)
	srv := newDrainServer(t)
	h := startDrain(t, srv, bs)

	// Startup: created, then a stored chain of 3 full blocks and a partial one.
	first := decodeEvents(t, bodies["startup_created_and_first_store"])[1]
	a := chain(t, 0, bs, first.BlockTokens[:3]...)
	if len(first.BlockTokens[3]) >= bs {
		t.Fatal("sample changed: block 3 should be partial")
	}
	srv.queue <- bodies["startup_created_and_first_store"]
	h.waitKeys(setOf(a...))

	// Reuse: a continuation from block 1 (one full, one partial), a priority-only update, block 2
	// offloaded to host (not resident any more), and a removal of the two partial blocks.
	reuse := decodeEvents(t, bodies["reuse_updated_removed"])
	if reuse[0].Parent != first.BlockHashes[1] || len(reuse[0].BlockTokens[1]) >= bs {
		t.Fatal("sample changed: reuse should continue from block 1 and end partial")
	}
	c := chain(t, a[1], bs, reuse[0].BlockTokens[0])
	srv.queue <- bodies["reuse_updated_removed"]
	h.waitKeys(setOf(a[0], a[1], c[0]))
	if n := h.metric("kvexact_ingest_skipped_total", lbl("rank", "0", "reason", "unknown_block")); n != 0 {
		t.Errorf("unknown removals: %v, want 0 (partial removals are suppressed)", n)
	}
	if n := h.metric("kvexact_ingest_skipped_total", lbl("rank", "0", "reason", "partial_block")); n != 4 {
		t.Errorf("partial blocks skipped: %v, want 4 (2 stored, 2 removals)", n)
	}

	// VSWA: event_id back to 0 is an engine restart (clear); only the global window (32768) counts.
	vswa := decodeEvents(t, bodies["vswa_attention_windows"])
	var global engines.Event
	for _, e := range vswa {
		if e.Kind == engines.BlockStored && e.WindowSize == 32768 {
			global = e
		}
	}
	v := chain(t, 0, bs, global.BlockTokens[:2]...)
	srv.queue <- bodies["vswa_attention_windows"]
	h.waitKeys(setOf(v...))
	if n := h.metric("kvexact_ingest_clears_total", lbl("cause", "regression")); n != 1 {
		t.Errorf("regression clears: %v, want 1", n)
	}
	if n := h.metric("kvexact_ingest_skipped_total", lbl("rank", "0", "reason", "window")); n != 2 {
		t.Errorf("window skips: %v, want 2\n%s", n, h.traceLog())
	}

	// Attention DP: rank 0 continues at event_id 17 (12 missing: kept), but its window (8192) is
	// not rank 0's global one any more, so its events are filtered; rank 1 is new, learns nothing
	// from a created event and keeps its one full block until it is offloaded to host.
	srv.queue <- bodies["attention_dp_uint64_above_2p63"]
	eventually(t, 5*time.Second, "dp body applied", func() bool {
		return h.metric("kvexact_ingest_events_applied_total", lbl("rank", "1", "kind", "BlockUpdated")) == 1
	})
	h.waitKeys(setOf(v...))
	if n := h.metric("kvexact_ingest_gaps_total", lbl("rank", "0", "decision", "kept")); n != 1 {
		t.Errorf("rank 0 gaps kept: %v, want 1", n)
	}
	if n := h.metric("kvexact_ingest_skipped_total", lbl("rank", "0", "reason", "window")); n != 4 {
		t.Errorf("window skips: %v, want 4", n)
	}

	// After a restart: created again, event_id 0: cleared.
	srv.queue <- bodies["after_restart"]
	srv.queue <- bodies["empty_drain"]
	h.waitKeys(map[uint64]int{})
	if n := h.metric("kvexact_ingest_clears_total", lbl("cause", "regression")); n != 2 {
		t.Errorf("regression clears: %v, want 2", n)
	}
}

// TestDrainAttentionDP runs the attention-DP body alone: both ranks' chains, hashes above 2^63.
func TestDrainAttentionDP(t *testing.T) {
	checkNoLeak(t)
	bodies, bs := trtBodies(t)
	srv := newDrainServer(t)
	h := startDrain(t, srv, bs)
	evs := decodeEvents(t, bodies["attention_dp_uint64_above_2p63"])
	r0 := chain(t, 0, bs, evs[0].BlockTokens...)
	srv.queue <- bodies["attention_dp_uint64_above_2p63"]
	// Rank 0 stored 3 blocks and removed blocks 2 and 1; rank 1's only full block went to host.
	h.waitKeys(setOf(r0[0]))
	if evs[0].BlockHashes[0] < 1<<63 {
		t.Fatal("sample changed: hashes should be above 2^63")
	}
	if n := h.metric("kvexact_ingest_events_applied_total", lbl("rank", "1", "kind", "BlockUpdated")); n != 1 {
		t.Errorf("rank 1 updates applied: %v, want 1", n)
	}
}

func TestDrainRejectsAndGuard(t *testing.T) {
	checkNoLeak(t)
	bodies, bs := trtBodies(t)
	srv := newDrainServer(t)
	h := startDrain(t, srv, bs)
	srv.queue <- []byte(`[{"event_id": 0, "data": {"type": "stored", "parent_hash": 1.5e19, "blocks": []}}]`)
	eventually(t, 5*time.Second, "decode reject counted", func() bool {
		return h.metric("kvexact_ingest_rejects_total", lbl("rank", "0", "reason", "schema_mismatch"))+
			h.metric("kvexact_ingest_rejects_total", lbl("rank", "0", "reason", "decode_error")) == 1
	})
	// The stream goes on.
	first := decodeEvents(t, bodies["startup_created_and_first_store"])[1]
	srv.queue <- bodies["startup_created_and_first_store"]
	h.waitKeys(setOf(chain(t, 0, bs, first.BlockTokens[:3]...)...))

	// A second poller on the same drain would steal events: refused.
	src, err := New(Config{Family: "trtllm", DrainURL: srv.URL + "/", BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := src.Run(ctx, func(Update) {}); !errors.Is(err, ErrDrainBusy) {
		t.Fatalf("second poller: got %v, want ErrDrainBusy", err)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		cfg   Config
		field string
	}{
		{Config{Family: "llamacpp"}, "family"},
		{Config{Family: "tgi"}, "family"},
		{Config{Family: "vllm"}, "publish"},
		{Config{Family: "vllm", Release: "v0.9.0", Publish: []string{"tcp://127.0.0.1:5557"}}, "release"},
		{Config{Family: "vllm", Publish: []string{"tcp://*:5557"}}, "publish[0]"},
		{Config{Family: "vllm", Publish: []string{"tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"}, Replay: []string{"tcp://127.0.0.1:5600"}}, "replay"},
		{Config{Family: "sglang", Publish: []string{"tcp://127.0.0.1:5557"}, Binding: BindingRouter}, "block_size"},
		{Config{Family: "trtllm", DrainURL: "http://127.0.0.1:8000"}, "block_size"},
		{Config{Family: "trtllm", DrainURL: "http://127.0.0.1:8000", BlockSize: 32, Binding: BindingEngine}, "binding"},
		{Config{Family: "trtllm", BlockSize: 32}, "drain_url"},
	} {
		_, err := New(tc.cfg)
		if !errors.Is(err, ErrConfig) || !containsField(err.Error(), tc.field) {
			t.Errorf("%+v: got %v, want a config error naming %q", tc.cfg, err, tc.field)
		}
	}
}

func containsField(msg, field string) bool { return strings.Contains(msg, ": "+field+":") }
