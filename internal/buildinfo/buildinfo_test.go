package buildinfo_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvexact/kvexact/internal/buildinfo"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestEveryCommandAnswersVersion: every binary under cmd/ answers --version through Flag (read
// from its source, so a new command without it fails here), and a build stamped with -ldflags -X
// prints the stamped version and revision.
func TestEveryCommandAnswersVersion(t *testing.T) {
	root := repoRoot(t)
	mains, err := filepath.Glob(filepath.Join(root, "cmd", "*", "main.go"))
	if err != nil || len(mains) == 0 {
		t.Fatalf("no cmd/*/main.go under %s (%v)", root, err)
	}
	for _, m := range mains {
		src, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(filepath.Dir(m))
		if !bytes.Contains(src, []byte(`buildinfo.Flag("`+name+`", `)) {
			t.Errorf("%s does not answer --version with buildinfo.Flag(%q, …)", m, name)
		}
	}
	if testing.Short() {
		t.Skip("-short: the stamped build is not run")
	}
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out := t.TempDir()
	const pkg = "github.com/kvexact/kvexact/internal/buildinfo"
	build := exec.Command(goBin, "build", "-o", out+"/", "-ldflags", "-X "+pkg+".Version=v9.8.7-stamp -X "+pkg+".Revision=abc123", "./cmd/ctk", "./cmd/vecgen")
	build.Dir = root
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	for _, name := range []string{"ctk", "vecgen"} {
		for _, arg := range []string{"--version", "-version"} {
			b, err := exec.Command(filepath.Join(out, name), arg).Output()
			if err != nil {
				t.Fatalf("%s %s: %v", name, arg, err)
			}
			want := name + " v9.8.7-stamp (revision abc123, " + runtime.Version() + ")\n"
			if string(b) != want {
				t.Fatalf("%s %s: %q, want %q", name, arg, b, want)
			}
		}
	}
}

func TestFlagOnlyAlone(t *testing.T) {
	var w strings.Builder
	for _, args := range [][]string{nil, {"--config", "x"}, {"--version", "x"}, {"version"}, {"--versions"}} {
		if buildinfo.Flag("x", args, &w) || w.Len() != 0 {
			t.Fatalf("%q answered as --version: %q", args, w.String())
		}
	}
	if !buildinfo.Flag("gateway", []string{"--version"}, &w) || !strings.HasPrefix(w.String(), "gateway ") {
		t.Fatalf("--version: %q", w.String())
	}
}

// TestBuildInfoMetric: kvexact_build_info is 1 with the stamped version, the revision and the Go
// version as labels.
func TestBuildInfoMetric(t *testing.T) {
	old := buildinfo.Version
	buildinfo.Version = "v1.2.3"
	defer func() { buildinfo.Version = old }()
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildinfo.Collector())
	in := buildinfo.Read()
	want := `# HELP kvexact_build_info 1, labelled with the running binary's version, VCS revision and Go version.
# TYPE kvexact_build_info gauge
kvexact_build_info{goversion="` + runtime.Version() + `",revision="` + in.Revision + `",version="v1.2.3"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvexact_build_info"); err != nil {
		t.Fatal(err)
	}
}
