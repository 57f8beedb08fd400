package vectors

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// The vocabulary: one name per quantity a block-hash case pins, whichever engine's hashing it
// defends. The project's schema (schema/kvexact_vectors_v1.schema.json) spells its fields with these
// names; an engine-produced original names the same quantities its own way, and
// schema/engines.json says where each one sits in its cases. docs/vectors.md defines
// every name.
const (
	qName               = "name"
	qComment            = "comment"
	qFlags              = "flags"
	qAlgorithm          = "algorithm"
	qBlockSize          = "blockSize"
	qSeed               = "seed"
	qRootSeed           = "rootSeed"
	qReproducible       = "reproducible" // originals only; the project schema says it by result
	qResult             = "result"
	qBigram             = "bigram"
	qTokens             = "tokens"
	qPromptLength       = "promptLength"
	qGroupBlockSize     = "groupBlockSize"
	qRequest            = "request"
	qLoRAName           = "loraName"
	qLoRAIntID          = "loraIntId"
	qLoRAPath           = "loraPath"
	qCacheSalt          = "cacheSalt"
	qMMFeatures         = "mmFeatures"
	qPromptEmbedsRows   = "promptEmbedsRows"
	qExtraKeys          = "extraKeys"
	qExtraKeysOneShot   = "extraKeysOneShot"
	qExpected           = "expected"
	qRoot               = "root"
	qNumFullBlocks      = "numFullBlocks"
	qDigests            = "digests"
	qKeys               = "keys"
	qFirstBlockPreimage = "firstBlockPreimage"
	qGroupDigests       = "groupDigests"
	qGroupKeys          = "groupKeys"
	qUnsaltedDigests    = "unsaltedDigests"
)

// Key types: how a file writes the 64-bit keys an engine publishes.
const (
	KeyUint64 = "uint64" // unsigned, 0..2^64-1
	KeyInt64  = "int64"  // signed, as the engine publishes it; held as the same bit pattern
)

// layout says where a file keeps each quantity: a dotted path relative to one case (or, for the
// project's test-group parameters, to the group). It is the only thing the loader knows about a
// file's schema, so one decoder reads every file.
type layout struct {
	// Schema names the layout in errors and in File.Schema.
	Schema string
	// README is the document (relative to the vectors root) that describes the layout.
	README string `json:"readme"`
	// FileAlgorithm is the header field holding the file's algorithm ("" = none).
	FileAlgorithm string `json:"fileAlgorithm"`
	// Algorithm is the algorithm of every case when the cases do not name one.
	Algorithm string `json:"algorithm"`
	// KeyType is how the file writes keys (KeyUint64 or KeyInt64).
	KeyType string `json:"keyType"`
	// Fields maps a quantity to its path in a case.
	Fields map[string]string `json:"fields"`
	// Group maps a quantity to its path in the case's test group (project schema only).
	Group map[string]string `json:"-"`
	// Required quantities must be present in every case; RequiredWhenValid in every reproducible one.
	Required          []string `json:"required"`
	RequiredWhenValid []string `json:"requiredWhenValid"`
}

// field is the name a quantity has in this layout (its last path element), for messages and
// failures; "" when the layout does not have it.
func (l *layout) field(q string) string {
	p, ok := l.Fields[q]
	if !ok {
		p, ok = l.Group[q]
	}
	if !ok {
		return ""
	}
	return p[strings.LastIndexByte(p, '.')+1:]
}

func (l *layout) required(q string, valid bool) bool {
	for _, r := range l.Required {
		if r == q {
			return true
		}
	}
	if valid {
		for _, r := range l.RequiredWhenValid {
			if r == q {
				return true
			}
		}
	}
	return false
}

