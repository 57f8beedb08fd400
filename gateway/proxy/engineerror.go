package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/kvexact/kvexact/gateway/apierror"
)

// maxEngineError bounds the engine error body the proxy reads to rewrite it; a larger one is
// relayed as it came.
const maxEngineError = 64 << 10

// maxEngineMessage bounds a message taken from a body that is not JSON.
const maxEngineMessage = 2048

// openAIError rewrites an engine's error answer into OpenAI's shape,
// {"error":{"message","type","param","code"}}, keeping its message (the status stays the engine's).
// OpenAI clients read only error.message: SGLang and TensorRT-LLM answer
// {"object":"error","message",…} with no top-level error, FastAPI {"detail":…}, and some paths plain
// text or nothing, all of which an SDK shows as "400 status code (no body)". A body that already has
// an error object with a message (vLLM, llama.cpp, the proxy's own) is returned unchanged, so is
// any body when status is not an error; rewritten says whether it was.
func openAIError(status int, body []byte) (out []byte, rewritten bool) {
	if status < 400 {
		return body, false
	}
	e := &apierror.Error{Status: status, Type: apierror.TypeInvalid}
	if status >= 500 {
		e.Type = apierror.TypeServer
	}
	var v map[string]json.RawMessage
	if json.Unmarshal(body, &v) == nil && v != nil {
		if raw, ok := v["error"]; ok {
			var inner map[string]json.RawMessage
			if json.Unmarshal(raw, &inner) == nil && jsonString(inner["message"]) != "" {
				return body, false
			}
			if s := jsonString(raw); s != "" {
				e.Message = s // {"error": "text"}
			}
		}
		if e.Message == "" {
			e.Message = jsonString(v["message"])
		}
		if e.Message == "" {
			e.Message = detailMessage(v["detail"])
		}
		if t := jsonString(v["type"]); t != "" {
			e.Type = t
		}
		e.Param = jsonString(v["param"])
		e.Code = jsonScalar(v["code"])
	}
	if e.Message == "" {
		e.Message = textMessage(body)
	}
	if e.Message == "" {
		e.Message = fmt.Sprintf("the engine answered %d %s with no message", status, http.StatusText(status))
	}
	return e.Body(), true
}

// relayEngineError answers with resp's error body in OpenAI's shape. It returns false, having
// consumed nothing, when the body cannot be rewritten (compressed, an event stream); then the
// caller relays it as it is.
func (c *call) relayEngineError(resp *http.Response, commit func() bool) (relayResult, bool) {
	if header(resp.Header, "Content-Encoding") != "" || isSSE(resp.Header) {
		return 0, false
	}
	body, ok, err := readAllLimit(resp.Body, maxEngineError)
	if !ok || err != nil {
		// Too large to hold, or broken off: relay what was read followed by the rest, unchanged
		// (a read error then surfaces again in the relay, which handles it).
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), resp.Body), resp.Body}
		return 0, false
	}
	resp.Body.Close()
	if commit != nil && !commit() {
		return relayRefused, true
	}
	c.writeBuffered(resp.StatusCode, resp.Header, body)
	return relayed, true
}

func jsonString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// jsonScalar is a string as is, a number as its text (OpenAI's code is a string), else "".
func jsonScalar(raw json.RawMessage) string {
	if s := jsonString(raw); s != "" {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		if _, err := strconv.ParseFloat(string(n), 64); err == nil {
			return string(n)
		}
	}
	return ""
}

// detailMessage reads FastAPI's detail: a string, or pydantic's list of {loc, msg}.
func detailMessage(raw json.RawMessage) string {
	if s := jsonString(raw); s != "" {
		return s
	}
	var items []struct {
		Loc []any  `json:"loc"`
		Msg string `json:"msg"`
	}
	if json.Unmarshal(raw, &items) != nil {
		return ""
	}
	var parts []string
	for _, it := range items {
		loc := make([]string, len(it.Loc))
		for i, l := range it.Loc {
			loc[i] = fmt.Sprint(l)
		}
		parts = append(parts, strings.Join(loc, ".")+": "+it.Msg)
	}
	return strings.Join(parts, "; ")
}

// textMessage is a plain-text body as a message: valid UTF-8, trimmed, bounded.
func textMessage(body []byte) string {
	s := strings.TrimSpace(strings.ToValidUTF8(string(body), "\uFFFD"))
	if len(s) > maxEngineMessage {
		s = s[:maxEngineMessage]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	return s
}
