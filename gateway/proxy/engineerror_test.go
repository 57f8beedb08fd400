package proxy

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/gateway/apierror"
)

func TestOpenAIError(t *testing.T) {
	cases := []struct {
		name      string
		status    int
		body      string
		rewritten bool
		message   string
		typ, code string
	}{
		{"sglang", 400, `{"object":"error","message":"1 validation error: temperature","type":"BadRequestError","param":null,"code":400}`, true, "1 validation error: temperature", "BadRequestError", "400"},
		{"trtllm-param", 400, `{"object":"error","message":"bad","type":"BadRequestError","param":"temperature","code":"bad_param"}`, true, "bad", "BadRequestError", "bad_param"},
		{"fastapi-detail", 422, `{"detail":"Not allowed"}`, true, "Not allowed", apierror.TypeInvalid, ""},
		{"fastapi-list", 422, `{"detail":[{"loc":["body","temperature"],"msg":"Input should be a valid number"}]}`, true, "body.temperature: Input should be a valid number", apierror.TypeInvalid, ""},
		{"error-string", 500, `{"error":"boom"}`, true, "boom", apierror.TypeServer, ""},
		{"text", 400, "Cache not flushed.\n", true, "Cache not flushed.", apierror.TypeInvalid, ""},
		{"empty", 503, "", true, "the engine answered 503 Service Unavailable with no message", apierror.TypeServer, ""},
		{"vllm-unchanged", 400, `{"error":{"message":"m","type":"BadRequestError","param":null,"code":400}}`, false, "m", "", ""},
		{"llamacpp-unchanged", 500, `{"error":{"code":500,"message":"m","type":"server_error"}}`, false, "m", "", ""},
		{"success-unchanged", 200, `{"object":"error"}`, false, "", "", ""},
	}
	for _, c := range cases {
		out, rw := openAIError(c.status, []byte(c.body))
		if rw != c.rewritten {
			t.Errorf("%s: rewritten %v, want %v (%s)", c.name, rw, c.rewritten, out)
			continue
		}
		if !rw {
			if string(out) != c.body {
				t.Errorf("%s: body changed: %s", c.name, out)
			}
			continue
		}
		var v struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("%s: %v: %s", c.name, err, out)
		}
		code := ""
		if v.Error.Code != nil {
			code = *v.Error.Code
		}
		if v.Error.Message != c.message || v.Error.Type != c.typ || code != c.code {
			t.Errorf("%s: got %s", c.name, out)
		}
	}
	long := strings.Repeat("é", maxEngineMessage)
	out, _ := openAIError(500, []byte(long))
	var v struct{ Error struct{ Message string } }
	if json.Unmarshal(out, &v) != nil || len(v.Error.Message) > maxEngineMessage+len("…") {
		t.Fatalf("a long text body is not bounded: %d bytes", len(v.Error.Message))
	}
}

// FuzzOpenAIError: any engine body becomes a JSON error with a message, or is left as it was.
func FuzzOpenAIError(f *testing.F) {
	for _, s := range []string{`{"object":"error","message":"x","code":400}`, `{"detail":[{"loc":[1],"msg":"m"}]}`, `{"error":{}}`, "\xff\xfe", "", `{"error":7}`} {
		f.Add(400, []byte(s))
	}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		out, rw := openAIError(status, body)
		if !rw {
			if string(out) != string(body) {
				t.Fatal("unchanged body differs")
			}
			return
		}
		var v struct{ Error struct{ Message string } }
		if err := json.Unmarshal(out, &v); err != nil || v.Error.Message == "" {
			t.Fatalf("rewritten body %q: %v", out, err)
		}
	})
}