// projectLayout is the project's own schema: the vocabulary's names, block geometry and seeds shared
// by a test group.
var projectLayout = &layout{
	Schema: SchemaName,
	README: "schema/" + SchemaName,
	Fields: map[string]string{
		qName: qName, qComment: qComment, qFlags: qFlags, qResult: qResult, qTokens: qTokens,
		qPromptLength: qPromptLength, qGroupBlockSize: qGroupBlockSize, qRequest: qRequest,
		qLoRAName: "request.loraName", qLoRAIntID: "request.loraIntId", qLoRAPath: "request.loraPath", qCacheSalt: "request.cacheSalt",
		qMMFeatures: "request.mmFeatures", qPromptEmbedsRows: "request.promptEmbedsRows",
		qExtraKeys: qExtraKeys, qExtraKeysOneShot: qExtraKeysOneShot, qExpected: qExpected,
		qRoot: "expected.root", qNumFullBlocks: "expected.numFullBlocks", qDigests: "expected.digests",
		qKeys: "expected.keys", qFirstBlockPreimage: "expected.firstBlockPreimage",
		qGroupDigests: "expected.groupDigests", qGroupKeys: "expected.groupKeys",
		qUnsaltedDigests: "expected.unsaltedDigests",
	},
	Group:             map[string]string{qBlockSize: qBlockSize, qSeed: qSeed, qRootSeed: qRootSeed, qBigram: qBigram},
	Required:          []string{qBlockSize, qResult, qTokens, qNumFullBlocks},
	RequiredWhenValid: []string{qDigests, qKeys},
}

//go:embed schema/engines.json
var enginesJSON []byte

// AlgorithmInfo is what schema/engines.json says about one hash algorithm.
type AlgorithmInfo struct {
	// Engine is the engine whose hashing the algorithm is (EngineKVExact for router keys).
	Engine string `json:"engine"`
	// KeyType is how its keys are written: KeyUint64 or KeyInt64.
	KeyType string `json:"keyType"`
	// Seeded: a PYTHONHASHSEED-style seed string roots the chain.
	Seeded bool `json:"seeded"`
	// ExtraKeys: its cases pin per-block extra keys (LoRA, salt, multimodal items, prompt embeddings).
	ExtraKeys bool `json:"extraKeys"`
	// SaltInRoot: a cache salt roots the chain instead; salted cases pin the unsalted digests too.
	SaltInRoot bool `json:"saltInRoot"`
	// Bigram: the engine can hash EAGLE bigram units.
	Bigram bool `json:"bigram"`
	// GeneratedFile is the file cmd/vecgen writes for the algorithm under generated/.
	GeneratedFile string `json:"generatedFile"`
}

var engines = func() (e struct {
	Originals  map[string]*layout        `json:"originals"`
	Algorithms map[string]*AlgorithmInfo `json:"algorithms"`
}) {
	if err := json.Unmarshal(enginesJSON, &e); err != nil {
		panic("vectors: schema/engines.json: " + err.Error())
	}
	for name, l := range e.Originals {
		l.Schema = "the " + name + " case schema (" + l.README + ")"
		if l.KeyType != KeyUint64 && l.KeyType != KeyInt64 {
			panic(fmt.Sprintf("vectors: schema/engines.json: %s: keyType %q", name, l.KeyType))
		}
	}
	for name, a := range e.Algorithms {
		if a.KeyType != KeyUint64 && a.KeyType != KeyInt64 || a.Engine == "" || a.GeneratedFile == "" {
			panic(fmt.Sprintf("vectors: schema/engines.json: algorithm %s: engine %q, keyType %q", name, a.Engine, a.KeyType))
		}
	}
	return e
}()

// engineLayouts are the engine-produced originals' layouts, by the engine named in their header.
var engineLayouts = engines.Originals

// Algorithm returns what schema/engines.json says about a hash algorithm.
func Algorithm(name string) (AlgorithmInfo, error) {
	a, ok := engines.Algorithms[name]
	if !ok {
		return AlgorithmInfo{}, fmt.Errorf("vectors: algorithm %q is not in schema/engines.json", name)
	}
	return *a, nil
}

// engineNames lists the engines whose originals the loader reads, sorted.
func engineNames() []string {
	var out []string
	for n := range engineLayouts {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
