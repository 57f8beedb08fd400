package main

import (
	"strings"
	"testing"
)

// TestRun: a skip is printed with its reason, a failure with its output, a pass as its ok line, and
// the exit status follows the failures.
func TestRun(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:9: no Docker daemon: apt-get install -y docker.io\n"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"--- SKIP: TestA (0.00s)\n"}`,
		`{"Action":"skip","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Output":"ok  \tp\t0.1s\n"}`,
		`{"Action":"pass","Package":"p"}`,
	}, "\n")
	var out strings.Builder
	if code := run(strings.NewReader(in), &out); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
	want := "SKIP p TestA: a_test.go:9: no Docker daemon: apt-get install -y docker.io"
	if !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "ok  \tp\t0.1s") {
		t.Fatalf("output lacks %q or the ok line:\n%s", want, out.String())
	}
	in += "\n" + strings.Join([]string{
		`{"Action":"output","Package":"q","Test":"TestB","Output":"    b_test.go:3: boom\n"}`,
		`{"Action":"fail","Package":"q","Test":"TestB"}`,
		`{"Action":"fail","Package":"q"}`,
	}, "\n")
	out.Reset()
	if code := run(strings.NewReader(in), &out); code != 1 || !strings.Contains(out.String(), "b_test.go:3: boom") {
		t.Fatalf("a failure: exit %d:\n%s", code, out.String())
	}
	out.Reset()
	if code := run(strings.NewReader("go: cannot find main module\n"), &out); code != 1 {
		t.Fatalf("no package result: exit %d", code)
	}
}
