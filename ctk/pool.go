// Package ctk is kvexact's conformance test kit: it certifies a live engine pool — model,
// tokenizer, chat template, block geometry and hash binding, proven end to end against each
// endpoint's own HTTP API and KV event stream — and writes the certificate the gateway enforces,
// a human report and JUnit XML. It exists because one wrong leg (seed, algorithm, block size,
// tokenizer, template) gives a silent 0 % hit rate; docs/certification.md describes every spec.
package ctk

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/gateway/rules"
)

// Pool is a pool.yaml: the staged profile (what the gateway rule will use) and the endpoints to
// certify. Field names mirror the gateway rule's, so a pool file and its rule say the same thing.
type Pool struct {
	// Model is the served model name (the rule's single model).
	Model string `yaml:"model" json:"model"`
	// Tokenizer is the staged tokenizer folder (tokenizer.json + tokenizer_config.json); relative
	// paths are relative to the pool file. "" looks the model slug up under the tokenizer roots, as
	// the gateway does.
	Tokenizer string `yaml:"tokenizer" json:"tokenizer,omitempty"`
	// Tokenizers.Hub fetches the tokenizer from a Hugging Face–compatible hub instead, with the
	// gateway configuration's own tokenizers.hub section (the model must be one of its models).
	Tokenizers PoolTokenizers `yaml:"tokenizers" json:"tokenizers,omitzero"`
	// Engine is the default engine family and release of the endpoints (the rule's engine).
	Engine EngineRef `yaml:"engine" json:"engine"`
	// BlockSize in tokens; 0 takes the contract's default, as the rule does.
	BlockSize int `yaml:"blockSize" json:"blockSize,omitempty"`
	// HashAlgorithm is the engine's configured algorithm; "" takes the contract's default.
	HashAlgorithm string `yaml:"hashAlgorithm" json:"hashAlgorithm,omitempty"`
	// Binding is auto (default), engine or router.
	Binding string `yaml:"binding" json:"binding,omitempty"`
	// Seed is vLLM's PYTHONHASHSEED string ("" is a valid seed; absent = unknown).
	Seed *string `yaml:"seed" json:"seed,omitempty"`
	// Adapters are the LoRA adapters the rule declares: each is probed on every endpoint, and the
	// LoRA names proven go into the certificate (specs_lora.go).
	Adapters []Adapter `yaml:"adapters" json:"adapters,omitempty"`
	// DiscoverAdapters probes the adapters (at most maxProbedAdapters) each endpoint lists in
	// /v1/models when Adapters is empty (the rule's discoverAdapters).
	DiscoverAdapters bool `yaml:"discoverAdapters" json:"discoverAdapters,omitempty"`
	// Endpoints to certify.
	Endpoints []Endpoint `yaml:"endpoints" json:"endpoints"`

	dir    string            // folder of the pool file, for relative tokenizer paths
	staged map[string]Staged // per family, after Normalize
}

// PoolTokenizers says where the staged tokenizer comes from when not from a folder.
type PoolTokenizers struct {
	Hub *rules.TokenizerHub `yaml:"hub" json:"hub,omitempty"`
}

// EngineRef names an engine family and release.
type EngineRef struct {
	Family  string `yaml:"family" json:"family"`
	Release string `yaml:"release" json:"release"`
}

// Endpoint is one engine server of the pool.
type Endpoint struct {
	// Name identifies the endpoint; the certificate lists it under this name, which must equal the
	// endpoint's name in the gateway rule (default: Address, as in the rule).
	Name string `yaml:"name" json:"name"`
	// Address is the engine's base URL.
	Address string `yaml:"address" json:"address"`
	// Family and Release override Engine for this endpoint.
	Family  string `yaml:"family" json:"family,omitempty"`
	Release string `yaml:"release" json:"release,omitempty"`
	// Role: normal (default), prefill or decode (as in the rule; informational here).
	Role string `yaml:"role" json:"role,omitempty"`
	// Require is what the endpoint must be certified for: exact (the default for families with KV
	// events: the pool's binding, auto meaning engine or router) or affinity (content affinity only;
	// the default and the only choice for llama.cpp).
	Require string `yaml:"require" json:"require,omitempty"`
	// Events says where the endpoint publishes KV events.
	Events Events `yaml:"events" json:"events"`
	// Clear is a URL (or path on Address) that clears the engine's prefix cache, used instead of the
	// family's own (e.g. the simulator's /sim/clear); "" uses the family's.
	Clear string `yaml:"clear" json:"clear,omitempty"`

	contract *contracts.Contract
}

