package rules

import (
	"fmt"
	"slices"
	"unicode/utf8"
)

// normalizeAdapters validates the LoRA adapters and fills their defaults.
func (r *Rule) normalizeAdapters() error {
	seen := map[string]bool{}
	for i := range r.Adapters {
		a := &r.Adapters[i]
		f := fmt.Sprintf("adapters[%d]", i)
		if err := checkName(f+".name", a.Name); err != nil {
			return err
		}
		if seen[a.Name] {
			return fieldErr(f+".name", "%q is listed twice", a.Name)
		}
		seen[a.Name] = true
		if slices.Contains(r.Models, a.Name) {
			return fieldErr(f+".name", "%q is also one of models: an adapter is requested by its own name", a.Name)
		}
		if a.Base == "" {
			if len(r.Models) != 1 {
				return fieldErr(f+".base", "required when the rule does not list exactly one model")
			}
			a.Base = r.Models[0]
		}
		if len(r.Models) > 0 && !slices.Contains(r.Models, a.Base) {
			return fieldErr(f+".base", "%q is not one of this rule's models %v", a.Base, r.Models)
		}
		if err := checkName(f+".base", a.Base); err != nil {
			return err
		}
		if a.LoRAName == "" {
			a.LoRAName = a.Name
		}
		// The engine hashes this name into every block key and it reaches no header or label: any
		// UTF-8 the engine accepts, within the names' length.
		if !utf8.ValidString(a.LoRAName) || len(a.LoRAName) > maxNameLen {
			return fieldErr(f+".loraName", "must be valid UTF-8 of at most %d bytes", maxNameLen)
		}
		if !utf8.ValidString(a.LoRAPath) || len(a.LoRAPath) > maxPathLen {
			return fieldErr(f+".loraPath", "must be valid UTF-8 of at most %d bytes", maxPathLen)
		}
	}
	return nil
}

// maxPathLen bounds an adapter's path (hashed only: it reaches no header or label).
const maxPathLen = 4096

// DiscoveredAdapter checks an adapter an endpoint lists in /v1/models (id, parent, root) against
// the rule and returns it as the rule would declare it (vLLM hashes the served name and, from
// v0.31.0, the path it lists as root: LoRAName = id, LoRAPath = root).
func (r *Rule) DiscoveredAdapter(id, parent, root string) (Adapter, error) {
	// An adapter name reaches the same headers, log fields and metric labels as a declared one:
	// the same rule, or the adapter is not served.
	if err := checkName("id", id); err != nil {
		return Adapter{}, err
	}
	if err := checkName("parent", parent); err != nil {
		return Adapter{}, fmt.Errorf("%q: %w", id, err)
	}
	if slices.Contains(r.Models, id) {
		return Adapter{}, fmt.Errorf("%q is one of the rule's models", id)
	}
	if len(r.Models) > 0 && !slices.Contains(r.Models, parent) {
		return Adapter{}, fmt.Errorf("%q: parent %q is not one of the rule's models %v", id, parent, r.Models)
	}
	if !utf8.ValidString(root) || len(root) > maxPathLen {
		return Adapter{}, fmt.Errorf("%q: root must be valid UTF-8 of at most %d bytes", id, maxPathLen)
	}
	return Adapter{Name: id, Base: parent, LoRAName: id, LoRAPath: root}, nil
}
