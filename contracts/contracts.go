// Package contracts is the registry of pinned engine releases: for each engine family and range of
// releases, how its KV events travel (transport, wire schema), how its block keys are computed (hash
// bindings, seed and truncation rules), where the block size comes from, which request fields enter
// the keys, its prefill/decode dialect, the HTTP probes certification uses, the OpenAI routes its server
// mounts (the API surface the proxy forwards), and the vector folder that
// defends the hashing facts. Contracts are embedded YAML files (data/), validated when first used
// against the closed vocabularies of vocabulary.yaml (the family list among them).
// Adding an engine release is adding one file here and its vectors; nothing else should change.
//
// This package imports nothing of the project: every other layer may depend on it.
package contracts

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

//go:embed data/*.yaml
var dataFS embed.FS

//go:embed vocabulary.yaml
var vocabularyYAML []byte

// Closed vocabularies, read from vocabulary.yaml. A contract file using any other value fails
// validation.
var (
	vocab       = mustVocabulary()
	Families    = vocab.Families // in the order messages list them
	Transports  = vocab.Transports
	WireSchemas = vocab.WireSchemas
	Bindings    = vocab.Bindings
	Algorithms  = vocab.Algorithms
	SeedRules   = vocab.SeedRules
	Truncations = vocab.Truncations
	PDDialects  = vocab.PDDialects
)

type vocabulary struct {
	Families    []string `yaml:"families"`
	Transports  []string `yaml:"transports"`
	WireSchemas []string `yaml:"wireSchemas"`
	Bindings    []string `yaml:"bindings"`
	Algorithms  []string `yaml:"algorithms"`
	SeedRules   []string `yaml:"seedRules"`
	Truncations []string `yaml:"truncations"`
	PDDialects  []string `yaml:"pdDialects"`
}

// mustVocabulary parses the embedded vocabulary; it panics only on a broken embedded file, which
// the package tests rule out.
func mustVocabulary() vocabulary {
	dec := yaml.NewDecoder(bytes.NewReader(vocabularyYAML))
	dec.KnownFields(true)
	var v vocabulary
	if err := dec.Decode(&v); err != nil {
		panic(fmt.Sprintf("contracts: vocabulary.yaml: %v", err))
	}
	return v
}

// Contract pins one engine family over a range of releases. Field comments say what each one
// promises; the YAML keys are the camelCase names shown.
type Contract struct {
	// ID names the contract (e.g. "vllm-kv-map-v2"); certificates record it.
	ID string `yaml:"id"`
	// Family is the engine family: vllm, sglang, trtllm or llamacpp.
	Family string `yaml:"family"`
	// Versions is the span of releases whose wire and hashing this contract describes.
	Versions Range `yaml:"versions"`
	// Pin is the one release inside Versions that was checked against source and vectors.
	Pin Pin `yaml:"pin"`
	// Transport is how events leave the engine: zmq-multipart-v1, http-drain-v1 or none.
	Transport string `yaml:"transport"`
	// WireSchema is the payload layout the family decoder expects.
	WireSchema string `yaml:"wireSchema"`
	// Events holds the event-source facts (default endpoint, replay, rank port offset).
	Events Events `yaml:"events"`
	// Hash says how block keys are computed and which bindings a rule may use.
	Hash Hash `yaml:"hash"`
	// BlockSize says where the engine's block size comes from and its default.
	BlockSize BlockSize `yaml:"blockSize"`
	// ExtraKeys describes which request fields enter the keys (free text per field, for operators).
	ExtraKeys map[string]string `yaml:"extraKeys"`
	// ExtraKeyTags: the release hashes every extra key as a tuple led by its kind
	// (hashcore.Binding.TaggedExtraKeys), as the released vllm 0.31.0 package does.
	ExtraKeyTags bool `yaml:"extraKeyTags"`
	// PD is the prefill/decode disaggregation dialect.
	PD string `yaml:"pd"`
	// Probes maps probe names (version, models, tokenize, health, metrics, info, …) to HTTP paths.
	Probes map[string]string `yaml:"probes"`
	// API lists the OpenAI API paths the family's server mounts (exact paths, read from its serving
	// code; docs/proxy.md cites where). The proxy forwards these and no other path unless a rule lists
	// it under passthrough: an engine's admin routes, even those under /v1/ (vLLM
	// /v1/load_lora_adapter), are never in it. Every family serves completions, chat and models.
	API []string `yaml:"api"`
	// Vectors is the folder under vectors/ whose engine-produced vectors defend this contract
	// ("" only where the engine has no hashing to defend).
	Vectors string `yaml:"vectors"`
	// Recheck lists what moving the pin to another release must verify again (engine source files
	// and the facts they decide); ctk certify prints it for a release no contract covers.
	Recheck []string `yaml:"recheck"`

	file string
}

