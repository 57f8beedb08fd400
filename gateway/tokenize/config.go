package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Config is the parsed tokenizer_config.json: the transformers-level settings that sit on top of
// tokenizer.json (BOS/EOS rule, special token strings, chat templates).
type Config struct {
	TokenizerClass string
	// AddBOSToken / AddEOSToken are nil when the file does not set them; when either is set,
	// transformers replaces tokenizer.json's post-processor (tokenization.md §2).
	AddBOSToken *bool
	AddEOSToken *bool
	BOSToken    *AddedTokenSpec
	EOSToken    *AddedTokenSpec
	PadToken    *AddedTokenSpec
	UnkToken    *AddedTokenSpec
	// AdditionalSpecialTokens as listed (strings or AddedToken objects).
	AdditionalSpecialTokens []AddedTokenSpec
	// ChatTemplate is the default template ("" when none); ChatTemplates holds every named template
	// when the file gives a list (the unnamed string form is stored under "default").
	ChatTemplate  string
	ChatTemplates map[string]string
	// ModelMaxLength as written (may be 1e30, which transformers uses for "no limit").
	ModelMaxLength            json.Number
	CleanUpTokenizationSpaces bool
	SplitSpecialTokens        bool
	// Raw keeps every top-level field as written, for settings this type does not name.
	Raw map[string]json.RawMessage
}

// AddedTokenSpec is a special-token setting from tokenizer_config.json, which may be a plain string
// or an AddedToken object.
type AddedTokenSpec struct {
	Content    string
	Lstrip     bool
	Rstrip     bool
	Normalized bool
	SingleWord bool
	Special    bool
}

func (a *AddedTokenSpec) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		return json.Unmarshal(b, &a.Content)
	}
	var o struct {
		Content    *string `json:"content"`
		Lstrip     bool    `json:"lstrip"`
		Rstrip     bool    `json:"rstrip"`
		Normalized bool    `json:"normalized"`
		SingleWord bool    `json:"single_word"`
		Special    bool    `json:"special"`
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return err
	}
	if o.Content == nil {
		return fmt.Errorf("added token object has no \"content\"")
	}
	*a = AddedTokenSpec{Content: *o.Content, Lstrip: o.Lstrip, Rstrip: o.Rstrip, Normalized: o.Normalized, SingleWord: o.SingleWord, Special: o.Special}
	return nil
}

// ParseConfig parses tokenizer_config.json bytes. Errors name the offending field.
func ParseConfig(data []byte) (*Config, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("tokenizer_config.json: %w", err)
	}
	c := &Config{Raw: raw}
	isNull := func(m json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(m), []byte("null")) }
	field := func(name string, dst any) error {
		m, ok := raw[name]
		if !ok || isNull(m) {
			return nil
		}
		d := json.NewDecoder(bytes.NewReader(m))
		d.UseNumber()
		if err := d.Decode(dst); err != nil {
			return fmt.Errorf("tokenizer_config.json: $.%s: %w", name, err)
		}
		return nil
	}
	tok := func(name string) (*AddedTokenSpec, error) {
		m, ok := raw[name]
		if !ok || isNull(m) {
			return nil, nil
		}
		var s AddedTokenSpec
		if err := json.Unmarshal(m, &s); err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: $.%s: %w", name, err)
		}
		return &s, nil
	}
	var err error
	if err = field("tokenizer_class", &c.TokenizerClass); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		dst  **bool
	}{{"add_bos_token", &c.AddBOSToken}, {"add_eos_token", &c.AddEOSToken}} {
		if m, ok := raw[f.name]; ok && !isNull(m) {
			var v bool
			if err := json.Unmarshal(m, &v); err != nil {
				return nil, fmt.Errorf("tokenizer_config.json: $.%s: %w", f.name, err)
			}
			*f.dst = &v
		}
	}
	if c.BOSToken, err = tok("bos_token"); err != nil {
		return nil, err
	}
	if c.EOSToken, err = tok("eos_token"); err != nil {
		return nil, err
	}
	if c.PadToken, err = tok("pad_token"); err != nil {
		return nil, err
	}
	if c.UnkToken, err = tok("unk_token"); err != nil {
		return nil, err
	}
	if err = field("additional_special_tokens", &c.AdditionalSpecialTokens); err != nil {
		return nil, err
	}
	if err = field("model_max_length", &c.ModelMaxLength); err != nil {
		return nil, err
	}
	if err = field("clean_up_tokenization_spaces", &c.CleanUpTokenizationSpaces); err != nil {
		return nil, err
	}
	if err = field("split_special_tokens", &c.SplitSpecialTokens); err != nil {
		return nil, err
	}
	if m, ok := raw["chat_template"]; ok && !isNull(m) {
		m = bytes.TrimSpace(m)
		c.ChatTemplates = map[string]string{}
		if len(m) > 0 && m[0] == '"' {
			if err := json.Unmarshal(m, &c.ChatTemplate); err != nil {
				return nil, fmt.Errorf("tokenizer_config.json: $.chat_template: %w", err)
			}
			c.ChatTemplates["default"] = c.ChatTemplate
		} else {
			var list []struct {
				Name     *string `json:"name"`
				Template *string `json:"template"`
			}
			if err := json.Unmarshal(m, &list); err != nil {
				return nil, fmt.Errorf("tokenizer_config.json: $.chat_template: want a string or a list of {name, template}: %w", err)
			}
			for i, e := range list {
				if e.Name == nil || e.Template == nil {
					return nil, fmt.Errorf("tokenizer_config.json: $.chat_template[%d]: needs both \"name\" and \"template\"", i)
				}
				c.ChatTemplates[*e.Name] = *e.Template
			}
			c.ChatTemplate = c.ChatTemplates["default"]
		}
	}
	return c, nil
}
