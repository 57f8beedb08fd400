// Package vectors loads the golden block-hash vectors (one folder per engine release, plus the
// project's own generated cases under generated/) and checks them against the hash core.
//
// Engine-produced files carry no origin field; files written by cmd/vecgen carry
// Header.Origin == GeneratedOrigin and live under generated/. The loader enforces both directions so
// a generated case can never pass for engine truth.
package vectors

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
)

// GeneratedOrigin is the origin label of every file cmd/vecgen writes.
const GeneratedOrigin = "kvexact-vecgen (Go reference)"

// GeneratedDir is the folder (under the vectors root) that holds generated files.
const GeneratedDir = "generated"

// Engine families a block-hash file can belong to.
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
	// EngineKVExact marks generated router-key files (kvexact-xxh3-v1), which use the vLLM case
	// schema; only generated files may carry it.
	EngineKVExact = "kvexact"
)

// Header is a vector file's provenance.
type Header struct {
	Engine string // "vllm" or "sglang"
	Tag    string // engine release tag
	Commit string // engine commit
	// Algo is the file's hash_algo (vLLM files); "" for SGLang files.
	Algo string
	// Generator is how the expected values were produced (one or more lines).
	Generator      []string
	GeneratorNotes string
	Notes          []string
	// Origin is GeneratedOrigin for cmd/vecgen output and "" for engine-produced files.
	Origin string
}

// Generated reports whether the file was produced by the project's own Go reference (and is
// therefore not engine truth).
func (h Header) Generated() bool { return h.Origin != "" }

// File is one block-hash vector file.
type File struct {
	Path   string
	Header Header
	Cases  []Case
}

// Case is one vector case, vLLM or SGLang schema, with every integer decoded exactly.
type Case struct {
	Index int    // position in the file's cases array
	Name  string // case name
	// Algo is the hash algorithm: the vLLM case's hash_algo, or "sglang_sha256" for SGLang cases.
	Algo string
	// BlockSize is vLLM's block_size or SGLang's page_size.
	BlockSize int
	// Seed is the PYTHONHASHSEED string (vLLM; nil = unset).
	Seed *string
	// NoneHashSeed is, for a reproducible case with PYTHONHASHSEED unset, the seed the engine itself
	// resolved and rooted its chain in (vLLM ≥ v0.28 for its cryptographic algorithms).
	NoneHashSeed *string
	// Reproducible is false for documentation cases whose expected values cannot be reproduced.
	Reproducible bool
	// Bigram is SGLang's EAGLE bigram mode.
	Bigram bool
	Tokens []uint32
	// PromptLen, when > 0, asks for decode-style hashing: prompt first, then one token at a time.
	PromptLen int
	// GroupBlockSize, when > 0, is a coarser KV-cache group's block size.
	GroupBlockSize int
	Request        Request
	// ExtraKeys are the per-block extra keys the engine's hasher used (nil entry = None); HasExtraKeys
	// says whether the case has the field at all (SGLang cases do not).
	ExtraKeys    [][]any
	HasExtraKeys bool
	// ExtraKeysOneShot, when non-nil, are the one-shot extra keys where they differ (mm quirk).
	ExtraKeysOneShot [][]any
	Note             string
	Expected         Expected
}

// Request holds the request fields extra keys are built from.
type Request struct {
	LoRAName  string
	LoRAIntID *int64 // recorded but never hashed (v0.11.1+)
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
	// Root is vLLM's none_hash_hex or SGLang's salt_root_hex (nil when the case has none).
	Root          []byte
	NumFullBlocks int
	Digests       [][]byte
	// Keys are block_hashes_u64, or page_hashes_i64 as uint64 bit patterns.
	Keys          []uint64
	FirstPreimage []byte
	GroupDigests  [][]byte
	GroupKeys     []uint64
	// UnsaltedDigests are SGLang's internal unsalted page hashes of salted cases.
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

// Load reads and decodes one block-hash vector file.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse decodes a block-hash vector file from data; name is used in errors.
func Parse(name string, data []byte) (*File, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var root any
	if err := dec.Decode(&root); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, &PathError{File: name, Path: "$", Err: fmt.Errorf("invalid JSON at byte offset %d: %w", se.Offset, err)}
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, &PathError{File: name, Path: "$", Err: fmt.Errorf("invalid JSON at byte offset %d: %w", te.Offset, err)}
		}
		return nil, &PathError{File: name, Path: "$", Err: fmt.Errorf("invalid JSON: %w", err)}
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, &PathError{File: name, Path: "$", Err: fmt.Errorf("trailing data after the JSON value at byte offset %d", dec.InputOffset())}
	}
	p := &parser{file: name}
	f, err := p.file_(root)
	if err != nil {
		return nil, err
	}
	f.Path = name
	if err := checkOrigin(name, f.Header); err != nil {
		return nil, err
	}
	if f.Header.Engine == EngineKVExact && !f.Header.Generated() {
		return nil, &PathError{File: name, Path: "$.engine", Err: fmt.Errorf("engine %q is only valid in generated files", EngineKVExact)}
	}
	return f, nil
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
	}
	return nil
}

