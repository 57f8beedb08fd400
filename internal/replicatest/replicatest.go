// Package replicatest runs standalone gateway replicas as separate processes behind Debian's nginx
// for end-to-end tests: the test binary itself runs as each gateway process (Main), with the same
// assembly cmd/gateway runs, so no gateway binary is built in the test; nginx is the load balancer
// users would put in front (passive health only: open-source nginx reads no /readyz).
package replicatest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/rules"
)

// Env, set to a configuration path, makes a test binary whose TestMain calls RunIfReplica run as
// one gateway process instead of its tests; certEnv names its certificate file.
const (
	Env     = "KVEXACT_TEST_REPLICA_CONFIG"
	certEnv = "KVEXACT_TEST_REPLICA_CERT"
)

// RunIfReplica runs the gateway and exits when the process was started as a replica (Env set);
// otherwise it returns at once. Call it first in TestMain.
func RunIfReplica() {
	if path := os.Getenv(Env); path != "" {
		os.Exit(run(path, os.Getenv(certEnv)))
	}
}

func run(path, cert string) int {
	cfg, err := rules.Load(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	certs, err := gateway.LoadCertificates([]string{cert}, nil, false)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	gw, err := assemble.New(assemble.Config{Options: gateway.Options{Config: cfg, Certificates: certs, CertificatePaths: []string{cert},
		Registry: prometheus.NewRegistry(), ProbeInterval: -1, ReprobeInterval: -1, EventReplayTimeout: 500 * time.Millisecond}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := gw.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("gateway ready admin=%s\n", gw.Servers.Admin)
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gw.Shutdown(sctx)
	return 0
}

// Proc is one gateway process of the replica set, serving the rule named "pool".
type Proc struct {
	T             *testing.T
	Config, Cert  string // configuration and certificate files
	Client, Admin string // host:port
	Token         string // the admin token
	cmd           *exec.Cmd
}

// FreeAddr is a 127.0.0.1 address no one listens on at the moment, chosen below the kernel's
// ephemeral port range: a replica binds it later (and again after a restart), and a port the
// kernel hands out for port-0 listeners and outgoing connections could be taken by then.
func FreeAddr(t *testing.T) string {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 11000 {
				low = n
			}
		}
	}
	for range 100 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(10000+rand.IntN(low-10000)))
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Start runs the process (this test binary, as a replica) and waits for its ready line
// (listening; not yet /readyz).
func (r *Proc) Start() {
	r.T.Helper()
	bin, err := os.Executable()
	if err != nil {
		r.T.Fatal(err)
	}
	r.cmd = exec.Command(bin, "-test.run=^$")
	r.cmd.Env = append(os.Environ(), Env+"="+r.Config, certEnv+"="+r.Cert)
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		r.T.Fatal(err)
	}
	r.cmd.Stderr = os.Stderr
	if err := r.cmd.Start(); err != nil {
		r.T.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "gateway ready") {
				ready <- true
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		r.T.Fatal("gateway process: no ready line within 30s")
	}
}

// Kill ends the process with SIGKILL (no draining), as a crash would.
func (r *Proc) Kill() {
	if r.cmd != nil && r.cmd.Process != nil {
		syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		r.cmd.Wait()
		r.cmd = nil
	}
}

