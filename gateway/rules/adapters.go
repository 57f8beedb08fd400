package rules

import (
	"fmt"
	"slices"
	"unicode"
	"unicode/utf8"
)

// maxModelName bounds model and adapter names (they reach headers and logs).
const maxModelName = 256

// normalizeAdapters validates the LoRA adapters and fills their defaults.
func (r *Rule) normalizeAdapters() error {
	seen := map[string]bool{}
	for i := range r.Adapters {
		a := &r.Adapters[i]
		f := fmt.Sprintf("adapters[%d]", i)
		if err := checkModelName(a.Name); err != nil {
			return fieldErr(f+".name", "%v", err)
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
		if err := checkModelName(a.Base); err != nil {
			return fieldErr(f+".base", "%v", err)
		}
		if a.LoRAName == "" {
			a.LoRAName = a.Name
		}
		if !utf8.ValidString(a.LoRAName) || len(a.LoRAName) > maxModelName {
			return fieldErr(f+".loraName", "must be valid UTF-8 of at most %d bytes", maxModelName)
		}
	}
	return nil
}

// checkModelName accepts what an engine serves as a model id: non-empty UTF-8 of at most 256 bytes
// without control characters or spaces.
func checkModelName(s string) error {
	if s == "" {
		return fmt.Errorf("required")
	}
	if len(s) > maxModelName || !utf8.ValidString(s) {
		return fmt.Errorf("must be valid UTF-8 of at most %d bytes", maxModelName)
	}
	for i, c := range s {
		if unicode.IsControl(c) || unicode.IsSpace(c) {
			return fmt.Errorf("%q has a space or control character at byte %d", s, i)
		}
	}
	return nil
}

// DiscoveredAdapter checks an adapter an endpoint lists in /v1/models (id, parent) against the rule
// and returns it as the rule would declare it (vLLM hashes the served name, so LoRAName = id).
func (r *Rule) DiscoveredAdapter(id, parent string) (Adapter, error) {
	if err := checkModelName(id); err != nil {
		return Adapter{}, fmt.Errorf("id: %v", err)
	}
	if err := checkModelName(parent); err != nil {
		return Adapter{}, fmt.Errorf("parent of %q: %v", id, err)
	}
	if slices.Contains(r.Models, id) {
		return Adapter{}, fmt.Errorf("%q is one of the rule's models", id)
	}
	if len(r.Models) > 0 && !slices.Contains(r.Models, parent) {
		return Adapter{}, fmt.Errorf("%q: parent %q is not one of the rule's models %v", id, parent, r.Models)
	}
	return Adapter{Name: id, Base: parent, LoRAName: id}, nil
}
