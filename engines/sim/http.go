package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// ReceiptHeader names the endpoint that served a response (delivery proof, independent of any
// gateway metric). Response ids carry the same name.
const ReceiptHeader = "X-Kvexact-Served-By"

// PrefilledByHeader names the prefill endpoint whose KV a decode response used (P/D).
const PrefilledByHeader = "X-Kvexact-Prefilled-By"

// maxBody bounds request bodies.
const maxBody = 64 << 20

func (e *Engine) routes() *http.ServeMux {
	m := http.NewServeMux()
	h := func(pattern string, f http.HandlerFunc) { m.Handle(pattern, e.receipt(f)) }
	h("POST /v1/completions", e.handleCompletions)
	h("POST /v1/chat/completions", e.handleChat)
	h("GET /v1/models", e.handleModels)
	h("GET /health", e.handleHealth)
	h("GET /metrics", e.handleMetrics)
	switch e.cfg.Family {
	case "vllm":
		h("GET /version", e.handleVersion)
		h("POST /tokenize", e.handleTokenize)
		h("POST /detokenize", e.handleDetokenize)
		if e.cfg.DevMode {
			// vLLM mounts its development routes only with VLLM_SERVER_DEV_MODE=1.
			h("POST /reset_prefix_cache", e.handleResetPrefixCache)
		}
		h("GET /ping", e.handleHealth)
	case "sglang":
		for _, p := range []string{"/server_info", "/get_server_info"} {
			h("GET "+p, e.handleSGLangServerInfo)
		}
		for _, p := range []string{"/model_info", "/get_model_info"} {
			h("GET "+p, e.handleSGLangModelInfo)
		}
		for _, p := range []string{"/v1/tokenize", "/tokenize"} {
			h("POST "+p, e.handleTokenize)
		}
		for _, p := range []string{"/v1/detokenize", "/detokenize"} {
			h("POST "+p, e.handleDetokenize)
		}
		h("/flush_cache", e.handleFlushCache)
		h("GET /health_generate", e.handleHealth)
		h("GET /v1/loads", e.handleSGLangLoads)
	case "trtllm":
		h("GET /version", e.handleVersion)
		h("POST /kv_cache_events", e.handleKVCacheEvents)
		h("GET /server_info", e.handleTRTServerInfo)
	case "llamacpp":
		h("GET /v1/health", e.handleHealth)
		h("GET /models", e.handleModels)
		h("GET /props", e.handleProps)
		h("POST /tokenize", e.handleTokenize)
		h("POST /detokenize", e.handleDetokenize)
		h("POST /apply-template", e.handleApplyTemplate)
		h("GET /slots", e.handleSlots)
	}
	e.mountAdmin(m)
	m.Handle("/", e.receipt(func(w http.ResponseWriter, r *http.Request) {
		e.writeError(w, http.StatusNotFound, "Not Found", "")
	}))
	return m
}

// receipt stamps every response with the endpoint name.
func (e *Engine) receipt(f http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(ReceiptHeader, e.cfg.Endpoint)
		defer func() {
			// A handler bug must not take the simulator down; answer 500 like the engine would.
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				e.cfg.Logger.Error("sim: handler panic", "path", r.URL.Path, "panic", fmt.Sprint(v))
				e.writeError(w, http.StatusInternalServerError, fmt.Sprint(v), "")
			}
		}()
		f(w, r)
	})
}

// errType is the engine's error type name for a status.
func (e *Engine) errType(status int) string {
	if e.cfg.Family == "llamacpp" {
		switch {
		case status == 404:
			return "not_found_error"
		case status == 503:
			return "unavailable_error"
		case status >= 500:
			return "server_error"
		case status == 401:
			return "authentication_error"
		}
		return "invalid_request_error"
	}
	switch status {
	case 400, 422:
		return "BadRequestError"
	case 404:
		return "NotFoundError"
	case 501:
		return "NotImplementedError"
	case 503:
		return "ServiceUnavailableError"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return "BadRequestError"
}

// writeError answers in the family's error shape: vLLM {"error":{message,type,param,code}};
// SGLang and TensorRT-LLM {"object":"error",message,type,param,code}; llama.cpp
// {"error":{code,message,type}}.
func (e *Engine) writeError(w http.ResponseWriter, status int, msg, param string) {
	var p any
	if param != "" {
		p = param
	}
	var body any
	switch e.cfg.Family {
	case "vllm":
		body = map[string]any{"error": map[string]any{"message": msg, "type": e.errType(status), "param": p, "code": status}}
	case "llamacpp":
		body = map[string]any{"error": map[string]any{"code": status, "message": msg, "type": e.errType(status)}}
	default:
		body = map[string]any{"object": "error", "message": msg, "type": e.errType(status), "param": p, "code": status}
	}
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// readBody reads a bounded body; the error is already answered when it returns false.
func (e *Engine) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			e.writeError(w, http.StatusRequestEntityTooLarge, "request body too large", "")
		} else {
			e.writeError(w, http.StatusBadRequest, "could not read the request body: "+err.Error(), "")
		}
		return nil, false
	}
	return b, true
}

// badJSON answers a body that is not the JSON the endpoint expects, as the engine would: 400 for
// the Python servers (pydantic validation), 500 for llama.cpp's JSON parse exception.
func (e *Engine) badJSON(w http.ResponseWriter, err error) {
	msg := jsonErrorMessage(err)
	if e.cfg.Family == "llamacpp" {
		var se *json.SyntaxError
		if errors.As(err, &se) || strings.Contains(msg, "unexpected end of JSON") {
			e.writeError(w, http.StatusInternalServerError, "[json.exception.parse_error.101] parse error: "+msg, "")
			return
		}
	}
	e.writeError(w, http.StatusBadRequest, msg, "")
}

func jsonErrorMessage(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			field = "body"
		}
		return fmt.Sprintf("1 validation error: %s: Input should be a valid %s, got JSON %s", field, pyTypeName(te.Type.Kind().String()), te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("JSON decode error at byte %d: %v", se.Offset, err)
	}
	return err.Error()
}

func pyTypeName(kind string) string {
	switch kind {
	case "int", "int64", "int32", "uint32", "uint64":
		return "integer"
	case "bool":
		return "boolean"
	case "string":
		return "string"
	case "slice", "array":
		return "list"
	case "map", "struct", "ptr":
		return "dictionary"
	case "float64":
		return "number"
	}
	return kind
}

var errEmptyBody = errors.New("unexpected end of JSON input: the request body is empty")

// decodeJSON decodes body into v; the body must be one JSON object.
func decodeJSON(body []byte, v any) error {
	trimmed := strings.TrimSpace(string(body))
	if trimmed == "" {
		return errEmptyBody
	}
	if trimmed[0] != '{' {
		return fmt.Errorf("1 validation error: body: Input should be a valid dictionary or object")
	}
	return json.Unmarshal(body, v)
}
