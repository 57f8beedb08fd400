package vectors

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
)

// Event-payload samples: the bytes an engine publishes for its KV-cache events (a ZeroMQ payload
// frame, or an HTTP drain's body), each with the file's own JSON rendering of what it decodes to.
// One loader reads both kinds of file: the project's (an EventPayloadTest group in the project
// schema) and the engine-produced originals, through schema/engines.json's eventSamples table.

// Transports an event sample was carried on.
const (
	TransportZMQ  = "zmq"  // a PUB message: topic, 8-byte big-endian sequence, payload frames
	TransportHTTP = "http" // a drain's response body
)

// SourceReconstructed: the project rebuilt the engine's bytes from its source definitions (event
// samples only; never block-hash truth).
const SourceReconstructed = "reconstructed"

// SampleFile is one event-payload sample file, in either schema.
type SampleFile struct {
	Path   string
	Header Header
	// Samples are in tcId order (originals: the order of their array).
	Samples []Sample
}

// Sample is one event payload with what it decodes to.
type Sample struct {
	ID      int // tcId: 1..len(Samples)
	Name    string
	Comment string
	// Flags say what the sample exercises (project files; nil for originals).
	Flags  []string
	Result string
	// Transport is TransportZMQ or TransportHTTP.
	Transport string
	// Layout names the engine's wire layout where a file says it ("" otherwise).
	Layout string
	// Topic and SeqFrame are the ZeroMQ frames as written; Seq is the sequence the file states.
	Topic    []byte
	Seq      uint64
	SeqFrame []byte
	// Payload is the ZeroMQ payload frame, or the HTTP body.
	Payload []byte
	// Decoded is the file's JSON rendering of the payload, numbers as json.Number (exact).
	Decoded any
	// BlockSize is the tokens per block the payload's stores use, 0 when the file does not say.
	BlockSize int
	// PrefixHits are prompts scored against the blocks the payload leaves cached, with the hit
	// the engine's own rule gives (project files; hybrid models' samples).
	PrefixHits []PrefixHit
	// Request is the request the payload's blocks were stored for (its extra keys' fields), when
	// the file says (captured samples); zero otherwise.
	Request Request
}

// PrefixHit is one prompt against a sample's cached blocks.
type PrefixHit struct {
	Name, Comment string
	HashBlockSize int      // tokens per block of the prompt's chain
	Prompt        []uint32 // token ids
	HitTokens     int      // the engine's hit length
	FullTokens    int      // the full-attention group's hit alone
	LimitingGroup int      // the group that cut the hit, -1 when none did
}

// Sample returns the sample named name.
func (f *SampleFile) Sample(name string) (*Sample, bool) {
	for i := range f.Samples {
		if f.Samples[i].Name == name {
			return &f.Samples[i], true
		}
	}
	return nil, false
}

// Payloads maps each sample's name to its payload.
func (f *SampleFile) Payloads() map[string][]byte {
	out := make(map[string][]byte, len(f.Samples))
	for _, s := range f.Samples {
		out[s.Name] = s.Payload
	}
	return out
}

// sampleLayout says where an original sample file keeps each quantity (schema/engines.json).
type sampleLayout struct {
	README    string            `json:"readme"`
	Release   string            `json:"release"`
	Transport string            `json:"transport"`
	List      string            `json:"list"`
	Fields    map[string]string `json:"fields"`
}

var sampleLayouts = func() map[string]*sampleLayout {
	var e struct {
		EventSamples map[string]*sampleLayout `json:"eventSamples"`
	}
	if err := json.Unmarshal(enginesJSON, &e); err != nil {
		panic("vectors: schema/engines.json: " + err.Error())
	}
	for name, l := range e.EventSamples {
		if (l.Transport != TransportZMQ && l.Transport != TransportHTTP) || l.List == "" || l.Fields["name"] == "" {
			panic(fmt.Sprintf("vectors: schema/engines.json: eventSamples %s: transport %q, list %q", name, l.Transport, l.List))
		}
	}
	return e.EventSamples
}()

