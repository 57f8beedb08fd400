package engines_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/engines"
)

// TestPostClear: a clear is done only on a 2xx that does not answer success false (vLLM's refusal
// while blocks are held); a 409 is a refusal too, another non-2xx an *HTTPError; bodies without a
// success field (SGLang's text) are a clear. Either error names the full URL.
func TestPostClear(t *testing.T) {
	for _, c := range []struct {
		name    string
		status  int
		body    string
		refused bool
		httpErr bool
	}{
		{"vllm accepted", 200, `{"success":true}`, false, false},
		{"vllm refused", 200, `{"success":false}`, true, false},
		{"empty body", 200, ``, false, false},
		{"text body", 200, `Cache flushed.`, false, false},
		{"json without success", 200, `{"message":"ok"}`, false, false},
		{"not 2xx", 400, `{"success":false}`, false, true},
		{"conflict", 409, `{"error":"cache not cleared: requests are running"}`, true, false},
		{"299", 299, `{}`, false, false},
		{"300", 300, `{}`, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || r.URL.Path != "/reset_prefix_cache" {
					t.Errorf("%s %s", r.Method, r.URL.Path)
				}
				w.WriteHeader(c.status)
				w.Write([]byte(c.body))
			}))
			defer srv.Close()
			err := engines.NewClient(srv.URL, srv.Client()).PostClear(t.Context(), "/reset_prefix_cache")
			var re *engines.ClearRefusedError
			var he *engines.HTTPError
			if got := errors.As(err, &re); got != c.refused {
				t.Fatalf("refused %v, want %v (err %v)", got, c.refused, err)
			}
			if got := errors.As(err, &he); got != c.httpErr {
				t.Fatalf("HTTP error %v, want %v (err %v)", got, c.httpErr, err)
			}
			if !c.refused && !c.httpErr && err != nil {
				t.Fatal(err)
			}
			if err != nil && !strings.Contains(err.Error(), "POST "+srv.URL+"/reset_prefix_cache:") {
				t.Errorf("the error does not name the URL posted: %v", err)
			}
		})
	}
}
