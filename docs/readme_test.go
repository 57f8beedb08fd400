package docs

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

// byHand is the README's "Run it by hand" section: its shell lines and its two files, in order.
type byHand struct {
	commands []string          // shell lines running bin/ commands (continuations joined)
	files    map[string]string // file name (the block's first comment line) → content
}

func readByHand(t *testing.T) byHand {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n## Run it by hand\n")
	if i < 0 {
		t.Fatal(`README.md has no "## Run it by hand" section`)
	}
	s = s[i+1:]
	if j := strings.Index(s[3:], "\n## "); j >= 0 {
		s = s[:j+3]
	}
	out := byHand{files: map[string]string{}}
	for _, m := range regexp.MustCompile("(?ms)^```(\\w+)\n(.*?)^```").FindAllStringSubmatch(s, -1) {
		lang, body := m[1], m[2]
		switch lang {
		case "yaml":
			first, _, _ := strings.Cut(body, "\n")
			name, ok := strings.CutPrefix(first, "# ")
			if !ok {
				t.Fatalf("a yaml block of the section does not start with its file name (# name.yaml): %q", first)
			}
			out.files[name] = body
		case "sh":
			for _, line := range strings.Split(strings.ReplaceAll(body, "\\\n", " "), "\n") {
				if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "make ") {
					out.commands = append(out.commands, line)
				}
			}
		}
	}
	if len(out.files) != 2 || len(out.commands) < 4 {
		t.Fatalf("the section has %d files and %d commands; want pool.yaml, gateway.yaml, the engines, ctk, gateway", len(out.files), len(out.commands))
	}
	return out
}

// words splits a shell line into its words (single and double quotes, no expansions) and strips a
// trailing comment; env are leading NAME=value words.
func words(line string) (env, args []string, background bool) {
	var cur strings.Builder
	in, have := rune(0), false
	flush := func() {
		if have {
			args = append(args, cur.String())
		}
		cur.Reset()
		have = false
	}
	for _, r := range line {
		switch {
		case in != 0 && r == in:
			in = 0
		case in != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			in, have = r, true
		case r == ' ' || r == '\t':
			flush()
		case r == '#' && !have:
			flush()
			goto done
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	flush()
done:
	if n := len(args); n > 0 && args[n-1] == "&" {
		args, background = args[:n-1], true
	}
	for len(args) > 0 && regexp.MustCompile(`^[A-Z_]+=`).MatchString(args[0]) {
		env, args = append(env, args[0]), args[1:]
	}
	return env, args, background
}

// TestReadmeByHand runs the README's "Run it by hand" section as written: the bin/ commands its
// shell blocks list (the engines in the background, ctk certify to completion, then the gateway) in
// a fresh folder with its two files, the binaries built from this checkout into bin/ there. Only the
// ports change, to free ones (the machine is shared). Then it does what the section says to try: the
// same prompt twice, the second decided by KV-exact, and the status with the admin token.
func TestReadmeByHand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three commands and runs them: not in -short")
	}
	if _, err := tokenize.NewPool("").Get("llama3"); err != nil {
		t.Skipf("the llama3 tokenizer is missing (%v): make tokenizers", err)
	}
	hand := readByHand(t)
	dir := t.TempDir()
	root, _ := filepath.Abs("..")
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "bin")+"/", "./cmd/gateway", "./cmd/ctk", "./cmd/enginesim")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// Every port the section names moves to a free one, the same everywhere.
	ports := map[string]string{}
	portRe := regexp.MustCompile(`(127\.0\.0\.1|\*):(\d{4,5})\b`)
	remap := func(s string) string {
		return portRe.ReplaceAllStringFunc(s, func(m string) string {
			host, port, _ := strings.Cut(m, ":")
			if _, ok := ports[port]; !ok {
				ports[port] = freePort(t)
			}
			return host + ":" + ports[port]
		})
	}
	for name, body := range hand.files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(remap(body)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Inside the checkout the commands find the staged tokenizers; the folder here is outside it.
	env := append(os.Environ(), "KVEXACT_TOKENIZERS="+strings.Join(tokenize.DefaultRoots(), string(os.PathListSeparator)))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var gatewayAddr, adminAddr, token, body string
	for _, line := range hand.commands {
		ev, args, bg := words(remap(line))
		if len(args) == 0 {
			continue
		}
		if args[0] == "curl" {
			// Done below, in Go, with the answers checked: the completion's body is the README's.
			for i, a := range args {
				if a == "-d" && i+1 < len(args) && strings.Contains(line, "/v1/completions") {
					body = args[i+1]
				}
			}
			continue
		}
		if !strings.HasPrefix(args[0], "bin/") {
			t.Fatalf("README command %q runs %s, not a command of bin/", line, args[0])
		}
		cmd := exec.CommandContext(ctx, filepath.Join(dir, args[0]), args[1:]...)
		cmd.Dir, cmd.Env = dir, append(append([]string{}, env...), ev...)
		if !bg {
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", line, err, out)
			}
			continue
		}
		ready := map[string]string{"bin/enginesim": "enginesim listening", "bin/gateway": "gateway ready"}[args[0]]
		if ready == "" {
			t.Fatalf("README runs %s in the background; the test knows no ready line for it", args[0])
		}
		line := startAndWait(t, cmd, ready)
		if args[0] == "bin/gateway" {
			for _, f := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(f, "admin="); ok {
					adminAddr = v
				}
				if v, ok := strings.CutPrefix(f, "listeners="); ok {
					gatewayAddr, _, _ = strings.Cut(v, ",")
				}
			}
		}
	}
	if gatewayAddr == "" {
		t.Fatal("the section never starts the gateway")
	}
	if m := regexp.MustCompile(`token: (\S+)\}`).FindStringSubmatch(hand.files["gateway.yaml"]); m != nil {
		token = m[1]
	}
	if body == "" {
		t.Fatal("the section sends no completion (curl … /v1/completions -d BODY)")
	}
	var decision string
	for i := 0; i < 2; i++ {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+gatewayAddr+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("completion %d: %s", i+1, resp.Status)
		}
		decision = resp.Header.Get("X-Kvexact-Decision")
		time.Sleep(300 * time.Millisecond) // the engine's events for the first prompt reach the gateway
	}
	if !strings.Contains(decision, `"tier":"kv-exact"`) {
		t.Fatalf("the second identical prompt was not decided by KV-exact, as the README says: %s", decision)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+adminAddr+"/admin/status", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var st struct {
		Rules []struct {
			Exact struct {
				Enabled bool `json:"enabled"`
			} `json:"exact"`
		} `json:"rules"`
	}
	if err := json.Unmarshal(b, &st); resp.StatusCode != 200 || err != nil || len(st.Rules) != 1 || !st.Rules[0].Exact.Enabled {
		t.Fatalf("/admin/status with the README's token: %s (%v) %s", resp.Status, err, b)
	}
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, p, _ := net.SplitHostPort(l.Addr().String())
	return p
}

// startAndWait starts cmd and returns its first stdout line containing ready; the process is
// stopped when the test ends.
func startAndWait(t *testing.T, cmd *exec.Cmd, ready string) string {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuf
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), ready) {
				lines <- sc.Text()
				io.Copy(io.Discard, out)
				return
			}
		}
		close(lines)
	}()
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatalf("%s exited before %q:\n%s", cmd.Path, ready, stderr.String())
		}
		return l
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: no %q within 60s:\n%s", cmd.Path, ready, stderr.String())
	}
	return ""
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