// Pin identifies the checked release.
type Pin struct {
	Release        string `yaml:"release"`
	Commit         string `yaml:"commit"`
	CommitVerified bool   `yaml:"commitVerified"`
	Image          string `yaml:"image"`
	ImageVerified  bool   `yaml:"imageVerified"`
	Note           string `yaml:"note"`
}

// Events holds the event-source facts of a family.
type Events struct {
	// DefaultEndpoint is the engine's default publish address (ZeroMQ families).
	DefaultEndpoint string `yaml:"defaultEndpoint"`
	// DrainPath is the HTTP drain path (TensorRT-LLM).
	DrainPath string `yaml:"drainPath"`
	// Replay is "optional" when the engine can serve replay on a ROUTER socket, else "none".
	Replay string `yaml:"replay"`
	// RankPortOffset: data-parallel rank r publishes (and replays) on base port + r.
	RankPortOffset bool `yaml:"rankPortOffset"`
	// Int64Keys says how 64-bit keys are carried: "unsigned" or "signed" (bit pattern kept).
	Int64Keys string `yaml:"int64Keys"`
	// Residency says what a BlockStored means for the inventory: "copies" (the default: one more
	// cached copy, reference-counted, one BlockRemoved drops one) or "presence" (the engine may
	// repeat a store for a block it already holds — vLLM's kv_cache_report_mode="full" re-emits
	// prefix-cache hits — so a key is held or not per KV-cache group, and one removal ends it).
	Residency string `yaml:"residency"`
}

// The residency rules of Events.Residency.
const (
	ResidencyCopies   = "copies"
	ResidencyPresence = "presence"
)

// ResidencyRule is Residency with its default.
func (e Events) ResidencyRule() string {
	if e.Residency == "" {
		return ResidencyCopies
	}
	return e.Residency
}

// Hash says how keys are computed.
type Hash struct {
	// Bindings offered: engine (the engine's own ids, recomputed by the hash core) and/or router
	// (kvexact-xxh3-v1 over event tokens).
	Bindings []string `yaml:"bindings"`
	// DefaultBinding is what "auto" resolves to when certification proves nothing better: engine,
	// router or none.
	DefaultBinding string `yaml:"defaultBinding"`
	// Algorithms the engine can be configured with (the engine binding must name one).
	Algorithms []string `yaml:"algorithms"`
	// DefaultAlgorithm is the engine's own default.
	DefaultAlgorithm string `yaml:"defaultAlgorithm"`
	// Seed: pythonhashseed (vLLM: the exact PYTHONHASHSEED string) or none.
	Seed string `yaml:"seed"`
	// DefaultSeed is what the engine roots its chains in when PYTHONHASHSEED is unset. Absent: every
	// algorithm then roots in random bytes per process (vLLM ≤ v0.27), so no gateway can follow.
	DefaultSeed *DefaultSeed `yaml:"defaultSeed"`
	// Truncation: how a digest becomes the 64-bit id on the wire.
	Truncation string `yaml:"truncation"`
	// NoneReason explains why no binding exists (llama.cpp).
	NoneReason string `yaml:"noneReason"`
}

