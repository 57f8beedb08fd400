package admin

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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

// failingSnapshot writes n bytes of a snapshot, then fails.
type failingSnapshot struct {
	Backend
	n int
}

func (b failingSnapshot) Registry() *prometheus.Registry { return prometheus.NewRegistry() }
func (b failingSnapshot) EndpointSnapshot(rule, endpoint string, w io.Writer) error {
	if b.n > 0 {
		if _, err := w.Write(make([]byte, b.n)); err != nil {
			return err
		}
	}
	return statusErr(http.StatusConflict)
}

type statusErr int

func (e statusErr) Error() string   { return "endpoint not synchronized" }
func (e statusErr) StatusCode() int { return int(e) }

// TestSnapshotStreamErrors: a snapshot failing before its first byte answers with its status; one
// failing after the body began is cut (the client sees an error, never a complete-looking body).
func TestSnapshotStreamErrors(t *testing.T) {
	for _, n := range []int{0, 100 << 10} {
		srv := httptest.NewServer(Handler(failingSnapshot{n: n}, "t"))
		req, _ := http.NewRequest("GET", srv.URL+"/admin/snapshot/r/e", nil)
		req.Header.Set("Authorization", "Bearer t")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case n == 0 && (resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), "not synchronized")):
			t.Errorf("failing at once: %s %q, want 409 naming why", resp.Status, body)
		case n > 0 && (resp.StatusCode != http.StatusOK || err == nil || len(body) >= n+1):
			t.Errorf("failing after %d bytes: %s, %d bytes, read error %v; want 200 and a cut body", n, resp.Status, len(body), err)
		}
		srv.Close()
	}
}
