package admin

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestRequireTokenScheme(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	h := requireToken("s3cret", ok)
	for auth, want := range map[string]int{
		"Bearer s3cret":  204,
		"bearer s3cret":  204, // RFC 9110 §11.1: the scheme is case-insensitive
		"BEARER s3cret":  204,
		"Bearer  s3cret": 204,
		"Bearer S3cret":  401, // the token is not
		"Bearer s3cretx": 401,
		"Bearer s3cre":   401,
		"Basic s3cret":   401,
		"Bearers3cret":   401,
		"s3cret":         401,
		"Bearer":         401,
		"":               401,
	} {
		r := httptest.NewRequest("GET", "/admin/status", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("Authorization %q: %d, want %d", auth, w.Code, want)
		}
	}
	// No configured token: nothing passes.
	r := httptest.NewRequest("GET", "/admin/status", nil)
	r.Header.Set("Authorization", "Bearer ")
	w := httptest.NewRecorder()
	requireToken("", ok).ServeHTTP(w, r)
	if w.Code != 401 {
		t.Fatalf("empty token configured: %d", w.Code)
	}
}