// Events lists an endpoint's event sources, one entry per data-parallel rank in rank order.
type Events struct {
	ZMQ    []string `yaml:"zmq" json:"zmq,omitempty"`
	Replay []string `yaml:"replay" json:"replay,omitempty"`
	Topic  string   `yaml:"topic" json:"topic,omitempty"`
	// Drain is the TensorRT-LLM server base URL (default: Address).
	Drain string `yaml:"drain" json:"drain,omitempty"`
}

// Staged is the profile one engine family is certified against, with defaults filled the way the
// gateway rule fills them.
type Staged struct {
	Contract  *contracts.Contract
	BlockSize int
	Algorithm string
	Binding   string // auto, engine, router; "none" for llama.cpp
	Seed      *string
}

// Requirements.
const (
	RequireExact    = "exact"
	RequireAffinity = "affinity"
)

// FieldError is a pool-file error naming the field.
type FieldError struct {
	Field, Msg string
}

func (e *FieldError) Error() string { return "pool: " + e.Field + ": " + e.Msg }

func fieldErr(field, format string, a ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, a...)}
}

// LoadPool reads and validates a pool file; errors name the field.
func LoadPool(path string) (*Pool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	p, err := ParsePool(b)
	if err != nil {
		return nil, err
	}
	if abs, err := filepath.Abs(filepath.Dir(path)); err == nil {
		p.dir = abs
	}
	return p, nil
}

// LoadPoolWithEndpoints reads a pool file for its staged profile and certifies endpoints instead
// of the ones it lists (which may be none): the pods of an InferencePool, listed when the run
// starts (ctk certify --from-inferencepool).
func LoadPoolWithEndpoints(path string, endpoints func(EngineRef) ([]Endpoint, error)) (*Pool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var p Pool
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	if p.Endpoints, err = endpoints(p.Engine); err != nil {
		return nil, err
	}
	if err := p.Normalize(); err != nil {
		return nil, err
	}
	if abs, err := filepath.Abs(filepath.Dir(path)); err == nil {
		p.dir = abs
	}
	return &p, nil
}

// ParsePool decodes and validates a pool document (relative tokenizer paths are taken from the
// working directory). Unknown keys are errors.
func ParsePool(b []byte) (*Pool, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var p Pool
	if err := dec.Decode(&p); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("pool: empty document")
		}
		return nil, fmt.Errorf("pool: %w", err)
	}
	if err := p.Normalize(); err != nil {
		return nil, err
	}
	return &p, nil
}

var bindings = []string{"auto", "engine", "router"}
var roles = []string{"normal", "prefill", "decode"}

// Normalize fills defaults and validates; the error names the field and the allowed values.
func (p *Pool) Normalize() error {
	if strings.TrimSpace(p.Model) == "" {
		return fieldErr("model", "required (the served model name the rule routes)")
	}
	if p.Binding == "" {
		p.Binding = "auto"
	}
	if !slices.Contains(bindings, p.Binding) {
		return fieldErr("binding", "%q is not one of %s", p.Binding, strings.Join(bindings, ", "))
	}
	if len(p.Endpoints) == 0 {
		return fieldErr("endpoints", "at least one endpoint is required")
	}
	if h := p.Tokenizers.Hub; h != nil {
		if p.Tokenizer != "" {
			return fieldErr("tokenizer", "set with tokenizers.hub: name the folder or the hub, not both")
		}
		if err := h.Normalize(); err != nil {
			return fieldErr("tokenizers.hub", "%v", err)
		}
		if _, ok := h.Models[p.Model]; !ok {
			return fieldErr("tokenizers.hub.models", "lists no %q (the pool's model)", p.Model)
		}
	}
	if err := p.normalizeAdapters(); err != nil {
		return err
	}
	p.staged = map[string]Staged{}
	names := map[string]bool{}
	for i := range p.Endpoints {
		e := &p.Endpoints[i]
		f := fmt.Sprintf("endpoints[%d]", i)
		if err := p.normalizeEndpoint(e, f); err != nil {
			return err
		}
		if names[e.Name] {
			return fieldErr(f+".name", "%q is used by another endpoint", e.Name)
		}
		names[e.Name] = true
	}
	return nil
}

