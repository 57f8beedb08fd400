package openaisdk

import (
	"path/filepath"
	"strings"
	"testing"
)

// outcome records how a helper ended a test: the failure or skip message. Fatal and Skip stop the
// helper as the real ones do (runtime.Goexit there, a panic recovered by run here).
type outcome struct {
	testing.TB
	fatal, skip string
}

type stop struct{}

func (o *outcome) Helper()                   {}
func (o *outcome) Fatal(a ...any)            { o.fatal = strings.TrimSpace(fmtln(a)); panic(stop{}) }
func (o *outcome) Skip(a ...any)             { o.skip = strings.TrimSpace(fmtln(a)); panic(stop{}) }
func (o *outcome) Fatalf(f string, a ...any) { o.Fatal(f) }
func (o *outcome) Skipf(f string, a ...any)  { o.Skip(f) }

func fmtln(a []any) string {
	var b strings.Builder
	for _, x := range a {
		if s, ok := x.(string); ok {
			b.WriteString(s)
		}
	}
	return b.String()
}

func run(t *testing.T, f func(tb testing.TB)) *outcome {
	o := &outcome{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(stop); !ok {
					panic(r)
				}
			}
		}()
		f(o)
	}()
	return o
}

// TestMissingSDKFailsUnderCI: a missing Node.js or Python SDK skips a test naming what installs
// it, and fails it under CI=true, where .ci/run installs both.
func TestMissingSDKFailsUnderCI(t *testing.T) {
	noPy := filepath.Join(t.TempDir(), "python")
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		t.Setenv("PATH", t.TempDir()) // no node, no npm
		for name, f := range map[string]func(testing.TB){
			"node":   func(tb testing.TB) { Node(tb) },
			"python": func(tb testing.TB) { python(tb, noPy) },
		} {
			o := run(t, f)
			got, other := o.skip, o.fatal
			if ci != "" {
				got, other = o.fatal, o.skip
			}
			if got == "" || other != "" || !strings.Contains(got, ".ci/run") {
				t.Errorf("CI=%q, %s missing: fatal %q, skip %q; want only the %s naming the install", ci, name, o.fatal, o.skip, map[bool]string{true: "failure", false: "skip"}[ci != ""])
			}
		}
	}
}