// DefaultSeed is a release's rule for an unset PYTHONHASHSEED (vLLM PR #51875): the algorithms listed
// root in H(Value); every other algorithm keeps a random root per process.
type DefaultSeed struct {
	// Value is the seed string hashed into the root, as the engine's DEFAULT_NONE_HASH_SEED.
	Value string `yaml:"value"`
	// Algorithms are those that take Value when the seed is unset (the cryptographic ones).
	Algorithms []string `yaml:"algorithms"`
	// Source cites the engine lines that define the rule.
	Source string `yaml:"source"`
}

// ErrRandomRoot says that the engine's roots are random per process: without the engine's seed no
// gateway can compute its block keys.
var ErrRandomRoot = errors.New("the engine roots its block hashes in random bytes per process")

// EngineSeed is the seed the engine actually hashes into its roots for algorithm, given the staged
// PYTHONHASHSEED (nil = unset): the staged one when set; the release's default seed when unset and
// the algorithm takes it; nil with no error for families without a seed. An unset seed where the
// roots are random is an error wrapping ErrRandomRoot that names the release, the algorithm and the
// remedy.
func (c *Contract) EngineSeed(algorithm string, staged *string) (*string, error) {
	if c.Hash.Seed != "pythonhashseed" {
		return nil, nil
	}
	if staged != nil {
		return staged, nil
	}
	if d := c.Hash.DefaultSeed; d != nil {
		if slices.Contains(d.Algorithms, algorithm) {
			v := d.Value
			return &v, nil
		}
		return nil, fmt.Errorf("%w: %s %s keeps a random root for %s when PYTHONHASHSEED is unset (its default seed %q covers only %s); set PYTHONHASHSEED on the engines and the same seed here, or run %s",
			ErrRandomRoot, c.Family, c.Versions.String(), algorithm, d.Value, strings.Join(d.Algorithms, ", "), strings.Join(d.Algorithms, " or "))
	}
	return nil, fmt.Errorf("%w: %s %s has no default seed, so with PYTHONHASHSEED unset no gateway can compute its keys; set PYTHONHASHSEED on the engines and the same seed here (\"\" is a valid seed)",
		ErrRandomRoot, c.Family, c.Versions.String())
}

// BlockSize says where the block size comes from.
type BlockSize struct {
	Source  string `yaml:"source"`
	Default int    `yaml:"default"`
	Note    string `yaml:"note"`
}

// File is the embedded file the contract came from.
func (c *Contract) File() string { return c.file }

// ServesAPI reports whether path is one of the OpenAI API paths the family's server mounts.
func (c *Contract) ServesAPI(path string) bool { return c != nil && slices.Contains(c.API, path) }

// SupportsBinding reports whether a rule may use binding b ("engine" or "router") with this contract.
func (c *Contract) SupportsBinding(b string) bool { return slices.Contains(c.Hash.Bindings, b) }

// SupportsAlgorithm reports whether the engine can be configured with algorithm a.
func (c *Contract) SupportsAlgorithm(a string) bool { return slices.Contains(c.Hash.Algorithms, a) }

// Seeded reports whether the engine roots its block hashes in a seed (PYTHONHASHSEED), so the
// seed is part of what certification proves.
func (c *Contract) Seeded() bool { return c.Hash.Seed == "pythonhashseed" }

// Drained reports whether the engine's events are drained over HTTP (one consumer, event ids from
// 0) rather than published over ZeroMQ.
func (c *Contract) Drained() bool { return c.Transport == "http-drain-v1" }

// Published reports whether the engine publishes its events over ZeroMQ (one socket per
// data-parallel rank, replay where Events.Replay offers it).
func (c *Contract) Published() bool { return c.Transport == "zmq-multipart-v1" }

// HasEvents reports whether the family publishes KV events at all.
func (c *Contract) HasEvents() bool { return c.Transport != "none" }

func (c *Contract) String() string {
	return fmt.Sprintf("%s %s (%s)", c.Family, c.Versions.String(), c.ID)
}

