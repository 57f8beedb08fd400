package containers

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/moby/moby/client"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
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
	if family(ct) == nil {
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

// realConfigMount is where files of a serve command appear in the container.
const realConfigMount = "/kvexact"

// realModelMount is where RealEngineSpec.ModelDir is mounted.
const realModelMount = "/model"

// family is the contract's engine family (nil when it is not registered).
func family(ct *contracts.Contract) engines.Family {
	f, _ := registry.Lookup(ct.Family)
	return f
}

// RealEventsMissing says why the contract's engine gives the gateway no event stream the real-engine
// scenarios can check ("" when it does).
func RealEventsMissing(ct *contracts.Contract) string {
	if !ct.HasEvents() {
		return family(ct).Display() + " publishes no KV events (content affinity only)"
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
	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	ss := engines.ServeSpec{Model: s.Model, ModelFile: s.ModelFile, ServedName: s.Model, HTTPPort: ports[0], ZMQPort: ports[1], ReplayPort: ports[2],
		ConfigDir: realConfigMount, Args: s.Args}
	binds := map[string]string{}
	if s.ModelDir != "" {
		binds[s.ModelDir] = realModelMount
		ss.Model, ss.ModelMount = realModelMount, realModelMount
	}
	rc, err := family(s.Contract).ServeCommand(ss)
	if err != nil {
		return nil, fmt.Errorf("real engine %s: %w", s.Contract.ID, err)
	}
	var cfgDir string
	if len(rc.Files) > 0 {
		if cfgDir, err = os.MkdirTemp("", "kvexact-real-"); err != nil {
			return nil, err
		}
		for name, body := range rc.Files {
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
	maps.Copy(env, rc.Env)
	if s.ReadyTimeout == 0 {
		s.ReadyTimeout = 15 * time.Minute
	}
	c, err := h.Start(ctx, Spec{Role: "engine", Name: s.Endpoint, Image: s.Contract.Pin.Image, Entrypoint: rc.Entrypoint,
		Args: rc.Args, Env: env, Binds: binds, Ready: rc.Ready,
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
	if s.Contract.Published() {
		e.ZMQPort = ports[1]
		if rc.Replay {
			e.ReplayPort = ports[2]
			e.Spec.Replay = true
		}
	}
	return e, nil
}
