package containers

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
)

// VLLMCPUImage is the local image that runs the real vLLM engine (the CPU build of the pinned
// environment): a minimal Debian root with the environment's interpreter and shared libraries,
// made by scripts/vllm-image.sh. The environment and the model are not in it: they are bound
// read-only at their host paths (see docs/containers.md).
const VLLMCPUImage = "kvexact/vllm-cpu:dev"

// VLLMCPUImageHint is what a test that needs the image says when it is absent.
const VLLMCPUImageHint = "image " + VLLMCPUImage + " is missing: run scripts/vllm-image.sh (or make images)"

// StartVLLMCPU runs the engine s in a container of VLLMCPUImage with the command line and
// environment a vllmpool process gets (vllmpool.ServerArgs, vllmpool.ServerEnv), with free ports
// for those s leaves 0. On the host's network (nw nil) it binds 127.0.0.1; on the bridge network
// nw it binds every interface of its own namespace and its three ports are published on the host's
// 127.0.0.1 under the same numbers, so that its link can be cut. The pinned environment and the model
// folder are bound read-only at their host paths: a venv works only at the path it was made at, and
// copying its 6 GB into every image would cost minutes and disk per build. It waits at most timeout
// for the server's startup line. The returned description is the engine as vllmpool.Pool and
// vllmpool.Rule see it. It refuses data-parallel ranks, LoRA adapters and an offload tier
// (Spec.OffloadBlocks), none of whose files are bound into the container.
func (h *Harness) StartVLLMCPU(ctx context.Context, env *vllmpool.Env, nw *Network, s vllmpool.Spec, timeout time.Duration) (*Engine, *vllmpool.Engine, error) {
	if nw != nil {
		s.Host = bindHost(nw)
	}
	s = s.Filled()
	if s.DP != 1 || s.LoRA != "" {
		return nil, nil, fmt.Errorf("vllm container %s: data-parallel ranks and LoRA adapters are not bound into the container", s.Name)
	}
	if s.OffloadBlocks > 0 {
		// The connector loads the project's offload spec (vllmpool.OffloadSpec) from
		// scripts/vllm_offload, which a process engine gets on its PYTHONPATH and the container
		// has neither in its image nor among its binds: the engine would fail at start.
		return nil, nil, fmt.Errorf("vllm container %s: vllmpool.Spec.OffloadBlocks (%d) is not supported in a container: the offload spec (scripts/vllm_offload) is not bound into it; run the engine as a process (vllmpool.Env.Start)", s.Name, s.OffloadBlocks)
	}
	ports, err := FreePorts(3)
	if err != nil {
		return nil, nil, err
	}
	for i, p := range []*int{&s.Port, &s.EventsPort, &s.ReplayPort} {
		if *p == 0 {
			*p = ports[i]
		}
	}
	// The venv's own path, not a symlink to it: its scripts and pyvenv.cfg name the real one.
	venv, err := filepath.EvalSymlinks(filepath.Dir(filepath.Dir(env.Python)))
	if err != nil {
		return nil, nil, err
	}
	model, err := filepath.Abs(s.Model)
	if err != nil {
		return nil, nil, err
	}
	s.Model = model
	// Unbuffered: vLLM logs to stdout, which in a container is a pipe (block-buffered), so the
	// engine core's traceback would otherwise stay in the dying process's buffer.
	vars := map[string]string{"HOME": "/root", "PYTHONUNBUFFERED": "1"}
	for _, kv := range vllmpool.ServerEnv(s.Seed) {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	var published []int
	if nw != nil {
		published = []int{s.Port, s.EventsPort, s.ReplayPort}
	}
	c, err := h.Start(ctx, Spec{Role: "vllm", Name: s.Name, Image: VLLMCPUImage, Network: nw, Publish: published,
		Entrypoint: []string{filepath.Join(venv, "bin", "python")}, Args: vllmpool.ServerArgs(s), Env: vars,
		Binds: map[string]string{venv: venv, model: model},
		// uvicorn's line once the OpenAI server accepts requests (the engine core is up by then).
		Ready: "Application startup complete", ReadyTimeout: timeout, StopGrace: 15 * time.Second, ShmSize: 1 << 30})
	if err != nil {
		return nil, nil, err
	}
	d := vllmpool.Describe(s)
	e := &Engine{Container: c, Spec: EngineSimSpec{Endpoint: s.Name, Family: "vllm", Release: vllmpool.Release, Model: s.ServedModel, Replay: !s.NoEvents},
		HTTPPort: s.Port, http: &http.Client{Timeout: 5 * time.Minute}}
	if !s.NoEvents {
		e.ZMQPort, e.ReplayPort = s.EventsPort, s.ReplayPort
	}
	return e, d, nil
}
