package ingest

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/sglang"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/vectors"
)

// debianPython is the interpreter Debian's python3-zmq and python3-msgpack install into; the python3
// first on PATH may be another one without them.
const debianPython = "/usr/bin/python3"

// pyPeer is testdata/zmq_peer.py, a libzmq publisher driven over stdin/stdout.
type pyPeer struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	Pub    []string
	Replay []string
}

func startPyPeer(t *testing.T, ranks int, samples ...string) *pyPeer {
	t.Helper()
	if _, err := os.Stat(debianPython); err != nil {
		t.Skipf("interop peer needs %s (Debian's python3): apt-get install -y python3 python3-zmq python3-msgpack", debianPython)
	}
	if out, err := exec.Command(debianPython, "-c", "import zmq, msgpack").CombinedOutput(); err != nil {
		t.Skipf("interop peer needs python3-zmq and python3-msgpack for %s (apt-get update && apt-get install -y python3-zmq python3-msgpack): %s",
			debianPython, out)
	}
	args := []string{"testdata/zmq_peer.py", "--ranks", itoa(ranks)}
	for _, s := range samples {
		args = append(args, "--samples", s)
	}
	cmd := exec.Command(debianPython, args...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pyPeer{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	var ready struct {
		Ready       bool
		Pub, Replay []string
	}
	p.read(&ready)
	if !ready.Ready || len(ready.Pub) != ranks {
		t.Fatalf("peer not ready: %+v", ready)
	}
	p.Pub, p.Replay = ready.Pub, ready.Replay
	return p
}

func (p *pyPeer) read(v any) {
	p.t.Helper()
	if !p.out.Scan() {
		p.t.Fatalf("peer closed its output: %v", p.out.Err())
	}
	if err := json.Unmarshal(p.out.Bytes(), v); err != nil {
		p.t.Fatalf("peer said %q: %v", p.out.Text(), err)
	}
}

// do sends one command and waits for its answer.
func (p *pyPeer) do(cmd map[string]any) map[string]any {
	p.t.Helper()
	b, _ := json.Marshal(cmd)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		p.t.Fatalf("peer command %s: %v", b, err)
	}
	var resp map[string]any
	p.read(&resp)
	if e, ok := resp["error"]; ok {
		p.t.Fatalf("peer command %s: %v", b, e)
	}
	return resp
}

func (p *pyPeer) publish(rank int, seq uint64, sample string) {
	p.do(map[string]any{"op": "publish", "rank": rank, "seq": seq, "sample": sample})
}

// publishRestamped publishes a sample re-encoded with a new timestamp and returns the bytes sent.
func (p *pyPeer) publishRestamped(rank int, seq uint64, sample string) []byte {
	p.t.Helper()
	resp := p.do(map[string]any{"op": "publish", "rank": rank, "seq": seq, "sample": sample, "restamp": true})
	b, err := hex.DecodeString(resp["payload_hex"].(string))
	if err != nil {
		p.t.Fatal(err)
	}
	return b
}

func (p *pyPeer) publishTopic(rank int, seq uint64, sample, topic string) {
	p.do(map[string]any{"op": "publish", "rank": rank, "seq": seq, "sample": sample, "topic": topic})
}

// sampleFile locates a shared vector file from this package's directory.
func sampleFile(t testing.TB, rel string) string {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(here), "..", "..", "vectors", rel)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("vector file: %v", err)
	}
	return p
}

// loadPayloads reads a sample file's payloads by name, through the one sample loader.
func loadPayloads(t testing.TB, path string) map[string][]byte {
	t.Helper()
	f, err := vectors.LoadSamples(path)
	if err != nil {
		t.Fatal(err)
	}
	return f.Payloads()
}

// oracle is the expected inventory under the engine binding, restated independently of the
// binder: GPU (or no) medium only; a vLLM group is indexed when its stores say full attention; a
// removal counts only in a group seen indexed; a clear forgets everything.
type oracle struct {
	counts map[uint64]int
	full   map[int]bool
}

func newOracle() *oracle { return &oracle{counts: map[uint64]int{}, full: map[int]bool{}} }

func (o *oracle) clear() { o.counts = map[uint64]int{} }

