package kvbench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CPU accounting of the proxies from /proc: utime + stime of every process in a process group (the
// nginx master and its workers; the gateway), read before and after each wrk run.

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat (`getconf CLK_TCK`). The
// kernel converts to it whatever its internal HZ, and it is 100 on every Linux architecture this
// runs on (x86, arm64, riscv), so it is not asked for at run time (cgo's sysconf is not worth it).
const clockTicks = 100

// procStat is what the CPU accounting needs from one /proc/PID/stat line.
type procStat struct {
	PID, PPID, PGRP int
	UTime, STime    uint64 // clock ticks (fields 14 and 15)
}

// CPU is the process's user + system time.
func (s procStat) CPU() time.Duration { return ticks(s.UTime + s.STime) }

func ticks(n uint64) time.Duration { return time.Duration(n) * (time.Second / clockTicks) }

// parseProcStat parses one /proc/PID/stat line (proc(5)): "pid (comm) state ppid pgrp session ...
// utime stime ...". comm may hold spaces and parentheses, so the fields after it are counted from
// the last ')'.
func parseProcStat(b []byte) (procStat, error) {
	var s procStat
	lp, rp := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if lp < 1 || rp < lp {
		return s, fmt.Errorf("proc stat: no (comm) in %.80q", b)
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:lp])))
	if err != nil {
		return s, fmt.Errorf("proc stat: pid: %v", err)
	}
	// rest[0] is field 3 (state), so field N is rest[N-3].
	rest := strings.Fields(string(b[rp+1:]))
	if len(rest) < 15-3+1 {
		return s, fmt.Errorf("proc stat: %d fields after comm, want at least 13", len(rest))
	}
	s.PID = pid
	if s.PPID, err = strconv.Atoi(rest[4-3]); err != nil {
		return s, fmt.Errorf("proc stat: ppid: %v", err)
	}
	if s.PGRP, err = strconv.Atoi(rest[5-3]); err != nil {
		return s, fmt.Errorf("proc stat: pgrp: %v", err)
	}
	if s.UTime, err = strconv.ParseUint(rest[14-3], 10, 64); err != nil {
		return s, fmt.Errorf("proc stat: utime: %v", err)
	}
	if s.STime, err = strconv.ParseUint(rest[15-3], 10, 64); err != nil {
		return s, fmt.Errorf("proc stat: stime: %v", err)
	}
	return s, nil
}

func readProcStat(root string, pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/stat", root, pid))
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(b)
}

// groupCPU sums the CPU time of the live processes of process group pgid under root (/proc) and
// says how many there were. Processes that exit while it reads are skipped (their time is lost to
// the sum, which is why the measured proxies keep their processes for the whole run).
func groupCPU(root string, pgid int) (time.Duration, int, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return 0, 0, err
	}
	var total time.Duration
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		s, err := readProcStat(root, pid)
		if err != nil || s.PGRP != pgid {
			continue
		}
		total += s.CPU()
		n++
	}
	if n == 0 {
		return 0, 0, fmt.Errorf("no process in group %d under %s", pgid, root)
	}
	return total, n, nil
}

// loadAvg is the first three fields of /proc/loadavg ("" when unreadable).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

var errNoProc = errors.New("no /proc: CPU per request needs Linux")

// checkProc fails early where /proc/self/stat cannot be read.
func checkProc() error {
	if _, err := readProcStat("/proc", os.Getpid()); err != nil {
		return fmt.Errorf("%w (%v)", errNoProc, err)
	}
	return nil
}
