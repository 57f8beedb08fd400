package engines

import (
	"encoding/json"
	"strconv"
)

// Container is how the container harness (containers/) starts the family's pinned engine image
// on real hardware.
type Container interface {
	// ServeCommand is the engine server's command line for spec, or an error saying what spec
	// lacks for this engine.
	ServeCommand(spec ServeSpec) (*ServeCommand, error)
}

// ServeSpec is what the harness decided for one real engine container.
type ServeSpec struct {
	// Model is what the engine loads: the model id, or ModelMount when a host folder is mounted.
	Model string
	// ModelMount is where a host model folder is mounted ("" when none is: the engine downloads
	// Model); ModelFile is the weights file in it, for engines that load one file.
	ModelMount, ModelFile string
	ServedName            string // the served model name
	HTTPPort              int
	ZMQPort, ReplayPort   int    // KV-event publisher and replay ROUTER ports (ZeroMQ families)
	ConfigDir             string // where ServeCommand.Files appear in the container
	Args                  []string
}

// ServeCommand is a real engine's command line.
type ServeCommand struct {
	Entrypoint []string
	Args       []string
	// Ready is the log line that says the server accepts requests.
	Ready string
	// Replay: the engine answers replay requests on its own ROUTER.
	Replay bool
	// Env is added to the container's environment.
	Env map[string]string
	// Files are written to a host folder mounted read-only at ServeSpec.ConfigDir.
	Files map[string]string
}

// KVEventsConfig is the --kv-events-config JSON of the engines whose publisher is configured that
// way (vLLM, SGLang): events on zmqPort, replay on replayPort, wildcard binds, every topic.
func KVEventsConfig(zmqPort, replayPort int) string {
	b, _ := json.Marshal(map[string]any{"enable_kv_cache_events": true, "publisher": "zmq",
		"endpoint": "tcp://*:" + strconv.Itoa(zmqPort), "replay_endpoint": "tcp://*:" + strconv.Itoa(replayPort), "topic": ""})
	return string(b)
}
