package tokenize

import (
	"encoding/json"
	"fmt"
)

// postProcessor is what add_special_tokens adds around a single sequence's ids.
type postProcessor struct {
	before, after []uint32
	source        string // where it came from, for diagnostics
}

func (p postProcessor) prefix(dst []uint32) []uint32 { return append(dst, p.before...) }
func (p postProcessor) suffix(dst []uint32) []uint32 { return append(dst, p.after...) }

// PostProcessorSummary says which ids add_special_tokens puts before and after the text, and why
// (tokenizer.json, or transformers' BOS/EOS rule from tokenizer_config.json).
func (t *Tokenizer) PostProcessorSummary() (before, after []uint32, source string) {
	return append([]uint32(nil), t.post.before...), append([]uint32(nil), t.post.after...), t.post.source
}

// buildPostProcessor applies transformers' rule (tokenization.md §2): when tokenizer_config.json
// sets add_bos_token or add_eos_token, the tokenizer.json post-processor is replaced by
// [bos] $A [eos] per those flags. Otherwise tokenizer.json's own post-processor is used.
func (t *Tokenizer) buildPostProcessor(m json.RawMessage) (postProcessor, error) {
	c := t.cfg
	if c.AddBOSToken != nil || c.AddEOSToken != nil {
		p := postProcessor{source: "tokenizer_config.json add_bos_token/add_eos_token (transformers replaces the tokenizer.json post_processor)"}
		if c.AddBOSToken != nil && *c.AddBOSToken {
			if c.BOSToken == nil {
				return p, fmt.Errorf("tokenizer_config.json: $.add_bos_token is true but $.bos_token is not set")
			}
			id, ok := t.TokenID(c.BOSToken.Content)
			if !ok {
				return p, fmt.Errorf("tokenizer_config.json: $.bos_token %q is not in the vocabulary", c.BOSToken.Content)
			}
			p.before = []uint32{id}
		}
		if c.AddEOSToken != nil && *c.AddEOSToken {
			if c.EOSToken == nil {
				return p, fmt.Errorf("tokenizer_config.json: $.add_eos_token is true but $.eos_token is not set")
			}
			id, ok := t.TokenID(c.EOSToken.Content)
			if !ok {
				return p, fmt.Errorf("tokenizer_config.json: $.eos_token %q is not in the vocabulary", c.EOSToken.Content)
			}
			p.after = []uint32{id}
		}
		return p, nil
	}
	p := postProcessor{source: "tokenizer.json post_processor"}
	if isNullJSON(m) {
		return p, nil
	}
	err := t.parsePost("$.post_processor", m, &p)
	return p, err
}

func (t *Tokenizer) parsePost(path string, m json.RawMessage, p *postProcessor) error {
	typ, err := typeOf(path, m)
	if err != nil {
		return err
	}
	switch typ {
	case "ByteLevel":
		return nil // offsets only
	case "Sequence":
		var s struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(m, &s); err != nil {
			return loadError(path+".processors", "%v", err)
		}
		for i, sub := range s.Processors {
			if err := t.parsePost(fmt.Sprintf("%s.processors[%d]", path, i), sub, p); err != nil {
				return err
			}
		}
		return nil
	case "TemplateProcessing":
		var s struct {
			Single []struct {
				SpecialToken *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
				Sequence *struct {
					ID string `json:"id"`
				} `json:"Sequence"`
			} `json:"single"`
			SpecialTokens map[string]struct {
				IDs []uint32 `json:"ids"`
			} `json:"special_tokens"`
		}
		if err := json.Unmarshal(m, &s); err != nil {
			return loadError(path, "%v", err)
		}
		var before, after []uint32
		seen := false
		for i, piece := range s.Single {
			ip := fmt.Sprintf("%s.single[%d]", path, i)
			switch {
			case piece.Sequence != nil:
				if piece.Sequence.ID != "A" || seen {
					return loadError(ip, "a single-sequence template must hold $A exactly once")
				}
				seen = true
			case piece.SpecialToken != nil:
				st, ok := s.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return loadError(ip, "special token %q is not in special_tokens", piece.SpecialToken.ID)
				}
				if seen {
					after = append(after, st.IDs...)
				} else {
					before = append(before, st.IDs...)
				}
			default:
				return loadError(ip, "neither SpecialToken nor Sequence")
			}
		}
		if !seen {
			return loadError(path+".single", "has no $A")
		}
		// Within a Sequence, later processors wrap the result of earlier ones.
		p.before = append(before, p.before...)
		p.after = append(p.after, after...)
		return nil
	case "BertProcessing", "RobertaProcessing":
		var s struct {
			Sep [2]json.RawMessage `json:"sep"`
			Cls [2]json.RawMessage `json:"cls"`
		}
		if err := json.Unmarshal(m, &s); err != nil {
			return loadError(path, "%v", err)
		}
		var sep, cls uint32
		if err := json.Unmarshal(s.Sep[1], &sep); err != nil {
			return loadError(path+".sep", "%v", err)
		}
		if err := json.Unmarshal(s.Cls[1], &cls); err != nil {
			return loadError(path+".cls", "%v", err)
		}
		p.before = append([]uint32{cls}, p.before...)
		p.after = append(p.after, sep)
		return nil
	}
	return unsupported(path, typ)
}
