// Package containers is the end-to-end harness: it runs the project's own binaries (enginesim,
// gateway) — and real engine images where a GPU host has them — as Docker containers on the host's
// network, so that faults a process cannot fake from inside (a paused gateway, a killed engine, a
// restarted container) happen to real processes. Images are FROM scratch with one static binary
// built on the host (no image can be pulled on the build machines), every container carries an
// owner label, and everything is terminated explicitly: the Ryuk reaper is not available.
package containers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tcexec "github.com/testcontainers/testcontainers-go/exec"
	tclog "github.com/testcontainers/testcontainers-go/log"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Labels every harness container carries: LabelHarness marks it, LabelOwner is the pid of the
// process that started it, so a later run can tell a dangling container (owner gone) from one a
// concurrent run still uses.
const (
	LabelHarness = "org.kvexact.harness"
	LabelOwner   = "org.kvexact.owner-pid"
	LabelHost    = "org.kvexact.owner-host"
	LabelRole    = "org.kvexact.role"
)

// ErrNoDocker is returned by Connect when no Docker daemon answers.
var ErrNoDocker = errors.New("no Docker daemon: apt-get install -y docker.io and start dockerd")

// Harness talks to the Docker daemon and owns the containers it starts.
type Harness struct {
	provider *testcontainers.DockerProvider
	cli      client.APIClient
	log      tclog.Logger
	seq      atomic.Uint64
}

// Options configure Connect.
type Options struct {
	// Logger receives testcontainers' own messages (default: discarded).
	Logger tclog.Logger
}

// Connect reaches the Docker daemon (DOCKER_HOST or the default socket). The Ryuk reaper image
// cannot be pulled on the build machines, so unless TESTCONTAINERS_RYUK_DISABLED is set it is set
// to true here: the harness terminates its containers itself and reaps dangling ones (Reap).
func Connect(ctx context.Context, opts Options) (*Harness, error) {
	if _, ok := os.LookupEnv("TESTCONTAINERS_RYUK_DISABLED"); !ok {
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	if opts.Logger == nil {
		opts.Logger = tclog.NewNoopLogger()
	}
	p, err := testcontainers.NewDockerProvider(testcontainers.WithLogger(opts.Logger))
	if err != nil {
		return nil, fmt.Errorf("%w (%v)", ErrNoDocker, err)
	}
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := p.Client().Ping(hctx, client.PingOptions{}); err != nil {
		p.Close()
		return nil, fmt.Errorf("%w (%v)", ErrNoDocker, err)
	}
	return &Harness{provider: p, cli: p.Client(), log: opts.Logger}, nil
}

// Close releases the Docker client (containers are terminated by their owners).
func (h *Harness) Close() error { return h.provider.Close() }

// Client is the raw Docker API client.
func (h *Harness) Client() client.APIClient { return h.cli }

// Reap removes harness containers whose owner process is gone (a run killed before its cleanup).
// Only containers started from this host name are judged (a pid means nothing elsewhere); those of
// live owners, including concurrent runs, are left alone.
func (h *Harness) Reap(ctx context.Context) (int, error) {
	res, err := h.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: client.Filters{}.Add("label", LabelHarness)})
	if err != nil {
		return 0, fmt.Errorf("reap: list containers: %w", err)
	}
	host, _ := os.Hostname()
	n := 0
	for _, c := range res.Items {
		if c.Labels[LabelHost] != host {
			continue
		}
		pid, err := strconv.Atoi(c.Labels[LabelOwner])
		if err == nil && pid > 0 && processAlive(pid) {
			continue
		}
		if _, err := h.cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
			return n, fmt.Errorf("reap: remove %s: %w", c.ID[:12], err)
		}
		n++
	}
	// Then the networks of dead owners (a network with containers left cannot be removed).
	nets, err := h.cli.NetworkList(ctx, client.NetworkListOptions{Filters: client.Filters{}.Add("label", LabelHarness)})
	if err != nil {
		return n, fmt.Errorf("reap: list networks: %w", err)
	}
	for _, nw := range nets.Items {
		if nw.Labels[LabelHost] != host {
			continue
		}
		if pid, err := strconv.Atoi(nw.Labels[LabelOwner]); err == nil && pid > 0 && processAlive(pid) {
			continue
		}
		if _, err := h.cli.NetworkRemove(ctx, nw.ID, client.NetworkRemoveOptions{}); err != nil {
			return n, fmt.Errorf("reap: remove network %s: %w", nw.Name, err)
		}
	}
	return n, nil
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// Spec describes one container.
type Spec struct {
	// Role and Name make the container's name (kvexact-<role>-<name>-<pid>-<n>) and its role label.
	Role, Name string
	Image      string
	// Entrypoint replaces the image's entrypoint when set.
	Entrypoint []string
	Args       []string
	Env        map[string]string
	// Binds are read-only bind mounts, host path → container path.
	Binds map[string]string
	// Ready is a substring of the one log line that says the process is serving.
	Ready        string
	ReadyTimeout time.Duration // default 30s
	// GPU asks for every GPU (Docker's --gpus all); only for real engine images.
	GPU bool
	// StopGrace is how long a stop waits after SIGTERM before SIGKILL (default 5s).
	StopGrace time.Duration
	// ShmSize in bytes (real engines want a large /dev/shm).
	ShmSize int64
	// Mounts are bind mounts that may be writable (a pod's emptyDir) or single files (a subPath).
	Mounts []Mount
	// Security is the process's identity and confinement (zero: the image's user, Docker's defaults).
	Security Security
	// Network runs the container on that bridge network instead of the host's (nil), with the
	// Publish ports published on the host's 127.0.0.1 under the same numbers: its link can then be
	// cut (Container.Disconnect). The process must listen on every interface of its namespace.
	Network *Network
	Publish []int
}

