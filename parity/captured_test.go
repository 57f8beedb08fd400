package parity

import (
	"bytes"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/vectors"
)

// capturedCorpus is what the captured file must hold: the request shapes whose keys the gateway
// computes (make vectors-engine writes it from a real engine).
var capturedCorpus = []string{"completion", "completion_shared_prefix", "chat", "completion_cache_salt", "chat_cache_salt",
	"completion_no_special_tokens", "token_id_prompt", "lora", "long_prompt", "eviction", "reset"}

// TestEventSamplesVLLMCaptured: the payloads a real vLLM v0.31.0 engine published for the corpus
// (vectors/vllm/v0.31.0/events-samples.json, captured by cmd/vllmpool capture) decode to what
// msgspec decoded them to, re-encode byte for byte, and carry the keys the gateway's hash core
// computes from their own token ids under the engine's configuration (PYTHONHASHSEED=0, sha256,
// tagged extra keys from each sample's request): every store chained on the root or on a block an
// earlier sample stored, every removal of a block the file stored. No engine is needed.
func TestEventSamplesVLLMCaptured(t *testing.T) {
	checkCaptured(t, "vllm/v0.31.0/events-samples.json", capturedCorpus)
}

// offloadCorpus is what the captured offload file must hold (cmd/vllmpool capture-offload).
var offloadCorpus = []string{"store", "filler_a", "filler_b", "filler_c", "filler_d", "load", "filler_e", "filler_f",
	"reset", "load_after_reset", "reset_external", "store_after_reset_external"}

// TestEventSamplesVLLMOffloadCaptured: the payloads a real vLLM v0.31.0 engine with the offloading
// connector published (vectors/vllm/v0.31.0/offload-samples.json, cmd/vllmpool capture-offload)
// pass TestEventSamplesVLLMCaptured's checks — the host stores' keys too are the gateway's keys
// of their own tokens, chained on blocks the GPU stored — and hold what the gateway's lower tier
// rests on: host stores and host evictions with medium CPU, each store self-describing (one block,
// its parent, its tokens, the block size), and every batch carrying one flagged SecondaryTier.
func TestEventSamplesVLLMOffloadCaptured(t *testing.T) {
	f := checkCaptured(t, "vllm/v0.31.0/offload-samples.json", offloadCorpus)
	var stores, removals int
	for _, s := range f.Samples {
		b, err := vllm.DecodeBatch(s.Payload)
		if err != nil {
			t.Fatal(err)
		}
		cpu := false
		for _, e := range b.Events {
			if e.Medium != "CPU" {
				continue
			}
			cpu = true
			switch e.Kind {
			case engines.BlockStored:
				stores++
				if len(e.BlockHashes) != 1 || len(e.TokenIDs) != 32 || e.BlockSize != 32 {
					t.Errorf("%s: a host store of %d blocks, parent %v, %d tokens, block size %d (want one self-describing block)", s.Name, len(e.BlockHashes), e.HasParent, len(e.TokenIDs), e.BlockSize)
				}
			case engines.BlockRemoved:
				removals++
			}
		}
		if cpu != slices.Contains(s.Flags, "SecondaryTier") {
			t.Errorf("%s: a CPU-medium event %v, flags %v", s.Name, cpu, s.Flags)
		}
	}
	if stores == 0 || removals == 0 {
		t.Errorf("%d host stores and %d host removals captured: want both", stores, removals)
	}
}

// checkCaptured checks a file of captured v0.31.0 payloads (TestEventSamplesVLLMCaptured) whose
// sample names cover corpus, and returns it.
func checkCaptured(t *testing.T, rel string, corpus []string) *vectors.SampleFile {
	t.Helper()
	f := evLoad(t, rel)
	if f.Header.Source != "engine" {
		t.Fatalf("source %q, want engine", f.Header.Source)
	}
	layout, err := vllm.LayoutForRelease(f.Header.Tag)
	if err != nil {
		t.Fatal(err)
	}
	seed := "0"
	h, err := hashcore.New(hashcore.Binding{Algorithm: hashcore.VLLMSHA256, BlockSize: 32, Seed: &seed}, hashcore.Default())
	if err != nil {
		t.Fatal(err)
	}
	// stored: every key the file stored, with its full digest and its block's index in the prompt.
	type block struct {
		digest []byte
		index  int
	}
	stored := map[uint64]block{}
	seen := map[string]bool{}
	kinds := map[engines.Kind]int{}
	for _, s := range f.Samples {
		t.Run(s.Name, func(t *testing.T) {
			evCheckFrames(t, s.Topic, s.SeqFrame, s.Payload, s.Seq)
			got, err := vllm.DecodeBatch(s.Payload)
			if err != nil {
				t.Fatal(err)
			}
			want := evBatch(t, s.Decoded.([]any), evVLLMEvent)
			if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
				t.Fatalf("decoded vs msgspec's decoding (-want +got):\n%s", d)
			}
			out, err := vllm.EncodeBatch(got, layout)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out, s.Payload) {
				t.Fatalf("re-encoded payload differs from the engine's:\n got %x\nwant %x", out, s.Payload)
			}
			ex := &hashcore.Extras{Tagged: true, CacheSalt: s.Request.CacheSalt, LoRAName: s.Request.LoRAName, LoRAPath: s.Request.LoRAPath}
			for i, e := range got.Events {
				kinds[e.Kind]++
				switch e.Kind {
				case engines.BlockStored:
					parent, first := h.Root(), 0
					if e.HasParent {
						p, ok := stored[e.Parent]
						if !ok {
							t.Fatalf("event %d: parent %016x was not stored by an earlier sample", i, e.Parent)
						}
						parent, first = p.digest, p.index+1
					}
					n := len(e.BlockHashes)
					all, err := hashcore.ExtraKeys(ex, (first+n)*32, 32)
					if err != nil {
						t.Fatal(err)
					}
					var extras [][]any
					if len(all) >= first+n {
						extras = all[first : first+n]
					}
					digests, keys, err := h.ChainFrom(parent, e.TokenIDs, extras)
					if err != nil {
						t.Fatal(err)
					}
					if d := cmp.Diff(e.BlockHashes, keys); d != "" {
						t.Fatalf("event %d: the engine's keys vs the gateway's from the event's tokens (-engine +gateway):\n%s", i, d)
					}
					for j, k := range keys {
						stored[k] = block{digests[j], first + j}
					}
				case engines.BlockRemoved:
					for _, k := range e.BlockHashes {
						if _, ok := stored[k]; !ok {
							t.Fatalf("event %d: removal of %016x, which no sample stored", i, k)
						}
					}
				}
			}
		})
		seen[trimIndex(s.Name)] = true
	}
	for _, c := range corpus {
		if !seen[c] {
			t.Errorf("no captured sample for %s", c)
		}
	}
	if kinds[engines.BlockStored] == 0 || kinds[engines.BlockRemoved] == 0 || kinds[engines.AllBlocksCleared] == 0 {
		t.Errorf("event kinds captured %v: want stores, removals and a clear", kinds)
	}
	return f
}

// trimIndex drops the _N a capture adds when one request published several batches.
func trimIndex(name string) string {
	for i := len(name) - 1; i > 0; i-- {
		if name[i] == '_' {
			if i < len(name)-1 && allDigits(name[i+1:]) {
				return name[:i]
			}
			break
		}
	}
	return name
}

func allDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
