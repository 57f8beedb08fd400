package kvbench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A real /proc/PID/stat line (nginx worker), and one whose comm holds spaces and parentheses.
const (
	statNginx = "4242 (nginx) S 4240 4240 4240 0 -1 4194624 1057 0 0 0 1234 567 0 0 20 0 1 0 8123456 56758272 1834 18446744073709551615 1 1 0 0 0 0 0 4096 134235655 0 0 0 17 1 0 0 0 0 0\n"
	statOdd   = "77 (a b) (c)) R 1 9 9 0 -1 4194304 0 0 0 0 31 9 11 13 20 0 1 0 1 0 0 0\n"
)

func TestParseProcStat(t *testing.T) {
	for _, c := range []struct {
		line            string
		pid, ppid, pgrp int
		utime, stime    uint64
		cpu             time.Duration
	}{
		{statNginx, 4242, 4240, 4240, 1234, 567, 18010 * time.Millisecond},
		// fields 16 and 17 (cutime 11, cstime 13) must not be counted
		{statOdd, 77, 1, 9, 31, 9, 400 * time.Millisecond},
	} {
		s, err := parseProcStat([]byte(c.line))
		if err != nil {
			t.Fatalf("%q: %v", c.line, err)
		}
		if s.PID != c.pid || s.PPID != c.ppid || s.PGRP != c.pgrp || s.UTime != c.utime || s.STime != c.stime || s.CPU() != c.cpu {
			t.Errorf("%q: got %+v cpu %v, want pid %d ppid %d pgrp %d utime %d stime %d cpu %v", c.line, s, s.CPU(), c.pid, c.ppid, c.pgrp, c.utime, c.stime, c.cpu)
		}
	}
	for _, bad := range []string{"", "12 nginx S 1 1", "12 (nginx) S 1 1 1 0 -1 0 0 0 0 0 5", "x (nginx) S 1 1 1 0 -1 0 0 0 0 0 5 6 0 0", "12 (nginx) S 1 1 1 0 -1 0 0 0 0 0 5 -6 0 0"} {
		if s, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("%q: parsed as %+v, want an error", bad, s)
		}
	}
}

