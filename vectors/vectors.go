// Package vectors owns the golden block-hash vectors and the event-payload samples: their schema,
// their one loader each (samples.go for the samples), and the checker that runs the block-hash
// vectors against the hash core (verify.go).
//
// Two kinds of file are read into the same in-memory cases:
//   - the project's files, in the project's schema (schema/kvexact_vectors_v1.schema.json, modelled
//     on Project Wycheproof: a header, numberOfTests, a notes map of flags, test groups sharing block
//     geometry and seed, cases with tcId, comment, flags and result). cmd/vecgen writes them:
//     generated/ (the Go reference's own cases) and the files the project made by running an engine's
//     own hashing code (their header keeps that provenance). Every one is validated against the JSON
//     Schema when it is loaded.
//   - the engine-produced originals of ../shared/vectors, imported unchanged: each engine's own flat
//     case layout, read through schema/engines.json (which field holds which quantity),
//     chosen by the file's engine field. The loader knows no engine by name: what differs between
//     engines is data in that file and in each file's header.
//
// Files labelled with GeneratedOrigin live under generated/ and nowhere else, and no other file
// lives there: the loader enforces both directions so a generated case can never pass for engine
// truth.
package vectors

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// GeneratedOrigin is the origin label of every file cmd/vecgen generates from the Go reference.
const GeneratedOrigin = "kvexact-vecgen (Go reference)"

// GeneratedDir is the folder (under the vectors root) that holds generated files.
const GeneratedDir = "generated"

// EngineKVExact is the engine of generated router-key files (kvexact-xxh3-v1): the gateway's own
// keys, which no engine produces, so only generated files may carry it.
const EngineKVExact = "kvexact"

// Sources: who computed a file's expected values.
const (
	SourceEngine    = "engine"    // the engine's own code
	SourceGenerated = "generated" // the project's Go reference (cmd/vecgen)
)

// Header is a vector file's provenance.
type Header struct {
	// Schema is the layout the file was read in: SchemaName, or an engine's original case schema.
	Schema string
	// Engine is the engine whose hashing the cases pin (EngineKVExact for router keys).
	Engine string
	Tag    string // engine release ("release" in the project schema)
	Commit string // engine commit, or why it is unknown
	// Algo is the file's algorithm; "" for an original that names none (its cases still do).
	Algo string
	// Source is SourceEngine or SourceGenerated.
	Source string
	// Generator is how the expected values were produced (one or more lines).
	Generator      []string
	GeneratorNotes string
	// Notes are documentation lines ("header" in the project schema, "notes" in the originals).
	Notes []string
	// Flags documents every flag a case may carry (the project schema's notes map); nil for originals.
	Flags map[string]string
	// KeyType is how the file writes keys: KeyUint64 or KeyInt64.
	KeyType string
	// Origin is GeneratedOrigin for generated files and "" otherwise.
	Origin string
	// ExtraKeyScheme is how the release builds extra keys: ExtraKeysFlat ("" in a file) or
	// ExtraKeysTagged (vLLM v0.31.0+: each key a tuple naming its source).
	ExtraKeyScheme string
}

// The extra-key schemes of Header.ExtraKeyScheme.
const (
	ExtraKeysFlat   = "flat"
	ExtraKeysTagged = "tagged"
)

// Generated reports whether the file was produced by the project's own Go reference (and is
// therefore not engine truth).
func (h Header) Generated() bool { return h.Origin != "" }

// File is one block-hash vector file.
type File struct {
	Path   string
	Header Header
	// Cases are in tcId order (for originals: the order of their cases array).
	Cases []Case
	// layout names the file's fields in failures.
	layout *layout
}

// Field is the name the file gives a quantity of the vocabulary (e.g. "keys" in the project schema,
// "block_hashes_u64" in an original); the quantity itself when the file has no such field.
func (f *File) Field(quantity string) string {
	if f.layout != nil {
		if n := f.layout.field(quantity); n != "" {
			return n
		}
	}
	return quantity
}