// Mount is one bind mount.
type Mount struct {
	Host, Container string
	ReadOnly        bool
}

// Security is what a Kubernetes securityContext sets, in Docker's terms.
type Security struct {
	// User is "uid:gid"; Groups are supplementary group ids (a pod's fsGroup and supplementalGroups).
	User   string
	Groups []string
	// ReadOnlyRootfs, CapDrop and NoNewPrivileges: readOnlyRootFilesystem, capabilities.drop and
	// allowPrivilegeEscalation: false.
	ReadOnlyRootfs  bool
	CapDrop         []string
	NoNewPrivileges bool
}

// Container is one running (or stopped, paused, killed) container of the harness.
type Container struct {
	h    *Harness
	c    *testcontainers.DockerContainer
	spec Spec
	// ID and Name identify the container in Docker.
	ID, Name string
	// starts counts how many times the process was (re)started, i.e. how many ready lines to expect.
	starts int
	// onTerminate releases host resources the container used (its config folder).
	onTerminate func()
}

// Start creates and starts a container on the host's network (or the spec's own) and waits for
// its ready line.
func (h *Harness) Start(ctx context.Context, s Spec) (*Container, error) {
	exposed, published, err := publish(s.Publish)
	if err != nil {
		return nil, err
	}
	if len(s.Publish) > 0 && s.Network == nil {
		return nil, fmt.Errorf("start %s: ports are published only from a network of the container's own", s.Name)
	}
	if s.ReadyTimeout == 0 {
		s.ReadyTimeout = 30 * time.Second
	}
	if s.StopGrace == 0 {
		s.StopGrace = 5 * time.Second
	}
	name := fmt.Sprintf("kvexact-%s-%s-%d-%d", s.Role, s.Name, os.Getpid(), h.seq.Add(1))
	req := testcontainers.ContainerRequest{
		Image:        s.Image,
		ExposedPorts: exposed,
		Entrypoint:   s.Entrypoint,
		Name:         name,
		Cmd:          s.Args,
		Env:          s.Env,
		User:         s.Security.User,
		Labels: map[string]string{
			LabelHarness: "containers",
			LabelOwner:   strconv.Itoa(os.Getpid()),
			LabelHost:    hostname(),
			LabelRole:    s.Role,
		},
		HostConfigModifier: func(hc *container.HostConfig) {
			hc.NetworkMode = "host"
			if s.Network != nil {
				hc.NetworkMode = container.NetworkMode(s.Network.Name)
				hc.PortBindings = published
			}
			for host, ctr := range s.Binds {
				hc.Binds = append(hc.Binds, host+":"+ctr+":ro")
			}
			if s.GPU {
				hc.DeviceRequests = append(hc.DeviceRequests, container.DeviceRequest{Count: -1, Capabilities: [][]string{{"gpu"}}})
			}
			if s.ShmSize > 0 {
				hc.ShmSize = s.ShmSize
			}
			for _, m := range s.Mounts {
				mode := ":rw"
				if m.ReadOnly {
					mode = ":ro"
				}
				hc.Binds = append(hc.Binds, m.Host+":"+m.Container+mode)
			}
			hc.GroupAdd = s.Security.Groups
			hc.ReadonlyRootfs = s.Security.ReadOnlyRootfs
			hc.CapDrop = s.Security.CapDrop
			if s.Security.NoNewPrivileges {
				hc.SecurityOpt = append(hc.SecurityOpt, "no-new-privileges")
			}
		},
	}
	if s.Ready != "" {
		req.WaitingFor = wait.ForLog(s.Ready).WithStartupTimeout(s.ReadyTimeout).WithPollInterval(50 * time.Millisecond)
	}
	gc, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: req, Started: true, Logger: h.log,
	})
	var dc *testcontainers.DockerContainer
	if gc != nil {
		dc, _ = gc.(*testcontainers.DockerContainer)
	}
	if err != nil {
		msg := err.Error()
		if dc != nil {
			if logs, lerr := containerLogs(ctx, dc); lerr == nil {
				msg += "\n--- container log ---\n" + tail(logs, 40)
			}
			_ = dc.Terminate(context.WithoutCancel(ctx))
		}
		return nil, fmt.Errorf("start %s (%s): %s", name, s.Image, msg)
	}
	return &Container{h: h, c: dc, spec: s, ID: dc.GetContainerID(), Name: name, starts: 1}, nil
}

