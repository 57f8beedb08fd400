package sglang

import (
	"strconv"

	"github.com/kvexact/kvexact/engines"
)

// ServeCommand starts sglang.launch_server with ZeroMQ events plus replay.
func (family) ServeCommand(s engines.ServeSpec) (*engines.ServeCommand, error) {
	return &engines.ServeCommand{Entrypoint: []string{"python3", "-m", "sglang.launch_server"}, Ready: "The server is fired up", Replay: true,
		Args: append([]string{"--model-path", s.Model, "--host", "127.0.0.1", "--port", strconv.Itoa(s.HTTPPort),
			"--served-model-name", s.ServedName, "--kv-events-config", engines.KVEventsConfig(s.ZMQPort, s.ReplayPort)}, s.Args...)}, nil
}