// Case is one vector case, whichever schema it was read from, with every integer decoded exactly.
type Case struct {
	Index int // position in the file's cases (tcId - 1)
	// ID is the case's tcId: unique within its file, 1..len(Cases).
	ID   int
	Name string // stable identifier, unique within its file
	// Comment says what the case is about ("" when nothing needs saying).
	Comment string
	// Flags name what the case exercises; the file's Header.Flags documents each (see Flags()).
	Flags []string
	// Algo is the hash algorithm, as gateway/hashcore names it.
	Algo string
	// BlockSize is the engine's block (page) size in tokens.
	BlockSize int
	// Seed is the PYTHONHASHSEED string (nil = unset, or a binding without one).
	Seed *string
	// RootSeed is, for a reproducible case with Seed unset, the seed the engine itself resolved and
	// rooted its chain in.
	RootSeed *string
	// Reproducible is false for documentation cases whose expected values cannot be reproduced
	// (result "acceptable").
	Reproducible bool
	// Bigram is EAGLE bigram mode: unit j = (t[j], t[j+1]).
	Bigram bool
	Tokens []uint32
	// PromptLen, when > 0, asks for decode-style hashing: prompt first, then one token at a time.
	PromptLen int
	// GroupBlockSize, when > 0, is a coarser KV-cache group's block size.
	GroupBlockSize int
	Request        Request
	// ExtraKeys are the per-block extra keys the engine's hasher used (nil entry = None); HasExtraKeys
	// says whether the case has the field at all.
	ExtraKeys    [][]any
	HasExtraKeys bool
	// ExtraKeysOneShot, when non-nil, are the one-shot extra keys where they differ (mm quirk).
	ExtraKeysOneShot [][]any
	// TaggedExtras: the file's ExtraKeyScheme is ExtraKeysTagged.
	TaggedExtras bool
	Expected     Expected
}

// Results a case can have (Wycheproof's vocabulary).
const (
	// ResultValid: the expected values are the engine's; every implementation must reproduce them.
	ResultValid = "valid"
	// ResultAcceptable: the engine's output cannot be reproduced (random root, unknown seed rule);
	// the case documents behaviour and is skipped. No case is "invalid": no vector pins a refusal.
	ResultAcceptable = "acceptable"
)

// Result is the case's result: ResultValid or ResultAcceptable.
func (c *Case) Result() string {
	if c.Reproducible {
		return ResultValid
	}
	return ResultAcceptable
}

// Request holds the request fields extra keys are built from.
type Request struct {
	LoRAName  string
	LoRAIntID *int64 // recorded but never hashed (v0.11.1+)
	// LoRAPath is the adapter's path (LoRARequest.lora_path), hashed by tagged extra keys only.
	LoRAPath  string
	CacheSalt string
	MM        []MMFeature
	// PromptEmbedsRows are the raw bytes of each prompt-embedding row; nil when absent.
	PromptEmbedsRows [][]byte
}

// MMFeature is one multimodal item of a request.
type MMFeature struct {
	Identifier string
	Offset     int
	Length     int
}

// Expected are the values a case pins. Nil slices mean "not pinned" except Digests/Keys, which are
// always present for reproducible cases.
type Expected struct {
	// Root is the chain's root, block 0's prior (nil: block 0 has none).
	Root          []byte
	NumFullBlocks int
	Digests       [][]byte
	// Keys are the published 64-bit keys, as uint64 bit patterns (int64 files: the same bits).
	Keys          []uint64
	FirstPreimage []byte
	GroupDigests  [][]byte
	GroupKeys     []uint64
	// UnsaltedDigests are the engine's internal unsalted hashes of salted cases (never published).
	UnsaltedDigests [][]byte
}

// PathError is a problem at a JSON path of a vector file.
type PathError struct {
	File string
	Path string // e.g. $.cases[7].token_ids[3]
	Err  error
}

func (e *PathError) Error() string { return fmt.Sprintf("%s: %s: %v", e.File, e.Path, e.Err) }
func (e *PathError) Unwrap() error { return e.Err }

// ErrNotVectorFile marks a JSON file that is not a block-hash vector file.
var ErrNotVectorFile = errors.New("not a block-hash vector file")