type parser struct{ file string }

func (p *parser) errf(path, format string, args ...any) error {
	return &PathError{File: p.file, Path: path, Err: fmt.Errorf(format, args...)}
}

func (p *parser) wrap(path string, err error) error {
	return &PathError{File: p.file, Path: path, Err: err}
}

func (p *parser) obj(path string, v any) (map[string]any, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, p.errf(path, "want an object, got %s", kind(v))
	}
	return m, nil
}

func (p *parser) arr(path string, v any) ([]any, error) {
	a, ok := v.([]any)
	if !ok {
		return nil, p.errf(path, "want an array, got %s", kind(v))
	}
	return a, nil
}

func (p *parser) str(path string, v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", p.errf(path, "want a string, got %s", kind(v))
	}
	return s, nil
}

func (p *parser) optStr(m map[string]any, key, path string) (string, error) {
	v, ok := m[key]
	if !ok || v == nil {
		return "", nil
	}
	return p.str(path+"."+key, v)
}

func (p *parser) boolean(path string, v any) (bool, error) {
	b, ok := v.(bool)
	if !ok {
		return false, p.errf(path, "want true or false, got %s", kind(v))
	}
	return b, nil
}

func (p *parser) i64(path string, v any) (int64, error) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, p.errf(path, "want an integer, got %s", kind(v))
	}
	i, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil {
		return 0, p.errf(path, "want an int64 integer, got %s", n)
	}
	return i, nil
}

func (p *parser) u64(path string, v any) (uint64, error) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, p.errf(path, "want an integer, got %s", kind(v))
	}
	u, err := strconv.ParseUint(n.String(), 10, 64)
	if err != nil {
		return 0, p.errf(path, "want an integer in 0..18446744073709551615, got %s", n)
	}
	return u, nil
}

func (p *parser) count(path string, v any, lo, hi int64) (int, error) {
	i, err := p.i64(path, v)
	if err != nil {
		return 0, err
	}
	if i < lo || i > hi {
		return 0, p.errf(path, "value %d out of range %d..%d", i, lo, hi)
	}
	return int(i), nil
}

func (p *parser) hexBytes(path string, v any) ([]byte, error) {
	s, err := p.str(path, v)
	if err != nil {
		return nil, err
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, p.errf(path, "bad hex: %v", err)
	}
	return b, nil
}

func (p *parser) hexList(path string, v any) ([][]byte, error) {
	a, err := p.arr(path, v)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(a))
	for i, e := range a {
		if out[i], err = p.hexBytes(fmt.Sprintf("%s[%d]", path, i), e); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func kind(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return fmt.Sprintf("the string %q", x)
	case json.Number:
		return "the number " + x.String()
	case bool:
		return fmt.Sprintf("%t", x)
	}
	return fmt.Sprintf("%T", v)
}

func (p *parser) strings_(path string, v any) ([]string, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		return []string{x}, nil
	case []any:
		out := make([]string, len(x))
		for i, e := range x {
			s, err := p.str(fmt.Sprintf("%s[%d]", path, i), e)
			if err != nil {
				return nil, err
			}
			out[i] = s
		}
		return out, nil
	}
	return nil, p.errf(path, "want a string or an array of strings, got %s", kind(v))
}

