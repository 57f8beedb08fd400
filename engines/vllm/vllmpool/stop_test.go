package vllmpool

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestStopGroup: a process group started elsewhere (a shell and its child, as an engine's server,
// engine core and worker) ends by its id; a group that ignores SIGTERM is killed after the grace;
// an ended group is no error.
func TestStopGroup(t *testing.T) {
	for _, c := range []struct {
		name, script string
	}{
		{"terminates", "sleep 60 & wait"},
		{"ignores SIGTERM", "trap '' TERM; sleep 60 & wait; sleep 60"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command("sh", "-c", c.script)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			time.Sleep(100 * time.Millisecond)
			pgid := cmd.Process.Pid
			if err := StopGroup(pgid, time.Second); err != nil {
				t.Fatal(err)
			}
			select {
			case <-done:
			case <-time.After(2 * time.Second):
				syscall.Kill(-pgid, syscall.SIGKILL)
				t.Fatalf("process group %d still alive after StopGroup", pgid)
			}
			if err := StopGroup(pgid, time.Second); err != nil {
				t.Fatalf("stopping an ended group: %v", err)
			}
		})
	}
}