// projectSampleFields is the project schema's EventPayloadTest, in the same terms.
var projectSampleFields = map[string]string{
	"name": "name", "comment": "comment", "topic": "frames.topic", "seq": "frames.seq",
	"seqFrame": "frames.seqFrame", "payload": "payload", "decoded": "decoded",
}

// ErrNotSampleFile marks a JSON file that is not an event-payload sample file.
var ErrNotSampleFile = errors.New("not an event-payload sample file")

// LoadSamples reads one event-payload sample file, in either schema.
func LoadSamples(path string) (*SampleFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseSamples(path, data)
}

// ParseSamples decodes an event-payload sample file from data; name is used in errors. A
// project-schema file is validated against the JSON Schema first.
func ParseSamples(name string, data []byte) (*SampleFile, error) {
	f, err := parseEither(name, data, ErrNotSampleFile, (*parser).projectSamples, (*parser).originalSamples)
	if err != nil {
		return nil, err
	}
	f.Path = name
	return f, nil
}

// isSampleFile reports whether a project file's groups are event-payload tests.
func isSampleFile(m map[string]any) bool {
	groups, _ := m["testGroups"].([]any)
	for _, g := range groups {
		if gm, ok := g.(map[string]any); ok && gm["type"] == eventPayloadTest {
			return true
		}
	}
	return false
}

const eventPayloadTest = "EventPayloadTest"

func (p *parser) projectSamples(m map[string]any) (*SampleFile, error) {
	bf, err := p.projectHeader(m)
	if err != nil {
		return nil, err
	}
	number, err := p.count("$.numberOfTests", m["numberOfTests"], 0, math.MaxInt32)
	if err != nil {
		return nil, err
	}
	f := &SampleFile{Header: bf, Samples: make([]Sample, number)}
	seen := make([]bool, number)
	n := 0
	for gi, g := range m["testGroups"].([]any) {
		gp := fmt.Sprintf("$.testGroups[%d]", gi)
		gm := g.(map[string]any)
		if gm["type"] != eventPayloadTest {
			return nil, p.errf(gp+".type", "a %s file holds only %s groups, got %v", eventPayloadTest, eventPayloadTest, gm["type"])
		}
		transport, _ := gm["transport"].(string)
		layout, _ := gm["layout"].(string)
		for ti, t := range gm["tests"].([]any) {
			path := fmt.Sprintf("%s.tests[%d]", gp, ti)
			tm := t.(map[string]any)
			n++
			id, err := p.tcID(path, tm, number, seen)
			if err != nil {
				return nil, err
			}
			s, err := p.sample(projectSampleFields, transport, path, tm)
			if err != nil {
				return nil, err
			}
			s.ID, s.Layout = id, layout
			s.Result, _ = tm["result"].(string)
			if s.PrefixHits, err = p.prefixHits(path+".prefixHits", tm["prefixHits"]); err != nil {
				return nil, err
			}
			if s.Request, err = p.request(&caseFields{l: projectLayout, path: path, m: tm, p: p}); err != nil {
				return nil, err
			}
			if s.Flags, err = p.strings_(path+".flags", tm["flags"]); err != nil {
				return nil, err
			}
			for fi, fl := range s.Flags {
				if _, ok := bf.Flags[fl]; !ok {
					return nil, p.errf(fmt.Sprintf("%s.flags[%d]", path, fi), "flag %q is not documented in the file's notes", fl)
				}
			}
			f.Samples[id-1] = *s
		}
	}
	if n != number {
		return nil, p.errf("$.numberOfTests", "numberOfTests is %d, the test groups hold %d tests", number, n)
	}
	return f, uniqueSampleNames(p, f)
}