var (
	loadOnce sync.Once
	loaded   []*Contract
	loadErr  error
)

// All returns every embedded contract, ordered by family then release. It panics only if the
// embedded data is invalid, which the package tests rule out.
func All() []*Contract {
	cs, err := registry()
	if err != nil {
		panic(err)
	}
	return cs
}

func registry() ([]*Contract, error) {
	loadOnce.Do(func() { loaded, loadErr = loadFS() })
	return loaded, loadErr
}

func loadFS() ([]*Contract, error) {
	entries, err := dataFS.ReadDir("data")
	if err != nil {
		return nil, err
	}
	var cs []*Contract
	for _, e := range entries {
		name := path.Join("data", e.Name())
		b, err := dataFS.ReadFile(name)
		if err != nil {
			return nil, err
		}
		c, err := Parse(name, b)
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
	}
	if err := checkSet(cs); err != nil {
		return nil, err
	}
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].Family != cs[j].Family {
			return cs[i].Family < cs[j].Family
		}
		return cs[i].Versions.min.Compare(cs[j].Versions.min) < 0
	})
	return cs, nil
}

// Parse reads and validates one contract file. Unknown keys are errors (a typo must not silently
// drop a promise); every message names the file and the field.
func Parse(name string, data []byte) (*Contract, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var c Contract
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("contract %s: empty file", name)
		}
		return nil, fmt.Errorf("contract %s: %w", name, err)
	}
	c.file = name
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("contract %s: %w", name, err)
	}
	return &c, nil
}

func oneOf(field, v string, allowed []string) error {
	if slices.Contains(allowed, v) {
		return nil
	}
	return fmt.Errorf("%s: %q is not one of %s", field, v, strings.Join(allowed, ", "))
}

