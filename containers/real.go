package containers

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/moby/moby/client"

	"github.com/kvexact/kvexact/contracts"
)

// EnvRealEngines must be "1" for the harness to start real engine images (they need a GPU, model
// weights and minutes to load, so they never start by accident).
const EnvRealEngines = "KVEXACT_REAL_ENGINES"

// RealEngineMissing lists what is missing to run the contract's pinned engine image here, each
// reason naming the thing to install or set; empty means the image can run.
func (h *Harness) RealEngineMissing(ctx context.Context, ct *contracts.Contract) []string {
	var why []string
	if os.Getenv(EnvRealEngines) != "1" {
		why = append(why, EnvRealEngines+"=1 is not set")
	}
	switch {
	case ct.Pin.Image == "":
		why = append(why, fmt.Sprintf("contract %s names no engine image (pin.image)", ct.ID))
	case !h.HasImage(ctx, ct.Pin.Image):
		why = append(why, fmt.Sprintf("image %s is not present locally (docker pull %s on a host with registry access)", ct.Pin.Image, ct.Pin.Image))
	}
	if g := h.GPUMissing(ctx); g != "" {
		why = append(why, g)
	}
	if realCommand(ct) == nil {
		why = append(why, fmt.Sprintf("the harness has no command line for %s images", ct.Family))
	}
	return why
}

// GPUMissing says why no GPU can be given to a container ("" when one can): the NVIDIA device
// nodes and Docker's nvidia runtime (nvidia-container-toolkit) are both needed.
func (h *Harness) GPUMissing(ctx context.Context) string {
	if _, err := os.Stat("/dev/nvidiactl"); err != nil {
		return "no NVIDIA GPU (/dev/nvidiactl is absent)"
	}
	info, err := h.cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		return "docker info: " + err.Error()
	}
	if _, ok := info.Info.Runtimes["nvidia"]; ok {
		return ""
	}
	if _, err := exec.LookPath("nvidia-container-runtime-hook"); err == nil {
		return ""
	}
	return "Docker has no nvidia runtime (install nvidia-container-toolkit and run nvidia-ctk runtime configure --runtime=docker)"
}

// RealEngineSpec describes a real engine container of a pinned release.
type RealEngineSpec struct {
	Contract *contracts.Contract
	Endpoint string
	// Model is the served model name; ModelDir, when set, is a host folder with the weights,
	// mounted read-only at /model and served from there (otherwise the engine downloads Model,
	// which needs network access and HFCache).
	Model    string
	ModelDir string
	// ModelFile is the weights file inside ModelDir for engines that load one file rather than a
	// folder: llama.cpp's GGUF (e.g. Llama-3.1-8B-Instruct-Q4_K_M.gguf). Required for llama.cpp.
	ModelFile string
	// HFCache is a host Hugging Face cache folder bound at /root/.cache/huggingface.
	HFCache string
	// Seed is PYTHONHASHSEED (vLLM); nil leaves it unset (no engine binding is then possible).
	Seed *string
	// Args are extra engine flags (e.g. --gpu-memory-utilization 0.4 to share one GPU).
	Args []string
	// ReadyTimeout bounds model loading (default 15 minutes).
	ReadyTimeout time.Duration
}

type realCmd struct {
	entrypoint []string
	ready      string
	// replay: the engine answers replay requests on its own ROUTER (ZeroMQ families only).
	replay bool
	args   func(s RealEngineSpec, model string, httpPort, zmqPort, replayPort int) []string
	// files are written to a host folder bound read-only at realConfigMount (TensorRT-LLM's
	// extra_llm_api_options YAML).
	files map[string]string
}

// realConfigMount is where files of a realCmd appear in the container.
const realConfigMount = "/kvexact"

// TRTLLMExtraOptions is the --extra_llm_api_options YAML the harness gives trtllm-serve: KV events
// need a positive event_buffer_max_size (0, the default, means no event manager) and block reuse
// (without it nothing is stored); tokens_per_block is the contract's 32, the geometry the gateway
// and ctk assume.
const TRTLLMExtraOptions = `kv_cache_config:
  enable_block_reuse: true
  event_buffer_max_size: 16384
  tokens_per_block: 32
`