func (p *parser) file_(root any) (*File, error) {
	m, err := p.obj("$", root)
	if err != nil {
		return nil, p.wrap("$", fmt.Errorf("%w: %v", ErrNotVectorFile, err))
	}
	var h Header
	if h.Engine, err = p.optStr(m, "engine", "$"); err != nil {
		return nil, err
	}
	if h.Engine != EngineVLLM && h.Engine != EngineSGLang && h.Engine != EngineKVExact {
		return nil, p.errf("$.engine", "%v: engine %q (want %q or %q)", ErrNotVectorFile, h.Engine, EngineVLLM, EngineSGLang)
	}
	for _, f := range []struct {
		key string
		dst *string
	}{{"tag", &h.Tag}, {"commit", &h.Commit}, {"hash_algo", &h.Algo}, {"generator_notes", &h.GeneratorNotes}, {"origin", &h.Origin}} {
		if *f.dst, err = p.optStr(m, f.key, "$"); err != nil {
			return nil, err
		}
	}
	if h.Generator, err = p.strings_("$.generator", m["generator"]); err != nil {
		return nil, err
	}
	if h.Notes, err = p.strings_("$.notes", m["notes"]); err != nil {
		return nil, err
	}
	rawCases, ok := m["cases"]
	if !ok {
		return nil, p.errf("$.cases", "%v: no cases array", ErrNotVectorFile)
	}
	cases, err := p.arr("$.cases", rawCases)
	if err != nil {
		return nil, err
	}
	f := &File{Header: h, Cases: make([]Case, len(cases))}
	for i, rc := range cases {
		path := fmt.Sprintf("$.cases[%d]", i)
		var c *Case
		if h.Engine != EngineSGLang {
			c, err = p.vllmCase(path, rc)
		} else {
			c, err = p.sglangCase(path, rc)
		}
		if err != nil {
			return nil, err
		}
		c.Index = i
		if h.Algo != "" && c.Algo != h.Algo {
			return nil, p.errf(path+".hash_algo", "case algorithm %q differs from the file's %q", c.Algo, h.Algo)
		}
		f.Cases[i] = *c
	}
	return f, nil
}

func (p *parser) tokens(path string, v any) ([]uint32, error) {
	a, err := p.arr(path, v)
	if err != nil {
		return nil, err
	}
	out := make([]uint32, len(a))
	for i, e := range a {
		ip := fmt.Sprintf("%s[%d]", path, i)
		n, ok := e.(json.Number)
		if !ok {
			return nil, p.errf(ip, "want a token id, got %s", kind(e))
		}
		u, err := strconv.ParseUint(n.String(), 10, 64)
		if err != nil || u > math.MaxUint32 {
			return nil, p.errf(ip, "token id %s outside 0..4294967295", n)
		}
		out[i] = uint32(u)
	}
	return out, nil
}

func (p *parser) name(path string, m map[string]any) (string, error) {
	n, err := p.str(path+".name", m["name"])
	if err != nil {
		return "", err
	}
	if n == "" {
		return "", p.errf(path+".name", "empty case name")
	}
	return n, nil
}

