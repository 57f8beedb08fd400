package trtllm

import (
	"strconv"

	"github.com/kvexact/kvexact/engines"
)

// ExtraOptions is the --extra_llm_api_options YAML given to trtllm-serve: KV events need a
// positive event_buffer_max_size (0, the default, means no event manager) and block reuse (without
// it nothing is stored); tokens_per_block is the contract's 32, the geometry the gateway and ctk
// assume. Events are then drained over HTTP at /kv_cache_events.
const ExtraOptions = `kv_cache_config:
  enable_block_reuse: true
  event_buffer_max_size: 16384
  tokens_per_block: 32
`

// ServeCommand starts trtllm-serve with ExtraOptions.
func (family) ServeCommand(s engines.ServeSpec) (*engines.ServeCommand, error) {
	return &engines.ServeCommand{Entrypoint: []string{"trtllm-serve"}, Ready: "Application startup complete",
		Files: map[string]string{"extra-llm-api-options.yaml": ExtraOptions},
		Args: append([]string{s.Model, "--host", "127.0.0.1", "--port", strconv.Itoa(s.HTTPPort), "--served_model_name", s.ServedName,
			"--extra_llm_api_options", s.ConfigDir + "/extra-llm-api-options.yaml"}, s.Args...)}, nil
}