// TestGroupCPU sums a fake /proc: the group's processes only, skipping other groups and entries
// that are not processes.
func TestGroupCPU(t *testing.T) {
	root := t.TempDir()
	write := func(name, content string) {
		if err := os.MkdirAll(filepath.Join(root, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if content != "" {
			if err := os.WriteFile(filepath.Join(root, name, "stat"), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("4240", "4240 (nginx) S 1 4240 4240 0 -1 0 0 0 0 0 10 20 0 0 20 0 1 0 1 0 0\n")    // master
	write("4242", statNginx)                                                                 // worker: 1234+567
	write("4243", "4243 (nginx) S 4240 4240 4240 0 -1 0 0 0 0 0 100 1 0 0 20 0 1 0 1 0 0\n") // worker
	write("5000", "5000 (wrk) S 1 5000 5000 0 -1 0 0 0 0 0 999 999 0 0 20 0 1 0 1 0 0\n")    // other group
	write("self", statNginx)                                                                 // not a pid
	write("6000", "")                                                                        // exited: no stat
	cpu, n, err := groupCPU(root, 4240)
	if err != nil {
		t.Fatal(err)
	}
	if want := ticks(10 + 20 + 1234 + 567 + 100 + 1); cpu != want || n != 3 {
		t.Errorf("group 4240: %v over %d processes, want %v over 3", cpu, n, want)
	}
	if _, _, err := groupCPU(root, 1234); err == nil {
		t.Error("an empty group: no error")
	}
}

// TestProcSelfCPU checks the reader against the kernel's own accounting of this process
// (getrusage), around a busy loop: reading the wrong fields gives another number.
func TestProcSelfCPU(t *testing.T) {
	if err := checkProc(); err != nil {
		t.Skip(err)
	}
	rusage := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	self := func() time.Duration {
		s, err := readProcStat("/proc", os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		return s.CPU()
	}
	p0, r0 := self(), rusage()
	x := 0
	for rusage()-r0 < 300*time.Millisecond {
		for i := 0; i < 1e5; i++ {
			x += i ^ x
		}
	}
	p1, r1 := self(), rusage()
	_ = x
	dp, dr := p1-p0, r1-r0
	// Both count every thread of the process; /proc rounds to 10 ms ticks per thread and field.
	if diff := (dp - dr).Abs(); diff > 60*time.Millisecond {
		t.Errorf("/proc/self/stat moved %v, getrusage %v", dp, dr)
	}
	pg := syscall.Getpgrp()
	g, n, err := groupCPU("/proc", pg)
	if err != nil || n < 1 || g < p1-20*time.Millisecond {
		t.Errorf("own process group %d: %v over %d processes (%v), want at least this process's %v", pg, g, n, err, p1)
	}
}

func TestCPUPerRequest(t *testing.T) {
	if got := cpuPerRequest(1500*time.Millisecond, 30000); got != 50 {
		t.Errorf("1.5 s over 30000 requests = %v µs, want 50", got)
	}
	if got := cpuPerRequest(time.Second, 0); got != 0 {
		t.Errorf("no requests: %v, want 0", got)
	}
}

const wrkOK = `Running 3s test @ http://127.0.0.1:36343/v1/completions
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.28ms    1.66ms  13.66ms   86.13%
    Req/Sec    19.90k     2.80k   23.35k    70.00%
  119607 requests in 3.01s, 45.03MB read
Requests/sec:  39374.38
Transfer/sec:     14.95MB
`

func TestParseWrk(t *testing.T) {
	r, err := parseWrk([]byte(wrkOK))
	if err != nil {
		t.Fatal(err)
	}
	if r.RPS != 39374.38 || r.Requests != 119607 {
		t.Errorf("got %+v, want 39374.38 req/s, 119607 requests", r)
	}
	for name, out := range map[string]string{
		"non-2xx":       strings.Replace(wrkOK, "Requests/sec", "  Non-2xx or 3xx responses: 12\nRequests/sec", 1),
		"socket errors": strings.Replace(wrkOK, "Requests/sec", "  Socket errors: connect 0, read 3, write 0, timeout 0\nRequests/sec", 1),
		"no rate":       strings.Replace(wrkOK, "Requests/sec:  39374.38\n", "", 1),
		"no count":      strings.Replace(wrkOK, "  119607 requests in 3.01s, 45.03MB read\n", "", 1),
		"zero requests": strings.Replace(wrkOK, "119607 requests in", "0 requests in", 1),
		"refused":       "unable to connect to 127.0.0.1:1 Connection refused\n",
	} {
		if r, err := parseWrk([]byte(out)); err == nil {
			t.Errorf("%s: parsed as %+v, want an error", name, r)
		}
	}
}

func TestCheckProxyToolsNamesWhatIsMissing(t *testing.T) {
	err := CheckProxyTools("/nonexistent/nginx", "/nonexistent/wrk")
	if err == nil {
		t.Fatal("missing nginx and wrk: no error")
	}
	for _, want := range []string{"nginx not found", "wrk not found", "apt-get install -y nginx-light wrk"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
}

func TestGatewayConfig(t *testing.T) {
	got := gatewayConfig([]string{"127.0.0.1:1001", "127.0.0.1:1002"})
	for _, want := range []string{"listen: 127.0.0.1:0\n", "  token: bench\n", "  - name: rr\n", "models: [llama3]", "engine: {family: vllm, release: v0.25.1}", "selector: rr\n",
		`- {name: u0, address: "http://127.0.0.1:1001"}`, `- {name: u1, address: "http://127.0.0.1:1002"}`} {
		if !strings.Contains(got, want) {
			t.Errorf("config lacks %q:\n%s", want, got)
		}
	}
}

func TestReadyWriter(t *testing.T) {
	w := &readyWriter{prefix: "gateway ready ", ch: make(chan string, 1)}
	for _, p := range []string{"noise\ngate", "way ready admin=127.0.0.1:9 listen", "ers=127.0.0.1:8\nmore\n"} {
		w.Write([]byte(p))
	}
	select {
	case l := <-w.ch:
		if l != "gateway ready admin=127.0.0.1:9 listeners=127.0.0.1:8" {
			t.Errorf("ready line %q", l)
		}
	default:
		t.Error("no ready line")
	}
}

// TestProxyDocument renders the proxy section from a JSON result: per-round req/s and CPU per
// request for both proxies, the medians, the ratios, the load average and the command.
func TestProxyDocument(t *testing.T) {
	ov := &Overhead{Command: "kvbench overhead --rounds 5", WrkCommand: "wrk -t2 -c32 -d3s", LoadAvg: "0.50 0.40 0.30", LoadAvgAfter: "1.90 0.70 0.40",
		GatewayCommand: "gateway --config gateway.yaml", Gateway: "/x/gateway (go1.27.3, rev abc)", WarmupSeconds: 1, Machine: Machine{Cores: 2}}
	for i, g := range []float64{10000, 11000, 9000, 12000, 10500} {
		ov.Proxy = append(ov.Proxy, ProxyRound{Direct: 40000, Nginx: 20000, Gateway: g, NginxCPUus: 40 + float64(i), GatewayCPUus: 100 + float64(i)})
	}
	// ratios 0.50 0.55 0.45 0.60 0.525 → 0.525; CPU 100/40 101/41 102/42 103/43 104/44 → 102/42
	ov.RatioVsNginx, ov.RatioVsDirect, ov.CPURatioVsNginx = 0.525, 0.2625, 102.0/42
	b, _ := json.Marshal(ov)
	var back Overhead
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"nginxCpuUsPerRequest":40`, `"gatewayCpuUsPerRequest":104`, `"loadAvg":"0.50 0.40 0.30"`, `"cpuRatioVsNginx":`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("JSON lacks %s", key)
		}
	}
	var sb strings.Builder
	writeProxy(&sb, &back, "bench")
	doc := sb.String()
	for _, want := range []string{
		"`kvbench overhead --rounds 5`", "**0.50 0.40 0.30**", "1.90 0.70 0.40", "nginx CPU µs/req", "gateway CPU µs/req",
		"| 1 |  | 40000 | 20000 | 40.0 | 10000 | 100.0 | 0.50 | 0.25 | 2.50 |",
		"| **median** | | 40000 | 20000 | 42.0 | 10500 | 102.0 | **0.53** | 0.26 | **2.43** |",
		"nginx 42.0 µs, gateway 102.0 µs", "one unrecorded 1 s wrk warm-up run", "child process", "gateway --config gateway.yaml",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("document lacks %q:\n%s", want, doc)
		}
	}
	if strings.Contains(doc, "Only 5 rounds") {
		t.Error("five rounds flagged as too few")
	}
	back.Proxy = back.Proxy[:3]
	sb.Reset()
	writeProxy(&sb, &back, "bench")
	if !strings.Contains(sb.String(), "Only 3 rounds") {
		t.Error("three rounds not flagged")
	}
}