func (p *Pool) normalizeEndpoint(e *Endpoint, f string) error {
	if e.Address == "" {
		return fieldErr(f+".address", "required (the engine's base URL, e.g. http://127.0.0.1:8000)")
	}
	if !strings.HasPrefix(e.Address, "http://") && !strings.HasPrefix(e.Address, "https://") {
		return fieldErr(f+".address", "%q must start with http:// or https://", e.Address)
	}
	e.Address = strings.TrimRight(e.Address, "/")
	if e.Name == "" {
		e.Name = e.Address
	}
	if e.Family == "" {
		e.Family = p.Engine.Family
		if e.Release == "" {
			e.Release = p.Engine.Release
		}
	}
	if e.Family == "" {
		return fieldErr(f+".family", "required here or as engine.family (%s)", strings.Join(contracts.Families, ", "))
	}
	if !slices.Contains(contracts.Families, e.Family) {
		return fieldErr(f+".family", "%q is not one of %s", e.Family, strings.Join(contracts.Families, ", "))
	}
	if e.Release == "" {
		return fieldErr(f+".release", "required here or as engine.release (the release the rule stages, e.g. v0.25.1, v0.5.18, 1.2, b10573)")
	}
	ct, err := contracts.Lookup(e.Family, e.Release)
	if err != nil {
		return fieldErr(f+".release", "%v", err)
	}
	e.contract = ct
	if e.Role == "" {
		e.Role = "normal"
	}
	if !slices.Contains(roles, e.Role) {
		return fieldErr(f+".role", "%q is not one of %s", e.Role, strings.Join(roles, ", "))
	}
	if e.Require == "" {
		e.Require = RequireExact
		if !ct.HasEvents() {
			e.Require = RequireAffinity
		}
	}
	switch e.Require {
	case RequireExact:
		if !ct.HasEvents() {
			return fieldErr(f+".require", "exact is refused for %s: %s; use require: affinity", e.Family, ct.Hash.NoneReason)
		}
	case RequireAffinity:
	default:
		return fieldErr(f+".require", "%q is not one of exact, affinity", e.Require)
	}
	st, err := p.stage(ct)
	if err != nil {
		return err
	}
	if prev, ok := p.staged[e.Family]; ok && prev.Contract.ID != ct.ID {
		return fieldErr(f+".release", "%s %s maps to contract %s, but another endpoint's %s release maps to %s: one pool certifies one contract per family (split the pool)", e.Family, e.Release, ct.ID, e.Family, prev.Contract.ID)
	}
	p.staged[e.Family] = st
	ev := &e.Events
	switch ct.Transport {
	case "none":
		if len(ev.ZMQ) > 0 || len(ev.Replay) > 0 || ev.Drain != "" {
			return fieldErr(f+".events", "%s publishes no KV events: %s", e.Family, ct.Hash.NoneReason)
		}
	case "zmq-multipart-v1":
		if ev.Drain != "" {
			return fieldErr(f+".events.drain", "%s publishes over ZeroMQ, not an HTTP drain", e.Family)
		}
		if e.Require == RequireExact && len(ev.ZMQ) == 0 {
			return fieldErr(f+".events.zmq", "required for exact routing: the publisher address of each data-parallel rank, in rank order (e.g. tcp://127.0.0.1:5557)")
		}
		if len(ev.ZMQ) > 8 {
			return fieldErr(f+".events.zmq", "%d ranks; at most 8", len(ev.ZMQ))
		}
		for i, a := range ev.ZMQ {
			if !strings.HasPrefix(a, "tcp://") && !strings.HasPrefix(a, "ipc://") {
				return fieldErr(fmt.Sprintf("%s.events.zmq[%d]", f, i), "%q must be a tcp:// or ipc:// address", a)
			}
		}
		if len(ev.Replay) > 0 {
			if ct.Events.Replay != "optional" {
				return fieldErr(f+".events.replay", "%s serves no replay", e.Family)
			}
			if len(ev.Replay) != len(ev.ZMQ) {
				return fieldErr(f+".events.replay", "%d addresses for %d ranks: give one replay address per rank, in rank order", len(ev.Replay), len(ev.ZMQ))
			}
			for i, a := range ev.Replay {
				if !strings.HasPrefix(a, "tcp://") && !strings.HasPrefix(a, "ipc://") {
					return fieldErr(fmt.Sprintf("%s.events.replay[%d]", f, i), "%q must be a tcp:// or ipc:// address", a)
				}
			}
		}
	case "http-drain-v1":
		if len(ev.ZMQ) > 0 || len(ev.Replay) > 0 {
			return fieldErr(f+".events.zmq", "%s drains events over HTTP (events.drain), not ZeroMQ", e.Family)
		}
		if ev.Drain == "" {
			ev.Drain = e.Address
		}
		ev.Drain = strings.TrimRight(ev.Drain, "/")
		if !strings.HasPrefix(ev.Drain, "http://") && !strings.HasPrefix(ev.Drain, "https://") {
			return fieldErr(f+".events.drain", "%q must start with http:// or https://", ev.Drain)
		}
	}
	if e.Clear != "" && !strings.HasPrefix(e.Clear, "/") && !strings.HasPrefix(e.Clear, "http://") && !strings.HasPrefix(e.Clear, "https://") {
		return fieldErr(f+".clear", "%q must be a URL or an absolute path on the endpoint", e.Clear)
	}
	return nil
}

