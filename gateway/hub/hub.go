// Package hub fetches a model's tokenizer files from a Hugging Face–compatible hub: the endpoint
// the engines load the model from (huggingface.co, or a mirror inside the cluster). It speaks the
// two calls huggingface_hub itself makes for this (huggingface_hub/hf_api.py and file_download.py):
//
//	GET {endpoint}/api/models/{repo}/revision/{revision}   → {"sha": commit, "siblings": [{"rfilename"}]}
//	GET {endpoint}/{repo}/resolve/{commit}/{filename}       → the file; X-Repo-Commit names the commit,
//	                                                          X-Linked-Etag the sha256 of an LFS file
//
// A revision (branch, tag or commit) is resolved to its commit first and the files are fetched at
// that commit, so one snapshot never mixes two commits. Snapshots are cached under
// {cacheDir}/{repo with "/" → "--"}/{commit}/, written to a temporary folder and renamed into place,
// so a reader sees a complete snapshot or none.
package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Files are the tokenizer files a snapshot holds: the first two are required (the tokenizer's
// own loader reads them), the others are fetched when the repository has them.
var Files = []string{"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"}

const required = 2

// MaxFileBytes bounds one downloaded file (the largest tokenizer.json of the supported models is
// about 17 MB); a larger answer is refused rather than filling the cache volume.
const MaxFileBytes = 64 << 20

// maxInfoBytes bounds the revision listing's JSON.
const maxInfoBytes = 8 << 20

// Source names where one model's tokenizer lives on a hub.
type Source struct {
	// Endpoint is the hub's base URL, e.g. https://huggingface.co.
	Endpoint string
	// Repo is the model repository id, e.g. meta-llama/Meta-Llama-3-8B-Instruct.
	Repo string
	// Revision is a branch, tag or commit ("" means main).
	Revision string
	// Token is sent as a bearer token when set (gated or private repositories).
	Token string
}

// Snapshot is a fetched (or cached) set of tokenizer files at one commit.
type Snapshot struct {
	Dir    string `json:"dir"`
	Repo   string `json:"repo"`
	Commit string `json:"commit"`
	// Files maps each file the snapshot holds to its sha256 (hex).
	Files map[string]string `json:"files"`
}

// manifest is the file a cached snapshot carries beside its files.
const manifest = ".kvexact-snapshot.json"

var (
	repoRe   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$`)
	commitRe = regexp.MustCompile(`^[0-9a-f]{40}$`)
	revRe    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)
)

// Validate checks the source's fields before any of them reaches a URL or a path.
func (s Source) Validate() error {
	u, err := url.Parse(s.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("hub endpoint %q: want an http(s) URL", s.Endpoint)
	}
	if !repoRe.MatchString(s.Repo) || strings.Contains(s.Repo, "..") {
		return fmt.Errorf("hub repo %q: want owner/name of letters, digits, '.', '_' or '-'", s.Repo)
	}
	if s.Revision != "" && (!revRe.MatchString(s.Revision) || strings.Contains(s.Revision, "..")) {
		return fmt.Errorf("hub revision %q: want a branch, tag or commit name", s.Revision)
	}
	return nil
}

// Client fetches snapshots.
type Client struct {
	// HTTP is the client used (nil: http.DefaultClient). Its timeout bounds each call.
	HTTP *http.Client
	// CacheDir holds the snapshots.
	CacheDir string
}

// Fetch returns the snapshot of s's revision: resolved to its commit by the hub, then served from
// the cache when that commit is there, else downloaded. A source whose revision is already a
// commit and is cached needs no hub at all.
func (c *Client) Fetch(ctx context.Context, s Source) (*Snapshot, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if c.CacheDir == "" {
		return nil, errors.New("hub: no cache folder configured")
	}
	rev := s.Revision
	if rev == "" {
		rev = "main"
	}
	if commitRe.MatchString(rev) {
		if snap, err := c.cached(s.Repo, rev); err == nil {
			return snap, nil
		}
	}
	commit, listed, err := c.resolve(ctx, s, rev)
	if err != nil {
		return nil, err
	}
	if snap, err := c.cached(s.Repo, commit); err == nil {
		return snap, nil
	}
	return c.download(ctx, s, commit, listed)
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

func (c *Client) get(ctx context.Context, s Source, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if s.Token != "" {
		req.Header.Set("Authorization", "Bearer "+s.Token)
	}
	req.Header.Set("User-Agent", "kvexact-gateway")
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("hub: GET %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		hint := ""
		switch resp.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			hint = " (a gated or private repository needs tokenizers.hub.tokenFile)"
		case http.StatusNotFound:
			hint = " (check the repository id and revision)"
		}
		return nil, fmt.Errorf("hub: GET %s: %s%s: %s", u, resp.Status, hint, strings.TrimSpace(string(b)))
	}
	return resp, nil
}

// resolve asks the hub which commit rev names and which files the repository has there.
func (c *Client) resolve(ctx context.Context, s Source, rev string) (string, map[string]bool, error) {
	u := strings.TrimRight(s.Endpoint, "/") + "/api/models/" + s.Repo + "/revision/" + url.PathEscape(rev)
	resp, err := c.get(ctx, s, u)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxInfoBytes+1))
	if err != nil {
		return "", nil, fmt.Errorf("hub: %s: %w", u, err)
	}
	if len(b) > maxInfoBytes {
		return "", nil, fmt.Errorf("hub: %s: revision listing larger than %d bytes", u, maxInfoBytes)
	}
	commit, listed, err := parseListing(b)
	if err != nil {
		return "", nil, fmt.Errorf("hub: %s: %w", u, err)
	}
	for _, f := range Files[:required] {
		if !listed[f] {
			return "", nil, fmt.Errorf("hub: %s at %s has no %s", s.Repo, commit, f)
		}
	}
	return commit, listed, nil
}

// parseListing reads a revision listing: the commit it resolved to and the files it lists.
func parseListing(b []byte) (string, map[string]bool, error) {
	var info struct {
		SHA      string `json:"sha"`
		Siblings []struct {
			RFilename string `json:"rfilename"`
		} `json:"siblings"`
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return "", nil, fmt.Errorf("revision listing: %w", err)
	}
	if !commitRe.MatchString(info.SHA) {
		return "", nil, fmt.Errorf("revision listing: field sha %q is not a 40-hex commit", info.SHA)
	}
	listed := map[string]bool{}
	for _, f := range info.Siblings {
		listed[f.RFilename] = true
	}
	return info.SHA, listed, nil
}

func (c *Client) snapshotDir(repo, commit string) string {
	return filepath.Join(c.CacheDir, strings.ReplaceAll(repo, "/", "--"), commit)
}

// cached returns the cached snapshot of repo at commit after checking every file's digest.
func (c *Client) cached(repo, commit string) (*Snapshot, error) {
	dir := c.snapshotDir(repo, commit)
	b, err := os.ReadFile(filepath.Join(dir, manifest))
	if err != nil {
		return nil, err
	}
	var snap Snapshot
	if err := json.Unmarshal(b, &snap); err != nil {
		return nil, fmt.Errorf("hub cache %s: %w", dir, err)
	}
	for name, want := range snap.Files {
		got, err := fileSHA256(filepath.Join(dir, name))
		if err != nil || got != want {
			return nil, fmt.Errorf("hub cache %s: %s does not match its recorded digest", dir, name)
		}
	}
	snap.Dir = dir
	return &snap, nil
}

func (c *Client) download(ctx context.Context, s Source, commit string, listed map[string]bool) (*Snapshot, error) {
	if err := os.MkdirAll(filepath.Dir(c.snapshotDir(s.Repo, commit)), 0o755); err != nil {
		return nil, fmt.Errorf("hub cache: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(c.snapshotDir(s.Repo, commit)), ".fetch-")
	if err != nil {
		return nil, fmt.Errorf("hub cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	snap := &Snapshot{Repo: s.Repo, Commit: commit, Files: map[string]string{}}
	for _, name := range Files {
		if !listed[name] {
			continue
		}
		sum, err := c.downloadFile(ctx, s, commit, name, filepath.Join(tmp, name))
		if err != nil {
			return nil, err
		}
		snap.Files[name] = sum
	}
	b, _ := json.MarshalIndent(snap, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, manifest), b, 0o644); err != nil {
		return nil, fmt.Errorf("hub cache: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("hub cache: %w", err)
	}
	dir := c.snapshotDir(s.Repo, commit)
	if err := os.Rename(tmp, dir); err != nil {
		// Another fetch of the same commit won the rename: use its snapshot.
		if snap, cerr := c.cached(s.Repo, commit); cerr == nil {
			return snap, nil
		}
		return nil, fmt.Errorf("hub cache: %w", err)
	}
	snap.Dir = dir
	return snap, nil
}

func (c *Client) downloadFile(ctx context.Context, s Source, commit, name, dst string) (string, error) {
	u := strings.TrimRight(s.Endpoint, "/") + "/" + s.Repo + "/resolve/" + commit + "/" + name
	resp, err := c.get(ctx, s, u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if got := resp.Header.Get("X-Repo-Commit"); got != "" && got != commit {
		return "", fmt.Errorf("hub: %s: X-Repo-Commit %q, asked for %s", u, got, commit)
	}
	f, err := os.Create(dst)
	if err != nil {
		return "", fmt.Errorf("hub cache: %w", err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, MaxFileBytes+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("hub: %s: %w", u, err)
	}
	if n > MaxFileBytes {
		return "", fmt.Errorf("hub: %s: larger than %d bytes (hub.MaxFileBytes)", u, MaxFileBytes)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	// An LFS file's linked ETag is its sha256: a truncated or altered body fails here.
	if le := normalizeETag(resp.Header.Get("X-Linked-Etag")); len(le) == 64 && le != sum {
		return "", fmt.Errorf("hub: %s: sha256 %s, the hub's X-Linked-Etag says %s", u, sum, le)
	}
	return sum, nil
}

// normalizeETag strips a weak marker and the quotes (huggingface_hub's _normalize_etag).
func normalizeETag(e string) string { return strings.Trim(strings.TrimPrefix(e, "W/"), `"`) }

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// SortedFiles lists the snapshot's files as "name sha256" in name order (for logs and status).
func (s *Snapshot) SortedFiles() []string {
	var out []string
	for n, d := range s.Files {
		out = append(out, n+" "+d)
	}
	sort.Strings(out)
	return out
}
