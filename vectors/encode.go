package vectors

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
)

// Encode renders f in the project's schema: cmd/vecgen writes every project file through it, and
// `vecgen -convert` moves a file the project made from an engine's original layout into it. Cases
// sharing block size, seed, root seed and bigram mode form one test group (in order of first
// appearance); tcIds follow f.Cases. The output is deterministic and loads back into equal cases.
func Encode(f *File) ([]byte, error) {
	h := f.Header
	algo := h.Algo
	for _, c := range f.Cases {
		if algo == "" {
			algo = c.Algo
		}
		if c.Algo != algo {
			return nil, fmt.Errorf("vectors: %s: case %s has algorithm %q, the file %q: one algorithm per file", f.Path, c.Name, c.Algo, algo)
		}
	}
	source := h.Source
	if source == "" {
		source = SourceEngine
		if h.Generated() {
			source = SourceGenerated
		}
	}
	if h.KeyType == "" {
		return nil, fmt.Errorf("vectors: %s: no key type", f.Path)
	}
	out := encFile{
		Schema: SchemaName, Algorithm: algo, Engine: h.Engine, Release: h.Tag, Commit: h.Commit,
		Source: source, Origin: h.Origin, Generator: h.Generator, Header: h.Notes, KeyType: h.KeyType, ExtraKeyScheme: h.ExtraKeyScheme,
		NumberOfTests: len(f.Cases), Notes: map[string]encNote{},
	}
	if out.Header == nil {
		out.Header = []string{}
	}
	if h.GeneratorNotes != "" {
		out.Generator = append(append([]string{}, out.Generator...), h.GeneratorNotes)
	}
	type groupKey struct {
		bs             int
		seed, rootSeed string
		hasSeed, hasRS bool
		bigram         bool
	}
	index := map[groupKey]int{}
	for i := range f.Cases {
		c := &f.Cases[i]
		k := groupKey{bs: c.BlockSize, bigram: c.Bigram, hasSeed: c.Seed != nil, hasRS: c.RootSeed != nil}
		if c.Seed != nil {
			k.seed = *c.Seed
		}
		if c.RootSeed != nil {
			k.rootSeed = *c.RootSeed
		}
		gi, ok := index[k]
		if !ok {
			gi = len(out.TestGroups)
			index[k] = gi
			g := encGroup{Type: "BlockHashTest", BlockSize: c.BlockSize, Seed: c.Seed, RootSeed: c.RootSeed, Bigram: c.Bigram}
			out.TestGroups = append(out.TestGroups, g)
		}
		t, err := encodeCase(c, i+1, h.KeyType)
		if err != nil {
			return nil, fmt.Errorf("vectors: %s: case %s: %w", f.Path, c.Name, err)
		}
		for _, fl := range t.Flags {
			d := h.Flags[fl]
			if d == "" {
				d = FlagDescription(fl)
			}
			if d == "" {
				return nil, fmt.Errorf("vectors: %s: case %s: flag %q has no description", f.Path, c.Name, fl)
			}
			out.Notes[fl] = encNote{Description: d}
		}
		out.TestGroups[gi].Tests = append(out.TestGroups[gi].Tests, t)
	}
	if out.TestGroups == nil {
		out.TestGroups = []encGroup{}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(out); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func encodeCase(c *Case, id int, keyType string) (encTest, error) {
	t := encTest{TcID: id, Name: c.Name, Comment: c.Comment, Flags: c.Flags, Result: c.Result(),
		Tokens: c.Tokens, PromptLength: c.PromptLen, GroupBlockSize: c.GroupBlockSize}
	if t.Flags == nil {
		t.Flags = Flags(c)
	}
	if t.Flags == nil {
		t.Flags = []string{}
	}
	sort.SliceStable(t.Flags, func(i, j int) bool { return flagOrder(t.Flags[i]) < flagOrder(t.Flags[j]) })
	if t.Tokens == nil {
		t.Tokens = []uint32{}
	}
	r := c.Request
	if r.LoRAName != "" || r.LoRAIntID != nil || r.LoRAPath != "" || r.CacheSalt != "" || r.MM != nil || r.PromptEmbedsRows != nil {
		er := &encRequest{LoRAName: r.LoRAName, LoRAIntID: r.LoRAIntID, LoRAPath: r.LoRAPath, CacheSalt: r.CacheSalt}
		for _, m := range r.MM {
			er.MMFeatures = append(er.MMFeatures, encMM(m))
		}
		if r.PromptEmbedsRows != nil {
			er.PromptEmbedsRows = hexes(r.PromptEmbedsRows)
		}
		t.Request = er
	}
	if c.HasExtraKeys {
		t.ExtraKeys = jsonExtras(c.ExtraKeys)
	}
	if c.ExtraKeysOneShot != nil {
		t.ExtraKeysOneShot = jsonExtras(c.ExtraKeysOneShot)
	}
	e := c.Expected
	t.Expected.NumFullBlocks = e.NumFullBlocks
	if !c.Reproducible {
		return t, nil
	}
	if e.Root != nil {
		s := hex.EncodeToString(e.Root)
		t.Expected.Root = &s
	}
	t.Expected.Digests = hexes(e.Digests)
	t.Expected.Keys = keyValues(e.Keys, keyType)
	if e.FirstPreimage != nil {
		s := hex.EncodeToString(e.FirstPreimage)
		t.Expected.FirstBlockPreimage = &s
	}
	if e.GroupDigests != nil {
		t.Expected.GroupDigests = hexes(e.GroupDigests)
		t.Expected.GroupKeys = keyValues(e.GroupKeys, keyType)
	}
	if e.UnsaltedDigests != nil {
		t.Expected.UnsaltedDigests = hexes(e.UnsaltedDigests)
	}
	return t, nil
}

func flagOrder(flag string) int {
	for i, f := range flagDescriptions {
		if f.Flag == flag {
			return i
		}
	}
	return len(flagDescriptions)
}

func keyValues(keys []uint64, keyType string) []any {
	out := make([]any, len(keys))
	for i, k := range keys {
		if keyType == KeyInt64 {
			out[i] = int64(k)
		} else {
			out[i] = k
		}
	}
	return out
}

func hexes(ds [][]byte) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = hex.EncodeToString(d)
	}
	return out
}

