// Command enginesim runs one simulated inference engine (vLLM, SGLang, TensorRT-LLM or llama.cpp
// of a pinned release) on the wire: OpenAI API, the family's own endpoints, KV events and P/D
// dialect, with a real prefix cache and fault switches. See docs/simulator.md.
//
// It prints one line "enginesim listening http=… zmq=… replay=…" once every socket listens, and
// stops gracefully on SIGTERM or SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/internal/buildinfo"
)

func main() {
	if buildinfo.Flag("enginesim", os.Args[1:], os.Stdout) {
		return
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "enginesim:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("enginesim", flag.ContinueOnError)
	var c sim.Config
	var seed *string
	if v, ok := os.LookupEnv("PYTHONHASHSEED"); ok {
		seed = &v // read as vLLM reads it: set (even empty) is a seed, unset is a random root
	}
	fs.StringVar(&c.Family, "family", "", "engine family: vllm, sglang, trtllm, llamacpp")
	fs.StringVar(&c.Release, "release", "", "engine release tag (v0.25.1, v0.23.0, v0.5.18, 1.2, b10573)")
	fs.StringVar(&c.Model, "model", "", "tokenizer folder, or a model slug under the tokenizer roots (llama3, qwen3, …)")
	fs.StringVar(&c.ServedModelName, "served-model-name", "", "model id the API answers to (default: --model as the engine reports it)")
	fs.StringVar(&c.Endpoint, "endpoint", "sim", "endpoint name for receipts (X-Kvexact-Served-By, response ids)")
	fs.StringVar(&c.HTTPAddr, "http", "127.0.0.1:8000", "API listen address")
	fs.StringVar(&c.AdminAddr, "admin", "", "optional separate listen address for the /sim/ admin API")
	fs.StringVar(&c.PublishAddr, "zmq", "", "ZeroMQ PUB endpoint of rank 0 (default: the contract's, tcp://*:5557); a wildcard host binds, any other host dials out")
	fs.StringVar(&c.ReplayAddr, "replay", "", "ZeroMQ ROUTER replay endpoint of rank 0 (default: none)")
	fs.IntVar(&c.DPRanks, "dp", 1, "data-parallel ranks (rank r on port + r)")
	fs.StringVar(&c.Topic, "topic", "", "ZeroMQ topic frame")
	fs.IntVar(&c.ReplayBuffer, "replay-buffer", sim.DefaultReplayBuffer, "batches kept for replay (buffer_steps)")
	fs.IntVar(&c.HWM, "hwm", sim.DefaultHWM, "ZeroMQ PUB send high-water mark in messages; past it messages are dropped (a stalled subscriber sees a gap)")
	fs.IntVar(&c.BlockSize, "block-size", 0, "KV block (page) size in tokens (default: the contract's)")
	fs.StringVar(&c.Algorithm, "algo", "", "vLLM --prefix-caching-hash-algo (default: the contract's, sha256)")
	fs.Func("seed", "PYTHONHASHSEED for vLLM hashes (default: the PYTHONHASHSEED environment variable; unset = random root)", func(s string) error {
		seed = &s
		return nil
	})
	fs.Func("lora-modules", "a LoRA adapter served on the model, name=path as vLLM's --lora-modules (repeat for more; vllm only)", func(s string) error {
		c.LoRAModules = append(c.LoRAModules, s)
		return nil
	})
	fs.IntVar(&c.CapacityBlocks, "capacity", sim.DefaultCapacityBlocks, "KV cache capacity in blocks per rank")
	fs.IntVar(&c.SlidingWindow, "sliding-window", 0, "vLLM only: a hybrid model with a sliding-window KV-cache group of this many tokens beside full attention (0: one group)")
	fs.IntVar(&c.SlidingWindowBlocks, "sliding-window-capacity", 0, "blocks the sliding-window group may cache per rank (default: -capacity)")
	fs.StringVar(&c.ReportMode, "kv-cache-report-mode", "", "vLLM kv_cache_report_mode for every request: incremental (default) or full (re-emits prefix-cache hits; v0.26+)")
	fs.IntVar(&c.MaxModelLen, "max-model-len", sim.DefaultMaxModelLen, "context length")
	fs.DurationVar(&c.PrefillPerToken, "prefill-per-token", sim.DefaultPrefillPerToken, "prefill time per uncached prompt token")
	fs.DurationVar(&c.DecodePerToken, "decode-per-token", sim.DefaultDecodePerToken, "decode time per output token")
	fs.IntVar(&c.PrefillChunk, "prefill-chunk", sim.DefaultPrefillChunk, "chunked-prefill step in tokens")
	fs.IntVar(&c.MaxConcurrency, "max-concurrency", sim.DefaultMaxConcurrency, "requests running at once per rank (others queue)")
	fs.IntVar(&c.DefaultMaxTokens, "default-max-tokens", sim.DefaultMaxTokens, "output length when a request gives none")
	role := fs.String("role", "normal", "P/D role: normal, prefill, decode")
	fs.StringVar(&c.BootstrapAddr, "bootstrap", "", "SGLang prefill bootstrap listen address (default 127.0.0.1:0 for --role prefill)")
	fs.DurationVar(&c.BootstrapTimeout, "bootstrap-timeout", sim.DefaultBootstrapTimeout, "P/D rendezvous timeout")
	fs.StringVar(&c.KVHost, "kv-host", "127.0.0.1", "vLLM prefill: remote_host advertised in kv_transfer_params")
	fs.IntVar(&c.KVPort, "kv-port", 5600, "vLLM prefill: remote_port advertised in kv_transfer_params")
	fs.DurationVar(&c.DrainWait, "drain-wait", sim.DefaultDrainWait, "TensorRT-LLM: how long POST /kv_cache_events waits when empty")
	fs.IntVar(&c.DrainBuffer, "drain-buffer", sim.DefaultDrainBuffer, "TensorRT-LLM event_buffer_max_size")
	fs.BoolVar(&c.NoTRTPartialBlocks, "no-trt-partial-blocks", false, "TensorRT-LLM: do not store trailing partial blocks")
	fs.IntVar(&c.Faults.DropEvents, "drop-events", 0, "fault: drop the next N event messages (sequence gap)")
	fs.IntVar(&c.Faults.SkipSeqEvery, "skip-seq-every", 0, "fault: after every N event messages skip one sequence number (a gap that keeps recurring, nothing lost)")
	fs.BoolVar(&c.NoEvents, "no-kv-events", false, "KV events off (no --kv-events-config; TensorRT-LLM event_buffer_max_size 0)")
	fs.StringVar(&c.ReportVersion, "report-version", "", "version string the engine reports (default: the release's); any string")
	fs.BoolVar(&c.Faults.Refuse, "refuse", false, "fault: refuse API connections")
	fs.IntVar(&c.Faults.Status5xx, "status-5xx", 0, "fault: answer the next N inference requests with --status-code")
	fs.IntVar(&c.Faults.StatusCode, "status-code", 503, "fault: the 5xx status to answer")
	fs.IntVar(&c.Faults.DelayMS, "delay-ms", 0, "fault: delay every inference request by this many milliseconds")
	fs.BoolVar(&c.Faults.ReplayOff, "replay-off", false, "fault: the replay socket answers nothing")
	fs.BoolVar(&c.Faults.Unhealthy, "unhealthy", false, "fault: /health answers 503")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	c.Role = sim.Role(*role)
	c.DevMode = os.Getenv("VLLM_SERVER_DEV_MODE") == "1" // vLLM mounts /reset_prefix_cache only then
	c.Seed = seed
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))

	e, err := sim.New(c)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := e.Start(ctx); err != nil {
		return err
	}
	in := e.Info()
	extra := ""
	if in.Bootstrap != "" {
		extra = " bootstrap=" + in.Bootstrap
	}
	if a := e.AdminAddr(); a != "" {
		extra += " admin=" + a
	}
	fmt.Printf("enginesim listening http=%s zmq=%s replay=%s family=%s release=%s endpoint=%s%s\n",
		in.HTTP, orDash(in.Publish), orDash(in.Replay), in.Family, in.Release, in.Endpoint, extra)
	<-ctx.Done()
	done := make(chan struct{})
	go func() { _ = e.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		return fmt.Errorf("shutdown timed out")
	}
	return nil
}

func orDash(v []string) string {
	if len(v) == 0 {
		return "-"
	}
	return strings.Join(v, ",")
}
