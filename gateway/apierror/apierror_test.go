package apierror

import (
	"net/http"
	"testing"
)

// TestBody pins the bytes both the proxy and the endpoint picker answer: OpenAI's field order,
// null param and code when empty, the message verbatim.
func TestBody(t *testing.T) {
	for _, c := range []struct {
		name  string
		e     *Error
		body  string
		retry bool
	}{
		{"invalid-param", Invalid(http.StatusNotFound, "model", "model_not_found", "the model `%s` does not exist", "m"),
			`{"error":{"message":"the model ` + "`m`" + ` does not exist","type":"invalid_request_error","param":"model","code":"model_not_found"}}`, false},
		{"invalid-no-param", Invalid(http.StatusBadRequest, "", "missing_body", "no body"),
			`{"error":{"message":"no body","type":"invalid_request_error","param":null,"code":"missing_body"}}`, false},
		{"server", Server(http.StatusServiceUnavailable, "no_healthy_endpoint", "none: %d", 3),
			`{"error":{"message":"none: 3","type":"server_error","param":null,"code":"no_healthy_endpoint"}}`, true},
		{"no-code", &Error{Status: http.StatusTooManyRequests, Type: TypeRateLimit, Message: "shed \"x\"; retry later"},
			`{"error":{"message":"shed \"x\"; retry later","type":"rate_limit_error","param":null,"code":null}}`, true},
	} {
		if got := string(c.e.Body()); got != c.body {
			t.Errorf("%s: body\n got %s\nwant %s", c.name, got, c.body)
		}
		if c.e.RetryAfter() != c.retry {
			t.Errorf("%s: RetryAfter() = %v, want %v", c.name, c.e.RetryAfter(), c.retry)
		}
		if c.e.Error() != c.e.Message || c.e.StatusCode() != c.e.Status {
			t.Errorf("%s: Error()/StatusCode() do not report Message/Status", c.name)
		}
	}
}
