package sim

import (
	"fmt"
	"strings"
)

// LoRA adapters, as vLLM serves them (--lora-modules name=path): a request whose model is an
// adapter's name runs on the base model with that LoRA, vLLM hashes the adapter name into every
// block's extra keys (so the adapter's blocks never match the base model's), BlockStored carries
// lora_name and the server-assigned lora_id, and /v1/models lists the adapter with its parent.
// The simulator only models vLLM's adapters; other families refuse the option.

// loraModule is one configured adapter.
type loraModule struct {
	name, path string
	id         int64 // vLLM's lora_int_id: 1, 2, … in flag order
}

// parseLoRAModules reads Config.LoRAModules ("name=path" or "name").
func parseLoRAModules(family, served string, specs []string) ([]loraModule, error) {
	if len(specs) > 0 && family != "vllm" {
		return nil, fmt.Errorf("lora modules: the simulator serves LoRA adapters for vllm only (family %s)", family)
	}
	var out []loraModule
	for i, s := range specs {
		name, path, _ := strings.Cut(s, "=")
		if name == "" || strings.ContainsAny(name, " \t\r\n") {
			return nil, fmt.Errorf("lora modules[%d] %q: want name=path with a non-empty name without spaces", i, s)
		}
		if name == served {
			return nil, fmt.Errorf("lora modules[%d]: %q is the served model name", i, name)
		}
		for _, m := range out {
			if m.name == name {
				return nil, fmt.Errorf("lora modules[%d]: %q is listed twice", i, name)
			}
		}
		if path == "" {
			path = "/adapters/" + name
		}
		out = append(out, loraModule{name: name, path: path, id: int64(i + 1)})
	}
	return out, nil
}

// lora returns the adapter a model name selects, nil for the base model or an unknown name.
func (e *Engine) lora(model string) *loraModule {
	for i := range e.loras {
		if e.loras[i].name == model {
			return &e.loras[i]
		}
	}
	return nil
}

// loraCards are the adapters' /v1/models entries (vLLM: id = name, root = path, parent = base).
func (e *Engine) loraCards() []any {
	var out []any
	for _, m := range e.loras {
		out = append(out, map[string]any{"id": m.name, "object": "model", "created": e.created.Unix(),
			"owned_by": e.ownedBy(), "root": m.path, "parent": e.cfg.ServedModelName, "max_model_len": e.cfg.MaxModelLen})
	}
	return out
}