// Load reads and decodes one block-hash vector file, in either schema.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse decodes a block-hash vector file from data; name is used in errors. A project-schema file is
// validated against the JSON Schema first.
func Parse(name string, data []byte) (*File, error) {
	f, err := parseEither(name, data, ErrNotVectorFile, (*parser).projectFile, (*parser).originalFile)
	if err != nil {
		return nil, err
	}
	f.Path = name
	if err := checkOrigin(name, f.Header); err != nil {
		return nil, err
	}
	return f, nil
}

// parseEither is what both loaders (block hashes, event samples) do before their own decoding:
// the JSON, its top-level object (else notKind), then the project schema — validated against the
// JSON Schema — when the file declares one, else the engine originals' layouts.
func parseEither[F any](name string, data []byte, notKind error, project, original func(*parser, map[string]any) (F, error)) (F, error) {
	var zero F
	root, err := decodeJSON(name, data)
	if err != nil {
		return zero, err
	}
	p := &parser{file: name}
	m, err := p.obj("$", root)
	if err != nil {
		return zero, p.wrap("$", fmt.Errorf("%w: %v", notKind, err))
	}
	if _, ok := m["schema"]; ok {
		if err := validateProject(name, root); err != nil {
			return zero, err
		}
		return project(p, m)
	}
	return original(p, m)
}

// checkOrigin keeps generated and engine-produced files apart.
func checkOrigin(name string, h Header) error {
	inGenerated := false
	for _, part := range strings.Split(filepath.ToSlash(filepath.Dir(name)), "/") {
		if part == GeneratedDir {
			inGenerated = true
		}
	}
	switch {
	case h.Origin != "" && h.Origin != GeneratedOrigin:
		return &PathError{File: name, Path: "$.origin", Err: fmt.Errorf("unknown origin %q (want %q or no origin for engine-produced files)", h.Origin, GeneratedOrigin)}
	case inGenerated && h.Origin == "":
		return &PathError{File: name, Path: "$.origin", Err: fmt.Errorf("file under %s/ has no origin label; generated vectors must say %q", GeneratedDir, GeneratedOrigin)}
	case !inGenerated && h.Origin != "":
		return &PathError{File: name, Path: "$.origin", Err: fmt.Errorf("origin %q outside a %s/ folder: generated vectors must not sit next to engine-produced ones", h.Origin, GeneratedDir)}
	case h.Engine == EngineKVExact && !h.Generated():
		return &PathError{File: name, Path: "$.engine", Err: fmt.Errorf("engine %q is only valid in generated files", EngineKVExact)}
	}
	return nil
}

// Dir finds the repository's vectors/ folder: it walks up from the working directory, then from this
// source file's directory, looking for a go.mod of module github.com/kvexact/kvexact next to a vectors
// folder. Tests and commands can therefore call it from any package.
func Dir() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	for _, s := range starts {
		for d := s; ; d = filepath.Dir(d) {
			mod, err := os.ReadFile(filepath.Join(d, "go.mod"))
			if err == nil && bytes.Contains(mod, []byte("module github.com/kvexact/kvexact")) {
				v := filepath.Join(d, "vectors")
				if st, err := os.Stat(v); err == nil && st.IsDir() {
					return v, nil
				}
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	return "", errors.New("vectors: cannot find the kvexact repository's vectors/ folder from the working directory or the source tree")
}

// BlockHashFiles lists the block-hash vector files under dir (a vectors root): every
// <engine>/<release>/*.json that is not an event-sample file, then generated/*.json. The order is
// stable.
func BlockHashFiles(dir string) ([]string, error) {
	var out []string
	for _, pat := range []string{"*/*/*.json", GeneratedDir + "/*.json"} {
		m, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			return nil, err
		}
		sort.Strings(m)
		for _, f := range m {
			rel, _ := filepath.Rel(dir, f)
			top := strings.Split(filepath.ToSlash(rel), "/")[0]
			if strings.Contains(filepath.Base(f), "sample") || top == "schema" || top == "testdata" {
				continue
			}
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("vectors: no block-hash files under %s", dir)
	}
	return out, nil
}
