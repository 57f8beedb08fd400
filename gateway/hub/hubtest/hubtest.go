// Package hubtest serves the hub's file API from memory on 127.0.0.1, for the tests of every
// package that fetches tokenizers from a hub.
package hubtest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Server is a local hub serving the two calls of the hub's file API for one repository:
// the revision listing and resolve, with the headers huggingface.co sends (X-Repo-Commit on
// every file, X-Linked-Etag with the sha256 on LFS files, here tokenizer.json).
type Server struct {
	*httptest.Server
	Repo, Commit, Branch string
	mu                   sync.Mutex
	Files                map[string][]byte
	Token                string // required bearer token ("" none)
	Calls                atomic.Int64
	Corrupt              atomic.Bool // serve tokenizer.json with one byte changed (its ETag stays)
	// Delay holds every answer this long (a slow or distant hub), in nanoseconds.
	Delay atomic.Int64
}

// SetToken makes the repository gated: requests must carry token as a bearer token.
func (s *Server) SetToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Token = token
}

// Set replaces the served files and commit (a new commit of the repository); nil files serve a
// repository without tokenizer files.
func (s *Server) Set(commit string, files map[string][]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Commit, s.Files = commit, files
}

// NewServer serves files as repo at one commit (its branch main names the same commit); it is
// closed when the test ends.
func NewServer(t testing.TB, repo string, files map[string][]byte) *Server {
	s := &Server{Repo: repo, Commit: strings.Repeat("ab", 20), Branch: "main", Files: files}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	time.Sleep(time.Duration(s.Delay.Load()))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Calls.Add(1)
	if s.Token != "" && r.Header.Get("Authorization") != "Bearer "+s.Token {
		http.Error(w, "gated", http.StatusUnauthorized)
		return
	}
	if rev, ok := strings.CutPrefix(r.URL.Path, "/api/models/"+s.Repo+"/revision/"); ok {
		if rev != s.Branch && rev != s.Commit {
			http.Error(w, "Revision Not Found", http.StatusNotFound)
			return
		}
		var sib []map[string]string
		for n := range s.Files {
			sib = append(sib, map[string]string{"rfilename": n})
		}
		json.NewEncoder(w).Encode(map[string]any{"id": s.Repo, "sha": s.Commit, "siblings": sib})
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/"+s.Repo+"/resolve/")
	rev, name, _ := strings.Cut(rest, "/")
	b, have := s.Files[name]
	if !ok || (rev != s.Commit && rev != s.Branch) || !have {
		http.Error(w, "Entry not found", http.StatusNotFound)
		return
	}
	w.Header().Set("X-Repo-Commit", s.Commit)
	if name == "tokenizer.json" {
		sum := sha256.Sum256(b)
		w.Header().Set("X-Linked-Etag", `"`+hex.EncodeToString(sum[:])+`"`)
		if s.Corrupt.Load() {
			b = append([]byte{}, b...)
			b[len(b)/2] ^= 1
		}
	}
	w.Write(b)
}
