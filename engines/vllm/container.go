package vllm

import (
	"strconv"

	"github.com/kvexact/kvexact/engines"
)

// ServeCommand starts `vllm serve` with prefix caching and ZeroMQ events plus replay; dev mode
// mounts /reset_prefix_cache, used by ctk's clear spec and the reset scenario.
func (family) ServeCommand(s engines.ServeSpec) (*engines.ServeCommand, error) {
	return &engines.ServeCommand{Entrypoint: []string{"vllm", "serve"}, Ready: "Application startup complete", Replay: true,
		Env: map[string]string{"VLLM_SERVER_DEV_MODE": "1"},
		Args: append([]string{s.Model, "--host", "127.0.0.1", "--port", strconv.Itoa(s.HTTPPort), "--served-model-name", s.ServedName,
			"--enable-prefix-caching", "--kv-events-config", engines.KVEventsConfig(s.ZMQPort, s.ReplayPort)}, s.Args...)}, nil
}