// Readyz is the replica's /readyz status code and body (0 and the error when it does not answer).
func (r *Proc) Readyz() (int, string) {
	resp, err := http.Get("http://" + r.Client + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// WaitReady waits up to d for /readyz to answer 200.
func (r *Proc) WaitReady(d time.Duration) {
	r.T.Helper()
	deadline := time.Now().Add(d)
	for {
		if code, _ := r.Readyz(); code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			_, b := r.Readyz()
			r.T.Fatalf("replica %s not ready within %v: %s", r.Client, d, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *Proc) admin(method, path string, body []byte, into any) {
	r.T.Helper()
	req, _ := http.NewRequest(method, "http://"+r.Admin+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+r.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.T.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(raw, into) != nil {
		r.T.Fatalf("%s %s on %s: %d %s", method, path, r.Admin, resp.StatusCode, raw)
	}
}

// Inventory is the replica's /admin/inventory of one endpoint: its keys with their counts, sorted.
func (r *Proc) Inventory(endpoint string) []string {
	r.T.Helper()
	var d struct {
		Blocks []struct {
			Key   string `json:"key"`
			Count int    `json:"count"`
		} `json:"blocks"`
	}
	r.admin("GET", "/admin/inventory/pool/"+endpoint, nil, &d)
	out := make([]string, len(d.Blocks))
	for i, b := range d.Blocks {
		out[i] = fmt.Sprintf("%s:%d", b.Key, b.Count)
	}
	sort.Strings(out)
	return out
}

// Explain is the replica's /admin/explain for a completion of prompt: the target and each
// endpoint's overlap score.
func (r *Proc) Explain(model, prompt string) map[string]int {
	r.T.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt})
	var d struct {
		Target    string `json:"target"`
		Endpoints []struct {
			Name    string `json:"name"`
			Overlap int    `json:"overlap"`
		} `json:"endpoints"`
	}
	r.admin("POST", "/admin/explain", body, &d)
	out := map[string]int{"target:" + d.Target: 1}
	for _, e := range d.Endpoints {
		out[e.Name] = e.Overlap
	}
	return out
}

// Nginx runs Debian's nginx in dir as the load balancer in front of the replicas' client
// listeners and returns its base URL. Passive health only: a connection refused or timed out is
// retried on the next replica (proxy_next_upstream error timeout), a request already sent never
// is; each response names the replica that answered in X-Upstream. Skips t naming the package
// when nginx is missing (fails under CI=true).
func Nginx(t *testing.T, dir string, reps []*Proc) string {
	t.Helper()
	ngx, err := exec.LookPath("nginx")
	if err != nil {
		if _, e := os.Stat("/usr/sbin/nginx"); e == nil {
			ngx = "/usr/sbin/nginx"
		} else if os.Getenv("CI") == "true" {
			t.Fatal("nginx not found: apt-get install -y nginx-light")
		} else {
			t.Skip("nginx not found: apt-get install -y nginx-light")
		}
	}
	nport := FreeAddr(t)
	var ups strings.Builder
	for _, r := range reps {
		fmt.Fprintf(&ups, "    server %s max_fails=1 fail_timeout=2s;\n", r.Client)
	}
	conf := fmt.Sprintf(`worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  upstream replicas {
%[2]s    keepalive 16;
  }
  server {
    listen %[3]s;
    location / {
      proxy_pass http://replicas;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_next_upstream error timeout;
      add_header X-Upstream $upstream_addr always;
    }
  }
}
`, dir, ups.String(), nport)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	ng := exec.Command(ngx, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;")
	ng.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	ng.Stderr = os.Stderr
	if err := ng.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-ng.Process.Pid, syscall.SIGTERM); ng.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", nport)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx does not listen on %s within 10s", nport)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "http://" + nport
}

// KillMidRun sends clients × perClient completions (body(c, i) each) through front, one at a
// time per client, and kills victim with SIGKILL once a third of them are answered. It fails t
// when a request fails on another replica than victim, or when more fail than the clients: nginx
// holds at most as many connections to victim as there are clients (each sends one request at a
// time), in flight or idle, and the kill fails at most the one request each carries. It returns how
// many failed (on victim) and how many were sent after the kill.
func KillMidRun(t *testing.T, front string, clients, perClient int, body func(c, i int) map[string]any, victim *Proc) (failed, afterKill int) {
	t.Helper()
	type result struct {
		status   int
		upstream string
		start    time.Time
		err      error
	}
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	sent := make(chan struct{}, clients*perClient)
	for c := range clients {
		wg.Go(func() {
			for i := range perClient {
				b, _ := json.Marshal(body(c, i))
				res := result{start: time.Now()}
				resp, err := http.Post(front+"/v1/completions", "application/json", bytes.NewReader(b))
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					res.status, res.upstream = resp.StatusCode, resp.Header.Get("X-Upstream")
				}
				res.err = err
				mu.Lock()
				results = append(results, res)
				mu.Unlock()
				sent <- struct{}{}
			}
		})
	}
	for range clients * perClient / 3 {
		<-sent
	}
	victim.Kill() // returns once the process is reaped: its sockets are closed
	killedAt := time.Now()
	wg.Wait()
	for _, r := range results {
		ok := r.err == nil && r.status == 200
		if r.start.After(killedAt) {
			afterKill++
			if ok {
				continue
			}
			// nginx may still hold an idle keep-alive connection the kill closed and send the next
			// request on it before its event loop reads the close: that request was sent, so (a
			// POST) it is not retried, like one in flight. Any other failure after the kill is not
			// allowed: a refused connection is retried on the next replica.
			if r.err != nil || !strings.Contains(r.upstream, victim.Client) {
				t.Errorf("a request sent after the kill failed: %d %q %v", r.status, r.upstream, r.err)
			}
			failed++
			continue
		}
		if !ok {
			failed++
			if r.err == nil && !strings.Contains(r.upstream, victim.Client) {
				t.Errorf("a request failed on %q, not on the killed replica %s: %d", r.upstream, victim.Client, r.status)
			}
		}
	}
	if failed > clients {
		t.Errorf("%d requests failed; at most the %d in flight on the killed replica may", failed, clients)
	}
	if afterKill == 0 {
		t.Fatal("no request was sent after the kill")
	}
	return failed, afterKill
}