// stage resolves the staged hash fields for one contract exactly as the gateway rule does.
func (p *Pool) stage(ct *contracts.Contract) (Staged, error) {
	st := Staged{Contract: ct, BlockSize: p.BlockSize, Algorithm: p.HashAlgorithm, Binding: p.Binding, Seed: p.Seed}
	if !ct.HasEvents() {
		// As the rule: llama.cpp takes no hash fields; they stay unset and the binding is none.
		return Staged{Contract: ct, Binding: "none"}, nil
	}
	if st.BlockSize == 0 {
		st.BlockSize = ct.BlockSize.Default
	}
	if st.BlockSize < 1 || st.BlockSize > 4096 {
		return st, fieldErr("blockSize", "%d is outside 1..4096", st.BlockSize)
	}
	if st.Algorithm == "" {
		st.Algorithm = ct.Hash.DefaultAlgorithm
	}
	if !ct.SupportsAlgorithm(st.Algorithm) {
		return st, fieldErr("hashAlgorithm", "%q does not fit %s %s; it offers %s", st.Algorithm, ct.Family, ct.Pin.Release, strings.Join(ct.Hash.Algorithms, ", "))
	}
	if st.Binding != "auto" && !ct.SupportsBinding(st.Binding) {
		return st, fieldErr("binding", "%q is not offered by %s %s (offers %s)", st.Binding, ct.Family, ct.Pin.Release, strings.Join(ct.Hash.Bindings, ", "))
	}
	switch ct.Hash.Seed {
	case "pythonhashseed":
		if _, err := ct.EngineSeed(st.Algorithm, st.Seed); st.Binding == "engine" && err != nil {
			return st, fieldErr("seed", "required for the engine binding: %v", err)
		}
	case "none":
		// The rule refuses a seed for these families; the pool may carry one for its vLLM endpoints.
		st.Seed = nil
	}
	return st, nil
}

// Staged returns the resolved profile fields for a family present in the pool.
func (p *Pool) Staged(family string) (Staged, bool) {
	st, ok := p.staged[family]
	return st, ok
}

// Contract is the staged contract the endpoint's family and release name.
func (e *Endpoint) Contract() *contracts.Contract { return e.contract }

// tokenizerDir resolves the tokenizer folder ("" = look the model up under the default roots).
func (p *Pool) tokenizerDir() string {
	if p.Tokenizer == "" || filepath.IsAbs(p.Tokenizer) || p.dir == "" {
		return p.Tokenizer
	}
	return filepath.Join(p.dir, p.Tokenizer)
}