func (p *parser) vllmCase(path string, v any) (*Case, error) {
	m, err := p.obj(path, v)
	if err != nil {
		return nil, err
	}
	c := &Case{}
	if c.Name, err = p.name(path, m); err != nil {
		return nil, err
	}
	if c.Algo, err = p.str(path+".hash_algo", m["hash_algo"]); err != nil {
		return nil, err
	}
	if c.BlockSize, err = p.count(path+".block_size", m["block_size"], 1, math.MaxInt32); err != nil {
		return nil, err
	}
	switch s := m["hash_seed"].(type) {
	case nil:
	case string:
		c.Seed = &s
	default:
		return nil, p.errf(path+".hash_seed", "want a string or null, got %s", kind(s))
	}
	if c.Reproducible, err = p.boolean(path+".reproducible", m["reproducible"]); err != nil {
		return nil, err
	}
	switch s := m["none_hash_seed"].(type) {
	case nil:
	case string:
		if c.Seed != nil {
			return nil, p.errf(path+".none_hash_seed", "only a case with hash_seed null resolves its own seed")
		}
		c.NoneHashSeed = &s
	default:
		return nil, p.errf(path+".none_hash_seed", "want a string or null, got %s", kind(s))
	}
	if c.Tokens, err = p.tokens(path+".token_ids", m["token_ids"]); err != nil {
		return nil, err
	}
	if pl, ok := m["prompt_len"]; ok && pl != nil {
		if c.PromptLen, err = p.count(path+".prompt_len", pl, 0, int64(len(c.Tokens))); err != nil {
			return nil, err
		}
	}
	if g, ok := m["group_block_size"]; ok && g != nil {
		if c.GroupBlockSize, err = p.count(path+".group_block_size", g, 1, math.MaxInt32); err != nil {
			return nil, err
		}
	}
	if c.Request, err = p.request(path+".request", m["request"]); err != nil {
		return nil, err
	}
	if ek, ok := m["extra_keys"]; ok {
		c.HasExtraKeys = true
		if c.ExtraKeys, err = p.blockExtras(path+".extra_keys", ek); err != nil {
			return nil, err
		}
	}
	if ek, ok := m["extra_keys_one_shot"]; ok && ek != nil {
		if c.ExtraKeysOneShot, err = p.blockExtras(path+".extra_keys_one_shot", ek); err != nil {
			return nil, err
		}
	}
	if c.Note, err = p.optStr(m, "note", path); err != nil {
		return nil, err
	}
	ep := path + ".expected"
	em, err := p.obj(ep, m["expected"])
	if err != nil {
		return nil, err
	}
	if c.Expected.NumFullBlocks, err = p.count(ep+".num_full_blocks", em["num_full_blocks"], 0, math.MaxInt32); err != nil {
		return nil, err
	}
	if !c.Reproducible {
		return c, nil
	}
	e := &c.Expected
	if e.Root, err = p.hexBytes(ep+".none_hash_hex", em["none_hash_hex"]); err != nil {
		return nil, err
	}
	if e.Digests, err = p.hexList(ep+".block_hashes_hex", em["block_hashes_hex"]); err != nil {
		return nil, err
	}
	if e.Keys, err = p.u64List(ep+".block_hashes_u64", em["block_hashes_u64"]); err != nil {
		return nil, err
	}
	if len(e.Keys) != len(e.Digests) {
		return nil, p.errf(ep+".block_hashes_u64", "%d keys for %d digests", len(e.Keys), len(e.Digests))
	}
	if fp, ok := em["first_block_preimage_hex"]; ok && fp != nil {
		if e.FirstPreimage, err = p.hexBytes(ep+".first_block_preimage_hex", fp); err != nil {
			return nil, err
		}
	}
	if g, ok := em["group_block_hashes_hex"]; ok && g != nil {
		if e.GroupDigests, err = p.hexList(ep+".group_block_hashes_hex", g); err != nil {
			return nil, err
		}
		if e.GroupKeys, err = p.u64List(ep+".group_block_hashes_u64", em["group_block_hashes_u64"]); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (p *parser) u64List(path string, v any) ([]uint64, error) {
	a, err := p.arr(path, v)
	if err != nil {
		return nil, err
	}
	out := make([]uint64, len(a))
	for i, e := range a {
		if out[i], err = p.u64(fmt.Sprintf("%s[%d]", path, i), e); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (p *parser) i64AsU64List(path string, v any) ([]uint64, error) {
	a, err := p.arr(path, v)
	if err != nil {
		return nil, err
	}
	out := make([]uint64, len(a))
	for i, e := range a {
		x, err := p.i64(fmt.Sprintf("%s[%d]", path, i), e)
		if err != nil {
			return nil, err
		}
		out[i] = uint64(x)
	}
	return out, nil
}

func (p *parser) request(path string, v any) (Request, error) {
	var r Request
	if v == nil {
		return r, nil
	}
	m, err := p.obj(path, v)
	if err != nil {
		return r, err
	}
	if r.LoRAName, err = p.optStr(m, "lora_name", path); err != nil {
		return r, err
	}
	if r.CacheSalt, err = p.optStr(m, "cache_salt", path); err != nil {
		return r, err
	}
	if id, ok := m["lora_int_id"]; ok && id != nil {
		x, err := p.i64(path+".lora_int_id", id)
		if err != nil {
			return r, err
		}
		r.LoRAIntID = &x
	}
	if mm, ok := m["mm_features"]; ok && mm != nil {
		a, err := p.arr(path+".mm_features", mm)
		if err != nil {
			return r, err
		}
		for i, e := range a {
			ip := fmt.Sprintf("%s.mm_features[%d]", path, i)
			fm, err := p.obj(ip, e)
			if err != nil {
				return r, err
			}
			var f MMFeature
			if f.Identifier, err = p.str(ip+".identifier", fm["identifier"]); err != nil {
				return r, err
			}
			if f.Offset, err = p.count(ip+".offset", fm["offset"], 0, math.MaxInt32); err != nil {
				return r, err
			}
			if f.Length, err = p.count(ip+".length", fm["length"], 0, math.MaxInt32); err != nil {
				return r, err
			}
			r.MM = append(r.MM, f)
		}
	}
	if pe, ok := m["prompt_embeds_rows_hex"]; ok && pe != nil {
		if r.PromptEmbedsRows, err = p.hexList(path+".prompt_embeds_rows_hex", pe); err != nil {
			return r, err
		}
		if r.PromptEmbedsRows == nil {
			r.PromptEmbedsRows = [][]byte{}
		}
	}
	return r, nil
}

// blockExtras decodes a per-block extra-key list: null | array per block; inside, JSON array =
// tuple ([]any), string, integer (int64), {"$bytes": hex} ([]byte).
func (p *parser) blockExtras(path string, v any) ([][]any, error) {
	a, err := p.arr(path, v)
	if err != nil {
		return nil, err
	}
	out := make([][]any, len(a))
	for i, e := range a {
		ip := fmt.Sprintf("%s[%d]", path, i)
		if e == nil {
			continue
		}
		t, err := p.arr(ip, e)
		if err != nil {
			return nil, err
		}
		vals, err := p.extraValues(ip, t)
		if err != nil {
			return nil, err
		}
		out[i] = vals
	}
	return out, nil
}

func (p *parser) extraValues(path string, a []any) ([]any, error) {
	out := make([]any, len(a))
	for i, e := range a {
		ip := fmt.Sprintf("%s[%d]", path, i)
		switch x := e.(type) {
		case string:
			out[i] = x
		case json.Number:
			n, err := p.i64(ip, x)
			if err != nil {
				return nil, err
			}
			out[i] = n
		case []any:
			t, err := p.extraValues(ip, x)
			if err != nil {
				return nil, err
			}
			out[i] = t
		case map[string]any:
			hx, ok := x["$bytes"]
			if !ok || len(x) != 1 {
				return nil, p.errf(ip, "want {\"$bytes\": hex}, got an object with other keys")
			}
			b, err := p.hexBytes(ip+".$bytes", hx)
			if err != nil {
				return nil, err
			}
			out[i] = b
		default:
			return nil, p.errf(ip, "want a string, integer, array or {\"$bytes\": hex}, got %s", kind(e))
		}
	}
	return out, nil
}

func (p *parser) sglangCase(path string, v any) (*Case, error) {
	m, err := p.obj(path, v)
	if err != nil {
		return nil, err
	}
	c := &Case{Algo: "sglang_sha256", Reproducible: true}
	if c.Name, err = p.name(path, m); err != nil {
		return nil, err
	}
	if c.BlockSize, err = p.count(path+".page_size", m["page_size"], 1, math.MaxInt32); err != nil {
		return nil, err
	}
	if b, ok := m["bigram"]; ok && b != nil {
		if c.Bigram, err = p.boolean(path+".bigram", b); err != nil {
			return nil, err
		}
	}
	if c.Tokens, err = p.tokens(path+".token_ids", m["token_ids"]); err != nil {
		return nil, err
	}
	if c.Request.CacheSalt, err = p.optStr(m, "cache_salt", path); err != nil {
		return nil, err
	}
	if c.Note, err = p.optStr(m, "note", path); err != nil {
		return nil, err
	}
	ep := path + ".expected"
	em, err := p.obj(ep, m["expected"])
	if err != nil {
		return nil, err
	}
	e := &c.Expected
	if e.NumFullBlocks, err = p.count(ep+".num_full_pages", em["num_full_pages"], 0, math.MaxInt32); err != nil {
		return nil, err
	}
	if e.Digests, err = p.hexList(ep+".page_hashes_hex", em["page_hashes_hex"]); err != nil {
		return nil, err
	}
	if e.Keys, err = p.i64AsU64List(ep+".page_hashes_i64", em["page_hashes_i64"]); err != nil {
		return nil, err
	}
	if len(e.Keys) != len(e.Digests) {
		return nil, p.errf(ep+".page_hashes_i64", "%d keys for %d digests", len(e.Keys), len(e.Digests))
	}
	if r, ok := em["salt_root_hex"]; ok && r != nil {
		if e.Root, err = p.hexBytes(ep+".salt_root_hex", r); err != nil {
			return nil, err
		}
	}
	if u, ok := em["unsalted_page_hashes_hex"]; ok && u != nil {
		if e.UnsaltedDigests, err = p.hexList(ep+".unsalted_page_hashes_hex", u); err != nil {
			return nil, err
		}
	}
	return c, nil
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
// <engine>/<release>/*.json whose schema is a block-hash file (vLLM hash files and SGLang
// page_hash.json; event samples excluded), then generated/*.json. The order is stable.
func BlockHashFiles(dir string) ([]string, error) {
	var out []string
	for _, pat := range []string{"vllm/*/*.json", "sglang/*/*.json", GeneratedDir + "/*.json"} {
		m, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			return nil, err
		}
		sort.Strings(m)
		for _, f := range m {
			if strings.Contains(filepath.Base(f), "sample") {
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