func containerLogs(ctx context.Context, c *testcontainers.DockerContainer) (string, error) {
	rc, err := c.Logs(ctx)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	var b bytes.Buffer
	_, err = io.Copy(&b, rc)
	return b.String(), err
}

func tail(s string, lines int) string {
	all := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// Logs returns everything the container wrote to stdout and stderr, across restarts.
func (c *Container) Logs(ctx context.Context) (string, error) { return containerLogs(ctx, c.c) }

// ReadFile returns a file's bytes from the container's filesystem.
func (c *Container) ReadFile(ctx context.Context, path string) ([]byte, error) {
	rc, err := c.c.CopyFileFromContainer(ctx, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// ReadyLines returns the ready lines logged so far, oldest first (one per start).
func (c *Container) ReadyLines(ctx context.Context) ([]string, error) {
	logs, err := c.Logs(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		if c.spec.Ready != "" && strings.Contains(l, c.spec.Ready) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out, nil
}

// waitReady waits for the ready line of the current start (the starts-th one).
func (c *Container) waitReady(ctx context.Context) error {
	if c.spec.Ready == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.spec.ReadyTimeout)
	defer cancel()
	for {
		lines, err := c.ReadyLines(ctx)
		if err == nil && len(lines) >= c.starts {
			return nil
		}
		st, serr := c.State(ctx)
		if serr == nil && !st.Running && !st.Paused && !st.Restarting {
			logs, _ := c.Logs(context.WithoutCancel(ctx))
			return fmt.Errorf("%s exited (status %d) before its ready line:\n%s", c.Name, st.ExitCode, tail(logs, 40))
		}
		select {
		case <-ctx.Done():
			logs, _ := c.Logs(context.WithoutCancel(ctx))
			return fmt.Errorf("%s: no ready line %q within %s:\n%s", c.Name, c.spec.Ready, c.spec.ReadyTimeout, tail(logs, 40))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// State is the container's Docker state.
func (c *Container) State(ctx context.Context) (*container.State, error) {
	res, err := c.h.cli.ContainerInspect(ctx, c.ID, client.ContainerInspectOptions{})
	if err != nil {
		return nil, err
	}
	if res.Container.State == nil {
		return nil, fmt.Errorf("%s: no state", c.Name)
	}
	return res.Container.State, nil
}

// Stop sends SIGTERM and, after the spec's grace, SIGKILL; the process shuts down as in production.
func (c *Container) Stop(ctx context.Context) error {
	secs := int(c.spec.StopGrace / time.Second)
	if _, err := c.h.cli.ContainerStop(ctx, c.ID, client.ContainerStopOptions{Timeout: &secs}); err != nil {
		return fmt.Errorf("stop %s: %w", c.Name, err)
	}
	return nil
}

// Kill sends SIGKILL: the process dies mid-whatever, sockets reset.
func (c *Container) Kill(ctx context.Context) error {
	if _, err := c.h.cli.ContainerKill(ctx, c.ID, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		return fmt.Errorf("kill %s: %w", c.Name, err)
	}
	// Wait until Docker reports it stopped, so a following Start does not race the exit.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if st, err := c.State(ctx); err == nil && !st.Running {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("kill %s: still running after 10s", c.Name)
}

// StartAgain starts a stopped or killed container (same name, same arguments, same ports) and
// waits for its next ready line.
func (c *Container) StartAgain(ctx context.Context) error {
	if _, err := c.h.cli.ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
		return fmt.Errorf("start %s: %w", c.Name, err)
	}
	c.starts++
	return c.waitReady(ctx)
}

// Restart stops the container gracefully and starts it again: a new process, a new publisher
// (sequence from 0), an empty engine cache.
func (c *Container) Restart(ctx context.Context) error {
	if err := c.Stop(ctx); err != nil {
		return err
	}
	return c.StartAgain(ctx)
}

// Pause freezes every process of the container (cgroup freezer): sockets stay open, nothing is
// read or written, peers see a silent stall rather than a disconnect.
func (c *Container) Pause(ctx context.Context) error {
	if _, err := c.h.cli.ContainerPause(ctx, c.ID, client.ContainerPauseOptions{}); err != nil {
		return fmt.Errorf("pause %s: %w", c.Name, err)
	}
	return nil
}

// Unpause thaws a paused container.
func (c *Container) Unpause(ctx context.Context) error {
	if _, err := c.h.cli.ContainerUnpause(ctx, c.ID, client.ContainerUnpauseOptions{}); err != nil {
		return fmt.Errorf("unpause %s: %w", c.Name, err)
	}
	return nil
}

// Terminate stops (unpausing first if needed) and removes the container. It is safe to call more
// than once and on a container that was killed.
func (c *Container) Terminate(ctx context.Context) error {
	if c == nil || c.c == nil {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	if st, err := c.State(ctx); err == nil && st.Paused {
		_ = c.Unpause(ctx)
	}
	err := c.c.Terminate(ctx, testcontainers.StopTimeout(c.spec.StopGrace))
	if err != nil {
		// Fall back to the raw API: the container must not outlive the run.
		if _, rerr := c.h.cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); rerr == nil {
			err = nil
		}
	}
	c.c = nil
	if c.onTerminate != nil {
		c.onTerminate()
	}
	return err
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// Exec runs cmd inside the container (docker exec) and returns its exit code and combined output.
func (c *Container) Exec(ctx context.Context, cmd ...string) (int, string, error) {
	code, r, err := c.c.Exec(ctx, cmd, tcexec.Multiplexed())
	if err != nil {
		return 0, "", fmt.Errorf("exec in %s: %w", c.Name, err)
	}
	out, err := io.ReadAll(r)
	return code, string(out), err
}
