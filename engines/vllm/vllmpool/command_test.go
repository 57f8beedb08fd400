package vllmpool

import (
	"slices"
	"strings"
	"testing"
)

// TestServerCommand: the command line and environment a process or a container of the engine gets
// name the spec's ports, and Describe gives the addresses the gateway dials for the same ports;
// PYTHONHASHSEED is set exactly when a seed is given, and the host's environment is not in it; the
// offloading connector is configured exactly when host blocks are asked (64 blocks: 1 MiB).
func TestServerCommand(t *testing.T) {
	t.Setenv("PYTHONHASHSEED", "7")
	s := Spec{Name: "e", Model: "/m/llama3", Port: 41000, EventsPort: 41001, ReplayPort: 41002, KVBlocks: 96}.Filled()
	args := ServerArgs(s)
	joined := strings.Join(args, " ")
	for _, want := range []string{"--host 127.0.0.1 --port 41000", "--served-model-name llama3", "--block-size 32", "--prefix-caching-hash-algo sha256",
		`"endpoint":"tcp://*:41001"`, `"replay_endpoint":"tcp://127.0.0.1:41002"`, "--num-gpu-blocks-override 96"} {
		if !strings.Contains(joined, want) {
			t.Errorf("server args lack %q: %s", want, joined)
		}
	}
	d := Describe(s)
	if d.URL != "http://127.0.0.1:41000" || !slices.Equal(d.Publish, []string{"tcp://127.0.0.1:41001"}) || !slices.Equal(d.Replay, []string{"tcp://127.0.0.1:41002"}) {
		t.Errorf("describe: %s %v %v", d.URL, d.Publish, d.Replay)
	}
	// A container on its own network binds every interface of its namespace; the gateway still
	// dials 127.0.0.1, where Docker publishes the ports.
	all := s
	all.Host = "0.0.0.0"
	if j := strings.Join(ServerArgs(all), " "); !strings.Contains(j, "--host 0.0.0.0 ") || !strings.Contains(j, `"replay_endpoint":"tcp://0.0.0.0:41002"`) || Describe(all).URL != d.URL {
		t.Errorf("host 0.0.0.0: %s; describe %s", j, Describe(all).URL)
	}
	if strings.Contains(joined, "--kv-transfer-config") {
		t.Errorf("no offload asked, yet a connector is configured: %s", joined)
	}
	off := s
	off.OffloadBlocks = 64
	if j := strings.Join(ServerArgs(off), " "); !strings.Contains(j, `--kv-transfer-config {"kv_connector":"OffloadingConnector","kv_role":"kv_both",`) ||
		!strings.Contains(j, `"spec_name":"HostCopyOffloadingSpec","spec_module_path":"kvexact_offload","cpu_bytes_to_use":1048576,"self_describing_kv_events":true`) {
		t.Errorf("offload 64 blocks: %s", j)
	}
	s.NoEvents = true
	if strings.Contains(strings.Join(ServerArgs(s), " "), "--kv-events-config") || Describe(s).Publish != nil {
		t.Error("NoEvents still configures the publisher")
	}
	if env := ServerEnv(nil); slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PYTHONHASHSEED=") }) {
		t.Errorf("no seed asked, yet the environment sets one: %v", env)
	}
	zero := "0"
	if env := ServerEnv(&zero); !slices.Contains(env, "PYTHONHASHSEED=0") || slices.Contains(env, "PYTHONHASHSEED=7") {
		t.Errorf("seed 0: %v", env)
	}
	if env := engineEnv(nil); slices.Contains(env, "PYTHONHASHSEED=7") {
		t.Error("a process engine inherits the caller's PYTHONHASHSEED")
	}
}
