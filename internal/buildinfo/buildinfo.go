// Package buildinfo is what a kvexact binary knows of its own build: the version and revision it
// was built from and the Go toolchain, for every command's --version and the kvexact_build_info
// metric.
//
// The version comes from the module's build information (a tagged `go install …@vX.Y.Z` gives the
// tag) unless the build sets it:
//
//	go build -ldflags "-X github.com/kvexact/kvexact/internal/buildinfo.Version=v1.2.3 \
//	  -X github.com/kvexact/kvexact/internal/buildinfo.Revision=$(git rev-parse HEAD)" ./cmd/...
//
// The revision likewise comes from the VCS stamp Go embeds (vcs.revision, absent under
// -buildvcs=false) unless set.
package buildinfo

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Version and Revision are set with -ldflags -X; empty, they are read from the build information.
var (
	Version  string
	Revision string
)

// Info is one binary's build.
type Info struct {
	Version   string `json:"version"`
	Revision  string `json:"revision"`
	GoVersion string `json:"goversion"`
	// Modified is set when the VCS stamp says the work tree had uncommitted changes.
	Modified bool `json:"modified,omitempty"`
}

// Read returns the running binary's build: the -ldflags values where set, else the build
// information's; "unknown" where neither says.
func Read() Info {
	in := Info{Version: Version, Revision: Revision, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if in.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			in.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if in.Revision == "" {
					in.Revision = s.Value
				}
			case "vcs.modified":
				in.Modified = s.Value == "true"
			}
		}
	}
	if in.Version == "" {
		in.Version = "devel"
	}
	if in.Revision == "" {
		in.Revision = "unknown"
	}
	return in
}

// String is the --version line of command name.
func (in Info) String(name string) string {
	s := fmt.Sprintf("%s %s (revision %s", name, in.Version, in.Revision)
	if in.Modified {
		s += ", modified"
	}
	return s + ", " + in.GoVersion + ")"
}

// Flag answers --version (or -version) when it is a command's only argument, the one convention
// every binary under cmd/ follows whatever its flag parsing: it writes the line to w and reports
// true, and the command exits 0.
func Flag(name string, args []string, w io.Writer) bool {
	if len(args) != 1 || (args[0] != "--version" && args[0] != "-version") {
		return false
	}
	fmt.Fprintln(w, Read().String(name))
	return true
}

// Collector is kvexact_build_info{version,revision,goversion} = 1.
func Collector() prometheus.Collector {
	in := Read()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvexact_build_info", Help: "1, labelled with the running binary's version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{"version": in.Version, "revision": in.Revision, "goversion": in.GoVersion}})
	g.Set(1)
	return g
}
