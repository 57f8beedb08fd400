// Command vllmpool starts a pool of real vLLM engines (the pinned CPU build, a tiny generated model,
// dummy weights; engines/vllm/vllmpool) and stops it again by PID:
//
//	vllmpool up -dir DIR [-n 3] [-model llama3] [-seeds 0,0,unset] [-block-size 32] [-hash-algo sha256]
//	            [-kv-blocks 96] [-lora] [-dp 1] [-offload-blocks 0] [-listen 127.0.0.1:8080] [-admin 127.0.0.1:8081]
//	vllmpool restart -dir DIR -name vllm-1 [-seed 1|unset]
//	vllmpool down -dir DIR
//	vllmpool capture -out vectors/vllm/v0.31.0/events-samples.json
//	vllmpool capture-offload -out vectors/vllm/v0.31.0/offload-samples.json
//
// up writes DIR/pool.yaml (for ctk certify), DIR/gateway.yaml (for the gateway), DIR/pids (one
// process-group id a line) and each engine's log, prints one line per engine, and returns once
// every engine answers /health; the engines keep running. down ends each process group named in
// DIR/pids (SIGTERM, SIGKILL after 15 s) and removes the file. restart stops one engine and starts
// it again on the same ports (DIR/engines.json keeps each engine's spec), with another
// PYTHONHASHSEED when -seed says so. capture starts one engine, sends it a request corpus and
// writes the event payloads it published as the release's sample file (source engine; make
// vectors-engine).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
	"github.com/kvexact/kvexact/internal/buildinfo"
)

func main() {
	if buildinfo.Flag("vllmpool", os.Args[1:], os.Stdout) {
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: vllmpool up|down -dir DIR [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "up":
		err = up(os.Args[2:])
	case "restart":
		err = restart(os.Args[2:])
	case "down":
		err = down(os.Args[2:])
	case "capture":
		err = capture(os.Args[2:])
	case "capture-offload":
		err = captureOffload(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (up, restart, down, capture, capture-offload)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "vllmpool:", err)
		os.Exit(1)
	}
}

func up(args []string) error {
	fs := flag.NewFlagSet("vllmpool up", flag.ContinueOnError)
	dir := fs.String("dir", "", "folder for the model, logs, pool.yaml, gateway.yaml and pids (required)")
	n := fs.Int("n", 3, "number of engines")
	arch := fs.String("model", "llama3", "tiny model architecture: llama3 or qwen3")
	seeds := fs.String("seeds", "0", "PYTHONHASHSEED per engine, comma-separated (\"unset\" leaves it unset); the last one repeats; the pool file stages the first")
	blockSize := fs.Int("block-size", vllmpool.BlockSize, "tokens per block (the CPU build takes multiples of 32)")
	algo := fs.String("hash-algo", "sha256", "--prefix-caching-hash-algo")
	kvBlocks := fs.Int("kv-blocks", 96, "KV cache blocks per engine (0: vLLM's own sizing)")
	lora := fs.Bool("lora", false, "generate a dummy LoRA adapter and serve it on every engine")
	dp := fs.Int("dp", 1, "data-parallel size per engine")
	offload := fs.Int("offload-blocks", 0, "host-memory blocks of vLLM's offloading connector per engine (0: none; docs/vllm-engine.md)")
	binding := fs.String("binding", "", "the staged binding in pool.yaml and gateway.yaml: auto (default), engine or router")
	firstPort := fs.Int("port", 0, "first engine's HTTP port; engine i takes port+i (0: free ports)")
	listen := fs.String("listen", "127.0.0.1:8080", "the gateway config's client listener")
	admin := fs.String("admin", "127.0.0.1:8081", "the gateway config's admin listener")
	token := fs.String("token", "vllmpool-admin", "the gateway config's admin token")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long an engine may take to answer /health")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("up: -dir is required")
	}
	if *n < 1 {
		return fmt.Errorf("up: -n %d: at least one engine", *n)
	}
	env, err := vllmpool.Find()
	if err != nil {
		return err
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return err
	}
	model := filepath.Join(abs, *arch)
	loraDir := ""
	if *lora {
		loraDir = filepath.Join(abs, "tiny-lora")
	}
	if err := env.TinyModel(model, *arch, loraDir); err != nil {
		return err
	}
	seedList := strings.Split(*seeds, ",")
	seedOf := func(i int) *string {
		s := seedList[min(i, len(seedList)-1)]
		if s == "unset" {
			return nil
		}
		return &s
	}
	specs := make([]vllmpool.Spec, *n)
	for i := range specs {
		specs[i] = vllmpool.Spec{Name: fmt.Sprintf("vllm-%d", i), Model: model, ServedModel: *arch, BlockSize: *blockSize,
			HashAlgo: *algo, Seed: seedOf(i), KVBlocks: *kvBlocks, LoRA: loraDir, DP: *dp, OffloadBlocks: *offload}
		if *firstPort != 0 {
			specs[i].Port = *firstPort + i
		}
	}
	es := make([]*vllmpool.Engine, *n)
	errs := make([]error, *n)
	var wg sync.WaitGroup
	for i := range specs {
		wg.Go(func() { es[i], errs[i] = env.Start(context.Background(), specs[i], *timeout) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, e := range es {
			if e != nil {
				e.Stop()
			}
		}
		return err
	}
	for _, e := range es {
		report(e)
	}
	if err := writeState(abs, es); err != nil {
		return err
	}
	prof := vllmpool.Profile{Model: *arch, Tokenizer: model, BlockSize: *blockSize, HashAlgo: *algo, Seed: seedOf(0), Binding: *binding}
	if err := vllmpool.WriteFiles(abs, prof, es, *listen, *admin, *token); err != nil {
		return err
	}
	fmt.Printf("vllmpool: wrote %s and %s; stop with: vllmpool down -dir %s\n", filepath.Join(abs, "pool.yaml"), filepath.Join(abs, "gateway.yaml"), *dir)
	return nil
}

func down(args []string) error {
	fs := flag.NewFlagSet("vllmpool down", flag.ContinueOnError)
	dir := fs.String("dir", "", "the folder vllmpool up wrote (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("down: -dir is required")
	}
	path := filepath.Join(*dir, "pids")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for i, line := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(line)
		if err != nil || pid <= 1 {
			return fmt.Errorf("down: %s line %d: %q is not a process id", path, i+1, line)
		}
		if err := vllmpool.StopGroup(pid, 15*time.Second); err != nil {
			fmt.Fprintf(os.Stderr, "vllmpool: pid %d: %v\n", pid, err)
		}
	}
	return os.Remove(path)
}

func report(e *vllmpool.Engine) {
	seed := "unset"
	if e.Seed != nil {
		seed = *e.Seed
	}
	fmt.Printf("vllmpool: %s pid=%d url=%s events=%s replay=%s PYTHONHASHSEED=%s up in %v log=%s\n", e.Name, e.PID(), e.URL,
		strings.Join(e.Publish, ","), strings.Join(e.Replay, ","), seed, e.Started.Round(time.Second), e.LogPath)
}

// state is DIR/engines.json: each engine's spec (its ports included) and process-group id.
type state struct {
	Name string
	PID  int
	Spec vllmpool.Spec
}

func writeState(dir string, es []*vllmpool.Engine) error {
	var pids strings.Builder
	var st []state
	for _, e := range es {
		fmt.Fprintf(&pids, "%d\n", e.PID())
		st = append(st, state{Name: e.Name, PID: e.PID(), Spec: e.Spec})
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "engines.json"), b, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "pids"), []byte(pids.String()), 0o644)
}

