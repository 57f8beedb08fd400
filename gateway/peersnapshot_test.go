package gateway

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/ingest"
	"github.com/kvexact/kvexact/gateway/rules"
)

func TestPeerSnapshotCheck(t *testing.T) {
	for _, tc := range []struct {
		url, token, err string
	}{
		{"http://10.0.0.7:9090", "t", ""},
		{"https://peer:9090/", "t", ""},
		{"ftp://peer:9090", "t", "without a path"},
		{"http://peer:9090/admin", "t", "without a path"},
		{"http://peer:9090?x=1", "t", "without a path"},
		{"http://", "t", "without a path"},
		{"http://peer:9090", "", "token is empty"},
	} {
		p := PeerSnapshot{URL: tc.url, Token: tc.token}
		err := p.check()
		if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q token %q: %v, want %q", tc.url, tc.token, err, tc.err)
		}
		if err == nil && (p.MaxBytes != DefaultPeerSnapshotMaxBytes || p.Timeout != DefaultPeerSnapshotTimeout) {
			t.Errorf("%q: defaults not filled: %+v", tc.url, p)
		}
	}
}

// TestPeerSnapshotFetchLimits pins the size limit at the snapshot's size and one byte under it,
// with and without a Content-Length, and the timeout.
func TestPeerSnapshotFetchLimits(t *testing.T) {
	s := &ingest.Snapshot{Rule: "r", Endpoint: "e0", Family: "vllm", Binding: ingest.BindingEngine,
		Ranks: []ingest.RankSeq{{Seq: 3}}, Keys: []ingest.SnapshotKey{{Key: 1, Count: 1}, {Key: 2, Count: 1, Age: 1}}}
	var buf bytes.Buffer
	if err := s.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	var chunked bool
	var delay time.Duration
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" || r.URL.Path != "/admin/snapshot/r/e0" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		time.Sleep(delay)
		if !chunked {
			w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		}
		w.Write(data)
		if chunked {
			w.(http.Flusher).Flush()
		}
	}))
	defer srv.Close()
	fetch := func(max int64, timeout time.Duration, token string) error {
		g := &Gateway{log: slog.New(slog.DiscardHandler), opts: Options{PeerSnapshot: &PeerSnapshot{URL: srv.URL, Token: token, MaxBytes: max, Timeout: timeout}}}
		f := g.seedFrom("r", rules.Endpoint{Name: "e0", Events: rules.Events{ZMQ: []string{"tcp://127.0.0.1:1"}, Replay: []string{"tcp://127.0.0.1:2"}}})
		got, err := f(context.Background())
		if err == nil && len(got.Keys) != 2 {
			t.Fatalf("fetched %+v", got)
		}
		return err
	}
	n := int64(len(data))
	for _, c := range []bool{false, true} {
		chunked = c
		if err := fetch(n, time.Second, "tok"); err != nil {
			t.Errorf("chunked %v: a snapshot of exactly the limit: %v", c, err)
		}
		want := "announced, over the limit" // refused on the header, before the body is read
		if c {
			want = "over the limit of"
		}
		if err := fetch(n-1, time.Second, "tok"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("chunked %v: one byte over the limit: %v, want %q", c, err, want)
		}
	}
	if err := fetch(n, time.Second, "wrong"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong token: %v", err)
	}
	delay = 300 * time.Millisecond
	if err := fetch(n, 100*time.Millisecond, "tok"); err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Errorf("past the timeout: %v", err)
	}
}
