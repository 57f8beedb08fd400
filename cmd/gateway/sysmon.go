package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// Go's runtime has a system monitor thread (sysmon) that parks itself once every P is idle and is
// woken again, with a futex, the next time one gets work. A gateway at a moderate rate (1,000 small
// requests/s) goes idle between most requests, so nearly every request pays that park and wake on
// top of its own: on the proxy benchmark the gateway spent 1.16–1.27 times Envoy's CPU per request
// at that rate, and 0.93 once the monitor stayed awake (docs/benchmarks/envoy-overhead.md). The
// runtime keeps the monitor awake, polling at its longest interval (10 ms), whenever
// GODEBUG=schedtrace is set; the setting is read only at process start, so the gateway re-executes
// itself once with it. The interval asked for, 2³¹−1 ms (24.8 days), means the trace itself never
// prints, except one line at start on a host up longer than that (the runtime counts from boot).
const schedtraceAwake = "schedtrace=2147483647"

// keepMonitorAwake re-executes the gateway with GODEBUG's schedtrace set, unless it is already set
// (by the previous exec or by the operator). It returns only if no exec was needed (nil) or the exec
// failed (the reason). main sets it as run's reexec hook; tests calling run leave it nil, so their
// process is never replaced.
func keepMonitorAwake() error {
	env, ok := awakeEnv(os.Environ())
	if !ok {
		dropAwake()
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("the gateway's own path: %w", err)
	}
	return syscall.Exec(exe, os.Args, env)
}

// awakeEnv is environ with schedtrace added to GODEBUG (its other settings kept), and whether that
// changed anything.
func awakeEnv(environ []string) ([]string, bool) {
	var godebug []string
	env := make([]string, 0, len(environ)+1)
	for _, kv := range environ {
		v, found := strings.CutPrefix(kv, "GODEBUG=")
		if !found {
			env = append(env, kv)
			continue
		}
		for _, setting := range strings.Split(v, ",") {
			if strings.HasPrefix(setting, "schedtrace=") {
				return environ, false
			}
			if setting != "" {
				godebug = append(godebug, setting)
			}
		}
	}
	return append(env, "GODEBUG="+strings.Join(append(godebug, schedtraceAwake), ",")), true
}

// dropAwake takes the gateway's schedtrace setting out of its GODEBUG again once the runtime has
// read it: the runtime reads schedtrace only at start (a later change of GODEBUG re-reads only the
// settings that may change while running), so the monitor stays awake, and a process the gateway
// starts (client-go runs a kubeconfig's exec credential plugin with the gateway's environment) does
// not inherit a setting meant for the gateway. The other settings stay, and so does an operator's
// own schedtrace of another value (one of exactly schedtraceAwake reads as the gateway's).
func dropAwake() {
	v, ok := os.LookupEnv("GODEBUG")
	if !ok {
		return
	}
	rest, dropped := withoutAwake(v)
	switch {
	case !dropped:
	case rest == "":
		os.Unsetenv("GODEBUG")
	default:
		os.Setenv("GODEBUG", rest)
	}
}

// withoutAwake is a GODEBUG value without the setting awakeEnv adds, and whether it had it.
func withoutAwake(godebug string) (string, bool) {
	var kept []string
	dropped := false
	for _, setting := range strings.Split(godebug, ",") {
		if setting == schedtraceAwake {
			dropped = true
			continue
		}
		kept = append(kept, setting)
	}
	return strings.Join(kept, ","), dropped
}
