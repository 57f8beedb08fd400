// Package openaisdk finds the official OpenAI SDKs the end-to-end and wire tests drive the gateway
// with: the npm package (installed once, pinned, into .cache/npm/openai-sdk) and the Python one
// (the pinned tools environment, .cache/py/tools, made by scripts/pyenv.sh). A test that cannot
// get one skips naming what is missing and the command that installs it; under CI=true (.ci/run
// sets it and installs both) it fails instead: a missing SDK there is a broken setup, not a skip.
package openaisdk

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// NodePackages are the pinned npm SDK and HTTP client (undici 7: Node ≥ 20.18; openai 6 has no
// engine floor).
const NodePackages = "openai@6.30.1 undici@7.30.2"

// Node returns the folder whose node_modules holds NodePackages (for NODE_PATH), installing them
// from the npm registry the first time, or skips t.
func Node(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		missing(t, "node not found: install Node.js ≥ 20.18 and npm (Debian: apt-get install nodejs npm; .ci/run does) for the OpenAI SDK test")
		return ""
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		missing(t, "npm not found: install npm (Debian: apt-get install npm; .ci/run does) for the OpenAI SDK test")
		return ""
	}
	dir := filepath.Join(repoRoot(t), ".cache", "npm", "openai-sdk")
	stamp := filepath.Join(dir, ".installed")
	if b, err := os.ReadFile(stamp); err == nil && string(b) == NodePackages {
		return dir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(npm, append([]string{"install", "--no-audit", "--no-fund", "--no-save", "--prefix", dir}, strings.Fields(NodePackages)...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		missing(t, fmt.Sprintf("npm install %s failed (the npm registry must be reachable): %v\n%s", NodePackages, err, out))
		return ""
	}
	if err := os.WriteFile(stamp, []byte(NodePackages), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Python returns the interpreter of the tools environment, which has the pinned `openai` package
// (scripts/python/tools.txt), or skips t (fails it under CI).
func Python(t testing.TB) string {
	t.Helper()
	return python(t, filepath.Join(repoRoot(t), ".cache", "py", "tools", "bin", "python"))
}

func python(t testing.TB, py string) string {
	t.Helper()
	if err := exec.Command(py, "-c", "import openai").Run(); err != nil {
		missing(t, fmt.Sprintf("the OpenAI Python SDK is not installed in %s (%v): run scripts/pyenv.sh tools (.ci/run does)", py, err))
		return ""
	}
	return py
}

// missing ends t for a missing SDK: a skip naming what to install, or under CI=true a failure.
func missing(t testing.TB, hint string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(hint)
		return
	}
	t.Skip(hint)
}

// repoRoot is the folder holding go.mod, found upwards from the test's working directory.
func repoRoot(t testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("no go.mod above %s", dir)
		}
	}
}
