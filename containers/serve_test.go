package containers_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/containers"
	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
)

// The real engines' command lines, as the harness started them before they moved into the family
// packages (engines/<family>/container.go): a change here is a change to what TestRealEngines runs.
func TestRealEngineCommands(t *testing.T) {
	spec := engines.ServeSpec{Model: "/model", ModelMount: "/model", ModelFile: "m.gguf", ServedName: "llama3",
		HTTPPort: 8000, ZMQPort: 5557, ReplayPort: 5558, ConfigDir: "/kvexact", Args: []string{"--x"}}
	events := `{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","publisher":"zmq","replay_endpoint":"tcp://*:5558","topic":""}`
	for _, c := range []struct {
		family, entrypoint, args, ready string
		replay                          bool
		env, files                      []string
	}{
		{"vllm", "vllm serve", "/model --host 127.0.0.1 --port 8000 --served-model-name llama3 --enable-prefix-caching --kv-events-config " + events + " --x",
			"Application startup complete", true, []string{"VLLM_SERVER_DEV_MODE=1"}, nil},
		{"sglang", "python3 -m sglang.launch_server", "--model-path /model --host 127.0.0.1 --port 8000 --served-model-name llama3 --kv-events-config " + events + " --x",
			"The server is fired up", true, nil, nil},
		{"trtllm", "trtllm-serve", "/model --host 127.0.0.1 --port 8000 --served_model_name llama3 --extra_llm_api_options /kvexact/extra-llm-api-options.yaml --x",
			"Application startup complete", false, nil, []string{"extra-llm-api-options.yaml=kv_cache_config:\n  enable_block_reuse: true\n  event_buffer_max_size: 16384\n  tokens_per_block: 32\n"}},
		{"llamacpp", "/app/llama-server", "--model /model/m.gguf --host 127.0.0.1 --port 8000 --alias llama3 --metrics --slots --n-gpu-layers 999 --x",
			"server is listening on", false, nil, nil},
	} {
		f, err := registry.Lookup(c.family)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := f.ServeCommand(spec)
		if err != nil {
			t.Fatalf("%s: %v", c.family, err)
		}
		var env, files []string
		for k, v := range rc.Env {
			env = append(env, k+"="+v)
		}
		for k, v := range rc.Files {
			files = append(files, k+"="+v)
		}
		if got := strings.Join(rc.Entrypoint, " "); got != c.entrypoint {
			t.Errorf("%s entrypoint %q, want %q", c.family, got, c.entrypoint)
		}
		if got := strings.Join(rc.Args, " "); got != c.args {
			t.Errorf("%s args\n got %s\nwant %s", c.family, got, c.args)
		}
		if rc.Ready != c.ready || rc.Replay != c.replay || !slices.Equal(env, c.env) || !slices.Equal(files, c.files) {
			t.Errorf("%s: ready %q replay %v env %v files %q, want %q %v %v %q", c.family, rc.Ready, rc.Replay, env, files, c.ready, c.replay, c.env, c.files)
		}
	}
	ll, _ := registry.Lookup("llamacpp")
	if _, err := ll.ServeCommand(engines.ServeSpec{Model: "llama3"}); err == nil ||
		err.Error() != "llama-server loads one GGUF file: set ModelDir and ModelFile (KVEXACT_REAL_MODEL_DIR, KVEXACT_REAL_GGUF)" {
		t.Errorf("llama.cpp without a model folder: %v", err)
	}
}

func TestRealEventsMissing(t *testing.T) {
	for _, ct := range contracts.All() {
		got, want := containers.RealEventsMissing(ct), ""
		if ct.Family == "llamacpp" {
			want = "llama.cpp publishes no KV events (content affinity only)"
		}
		if got != want {
			t.Errorf("%s: RealEventsMissing = %q, want %q", ct.ID, got, want)
		}
	}
}
