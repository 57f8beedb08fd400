package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
)

// The tokenizer.json document, with polymorphic components kept raw until their type is known.
type tokenizerFile struct {
	Version       string           `json:"version"`
	Truncation    json.RawMessage  `json:"truncation"`
	Padding       json.RawMessage  `json:"padding"`
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	Model         json.RawMessage  `json:"model"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
}

type addedTokenJSON struct {
	ID         *uint32 `json:"id"`
	Content    string  `json:"content"`
	SingleWord bool    `json:"single_word"`
	Lstrip     bool    `json:"lstrip"`
	Rstrip     bool    `json:"rstrip"`
	Normalized bool    `json:"normalized"`
	Special    bool    `json:"special"`
}

// loadError is the error of an unsupported or malformed component, naming its JSON path.
func loadError(path, format string, args ...any) error {
	return fmt.Errorf("tokenizer.json: %s: %s", path, fmt.Sprintf(format, args...))
}

func unsupported(path, typ string) error {
	return fmt.Errorf("tokenizer.json: %s.type %q is not supported", path, typ)
}

func isNullJSON(m json.RawMessage) bool {
	m = bytes.TrimSpace(m)
	return len(m) == 0 || bytes.Equal(m, []byte("null"))
}

// typeOf reads the "type" field of a component object.
func typeOf(path string, m json.RawMessage) (string, error) {
	var h struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(m, &h); err != nil {
		return "", loadError(path, "%v", err)
	}
	if h.Type == nil {
		return "", loadError(path, "has no \"type\"")
	}
	return *h.Type, nil
}

func build(data []byte, cfg *Config) (*Tokenizer, error) {
	var f tokenizerFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if !isNullJSON(f.Truncation) {
		return nil, loadError("$.truncation", "truncation is not supported (must be null)")
	}
	t := &Tokenizer{cfg: cfg}
	var err error
	if !isNullJSON(f.Normalizer) {
		if t.normalizer, err = parseNormalizer("$.normalizer", f.Normalizer); err != nil {
			return nil, err
		}
	}
	byteLevel := false
	if !isNullJSON(f.PreTokenizer) {
		if t.pre, err = parsePreTokenizer("$.pre_tokenizer", f.PreTokenizer, &byteLevel); err != nil {
			return nil, err
		}
	}
	if isNullJSON(f.Model) {
		return nil, loadError("$.model", "missing")
	}
	if t.model, err = parseBPE("$.model", f.Model, byteLevel); err != nil {
		return nil, err
	}

	// Vocabulary tables: model vocabulary, then added tokens (which win on conflicts, as in HF).
	t.tokenToID = make(map[string]uint32, len(t.model.tokens)+len(f.AddedTokens))
	t.idToToken = make([]string, len(t.model.tokens))
	copy(t.idToToken, t.model.tokens)
	for id, s := range t.model.tokens {
		if _, dup := t.tokenToID[s]; !dup || t.model.vocab[s] == uint32(id) {
			t.tokenToID[s] = uint32(id)
		}
	}
	t.specialIDs = map[uint32]bool{}
	var specs []addedSpec
	for i, a := range f.AddedTokens {
		path := fmt.Sprintf("$.added_tokens[%d]", i)
		if a.ID == nil {
			return nil, loadError(path, "has no \"id\"")
		}
		if a.Content == "" {
			return nil, loadError(path, "empty \"content\"")
		}
		id := *a.ID
		if id >= 1<<24 {
			return nil, loadError(path+".id", "%d is out of range", id)
		}
		for int(id) >= len(t.idToToken) {
			t.idToToken = append(t.idToToken, "")
		}
		t.idToToken[id] = a.Content
		t.tokenToID[a.Content] = id
		if a.Special {
			t.specialIDs[id] = true
		}
		// split_special_tokens (transformers) leaves special tokens to the normal pipeline.
		if a.Special && cfg.SplitSpecialTokens {
			continue
		}
		specs = append(specs, addedSpec{content: a.Content, id: id, lstrip: a.Lstrip, rstrip: a.Rstrip, singleWord: a.SingleWord, normalized: a.Normalized})
	}
	t.added = newAddedVocab(specs, t.normalizer)

	if t.post, err = t.buildPostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	if !isNullJSON(f.Decoder) {
		if t.decoder, err = parseDecoder("$.decoder", f.Decoder); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// sortedKeys returns the keys of m in order (for deterministic error messages).
func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
