package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestAwakeEnv(t *testing.T) {
	for _, c := range []struct {
		name string
		in   []string
		want []string
		exec bool
	}{
		{"no GODEBUG", []string{"A=1"}, []string{"A=1", "GODEBUG=" + schedtraceAwake}, true},
		{"empty GODEBUG", []string{"GODEBUG=", "A=1"}, []string{"A=1", "GODEBUG=" + schedtraceAwake}, true},
		{"other settings kept", []string{"GODEBUG=madvdontneed=1,gctrace=1"}, []string{"GODEBUG=madvdontneed=1,gctrace=1," + schedtraceAwake}, true},
		{"the operator's schedtrace wins", []string{"GODEBUG=gctrace=1,schedtrace=1000"}, []string{"GODEBUG=gctrace=1,schedtrace=1000"}, false},
		{"already re-executed", []string{"GODEBUG=" + schedtraceAwake}, []string{"GODEBUG=" + schedtraceAwake}, false},
	} {
		got, exec := awakeEnv(c.in)
		if exec != c.exec || !slices.Equal(got, c.want) {
			t.Errorf("%s: awakeEnv(%q) = %q, %v; want %q, %v", c.name, c.in, got, exec, c.want, c.exec)
		}
	}
}

// TestKeepMonitorAwakeReexecutes runs this test binary as a child that calls keepMonitorAwake: the
// child replaces itself with schedtrace in GODEBUG (its other settings kept), and the second
// incarnation, seeing it, goes on and prints its GODEBUG.
func TestKeepMonitorAwakeReexecutes(t *testing.T) {
	if os.Getenv("KVEXACT_SYSMON_CHILD") == "1" {
		if err := keepMonitorAwake(); err != nil {
			t.Fatal(err)
		}
		os.Stdout.WriteString("GODEBUG=" + os.Getenv("GODEBUG") + "\n")
		return
	}
	for _, c := range []struct{ godebug, want string }{
		{"madvdontneed=1", "GODEBUG=madvdontneed=1," + schedtraceAwake},
		{"schedtrace=3600000", "GODEBUG=schedtrace=3600000"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKeepMonitorAwakeReexecutes$", "-test.v")
		cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") }),
			"KVEXACT_SYSMON_CHILD=1", "GODEBUG="+c.godebug)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child with GODEBUG=%s: %v\n%s", c.godebug, err, out)
		}
		if !strings.Contains(string(out), c.want+"\n") {
			t.Errorf("child with GODEBUG=%s printed %q; want the line %q", c.godebug, out, c.want)
		}
	}
}