func (c *Contract) validate() error {
	if c.ID == "" {
		return errors.New("id: required")
	}
	if err := oneOf("family", c.Family, Families); err != nil {
		return err
	}
	if err := c.Versions.compile(); err != nil {
		return err
	}
	pin, err := ParseVersion(c.Pin.Release)
	if err != nil {
		return fmt.Errorf("pin.release: %w", err)
	}
	if !c.Versions.Contains(pin) {
		return fmt.Errorf("pin.release: %s is outside versions %s", c.Pin.Release, c.Versions.String())
	}
	switch {
	case c.Pin.Commit == "":
		return errors.New("pin.commit: required (\"unknown\" with commitVerified: false and a note when it could not be verified)")
	case c.Pin.CommitVerified && !isHex(c.Pin.Commit, 40):
		return fmt.Errorf("pin.commit: %q: a verified commit is 40 hex digits", c.Pin.Commit)
	case !c.Pin.CommitVerified && c.Pin.Note == "":
		return errors.New("pin.note: required when commitVerified is false (say what was and was not verified)")
	}
	for _, check := range []struct {
		field, v string
		allowed  []string
	}{
		{"transport", c.Transport, Transports},
		{"wireSchema", c.WireSchema, WireSchemas},
		{"hash.seed", c.Hash.Seed, SeedRules},
		{"hash.truncation", c.Hash.Truncation, Truncations},
		{"pd", c.PD, PDDialects},
		{"hash.defaultBinding", c.Hash.DefaultBinding, append(slices.Clone(Bindings), "none")},
	} {
		if err := oneOf(check.field, check.v, check.allowed); err != nil {
			return err
		}
	}
	for i, b := range c.Hash.Bindings {
		if err := oneOf(fmt.Sprintf("hash.bindings[%d]", i), b, Bindings); err != nil {
			return err
		}
	}
	for i, a := range c.Hash.Algorithms {
		if err := oneOf(fmt.Sprintf("hash.algorithms[%d]", i), a, Algorithms); err != nil {
			return err
		}
	}
	switch {
	case c.Transport == "none":
		if len(c.Hash.Bindings) != 0 || c.WireSchema != "none" {
			return errors.New("transport none: a family without events can offer no wire schema and no binding")
		}
		if c.Hash.NoneReason == "" {
			return errors.New("hash.noneReason: required when no binding is offered (operators see it)")
		}
	default:
		if len(c.Hash.Bindings) == 0 {
			return errors.New("hash.bindings: a family with events must offer at least one binding")
		}
		if !c.SupportsBinding(c.Hash.DefaultBinding) {
			return fmt.Errorf("hash.defaultBinding: %q is not among hash.bindings %v", c.Hash.DefaultBinding, c.Hash.Bindings)
		}
		if !c.SupportsAlgorithm(c.Hash.DefaultAlgorithm) {
			return fmt.Errorf("hash.defaultAlgorithm: %q is not among hash.algorithms %v", c.Hash.DefaultAlgorithm, c.Hash.Algorithms)
		}
		if c.BlockSize.Default < 1 || c.BlockSize.Default > 4096 {
			return fmt.Errorf("blockSize.default: %d is outside 1..4096", c.BlockSize.Default)
		}
		if c.Vectors == "" {
			return errors.New("vectors: a family with events must name the vector folder that defends it")
		}
		if c.Transport == "zmq-multipart-v1" && c.Events.DefaultEndpoint == "" {
			return errors.New("events.defaultEndpoint: required for zmq-multipart-v1")
		}
		if c.Transport == "http-drain-v1" && c.Events.DrainPath == "" {
			return errors.New("events.drainPath: required for http-drain-v1")
		}
		if err := oneOf("events.int64Keys", c.Events.Int64Keys, []string{"unsigned", "signed"}); err != nil {
			return err
		}
	}
	if d := c.Hash.DefaultSeed; d != nil {
		if c.Hash.Seed != "pythonhashseed" {
			return errors.New("hash.defaultSeed: only a pythonhashseed family has a default seed")
		}
		if len(d.Algorithms) == 0 || d.Source == "" {
			return errors.New("hash.defaultSeed: algorithms and source are required")
		}
		for i, a := range d.Algorithms {
			if !c.SupportsAlgorithm(a) {
				return fmt.Errorf("hash.defaultSeed.algorithms[%d]: %q is not among hash.algorithms %v", i, a, c.Hash.Algorithms)
			}
		}
	}
	if c.SupportsBinding("engine") && c.Hash.Truncation == "none" {
		return errors.New("hash.truncation: the engine binding needs the digest-to-id rule")
	}
	if err := oneOf("events.residency", c.Events.ResidencyRule(), []string{ResidencyCopies, ResidencyPresence}); err != nil {
		return err
	}
	if c.Events.Replay != "" {
		if err := oneOf("events.replay", c.Events.Replay, []string{"optional", "none"}); err != nil {
			return err
		}
	}
	for _, p := range []string{"version", "models", "health"} {
		if !strings.HasPrefix(c.Probes[p], "/") {
			return fmt.Errorf("probes.%s: required, an absolute HTTP path", p)
		}
	}
	return c.validateAPI()
}

// requiredAPI are the paths the proxy serves itself (parsed, routed by prefix, fanned out): a family
// without one of them could not sit behind the gateway.
var requiredAPI = []string{"/v1/completions", "/v1/chat/completions", "/v1/models"}

func (c *Contract) validateAPI() error {
	for i, p := range c.API {
		if !strings.HasPrefix(p, "/v1/") || path.Clean(p) != p || strings.ContainsAny(p, "*?#%{} ") {
			return fmt.Errorf("api[%d]: %q is not an exact OpenAI path (/v1/…, clean, no wildcard, query or escape)", i, p)
		}
		if slices.Contains(c.API[:i], p) {
			return fmt.Errorf("api[%d]: %q listed twice", i, p)
		}
	}
	for _, p := range requiredAPI {
		if !c.ServesAPI(p) {
			return fmt.Errorf("api: %s is missing (every family behind the gateway serves %s)", p, strings.Join(requiredAPI, ", "))
		}
	}
	return nil
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, r := range s {
		if !strings.ContainsRune("0123456789abcdef", r) {
			return false
		}
	}
	return true
}