func (p *parser) originalSamples(m map[string]any) (*SampleFile, error) {
	var h Header
	var err error
	if h.Engine, err = p.optStr(m, "engine", "$"); err != nil {
		return nil, err
	}
	l, ok := sampleLayouts[h.Engine]
	if !ok {
		var names []string
		for n := range sampleLayouts {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, p.errf("$.engine", "%w: engine %q (want one of %s in an engine's own sample layout, or a %q field naming the project's schema)", ErrNotSampleFile, h.Engine, strings.Join(names, ", "), "schema")
	}
	h.Schema, h.Source = "the "+h.Engine+" event-sample layout ("+l.README+")", SourceEngine
	if h.Tag, err = p.optStr(m, l.Release, "$"); err != nil {
		return nil, err
	}
	if h.Commit, err = p.optStr(m, "commit", "$"); err != nil {
		return nil, err
	}
	if label, err := p.optStr(m, "label", "$"); err != nil {
		return nil, err
	} else if label != "" {
		h.Generator = []string{label}
	}
	list, err := p.arr("$."+l.List, m[l.List])
	if err != nil || len(list) == 0 {
		return nil, p.errf("$."+l.List, "%w: no %s", ErrNotSampleFile, l.List)
	}
	f := &SampleFile{Header: h, Samples: make([]Sample, len(list))}
	for i, v := range list {
		path := fmt.Sprintf("$.%s[%d]", l.List, i)
		sm, err := p.obj(path, v)
		if err != nil {
			return nil, err
		}
		s, err := p.sample(l.Fields, l.Transport, path, sm)
		if err != nil {
			return nil, err
		}
		s.ID, s.Result = i+1, ResultValid
		f.Samples[i] = *s
	}
	return f, uniqueSampleNames(p, f)
}

// at returns the value at a dotted path of m, and its JSON path.
func at(m map[string]any, base, rel string) (any, string) {
	var v any = m
	path := base
	for _, part := range strings.Split(rel, ".") {
		path += "." + part
		o, ok := v.(map[string]any)
		if !ok {
			return nil, path
		}
		v = o[part]
	}
	return v, path
}

// sample reads one sample whose quantities sit where fields says.
func (p *parser) sample(fields map[string]string, transport, path string, m map[string]any) (*Sample, error) {
	s := &Sample{Transport: transport}
	get := func(q string) (any, string, bool) {
		rel, ok := fields[q]
		if !ok {
			return nil, path + "." + q, false
		}
		v, vp := at(m, path, rel)
		return v, vp, v != nil
	}
	var err error
	for _, f := range []struct {
		q        string
		dst      *string
		required bool
	}{{"name", &s.Name, true}, {"comment", &s.Comment, false}, {"layout", &s.Layout, false}} {
		v, vp, ok := get(f.q)
		if !ok {
			if f.required {
				return nil, p.errf(vp, "missing %s", f.q)
			}
			continue
		}
		if *f.dst, err = p.str(vp, v); err != nil {
			return nil, err
		}
	}
	if v, vp, ok := get("payload"); ok {
		if s.Payload, err = p.hexBytes(vp, v); err != nil {
			return nil, err
		}
	} else if v, vp, ok := get("payloadText"); ok {
		t, err := p.str(vp, v)
		if err != nil {
			return nil, err
		}
		s.Payload = []byte(t)
	} else {
		return nil, p.errf(vp, "missing the payload")
	}
	v, vp, ok := get("decoded")
	if !ok {
		return nil, p.errf(vp, "missing the decoded rendering")
	}
	s.Decoded = v
	if v, vp, ok := get("blockSize"); ok {
		if s.BlockSize, err = p.count(vp, v, 1, math.MaxInt32); err != nil {
			return nil, err
		}
	}
	if transport != TransportZMQ {
		return s, nil
	}
	for _, f := range []struct {
		q   string
		dst *[]byte
	}{{"topic", &s.Topic}, {"seqFrame", &s.SeqFrame}} {
		v, vp, ok := get(f.q)
		if !ok {
			return nil, p.errf(vp, "missing the ZeroMQ %s frame", f.q)
		}
		if *f.dst, err = p.hexBytes(vp, v); err != nil {
			return nil, err
		}
	}
	v, vp, ok = get("seq")
	if !ok {
		return nil, p.errf(vp, "missing the sequence number")
	}
	if s.Seq, err = p.u64(vp, v); err != nil {
		return nil, err
	}
	if len(s.SeqFrame) != 8 || binary.BigEndian.Uint64(s.SeqFrame) != s.Seq {
		_, sp, _ := get("seqFrame")
		return nil, p.errf(sp, "sequence frame %s is not seq %d as 8 bytes big-endian", hex.EncodeToString(s.SeqFrame), s.Seq)
	}
	return s, nil
}

// prefixHits reads a sample's prompts with their expected hits (absent: none). The JSON Schema has
// checked the shape; this converts.
func (p *parser) prefixHits(path string, v any) ([]PrefixHit, error) {
	if v == nil {
		return nil, nil
	}
	list, err := p.arr(path, v)
	if err != nil {
		return nil, err
	}
	out := make([]PrefixHit, len(list))
	for i, e := range list {
		ep := fmt.Sprintf("%s[%d]", path, i)
		m, err := p.obj(ep, e)
		if err != nil {
			return nil, err
		}
		ph := &out[i]
		if ph.Name, err = p.str(ep+".name", m["name"]); err != nil {
			return nil, err
		}
		ph.Comment, _ = m["comment"].(string)
		if ph.HashBlockSize, err = p.count(ep+".hashBlockSize", m["hashBlockSize"], 1, math.MaxInt32); err != nil {
			return nil, err
		}
		toks, err := p.arr(ep+".prompt", m["prompt"])
		if err != nil {
			return nil, err
		}
		for j, t := range toks {
			n, err := p.count(fmt.Sprintf("%s.prompt[%d]", ep, j), t, 0, math.MaxUint32)
			if err != nil {
				return nil, err
			}
			ph.Prompt = append(ph.Prompt, uint32(n))
		}
		x, err := p.obj(ep+".expected", m["expected"])
		if err != nil {
			return nil, err
		}
		if ph.HitTokens, err = p.count(ep+".expected.hitTokens", x["hitTokens"], 0, math.MaxInt32); err != nil {
			return nil, err
		}
		if ph.FullTokens, err = p.count(ep+".expected.fullAttentionTokens", x["fullAttentionTokens"], 0, math.MaxInt32); err != nil {
			return nil, err
		}
		ph.LimitingGroup = -1
		if g := x["limitingGroup"]; g != nil {
			if ph.LimitingGroup, err = p.count(ep+".expected.limitingGroup", g, 0, math.MaxInt32); err != nil {
				return nil, err
			}
		}
		if ph.HitTokens > ph.FullTokens {
			return nil, p.errf(ep+".expected", "hitTokens %d above fullAttentionTokens %d: no group can add to full attention's hit", ph.HitTokens, ph.FullTokens)
		}
	}
	return out, nil
}

func uniqueSampleNames(p *parser, f *SampleFile) error {
	names := map[string]int{}
	for _, s := range f.Samples {
		if prev, ok := names[s.Name]; ok {
			return p.errf("$", "samples %d and %d share the name %q", prev, s.ID, s.Name)
		}
		names[s.Name] = s.ID
	}
	return nil
}

// sampleFlagDescriptions are the flags an event sample can carry, beside the block-hash flags it
// shares (EngineRootSeed: its keys come from such a case). A project sample file lists each flag
// it uses, with this description, in its notes map.
var sampleFlagDescriptions = map[string]string{
	"FullReportReemission":      `kv_cache_report_mode="full": blocks already held are re-emitted as a store (no new copy)`,
	"SecondaryTier":             "an event of a tier other than the GPU (CPU offload, STORAGE): it never touches GPU residency",
	"Locality":                  "an event carries a storage tier's locality (LOCAL or REMOTE)",
	"HashOnlyStore":             "a store with hashes only: no tokens, block size 0",
	"SlidingWindowGroup":        "a sliding-window KV-cache group's events beside the full-attention group's",
	"DataParallelRank":          "a batch of a data-parallel rank other than 0",
	"Cleared":                   "AllBlocksCleared: the engine dropped every block (start, cache flush)",
	"Coalesced":                 "one event carrying several blocks of one chain (or every block an eviction dropped)",
	"SessionID":                 "a store attributed to the session of the request that caused it: not a hash input, not block ownership",
	"MambaGroup":                "a Mamba (linear-attention) KV-cache group's events beside the full-attention group's: only checkpointed blocks are stored",
	"FullAttentionOverPredicts": "at least one prompt where the full-attention group alone would predict a longer hit than the engine's rule gives",
}