func restart(args []string) error {
	fs := flag.NewFlagSet("vllmpool restart", flag.ContinueOnError)
	dir := fs.String("dir", "", "the folder vllmpool up wrote (required)")
	name := fs.String("name", "", "the engine to restart (required)")
	seed := fs.String("seed", "", "PYTHONHASHSEED after the restart (\"unset\" leaves it unset; empty: as before)")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long the engine may take to answer /health")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *name == "" {
		return errors.New("restart: -dir and -name are required")
	}
	b, err := os.ReadFile(filepath.Join(*dir, "engines.json"))
	if err != nil {
		return err
	}
	var st []state
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("restart: %s: %v", filepath.Join(*dir, "engines.json"), err)
	}
	i := slices.IndexFunc(st, func(s state) bool { return s.Name == *name })
	if i < 0 {
		return fmt.Errorf("restart: no engine %q in %s", *name, *dir)
	}
	if err := vllmpool.StopGroup(st[i].PID, 15*time.Second); err != nil {
		return err
	}
	spec := st[i].Spec
	switch *seed {
	case "":
	case "unset":
		spec.Seed = nil
	default:
		spec.Seed = seed
	}
	env, err := vllmpool.Find()
	if err != nil {
		return err
	}
	e, err := env.Start(context.Background(), spec, *timeout)
	if err != nil {
		return err
	}
	report(e)
	st[i].PID = e.PID()
	st[i].Spec = e.Spec
	var pids strings.Builder
	for _, s := range st {
		fmt.Fprintf(&pids, "%d\n", s.PID)
	}
	out, _ := json.MarshalIndent(st, "", "  ")
	if err := os.WriteFile(filepath.Join(*dir, "engines.json"), out, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*dir, "pids"), []byte(pids.String()), 0o644)
}
