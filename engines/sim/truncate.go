package sim

import (
	"encoding/json"
	"fmt"
)

// truncation is a vLLM request's truncate_prompt_tokens and truncation_side, applied as vLLM's
// TokenizeParams does (vllm/renderers/params.py): n = -1 means max_model_len − max_tokens, and n
// above that is a 400; a prompt no longer than n is unchanged. With truncation_side the prompt is
// tokenized in full and sliced ("left" keeps the last n tokens, "right" the first n). Without it
// the tokenizer truncates with its own truncation_side, which vLLM sets to "left" for generative
// models (vllm/tokenizers/registry.py): Hugging Face's truncation cuts the text's own tokens so
// that they and the special tokens it adds fit n, the special tokens kept. Token-id prompts and
// chats, which add no special tokens, keep their last n.
type truncation struct {
	n    *int64
	side string
}

// parseTruncation reads the two fields from a vLLM request body (absent: no truncation).
func parseTruncation(raw []byte) (truncation, error) {
	var v struct {
		N    *int64  `json:"truncate_prompt_tokens"`
		Side *string `json:"truncation_side"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return truncation{}, fmt.Errorf("truncate_prompt_tokens: %v", err)
	}
	t := truncation{n: v.N}
	if v.Side != nil {
		if *v.Side != "left" && *v.Side != "right" {
			return truncation{}, fmt.Errorf("`truncation_side` must be either 'left' or 'right'.")
		}
		t.side = *v.Side
	}
	if t.n != nil && *t.n < -1 {
		return truncation{}, fmt.Errorf("truncate_prompt_tokens: Input should be greater than or equal to -1")
	}
	return t, nil
}

// limit is the number of tokens kept (-1: no truncation), or an error for n above the input room.
func (t truncation) limit(maxModelLen, maxTokens int) (int, error) {
	if t.n == nil {
		return -1, nil
	}
	room := int64(maxModelLen - maxTokens)
	n := *t.n
	if n < 0 {
		n = room
	}
	if n > room {
		return 0, fmt.Errorf("truncate_prompt_tokens=%d cannot be greater than max_model_len - max_tokens = %d. Please request a smaller truncation size.", n, room)
	}
	return int(n), nil
}

// slice cuts ids, which carry no special tokens of the tokenizer's adding, to n.
func (t truncation) slice(ids []uint32, n int) []uint32 {
	if n < 0 || n >= len(ids) {
		return ids
	}
	if t.side == "right" {
		return ids[:n]
	}
	return ids[len(ids)-n:]
}

// text truncates a text prompt to n tokens: with truncation_side the full tokenization is sliced;
// without, the tokenizer's left truncation keeps its special tokens (those it adds to an empty
// text, in front: the post-processors the simulator's models use add a BOS at most) and the text's
// last n − (special tokens).
func (e *Engine) truncateText(text string, add bool, t truncation, n int) ([]uint32, error) {
	full, err := e.tok.Encode(text, add)
	if err != nil || n < 0 || n >= len(full) {
		return full, err
	}
	if t.side != "" || !add {
		return t.slice(full, n), nil
	}
	special, err := e.tok.Encode("", true)
	if err != nil {
		return nil, err
	}
	bare, err := e.tok.Encode(text, false)
	if err != nil {
		return nil, err
	}
	if n < len(special) {
		return special[:0], nil
	}
	return append(append([]uint32{}, special...), bare[len(bare)-(n-len(special)):]...), nil
}