// jsonExtras renders per-block extra keys in the vectors' notation ({"$bytes": hex} for bytes).
func jsonExtras(blocks [][]any) []any {
	out := make([]any, len(blocks))
	for i, b := range blocks {
		if b != nil {
			out[i] = jsonValue(b)
		}
	}
	return out
}

func jsonValue(v any) any {
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonValue(e)
		}
		return out
	case []byte:
		return map[string]string{"$bytes": hex.EncodeToString(x)}
	}
	return v
}

// The project schema's JSON shapes, in the order the fields are written.
type encFile struct {
	Schema         string             `json:"schema"`
	Algorithm      string             `json:"algorithm"`
	Engine         string             `json:"engine"`
	Release        string             `json:"release"`
	Commit         string             `json:"commit"`
	Source         string             `json:"source"`
	Origin         string             `json:"origin,omitempty"`
	Generator      []string           `json:"generator"`
	Header         []string           `json:"header"`
	KeyType        string             `json:"keyType"`
	ExtraKeyScheme string             `json:"extraKeyScheme,omitempty"`
	NumberOfTests  int                `json:"numberOfTests"`
	Notes          map[string]encNote `json:"notes"`
	TestGroups     []encGroup         `json:"testGroups"`
}

type encNote struct {
	Description string `json:"description"`
}

type encGroup struct {
	Type      string `json:"type"`
	BlockSize int    `json:"blockSize"`
	// Seed is written when set (a string) and omitted when unset.
	Seed     *string   `json:"seed,omitempty"`
	RootSeed *string   `json:"rootSeed,omitempty"`
	Bigram   bool      `json:"bigram,omitempty"`
	Tests    []encTest `json:"tests"`
}

type encTest struct {
	TcID             int         `json:"tcId"`
	Name             string      `json:"name"`
	Comment          string      `json:"comment"`
	Flags            []string    `json:"flags"`
	Result           string      `json:"result"`
	Tokens           []uint32    `json:"tokens"`
	PromptLength     int         `json:"promptLength,omitempty"`
	GroupBlockSize   int         `json:"groupBlockSize,omitempty"`
	Request          *encRequest `json:"request,omitempty"`
	ExtraKeys        []any       `json:"extraKeys,omitzero"`
	ExtraKeysOneShot []any       `json:"extraKeysOneShot,omitzero"`
	Expected         encExpected `json:"expected"`
}

type encRequest struct {
	LoRAName         string   `json:"loraName,omitempty"`
	LoRAIntID        *int64   `json:"loraIntId,omitempty"`
	LoRAPath         string   `json:"loraPath,omitempty"`
	CacheSalt        string   `json:"cacheSalt,omitempty"`
	MMFeatures       []encMM  `json:"mmFeatures,omitzero"`
	PromptEmbedsRows []string `json:"promptEmbedsRows,omitzero"`
}

type encMM struct {
	Identifier string `json:"identifier"`
	Offset     int    `json:"offset"`
	Length     int    `json:"length"`
}

type encExpected struct {
	Root               *string  `json:"root,omitempty"`
	NumFullBlocks      int      `json:"numFullBlocks"`
	Digests            []string `json:"digests,omitzero"`
	Keys               []any    `json:"keys,omitzero"`
	FirstBlockPreimage *string  `json:"firstBlockPreimage,omitempty"`
	GroupDigests       []string `json:"groupDigests,omitzero"`
	GroupKeys          []any    `json:"groupKeys,omitzero"`
	UnsaltedDigests    []string `json:"unsaltedDigests,omitzero"`
}
