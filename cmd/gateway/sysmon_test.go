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

func TestWithoutAwake(t *testing.T) {
	for _, c := range []struct {
		in, want string
		dropped  bool
	}{
		{schedtraceAwake, "", true},
		{"madvdontneed=1,gctrace=1," + schedtraceAwake, "madvdontneed=1,gctrace=1", true},
		{"gctrace=1,schedtrace=1000", "gctrace=1,schedtrace=1000", false},
		{"", "", false},
	} {
		if got, dropped := withoutAwake(c.in); got != c.want || dropped != c.dropped {
			t.Errorf("withoutAwake(%q) = %q, %v; want %q, %v", c.in, got, dropped, c.want, c.dropped)
		}
	}
}

// TestKeepMonitorAwakeReexecutes runs this test binary as a child that calls keepMonitorAwake: the
// child replaces itself with schedtrace in GODEBUG (its other settings kept), and the second
// incarnation, seeing it, goes on with schedtrace out of its environment again, so a process it
// starts does not inherit it. An operator's own schedtrace means no exec, and stays.
func TestKeepMonitorAwakeReexecutes(t *testing.T) {
	godebug := func() string {
		if v, ok := os.LookupEnv("GODEBUG"); ok {
			return v
		}
		return "(unset)"
	}
	switch os.Getenv("KVEXACT_SYSMON_CHILD") {
	case "1":
		os.Stdout.WriteString("start GODEBUG=" + godebug() + "\n")
		if err := keepMonitorAwake(); err != nil {
			t.Fatal(err)
		}
		started := exec.Command(os.Args[0], "-test.run=^TestKeepMonitorAwakeReexecutes$")
		started.Env = append(os.Environ(), "KVEXACT_SYSMON_CHILD=2")
		started.Stdout = os.Stdout
		if err := started.Run(); err != nil {
			t.Fatal(err)
		}
		return
	case "2":
		os.Stdout.WriteString("started process GODEBUG=" + godebug() + "\n")
		return
	}
	for _, c := range []struct {
		godebug string // "" for none
		want    []string
	}{
		{"madvdontneed=1", []string{"start GODEBUG=madvdontneed=1", "start GODEBUG=madvdontneed=1," + schedtraceAwake, "started process GODEBUG=madvdontneed=1"}},
		{"", []string{"start GODEBUG=(unset)", "start GODEBUG=" + schedtraceAwake, "started process GODEBUG=(unset)"}},
		{"schedtrace=3600000", []string{"start GODEBUG=schedtrace=3600000", "started process GODEBUG=schedtrace=3600000"}},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKeepMonitorAwakeReexecutes$")
		cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") }), "KVEXACT_SYSMON_CHILD=1")
		if c.godebug != "" {
			cmd.Env = append(cmd.Env, "GODEBUG="+c.godebug)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child with GODEBUG=%s: %v\n%s", c.godebug, err, out)
		}
		var got []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "GODEBUG=") {
				got = append(got, l)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("child with GODEBUG=%q printed\n%s\nwant the lines %q", c.godebug, out, c.want)
		}
	}
}