// checkSet rejects duplicate ids and overlapping ranges within one family.
func checkSet(cs []*Contract) error {
	ids := map[string]string{}
	for i, c := range cs {
		if prev, dup := ids[c.ID]; dup {
			return fmt.Errorf("contract %s: id %q already used by %s", c.file, c.ID, prev)
		}
		ids[c.ID] = c.file
		for _, d := range cs[:i] {
			if d.Family == c.Family && (c.Versions.Contains(d.Versions.min) || d.Versions.Contains(c.Versions.min)) {
				return fmt.Errorf("contract %s: versions %s overlap %s (%s)", c.file, c.Versions.String(), d.Versions.String(), d.file)
			}
		}
	}
	return nil
}

// UnknownError says that no contract covers a family or version, and lists what is known. For a
// known family it names the nearest pinned contract and what pinning the release would verify.
// engines/registry reports an unregistered family name with it too (empty Version): one condition,
// one type.
type UnknownError struct {
	Family, Version string
	Known           []string
	// Nearest is the contract of the closest pinned release (the newest one below Version, else the
	// oldest one above it); nil for an unknown family.
	Nearest *Contract
}

func (e *UnknownError) Error() string {
	if e.Version == "" {
		return fmt.Sprintf("contracts: unknown engine family %q; known families: %s", e.Family, strings.Join(e.Known, ", "))
	}
	msg := fmt.Sprintf("contracts: no pinned contract for %s %s; known releases: %s", e.Family, e.Version, strings.Join(e.Known, "; "))
	if n := e.Nearest; n != nil {
		msg += fmt.Sprintf("; nearest pinned: %s (pin %s); to pin %s, verify: %s", n.ID, n.Pin.Release, e.Version, strings.Join(n.RecheckList(), "; "))
	}
	return msg
}

// RecheckList is what pinning another release of this family must verify: the contract's own list,
// or the facts every contract states.
func (c *Contract) RecheckList() []string {
	if len(c.Recheck) > 0 {
		return c.Recheck
	}
	return []string{"the tag's commit", "wire schema and event fields", "hash algorithms and seed rule", "block geometry", "extra keys", "P/D dialect", "vectors from the release's own hashing code", "the OpenAI routes the server mounts (api)"}
}

// Lookup finds the contract covering an engine family and release ("v0.25.1", "0.25.1",
// "1.2", "b10573-d775b89"). An unknown family or release is an *UnknownError listing what is known.
func Lookup(family, version string) (*Contract, error) {
	cs, err := registry()
	if err != nil {
		return nil, err
	}
	var fam []*Contract
	for _, c := range cs {
		if c.Family == family {
			fam = append(fam, c)
		}
	}
	if fam == nil {
		return nil, &UnknownError{Family: family, Known: Families}
	}
	v, err := ParseVersion(version)
	if err != nil {
		return nil, fmt.Errorf("contracts: %s: %w", family, err)
	}
	for _, c := range fam {
		if c.Versions.Contains(v) {
			return c, nil
		}
	}
	names := make([]string, len(fam))
	for i, c := range fam {
		names[i] = c.String()
	}
	return nil, &UnknownError{Family: family, Version: version, Known: names, Nearest: nearest(fam, v)}
}

// nearest is the contract whose range starts at the newest release at or below v, else the oldest;
// fam is ordered by range start.
func nearest(fam []*Contract, v Version) *Contract {
	best := fam[0]
	for _, c := range fam {
		if c.Versions.min.Compare(v) <= 0 {
			best = c
		}
	}
	return best
}

// ByID returns the contract with the given id.
func ByID(id string) (*Contract, error) {
	cs, err := registry()
	if err != nil {
		return nil, err
	}
	for _, c := range cs {
		if c.ID == id {
			return c, nil
		}
	}
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.ID
	}
	return nil, fmt.Errorf("contracts: no contract with id %q; known: %s", id, strings.Join(ids, ", "))
}
