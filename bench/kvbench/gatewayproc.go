package kvbench

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The proxies of the throughput comparison run as child processes, each in its own process group
// (nginx: master and workers; the gateway: one process), so that their CPU time can be read per
// group and the whole group stopped at the end.

// groupProc is a child process leading its own process group.
type groupProc struct {
	name string
	cmd  *exec.Cmd
	pgid int
	done chan struct{} // closed when the leader has exited
	err  error         // the leader's exit, once done
	tail *tailBuffer   // the end of its stderr, for error messages
}

// startGroup starts cmd as the leader of a new process group. The child gets SIGTERM should this
// process die first (Pdeathsig), so a killed kvbench leaves no proxy behind.
func startGroup(name string, cmd *exec.Cmd, tail *tailBuffer) (*groupProc, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &groupProc{name: name, cmd: cmd, pgid: cmd.Process.Pid, done: make(chan struct{}), tail: tail}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

// exited says whether the leader has exited, and how.
func (p *groupProc) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// explain adds to err what the process said and whether it exited.
func (p *groupProc) explain(err error) error {
	var extra []string
	if gone, werr := p.exited(); gone {
		extra = append(extra, fmt.Sprintf("%s exited (%v)", p.name, werr))
	}
	if p.tail != nil {
		if t := strings.TrimSpace(p.tail.String()); t != "" {
			extra = append(extra, fmt.Sprintf("%s stderr: %s", p.name, t))
		}
	}
	if len(extra) == 0 {
		return err
	}
	return fmt.Errorf("%w; %s", err, strings.Join(extra, "; "))
}

// stop sends SIGTERM to the group, waits up to 5 s for the leader and for the group to empty, then
// sends SIGKILL to what is left of it. It signals only while the group still has a member, so the
// group id cannot have been reused by an unrelated process.
func (p *groupProc) stop() {
	if gone, _ := p.exited(); !gone {
		_ = syscall.Kill(-p.pgid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		gone, _ := p.exited()
		_, n, err := groupCPU("/proc", p.pgid)
		left := err == nil && n > 0
		if gone && !left {
			return
		}
		if time.Now().After(deadline) {
			if left {
				_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
			}
			<-p.done
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// readyWriter watches a child's stdout for the line starting with prefix and sends it once.
type readyWriter struct {
	prefix string
	ch     chan string
	mu     sync.Mutex
	line   []byte
	sent   bool
}

func (w *readyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sent {
		return len(p), nil
	}
	w.line = append(w.line, p...)
	for {
		i := bytes.IndexByte(w.line, '\n')
		if i < 0 {
			break
		}
		l := string(w.line[:i])
		w.line = w.line[i+1:]
		if strings.HasPrefix(l, w.prefix) {
			w.sent = true
			w.ch <- l
			w.line = nil
			break
		}
	}
	return len(p), nil
}

// gatewayArgs are the gateway's flags for the comparison: no health probes, no re-probes, errors
// only on stderr, a short shutdown grace.
func gatewayArgs(config string) []string {
	return []string{"--config", config, "--probe-interval", "0", "--reprobe-interval", "0", "--log-level", "error", "--shutdown-grace", "2s"}
}

// gatewayConfig is the gateway's configuration: one rule `rr` for llama3, selector rr (kvExactMode
// 0, no certificate), the upstreams as endpoints u0.., every listener on a free loopback port.
func gatewayConfig(ups []string) string {
	var b strings.Builder
	b.WriteString("listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\n  token: bench\nrules:\n")
	fmt.Fprintf(&b, "  - name: rr\n    models: [llama3]\n    engine: {family: %s, release: %s}\n    selector: rr\n    endpoints:\n", family, release)
	for i, a := range ups {
		fmt.Fprintf(&b, "      - {name: u%d, address: \"http://%s\"}\n", i, a)
	}
	return b.String()
}

// startGateway writes the configuration into dir, starts the gateway binary in its own process
// group and waits for its ready line ("gateway ready admin=… listeners=…"); it returns the client
// listener's address.
func startGateway(ctx context.Context, bin string, ups []string, dir string, log io.Writer, extra ...string) (*groupProc, string, error) {
	p, addr, _, err := startGatewayConfig(ctx, bin, gatewayConfig(ups), dir, log, extra...)
	return p, addr, err
}

// startGatewayConfig is startGateway with the configuration's text given; it also returns the
// admin listener's address.
func startGatewayConfig(ctx context.Context, bin, config, dir string, log io.Writer, extra ...string) (*groupProc, string, string, error) {
	cfg := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		return nil, "", "", err
	}
	tail := &tailBuffer{max: 4096}
	ready := &readyWriter{prefix: "gateway ready ", ch: make(chan string, 1)}
	cmd := exec.Command(bin, append(gatewayArgs(cfg), extra...)...)
	cmd.Dir = dir
	cmd.Stdout = ready
	cmd.Stderr = io.MultiWriter(log, tail)
	p, err := startGroup("gateway", cmd, tail)
	if err != nil {
		return nil, "", "", err
	}
	fail := func(err error) (*groupProc, string, string, error) {
		err = p.explain(err)
		p.stop()
		return nil, "", "", fmt.Errorf("gateway %s: %w", bin, err)
	}
	select {
	case l := <-ready.ch:
		head, lst, _ := strings.Cut(l, " listeners=")
		addr, _, _ := strings.Cut(strings.TrimSpace(lst), ",")
		_, admin, _ := strings.Cut(head, "admin=")
		if addr == "" {
			return fail(fmt.Errorf("no listener in %q", l))
		}
		return p, addr, strings.TrimSpace(admin), nil
	case <-p.done:
		return fail(errors.New("exited before it was ready"))
	case <-time.After(30 * time.Second):
		return fail(errors.New("not ready after 30 s"))
	case <-ctx.Done():
		return fail(ctx.Err())
	}
}

// ResolveGateway finds the gateway binary to measure: explicit (--gateway) when given, else a
// `gateway` next to the running executable (bin/ after make build, the directory of
// `go build -o DIR/ ./cmd/...`), else one built with `go build` from the module in the working
// directory into a temporary directory, which cleanup removes.
func ResolveGateway(ctx context.Context, explicit string, log io.Writer) (path string, cleanup func(), err error) {
	cleanup = func() {}
	if explicit != "" {
		p, err := exec.LookPath(explicit)
		if err != nil {
			return "", cleanup, fmt.Errorf("--gateway %s: %w", explicit, err)
		}
		abs, err := filepath.Abs(p)
		return abs, cleanup, err
	}
	if self, err := os.Executable(); err == nil {
		cand := filepath.Join(filepath.Dir(self), "gateway")
		if st, err := os.Stat(cand); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return cand, cleanup, nil
		}
	}
	dir, err := os.MkdirTemp("", "kvbench-gateway-")
	if err != nil {
		return "", cleanup, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	bin := filepath.Join(dir, "gateway")
	fmt.Fprintf(log, "kvbench overhead: no gateway binary beside this one; go build -o %s github.com/kvexact/kvexact/cmd/gateway\n", bin)
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/kvexact/kvexact/cmd/gateway").CombinedOutput()
	if err != nil {
		cleanup()
		return "", func() {}, fmt.Errorf("no gateway binary beside kvbench and go build failed (%v: %s): build it (go build -o bin/ ./cmd/...) and pass --gateway PATH",
			err, strings.TrimSpace(string(out)))
	}
	return bin, cleanup, nil
}

// describeBinary names a Go binary with its build: Go version, VCS revision and whether the tree
// was modified, and says so when that build differs from the running kvbench's.
func describeBinary(path string) string {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return path
	}
	s := fmt.Sprintf("%s (%s%s)", path, bi.GoVersion, vcsOf(bi))
	if self, ok := debug.ReadBuildInfo(); ok && vcsOf(self) != vcsOf(bi) {
		s += "; kvbench itself: " + strings.TrimPrefix(vcsOf(self), ", ")
	}
	return s
}

func vcsOf(bi *debug.BuildInfo) string {
	rev, modified := vcsStamp(bi)
	mod := ""
	if modified {
		mod = ", modified tree"
	}
	if rev == "" {
		return ", no VCS stamp"
	}
	return ", rev " + rev[:min(len(rev), 12)] + mod
}
