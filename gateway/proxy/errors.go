package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// apiError is an error the proxy answers itself, in OpenAI's shape.
type apiError struct {
	Status  int
	Message string
	Type    string
	Param   string
	Code    string
}

func (e *apiError) Error() string { return e.Message }

// StatusCode is the HTTP status the data path answers with (the admin API's explain answers the same).
func (e *apiError) StatusCode() int { return e.Status }

// Error types, as OpenAI spells them.
const (
	typeInvalid   = "invalid_request_error"
	typeServer    = "server_error"
	typeRateLimit = "rate_limit_error"
)

func badRequest(param, code, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Message: fmt.Sprintf(format, args...), Type: typeInvalid, Param: param, Code: code}
}

func serverError(status int, code, format string, args ...any) *apiError {
	return &apiError{Status: status, Message: fmt.Sprintf(format, args...), Type: typeServer, Code: code}
}

// errorBody renders {"error":{"message","type","param","code"}} (param and code null when empty).
func errorBody(e *apiError) []byte {
	var v struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	v.Error.Message, v.Error.Type = e.Message, e.Type
	if e.Param != "" {
		v.Error.Param = &e.Param
	}
	if e.Code != "" {
		v.Error.Code = &e.Code
	}
	b, _ := json.Marshal(v) // strings and pointers only: cannot fail
	return b
}

// writeError answers the client with e. Only valid before any response byte was written.
func writeError(w http.ResponseWriter, e *apiError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	if e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	b := errorBody(e)
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(e.Status)
	_, _ = w.Write(b)
}