func (o *oracle) apply(t testing.TB, decode func([]byte) (engines.Batch, error), payload []byte) {
	t.Helper()
	b, err := decode(payload)
	if err != nil {
		t.Fatalf("oracle decode: %v", err)
	}
	for _, ev := range b.Events {
		if ev.Medium != "" && ev.Medium != "GPU" {
			continue
		}
		switch ev.Kind {
		case engines.AllBlocksCleared:
			o.clear()
		case engines.BlockStored:
			full := ev.SpecKind == "" || ev.SpecKind == "full_attention" || ev.SpecKind == "mla_attention"
			if ev.HasGroupIdx {
				o.full[ev.GroupIdx] = full
			}
			if !full {
				continue
			}
			for _, h := range ev.BlockHashes {
				o.counts[h]++
			}
		case engines.BlockRemoved:
			if ev.HasGroupIdx && !o.full[ev.GroupIdx] {
				continue
			}
			for _, h := range ev.BlockHashes {
				if o.counts[h] > 0 {
					o.counts[h]--
					if o.counts[h] == 0 {
						delete(o.counts, h)
					}
				}
			}
		}
	}
}

func (o *oracle) want() map[uint64]int {
	out := make(map[uint64]int, len(o.counts))
	for k, v := range o.counts {
		out[k] = v
	}
	return out
}

func TestInteropVLLMPeer(t *testing.T) {
	checkNoLeak(t)
	file := sampleFile(t, "vllm/v0.25.1/events-samples.json")
	pay := loadPayloads(t, file)
	peer := startPyPeer(t, 2, file)
	dec := vllm.DecodeBatch
	o := newOracle()

	// Published before the gateway subscribes: only replay on connect delivers it.
	peer.publish(0, 0, "stored_first_blocks")
	o.apply(t, dec, pay["stored_first_blocks"])

	h := startSource(t, Config{Family: "vllm", Release: "v0.25.1", Publish: peer.Pub, Replay: peer.Replay,
		DialBackoffMin: 20 * time.Millisecond})
	for r := range 2 {
		peer.do(map[string]any{"op": "wait_sub", "rank": r})
		eventually(t, 5*time.Second, "replay on connect", func() bool {
			return h.metric("kvexact_ingest_replays_total", lbl("rank", itoa(r), "outcome", "completed")) >= 1
		})
	}
	h.waitKeys(o.want())

	peer.publish(0, 1, "stored_continuation_lora")
	o.apply(t, dec, pay["stored_continuation_lora"])
	h.waitKeys(o.want())

	peer.publish(1, 0, "mixed_mm_sliding_window_dp1") // rank 1: group 0 full, group 1 sliding
	o.apply(t, dec, pay["mixed_mm_sliding_window_dp1"])
	h.waitKeys(o.want())

	peer.publish(0, 2, "mixed_mm_sliding_window_dp1") // rank 1's batch on rank 0: rejected
	eventually(t, 5*time.Second, "rank_mismatch counted", func() bool {
		return h.metric("kvexact_ingest_rejects_total", lbl("rank", "0", "reason", "rank_mismatch")) == 1
	})

	peer.do(map[string]any{"op": "drop", "rank": 0, "seq": 3, "sample": "removed_two_blocks"}) // lost
	peer.publish(0, 4, "legacy_array_like_stored_first_blocks")
	o.apply(t, dec, pay["legacy_array_like_stored_first_blocks"])
	h.waitKeys(o.want())
	if g := h.metric("kvexact_ingest_gaps_total", lbl("rank", "0", "decision", "kept")); g != 1 {
		t.Errorf("gaps kept: %v, want 1", g)
	}
	peer.publish(0, 5, "stored_bytes_hashes") // same blocks as 64-bit ids from full digests
	o.apply(t, dec, pay["stored_bytes_hashes"])
	h.waitKeys(o.want())

	// Engine restart of rank 0: sequence back to 0. The restart clears the endpoint (both ranks).
	peer.do(map[string]any{"op": "restart", "rank": 0})
	peer.do(map[string]any{"op": "wait_sub", "rank": 0})
	eventually(t, 5*time.Second, "rank 0 reconnected", func() bool {
		return h.metric("kvexact_ingest_reconnects_total", lbl("rank", "0")) == 1 &&
			h.metric("kvexact_ingest_connected", lbl("rank", "0")) == 1
	})
	peer.publish(0, 0, "stored_continuation_lora")
	o.clear()
	o.apply(t, dec, pay["stored_continuation_lora"])
	h.waitKeys(o.want())
	if c := h.metric("kvexact_ingest_clears_total", lbl("cause", "restart")); c != 1 {
		t.Errorf("restart clears: %v, want 1\n%s", c, h.traceLog())
	}

	peer.publish(0, 1, "removed_two_blocks")
	o.apply(t, dec, pay["removed_two_blocks"])
	peer.publish(1, 1, "stored_first_blocks") // rank 0 stamp on rank 1: rejected
	eventually(t, 5*time.Second, "rank_mismatch on rank 1", func() bool {
		return h.metric("kvexact_ingest_rejects_total", lbl("rank", "1", "reason", "rank_mismatch")) == 1
	})
	// An AllBlocksCleared built by python3-msgpack on rank 1 clears the union.
	peer.do(map[string]any{"op": "cleared", "rank": 1, "seq": 2})
	o.clear()
	h.waitKeys(o.want())
	peer.publish(0, 2, "stored_first_blocks")
	o.apply(t, dec, pay["stored_first_blocks"])
	h.waitKeys(o.want())
	if len(o.counts) == 0 {
		t.Fatal("oracle ended empty: the scenario proves nothing")
	}
	if c := h.metric("kvexact_ingest_clears_total", lbl("cause", "engine")); c != 1 {
		t.Errorf("engine clears: %v, want 1", c)
	}
	if testing.Verbose() {
		t.Logf("trace:\n%s", h.traceLog())
	}
	peer.do(map[string]any{"op": "quit"})
}