// realCommand is how each family's image is started (docs/reference: vLLM's and SGLang's
// --kv-events-config JSON, a wildcard endpoint binds; TensorRT-LLM's KvCacheConfig through
// --extra_llm_api_options, events drained over HTTP at /kv_cache_events; llama.cpp has no events).
func realCommand(ct *contracts.Contract) *realCmd {
	events := func(zmq, replay int) string {
		b, _ := json.Marshal(map[string]any{"enable_kv_cache_events": true, "publisher": "zmq",
			"endpoint": "tcp://*:" + strconv.Itoa(zmq), "replay_endpoint": "tcp://*:" + strconv.Itoa(replay), "topic": ""})
		return string(b)
	}
	switch ct.Family {
	case "vllm":
		return &realCmd{entrypoint: []string{"vllm", "serve"}, ready: "Application startup complete", replay: true,
			args: func(s RealEngineSpec, model string, hp, zp, rp int) []string {
				return append([]string{model, "--host", "127.0.0.1", "--port", strconv.Itoa(hp), "--served-model-name", s.Model,
					"--enable-prefix-caching", "--kv-events-config", events(zp, rp)}, s.Args...)
			}}
	case "sglang":
		return &realCmd{entrypoint: []string{"python3", "-m", "sglang.launch_server"}, ready: "The server is fired up", replay: true,
			args: func(s RealEngineSpec, model string, hp, zp, rp int) []string {
				return append([]string{"--model-path", model, "--host", "127.0.0.1", "--port", strconv.Itoa(hp),
					"--served-model-name", s.Model, "--kv-events-config", events(zp, rp)}, s.Args...)
			}}
	case "trtllm":
		return &realCmd{entrypoint: []string{"trtllm-serve"}, ready: "Application startup complete",
			files: map[string]string{"extra-llm-api-options.yaml": TRTLLMExtraOptions},
			args: func(s RealEngineSpec, model string, hp, _, _ int) []string {
				return append([]string{model, "--host", "127.0.0.1", "--port", strconv.Itoa(hp), "--served_model_name", s.Model,
					"--extra_llm_api_options", realConfigMount + "/extra-llm-api-options.yaml"}, s.Args...)
			}}
	case "llamacpp":
		return &realCmd{entrypoint: []string{"/app/llama-server"}, ready: "server is listening on",
			args: func(s RealEngineSpec, model string, hp, _, _ int) []string {
				return append([]string{"--model", model, "--host", "127.0.0.1", "--port", strconv.Itoa(hp), "--alias", s.Model,
					"--metrics", "--slots", "--n-gpu-layers", "999"}, s.Args...)
			}}
	}
	return nil
}

// RealEventsMissing says why the contract's engine gives the gateway no event stream the real-engine
// scenarios can check ("" when it does).
func RealEventsMissing(ct *contracts.Contract) string {
	if ct.Family == "llamacpp" {
		return "llama.cpp publishes no KV events (content affinity only)"
	}
	return ""
}

// StartRealEngine starts the contract's pinned image with every GPU, on free host ports, KV events
// and replay on. The returned Engine's /sim/ helpers do not apply (real engines have no fault
// API); restart, pause and kill do.
func (h *Harness) StartRealEngine(ctx context.Context, s RealEngineSpec) (*Engine, error) {
	if why := h.RealEngineMissing(ctx, s.Contract); len(why) > 0 {
		return nil, fmt.Errorf("real engine %s: %v", s.Contract.ID, why)
	}
	rc := realCommand(s.Contract)
	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	model := s.Model
	binds := map[string]string{}
	if s.ModelDir != "" {
		binds[s.ModelDir] = "/model"
		model = "/model"
	}
	if s.Contract.Family == "llamacpp" {
		if s.ModelDir == "" || s.ModelFile == "" {
			return nil, fmt.Errorf("real engine %s: llama-server loads one GGUF file: set ModelDir and ModelFile (KVEXACT_REAL_MODEL_DIR, KVEXACT_REAL_GGUF)", s.Contract.ID)
		}
		model = "/model/" + s.ModelFile
	}
	var cfgDir string
	if len(rc.files) > 0 {
		if cfgDir, err = os.MkdirTemp("", "kvexact-real-"); err != nil {
			return nil, err
		}
		for name, body := range rc.files {
			if err := os.WriteFile(filepath.Join(cfgDir, name), []byte(body), 0o644); err != nil {
				os.RemoveAll(cfgDir)
				return nil, err
			}
		}
		binds[cfgDir] = realConfigMount
	}
	if s.HFCache != "" {
		binds[s.HFCache] = "/root/.cache/huggingface"
	}
	env := map[string]string{}
	if s.Seed != nil {
		env["PYTHONHASHSEED"] = *s.Seed
	}
	if s.Contract.Family == "vllm" {
		env["VLLM_SERVER_DEV_MODE"] = "1" // /reset_prefix_cache, used by ctk's clear spec and the reset scenario
	}
	if s.ReadyTimeout == 0 {
		s.ReadyTimeout = 15 * time.Minute
	}
	c, err := h.Start(ctx, Spec{Role: "engine", Name: s.Endpoint, Image: s.Contract.Pin.Image, Entrypoint: rc.entrypoint,
		Args: rc.args(s, model, ports[0], ports[1], ports[2]), Env: env, Binds: binds, Ready: rc.ready,
		ReadyTimeout: s.ReadyTimeout, GPU: true, StopGrace: 30 * time.Second, ShmSize: 8 << 30})
	if err != nil {
		if cfgDir != "" {
			os.RemoveAll(cfgDir)
		}
		return nil, err
	}
	if cfgDir != "" {
		c.onTerminate = func() { os.RemoveAll(cfgDir) }
	}
	e := &Engine{Container: c, Spec: EngineSimSpec{Endpoint: s.Endpoint, Family: s.Contract.Family, Release: s.Contract.Pin.Release, Model: s.Model},
		HTTPPort: ports[0], http: &http.Client{Timeout: 5 * time.Minute}}
	if s.Contract.Family == "vllm" || s.Contract.Family == "sglang" {
		e.ZMQPort = ports[1]
		if rc.replay {
			e.ReplayPort = ports[2]
			e.Spec.Replay = true
		}
	}
	return e, nil
}
