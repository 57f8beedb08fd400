package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
)

// Field checks of the OpenAI request models, as the engines' pydantic models make them: a field
// of the wrong JSON type is a 400 naming the field, before anything is scheduled. Only the fields
// the probes, the gateway and common clients send are checked; the rest is ignored as before.

// fieldKind is the JSON type a request field must have (null is always accepted: every one of
// these fields is Optional in the engines' models).
type fieldKind int

const (
	fieldNumber  fieldKind = iota // float
	fieldInteger                  // int (a number without a fraction, as pydantic's lax mode takes it)
	fieldBool
	fieldString
	fieldStop // str | list[str]
)

var requestFields = map[string]fieldKind{
	"temperature": fieldNumber, "top_p": fieldNumber, "min_p": fieldNumber, "presence_penalty": fieldNumber,
	"frequency_penalty": fieldNumber, "repetition_penalty": fieldNumber, "length_penalty": fieldNumber,
	"top_k": fieldInteger, "seed": fieldInteger, "min_tokens": fieldInteger, "max_tokens": fieldInteger,
	"max_completion_tokens": fieldInteger, "n": fieldInteger, "best_of": fieldInteger, "top_logprobs": fieldInteger,
	"stream": fieldBool, "echo": fieldBool, "ignore_eos": fieldBool, "skip_special_tokens": fieldBool,
	"add_special_tokens": fieldBool, "add_generation_prompt": fieldBool, "continue_final_message": fieldBool,
	"user": fieldString, "model": fieldString, "cache_salt": fieldString,
	"stop": fieldStop,
}

// sglangRoles are the message roles SGLang's request models accept (ChatCompletionMessageUserParam
// and ChatCompletionMessageGenericParam, lower-cased first). vLLM and TensorRT-LLM accept any role
// string (their CustomChatCompletionMessageParam "enables custom roles"), which the template sees.
var sglangRoles = map[string]bool{"system": true, "user": true, "assistant": true, "tool": true, "function": true, "developer": true}

// checkFields returns the engine's validation message for the first ill-typed field of a request
// body that is already known to be a JSON object, or "".
func (e *Engine) checkFields(raw []byte, kind reqKind) string {
	if e.cfg.Family == "llamacpp" {
		return "" // llama.cpp's JSON handling reads what it knows and ignores types it cannot use
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil {
		return "" // the typed decode reports it
	}
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		want, ok := requestFields[k]
		if k == "logprobs" {
			// chat: a boolean; completions: the number of log-probabilities.
			want, ok = fieldInteger, true
			if kind == kindChat {
				want = fieldBool
			}
		}
		if !ok {
			continue
		}
		if msg := checkKind(fields[k], want); msg != "" {
			return validationError(k, msg, fields[k])
		}
	}
	if kind == kindChat {
		return e.checkMessages(fields["messages"])
	}
	return ""
}

func checkKind(v json.RawMessage, want fieldKind) string {
	s := strings.TrimSpace(string(v))
	if s == "null" {
		return ""
	}
	switch want {
	case fieldNumber, fieldInteger:
		var f float64
		if json.Unmarshal(v, &f) != nil {
			if want == fieldInteger {
				return "Input should be a valid integer"
			}
			return "Input should be a valid number"
		}
		if want == fieldInteger && f != math.Trunc(f) {
			return "Input should be a valid integer, got a number with a fractional part"
		}
	case fieldBool:
		var b bool
		if json.Unmarshal(v, &b) != nil {
			return "Input should be a valid boolean"
		}
	case fieldString:
		var x string
		if json.Unmarshal(v, &x) != nil {
			return "Input should be a valid string"
		}
	case fieldStop:
		var x string
		var xs []string
		if json.Unmarshal(v, &x) != nil && json.Unmarshal(v, &xs) != nil {
			return "Input should be a valid string or a list of strings"
		}
	}
	return ""
}

// checkMessages checks the messages list: objects, each with a string role (SGLang: one it knows)
// and a string, list or null content.
func (e *Engine) checkMessages(raw json.RawMessage) string {
	if len(raw) == 0 {
		return validationError("messages", "Field required", nil)
	}
	var msgs []map[string]json.RawMessage
	if json.Unmarshal(raw, &msgs) != nil {
		return validationError("messages", "Input should be a valid list of message objects", raw)
	}
	for i, m := range msgs {
		field := fmt.Sprintf("messages.%d.role", i)
		r, ok := m["role"]
		if !ok {
			return validationError(field, "Field required", nil)
		}
		var role string
		if json.Unmarshal(r, &role) != nil {
			return validationError(field, "Input should be a valid string", r)
		}
		if e.cfg.Family == "sglang" && !sglangRoles[strings.ToLower(role)] {
			return validationError(field, "Input should be 'system', 'user', 'assistant', 'tool', 'function' or 'developer'", r)
		}
		if c, ok := m["content"]; ok && strings.TrimSpace(string(c)) != "null" {
			var s string
			var parts []json.RawMessage
			if json.Unmarshal(c, &s) != nil && json.Unmarshal(c, &parts) != nil {
				return validationError(fmt.Sprintf("messages.%d.content", i), "Input should be a valid string or a list of content parts", c)
			}
		}
	}
	return ""
}

// validationError is pydantic's one-error message: the field's location, the problem, the input.
func validationError(field, problem string, input json.RawMessage) string {
	if input == nil {
		return fmt.Sprintf("1 validation error: %s: %s", field, problem)
	}
	in := string(input)
	if len(in) > 60 {
		in = in[:60] + "…"
	}
	return fmt.Sprintf("1 validation error: %s: %s [input_value=%s]", field, problem, in)
}