// TestInteropSGLangPeer: SGLang v0.5.18's own payloads from a libzmq publisher, two ranks (rank 1
// with topic "kv-events" and bigram pages), replay on connect, a lost message, a restart.
func TestInteropSGLangPeer(t *testing.T) {
	checkNoLeak(t)
	file := sampleFile(t, "sglang/v0.5.18/events-samples.json")
	pay := loadPayloads(t, file)
	peer := startPyPeer(t, 2, file)
	dec := sglang.DecodeBatch
	o := newOracle()

	for seq, name := range []string{"startup_all_blocks_cleared", "stored_root_prompt_coalesced"} {
		peer.publish(0, uint64(seq), name) // before anyone subscribed: replay delivers them
		o.apply(t, dec, pay[name])
	}
	h := startSource(t, Config{Family: "sglang", Release: "v0.5.18", Publish: peer.Pub, Replay: peer.Replay,
		DialBackoffMin: 20 * time.Millisecond})
	for r := range 2 {
		peer.do(map[string]any{"op": "wait_sub", "rank": r})
		eventually(t, 5*time.Second, "replay on connect", func() bool {
			return h.metric("kvexact_ingest_replays_total", lbl("rank", itoa(r), "outcome", "completed")) >= 1
		})
	}
	h.waitKeys(o.want())

	peer.publish(0, 2, "stored_continuation_and_unrelated")
	o.apply(t, dec, pay["stored_continuation_and_unrelated"])
	h.waitKeys(o.want())
	peer.publishTopic(1, 0, "stored_bigram_eagle_dp1", "kv-events")
	o.apply(t, dec, pay["stored_bigram_eagle_dp1"])
	h.waitKeys(o.want())
	peer.publish(0, 3, "stored_salted_with_metadata")
	o.apply(t, dec, pay["stored_salted_with_metadata"])
	h.waitKeys(o.want())
	peer.do(map[string]any{"op": "drop", "rank": 0, "seq": 4, "sample": "removed_coalesced_eviction"})
	peer.publish(0, 5, "stored_root_prompt_coalesced") // a second copy of the root prompt
	o.apply(t, dec, pay["stored_root_prompt_coalesced"])
	h.waitKeys(o.want())
	if g := h.metric("kvexact_ingest_gaps_total", lbl("rank", "0", "decision", "kept")); g != 1 {
		t.Errorf("gaps kept: %v, want 1", g)
	}

	// Restart of rank 0: its startup batch is AllBlocksCleared, as SGLang's RadixCache sends.
	peer.do(map[string]any{"op": "restart", "rank": 0})
	peer.do(map[string]any{"op": "wait_sub", "rank": 0})
	eventually(t, 5*time.Second, "rank 0 reconnected", func() bool {
		return h.metric("kvexact_ingest_connected", lbl("rank", "0")) == 1 &&
			h.metric("kvexact_ingest_reconnects_total", lbl("rank", "0")) == 1
	})
	for seq, name := range []string{"startup_all_blocks_cleared", "stored_root_prompt_coalesced", "stored_continuation_and_unrelated"} {
		o.apply(t, dec, peer.publishRestamped(0, uint64(seq), name))
	}
	h.waitKeys(o.want())
	o.apply(t, dec, peer.publishRestamped(0, 3, "removed_coalesced_eviction"))
	h.waitKeys(o.want())
	if len(o.counts) == 0 {
		t.Fatal("oracle ended empty: the scenario proves nothing")
	}
	peer.do(map[string]any{"op": "quit"})
}
