package vectors

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// This file is the one decoder: a file's layout (layout.go) says where each quantity sits, and every
// case of every schema goes through caseOf.

// decodeJSON decodes data with exact numbers and no trailing data.
func decodeJSON(name string, data []byte) (any, error) {
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
	return root, nil
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

// tcID checks a test's tcId: within 1..numberOfTests and not seen before in the file (seen has
// numberOfTests entries).
func (p *parser) tcID(path string, tm map[string]any, number int, seen []bool) (int, error) {
	id, err := p.count(path+".tcId", tm["tcId"], 1, int64(number))
	if err != nil {
		return 0, p.errf(path+".tcId", "tcId outside 1..numberOfTests (%d): %v", number, errors.Unwrap(err))
	}
	if seen[id-1] {
		return 0, p.errf(path+".tcId", "tcId %d is not unique", id)
	}
	seen[id-1] = true
	return id, nil
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

// keyList decodes published keys: unsigned, or signed int64 held as the same bit pattern.
func (p *parser) keyList(path string, v any, keyType string) ([]uint64, error) {
	a, err := p.arr(path, v)
	if err != nil {
		return nil, err
	}
	out := make([]uint64, len(a))
	for i, e := range a {
		ip := fmt.Sprintf("%s[%d]", path, i)
		if keyType == KeyInt64 {
			x, err := p.i64(ip, e)
			if err != nil {
				return nil, err
			}
			out[i] = uint64(x)
		} else if out[i], err = p.u64(ip, e); err != nil {
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

// originalFile reads an engine-produced original: a flat cases array in its engine's layout.
func (p *parser) originalFile(m map[string]any) (*File, error) {
	var h Header
	var err error
	if h.Engine, err = p.optStr(m, "engine", "$"); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		key string
		dst *string
	}{{"tag", &h.Tag}, {"commit", &h.Commit}, {"generator_notes", &h.GeneratorNotes}, {"origin", &h.Origin},
		{"extra_key_scheme", &h.ExtraKeyScheme}} {
		if *f.dst, err = p.optStr(m, f.key, "$"); err != nil {
			return nil, err
		}
	}
	l, ok := engineLayouts[h.Engine]
	if !ok {
		if h.Engine == EngineKVExact {
			return nil, checkOrigin(p.file, h)
		}
		return nil, p.errf("$.engine", "%w: engine %q (want one of %s in an engine's own case schema, or a %q field naming the project's schema)", ErrNotVectorFile, h.Engine, strings.Join(engineNames(), ", "), "schema")
	}
	h.Schema, h.KeyType, h.Source = l.Schema, l.KeyType, SourceEngine
	if h.Origin != "" {
		h.Source = SourceGenerated
	}
	if l.FileAlgorithm != "" {
		if h.Algo, err = p.optStr(m, l.FileAlgorithm, "$"); err != nil {
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
		return nil, p.errf("$.cases", "%w: no cases array", ErrNotVectorFile)
	}
	cases, err := p.arr("$.cases", rawCases)
	if err != nil {
		return nil, err
	}
	f := &File{Header: h, Cases: make([]Case, len(cases)), layout: l}
	for i, rc := range cases {
		path := fmt.Sprintf("$.cases[%d]", i)
		cm, err := p.obj(path, rc)
		if err != nil {
			return nil, err
		}
		c, err := p.caseOf(l, &h, path, cm, "", nil)
		if err != nil {
			return nil, err
		}
		c.Index, c.ID = i, i+1
		c.Flags = Flags(c)
		f.Cases[i] = *c
	}
	if err := f.markScheme(p); err != nil {
		return nil, err
	}
	return f, nil
}

// projectFile reads a file in the project's schema (already validated against the JSON Schema).
func (p *parser) projectFile(m map[string]any) (*File, error) {
	if isSampleFile(m) {
		return nil, p.errf("$.testGroups", "%w: an event-payload sample file (vectors.LoadSamples reads it)", ErrNotVectorFile)
	}
	h, err := p.projectHeader(m)
	if err != nil {
		return nil, err
	}
	number, err := p.count("$.numberOfTests", m["numberOfTests"], 0, math.MaxInt32)
	if err != nil {
		return nil, err
	}
	f := &File{Header: h, Cases: make([]Case, number), layout: projectLayout}
	seen := make([]bool, number)
	groups, _ := m["testGroups"].([]any)
	n := 0
	for gi, g := range groups {
		gp := fmt.Sprintf("$.testGroups[%d]", gi)
		gm := g.(map[string]any)
		for ti, t := range gm["tests"].([]any) {
			path := fmt.Sprintf("%s.tests[%d]", gp, ti)
			tm := t.(map[string]any)
			n++
			id, err := p.tcID(path, tm, number, seen)
			if err != nil {
				return nil, err
			}
			c, err := p.caseOf(projectLayout, &f.Header, path, tm, gp, gm)
			if err != nil {
				return nil, err
			}
			for fi, fl := range c.Flags {
				if _, ok := h.Flags[fl]; !ok {
					return nil, p.errf(fmt.Sprintf("%s.flags[%d]", path, fi), "flag %q is not documented in the file's notes", fl)
				}
			}
			c.Index, c.ID = id-1, id
			f.Cases[id-1] = *c
		}
	}
	if n != number {
		return nil, p.errf("$.numberOfTests", "numberOfTests is %d, the test groups hold %d tests", number, n)
	}
	names := map[string]int{}
	for _, c := range f.Cases {
		if prev, ok := names[c.Name]; ok {
			return nil, p.errf("$", "tcId %d and %d share the name %q", prev, c.ID, c.Name)
		}
		names[c.Name] = c.ID
	}
	if err := f.markScheme(p); err != nil {
		return nil, err
	}
	return f, nil
}

// projectHeader reads a project file's header (already validated against the JSON Schema).
func (p *parser) projectHeader(m map[string]any) (Header, error) {
	h := Header{Schema: SchemaName, Flags: map[string]string{}}
	var err error
	for _, f := range []struct {
		key string
		dst *string
	}{{"engine", &h.Engine}, {"release", &h.Tag}, {"commit", &h.Commit}, {"algorithm", &h.Algo},
		{"source", &h.Source}, {"origin", &h.Origin}, {"keyType", &h.KeyType}, {"extraKeyScheme", &h.ExtraKeyScheme}} {
		if *f.dst, err = p.optStr(m, f.key, "$"); err != nil {
			return h, err
		}
	}
	if h.Generator, err = p.strings_("$.generator", m["generator"]); err != nil {
		return h, err
	}
	if h.Notes, err = p.strings_("$.header", m["header"]); err != nil {
		return h, err
	}
	if (h.Source == SourceGenerated) != (h.Origin != "") {
		return h, p.errf("$.origin", "source %q with origin %q: a generated file, and only one, carries the origin label", h.Source, h.Origin)
	}
	notes, _ := m["notes"].(map[string]any)
	for flag, n := range notes {
		h.Flags[flag], _ = n.(map[string]any)["description"].(string)
	}
	return h, nil
}

// caseFields finds the quantities of one case: in the case object, else (project schema) in its
// test group.
type caseFields struct {
	l         *layout
	path      string // the case's JSON path
	m         map[string]any
	groupPath string
	group     map[string]any
	valid     bool
	p         *parser
}

// get returns q's value (nil when absent or null), its JSON path, and whether it is present.
func (s *caseFields) get(q string) (any, string, bool, error) {
	base, obj, rel := s.path, s.m, s.l.Fields[q]
	if rel == "" {
		if rel = s.l.Group[q]; rel == "" {
			return nil, s.path + "." + q, false, nil
		}
		base, obj = s.groupPath, s.group
	}
	parts := strings.Split(rel, ".")
	path := base
	for i, part := range parts {
		path += "." + part
		v, ok := obj[part]
		if i == len(parts)-1 {
			if ok && v != nil {
				return v, path, true, nil
			}
			if s.l.required(q, s.valid) {
				return nil, path, false, s.p.errf(path, "missing %s", part)
			}
			return nil, path, false, nil
		}
		if !ok || v == nil {
			path += "." + strings.Join(parts[i+1:], ".")
			if s.l.required(q, s.valid) {
				return nil, path, false, s.p.errf(path, "missing %s", parts[len(parts)-1])
			}
			return nil, path, false, nil
		}
		m, err := s.p.obj(path, v)
		if err != nil {
			return nil, path, false, err
		}
		obj = m
	}
	panic("unreachable")
}

// caseOf decodes one case of layout l at path (m), with its test group (gm) for the project schema.
func (p *parser) caseOf(l *layout, h *Header, path string, m map[string]any, gpath string, gm map[string]any) (*Case, error) {
	s := &caseFields{l: l, path: path, m: m, groupPath: gpath, group: gm, p: p}
	c := &Case{}
	v, vp, _, err := s.get(qName)
	if err != nil {
		return nil, err
	}
	if c.Name, err = p.str(vp, v); err != nil {
		return nil, err
	}
	if c.Name == "" {
		return nil, p.errf(vp, "empty case name")
	}
	c.Algo = h.Algo
	if l.Algorithm != "" {
		c.Algo = l.Algorithm
	}
	if _, ok := l.Fields[qAlgorithm]; ok {
		v, vp, _, err := s.get(qAlgorithm)
		if err != nil {
			return nil, err
		}
		if c.Algo, err = p.str(vp, v); err != nil {
			return nil, err
		}
		if h.Algo != "" && c.Algo != h.Algo {
			return nil, p.errf(vp, "case algorithm %q differs from the file's %q", c.Algo, h.Algo)
		}
	}
	if v, vp, _, err = s.get(qBlockSize); err != nil {
		return nil, err
	}
	if c.BlockSize, err = p.count(vp, v, 1, math.MaxInt32); err != nil {
		return nil, err
	}
	if v, vp, _, err = s.get(qSeed); err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case nil:
	case string:
		c.Seed = &x
	default:
		return nil, p.errf(vp, "want a string or null, got %s", kind(x))
	}
	// Reproducible: the originals' boolean (true when the layout has none), or the result.
	c.Reproducible = true
	if _, ok := l.Fields[qReproducible]; ok {
		if v, vp, _, err = s.get(qReproducible); err != nil {
			return nil, err
		}
		if c.Reproducible, err = p.boolean(vp, v); err != nil {
			return nil, err
		}
	}
	if _, ok := l.Fields[qResult]; ok {
		if v, vp, _, err = s.get(qResult); err != nil {
			return nil, err
		}
		switch v {
		case ResultValid:
		case ResultAcceptable:
			c.Reproducible = false
		default:
			return nil, p.errf(vp, "result %s (want %q or %q)", kind(v), ResultValid, ResultAcceptable)
		}
	}
	s.valid = c.Reproducible
	if v, vp, _, err = s.get(qRootSeed); err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case nil:
	case string:
		if c.Seed != nil {
			return nil, p.errf(vp, "only a case with %s null resolves its own seed", l.field(qSeed))
		}
		c.RootSeed = &x
	default:
		return nil, p.errf(vp, "want a string or null, got %s", kind(x))
	}
	if v, vp, ok, err := s.get(qBigram); err != nil {
		return nil, err
	} else if ok {
		if c.Bigram, err = p.boolean(vp, v); err != nil {
			return nil, err
		}
	}
	if v, vp, _, err = s.get(qTokens); err != nil {
		return nil, err
	}
	if c.Tokens, err = p.tokens(vp, v); err != nil {
		return nil, err
	}
	if v, vp, ok, err := s.get(qPromptLength); err != nil {
		return nil, err
	} else if ok {
		if c.PromptLen, err = p.count(vp, v, 0, int64(len(c.Tokens))); err != nil {
			return nil, err
		}
	}
	if v, vp, ok, err := s.get(qGroupBlockSize); err != nil {
		return nil, err
	} else if ok {
		if c.GroupBlockSize, err = p.count(vp, v, 1, math.MaxInt32); err != nil {
			return nil, err
		}
	}
	if c.Request, err = p.request(s); err != nil {
		return nil, err
	}
	if rel, ok := l.Fields[qExtraKeys]; ok {
		if ek, present := m[rel]; present {
			c.HasExtraKeys = true
			if c.ExtraKeys, err = p.blockExtras(path+"."+rel, ek); err != nil {
				return nil, err
			}
		}
	}
	if v, vp, ok, err := s.get(qExtraKeysOneShot); err != nil {
		return nil, err
	} else if ok {
		if c.ExtraKeysOneShot, err = p.blockExtras(vp, v); err != nil {
			return nil, err
		}
	}
	if v, vp, ok, err := s.get(qComment); err != nil {
		return nil, err
	} else if ok {
		if c.Comment, err = p.str(vp, v); err != nil {
			return nil, err
		}
	}
	if v, vp, ok, err := s.get(qFlags); err != nil {
		return nil, err
	} else if ok {
		if c.Flags, err = p.strings_(vp, v); err != nil {
			return nil, err
		}
		if len(c.Flags) == 0 {
			c.Flags = nil
		}
	}
	ep := path + "." + l.Fields[qExpected]
	if _, err := p.obj(ep, m[l.Fields[qExpected]]); err != nil {
		return nil, err
	}
	if err := p.expected(s, c, h.KeyType); err != nil {
		return nil, err
	}
	return c, nil
}

func (p *parser) expected(s *caseFields, c *Case, keyType string) error {
	e := &c.Expected
	v, vp, _, err := s.get(qNumFullBlocks)
	if err != nil {
		return err
	}
	if e.NumFullBlocks, err = p.count(vp, v, 0, math.MaxInt32); err != nil {
		return err
	}
	if !c.Reproducible {
		return nil
	}
	hexField := func(q string, dst *[]byte) error {
		v, vp, ok, err := s.get(q)
		if err != nil || !ok {
			return err
		}
		*dst, err = p.hexBytes(vp, v)
		return err
	}
	listField := func(q string, dst *[][]byte) error {
		v, vp, ok, err := s.get(q)
		if err != nil || !ok {
			return err
		}
		*dst, err = p.hexList(vp, v)
		return err
	}
	if err := hexField(qRoot, &e.Root); err != nil {
		return err
	}
	if err := listField(qDigests, &e.Digests); err != nil {
		return err
	}
	v, vp, ok, err := s.get(qKeys)
	if err != nil {
		return err
	}
	if ok {
		if e.Keys, err = p.keyList(vp, v, keyType); err != nil {
			return err
		}
	}
	if len(e.Keys) != len(e.Digests) {
		return p.errf(vp, "%d keys for %d digests", len(e.Keys), len(e.Digests))
	}
	if err := hexField(qFirstBlockPreimage, &e.FirstPreimage); err != nil {
		return err
	}
	if err := listField(qGroupDigests, &e.GroupDigests); err != nil {
		return err
	}
	if e.GroupDigests != nil {
		v, vp, _, err := s.get(qGroupKeys)
		if err != nil {
			return err
		}
		if e.GroupKeys, err = p.keyList(vp, v, keyType); err != nil {
			return err
		}
	}
	return listField(qUnsaltedDigests, &e.UnsaltedDigests)
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

func (p *parser) request(s *caseFields) (Request, error) {
	var r Request
	if rel, ok := s.l.Fields[qRequest]; ok {
		if v := s.m[rel]; v != nil {
			if _, err := p.obj(s.path+"."+rel, v); err != nil {
				return r, err
			}
		}
	}
	for _, f := range []struct {
		q   string
		dst *string
	}{{qLoRAName, &r.LoRAName}, {qLoRAPath, &r.LoRAPath}, {qCacheSalt, &r.CacheSalt}} {
		v, vp, ok, err := s.get(f.q)
		if err != nil {
			return r, err
		}
		if ok {
			if *f.dst, err = p.str(vp, v); err != nil {
				return r, err
			}
		}
	}
	if v, vp, ok, err := s.get(qLoRAIntID); err != nil {
		return r, err
	} else if ok {
		x, err := p.i64(vp, v)
		if err != nil {
			return r, err
		}
		r.LoRAIntID = &x
	}
	if v, vp, ok, err := s.get(qMMFeatures); err != nil {
		return r, err
	} else if ok {
		a, err := p.arr(vp, v)
		if err != nil {
			return r, err
		}
		for i, e := range a {
			ip := fmt.Sprintf("%s[%d]", vp, i)
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
	if v, vp, ok, err := s.get(qPromptEmbedsRows); err != nil {
		return r, err
	} else if ok {
		if r.PromptEmbedsRows, err = p.hexList(vp, v); err != nil {
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

// markScheme checks the header's extra-key scheme and marks every case with it.
func (f *File) markScheme(p *parser) error {
	switch f.Header.ExtraKeyScheme {
	case "", ExtraKeysFlat:
		f.Header.ExtraKeyScheme = ""
	case ExtraKeysTagged:
		for i := range f.Cases {
			f.Cases[i].TaggedExtras = true
		}
	default:
		return p.errf("$.extraKeyScheme", "%q is not one of %s, %s", f.Header.ExtraKeyScheme, ExtraKeysFlat, ExtraKeysTagged)
	}
	return nil
}
