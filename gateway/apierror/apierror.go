// Package apierror owns the error the gateway answers an OpenAI client itself, without the
// engine: its HTTP status and its body in OpenAI's shape, {"error":{"message","type","param","code"}}.
// The proxy writes it as an HTTP answer or an SSE error event, the endpoint picker (gateway/epp)
// as an ext_proc ImmediateResponse; one type keeps the two answers byte-identical.
package apierror

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// Error types, as OpenAI spells them.
const (
	TypeInvalid   = "invalid_request_error"
	TypeServer    = "server_error"
	TypeRateLimit = "rate_limit_error"
)

// Error is an answer to the client: Status is the HTTP status, the rest the body's fields
// (Param and Code render as null when empty).
type Error struct {
	Status  int
	Message string
	Type    string
	Param   string
	Code    string
}

func (e *Error) Error() string { return e.Message }

// StatusCode is the HTTP status the data path answers with (the admin API's explain answers the same).
func (e *Error) StatusCode() int { return e.Status }

// RetryAfter says whether the answer carries "Retry-After: 1": the client may try again at once.
func (e *Error) RetryAfter() bool {
	return e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable
}

// Invalid is a request error (invalid_request_error) with status, naming param when not empty.
func Invalid(status int, param, code, format string, args ...any) *Error {
	return &Error{Status: status, Message: fmt.Sprintf(format, args...), Type: TypeInvalid, Param: param, Code: code}
}

// Server is the gateway's own failure (server_error) with status.
func Server(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Message: fmt.Sprintf(format, args...), Type: TypeServer, Code: code}
}

// Body renders the error in OpenAI's shape.
func (e *Error) Body() []byte {
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
