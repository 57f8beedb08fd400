package registry

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/kvexact/kvexact"

// Import hygiene the layout depends on, checked on the build's own dependency graph (go list
// -deps, non-test imports, transitively):
//   - contracts and gateway/hashcore import nothing of the project: both are data and algorithms
//     every side reads, so they must stay at the bottom of the graph;
//   - engines, engines/registry and every family package import, of the project, only engines/...,
//     contracts and gateway/hashcore: gateway code imports engines/registry, which imports every
//     family, so a family importing any other gateway package is an import cycle waiting to happen;
//   - no gateway package depends on engines/sim, the simulator, which itself tokenizes with
//     gateway/tokenize (a test engine is no part of the gateway).
func TestImportHygiene(t *testing.T) {
	leaves := []string{module + "/contracts", module + "/gateway/hashcore"}
	for _, p := range leaves {
		for _, d := range projectDeps(t, p) {
			if d != p {
				t.Errorf("%s imports %s; it must import nothing of the project", p, d)
			}
		}
	}
	engineSide := []string{module + "/engines", module + "/engines/registry"}
	for _, f := range All() {
		engineSide = append(engineSide, module+"/engines/"+f.Name())
	}
	for _, p := range engineSide {
		for _, d := range projectDeps(t, p) {
			if !allowedForEngines(d, leaves) {
				t.Errorf("%s imports %s; engine packages may import only engines/..., contracts and gateway/hashcore", p, d)
			}
		}
	}
	for _, d := range projectDeps(t, module+"/gateway/...") {
		if d == module+"/engines/sim" {
			t.Errorf("a gateway package depends on engines/sim (go list -deps ./gateway/...): the simulator is a test engine")
		}
	}
}

func TestImportHygieneRule(t *testing.T) {
	leaves := []string{module + "/contracts", module + "/gateway/hashcore"}
	for d, want := range map[string]bool{
		module + "/engines/internal/mpack": true,
		module + "/contracts":              true,
		module + "/gateway/hashcore":       true,
		module + "/gateway/hashcorex":      false,
		module + "/gateway/tokenize":       false,
		module + "/gateway/ingest":         false,
		module + "/enginesx":               false,
	} {
		if got := allowedForEngines(d, leaves); got != want {
			t.Errorf("allowedForEngines(%s) = %v, want %v", d, got, want)
		}
	}
}

func allowedForEngines(dep string, leaves []string) bool {
	if dep == module+"/engines" || strings.HasPrefix(dep, module+"/engines/") {
		return true
	}
	for _, l := range leaves {
		if dep == l {
			return true
		}
	}
	return false
}

// projectDeps lists pkg (a pattern) and the project packages it depends on (non-test imports,
// transitively).
func projectDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg).Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v %s", pkg, err, msg)
	}
	var deps []string
	for _, l := range strings.Fields(string(out)) {
		if l == module || strings.HasPrefix(l, module+"/") {
			deps = append(deps, l)
		}
	}
	if len(deps) == 0 {
		t.Fatalf("go list -deps %s listed no project package (not even itself)", pkg)
	}
	return deps
}
