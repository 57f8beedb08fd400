package llamacpp

import (
	"errors"
	"strconv"

	"github.com/kvexact/kvexact/engines"
)

// ServeCommand starts llama-server on the one GGUF file of the mounted model folder (it publishes
// no KV events).
func (family) ServeCommand(s engines.ServeSpec) (*engines.ServeCommand, error) {
	if s.ModelMount == "" || s.ModelFile == "" {
		return nil, errors.New("llama-server loads one GGUF file: set ModelDir and ModelFile (KVEXACT_REAL_MODEL_DIR, KVEXACT_REAL_GGUF)")
	}
	model := s.ModelMount + "/" + s.ModelFile
	return &engines.ServeCommand{Entrypoint: []string{"/app/llama-server"}, Ready: "server is listening on",
		Args: append([]string{"--model", model, "--host", "127.0.0.1", "--port", strconv.Itoa(s.HTTPPort), "--alias", s.ServedName,
			"--metrics", "--slots", "--n-gpu-layers", "999"}, s.Args...)}, nil
}
