package gateway_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
)

// replicaProc is one gateway process (cmd/gateway) of the replica set.
type replicaProc struct {
	t                 *testing.T
	bin, config, cert string
	client, admin     string // host:port
	cmd               *exec.Cmd
	token             string
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// start runs the process and waits for its ready line (listening; not yet /readyz).
func (r *replicaProc) start() {
	r.t.Helper()
	r.cmd = exec.Command(r.bin, "-test.run=^$")
	r.cmd.Env = append(os.Environ(), replicaEnv+"="+r.config, "KVEXACT_TEST_REPLICA_CERT="+r.cert)
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		r.t.Fatal(err)
	}
	r.cmd.Stderr = os.Stderr
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
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
		r.t.Fatal("gateway process: no ready line within 30s")
	}
}

func (r *replicaProc) kill() {
	if r.cmd != nil && r.cmd.Process != nil {
		syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		r.cmd.Wait()
		r.cmd = nil
	}
}

func (r *replicaProc) readyz() (int, string) {
	resp, err := http.Get("http://" + r.client + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (r *replicaProc) waitReady() {
	r.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if code, _ := r.readyz(); code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			_, b := r.readyz()
			r.t.Fatalf("replica %s not ready within 15s: %s", r.client, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// inventory is the replica's /admin/inventory of one endpoint: its keys with their counts, sorted.
func (r *replicaProc) inventory(endpoint string) []string {
	r.t.Helper()
	req, _ := http.NewRequest("GET", "http://"+r.admin+"/admin/inventory/pool/"+endpoint, nil)
	req.Header.Set("Authorization", "Bearer "+r.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	var d struct {
		Blocks []struct {
			Key   string `json:"key"`
			Count int    `json:"count"`
		} `json:"blocks"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(raw, &d) != nil {
		r.t.Fatalf("inventory on %s: %d %s", r.admin, resp.StatusCode, raw)
	}
	out := make([]string, len(d.Blocks))
	for i, b := range d.Blocks {
		out[i] = fmt.Sprintf("%s:%d", b.Key, b.Count)
	}
	sort.Strings(out)
	return out
}

// explain is the replica's /admin/explain for prompt: each endpoint's overlap score.
func (r *replicaProc) explain(model, prompt string) map[string]int {
	r.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt})
	req, _ := http.NewRequest("POST", "http://"+r.admin+"/admin/explain", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+r.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	var d struct {
		Target    string `json:"target"`
		Endpoints []struct {
			Name    string `json:"name"`
			Overlap int    `json:"overlap"`
		} `json:"endpoints"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(raw, &d) != nil {
		r.t.Fatalf("explain on %s: %d %s", r.admin, resp.StatusCode, raw)
	}
	out := map[string]int{"target:" + d.Target: 1}
	for _, e := range d.Endpoints {
		out[e.Name] = e.Overlap
	}
	return out
}

// TestE2EThreeReplicasBehindNginx: three gateway processes (this test binary running the gateway's
// assembly, replica_main_test.go) behind Debian's nginx over a simulated
// pool. Killed mid-run (SIGKILL), one replica loses only the requests in flight on it: nginx
// retries a request whose connection to the dead replica was refused on the next one
// (proxy_next_upstream error), and never re-sends a POST it already sent, so an in-flight one
// reaches the client as a 502 (or a cut response). Restarted while an engine cannot replay, the
// replica is not ready, naming the endpoint; once the replay answers it is ready, and every
// replica's /admin/explain gives the same scores for the same prompts.
func TestE2EThreeReplicasBehindNginx(t *testing.T) {
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
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 3, seed: strp("0"), mode: 3, certify: true, replay: true})
	t0 := time.Now()
	lap := func(what string) { t.Logf("%6.1fs %s", time.Since(t0).Seconds(), what) }
	dir := t.TempDir()
	bin, err := os.Executable() // the test binary runs as each gateway process (replica_main_test.go)
	if err != nil {
		t.Fatal(err)
	}
	cert := filepath.Join(dir, "certificate.json")
	if err := p.opts.Certificates[0].Write(cert); err != nil {
		t.Fatal(err)
	}
	var eps strings.Builder
	for _, s := range p.sims {
		c := s.Config()
		fmt.Fprintf(&eps, "      - {name: %s, address: %q, events: {zmq: [%q], replay: [%q]}}\n", c.Endpoint, s.URL(), s.PublishAddrs()[0], s.ReplayAddrs()[0])
	}
	reps := make([]*replicaProc, 3)
	for i := range reps {
		r := &replicaProc{t: t, bin: bin, cert: cert, client: freeAddr(t), admin: freeAddr(t), token: "tok",
			config: filepath.Join(dir, fmt.Sprintf("gateway%d.yaml", i))}
		yaml := fmt.Sprintf(`listen: %s
admin: {listen: %s, token: tok}
debugHeader: true
rules:
  - name: pool
    models: [llama3]
    engine: {family: vllm, release: v0.25.1}
    seed: "0"
    kvExactMode: 3
    endpoints:
%s`, r.client, r.admin, eps.String())
		if err := os.WriteFile(r.config, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		r.start()
		t.Cleanup(r.kill)
		reps[i] = r
	}
	for _, r := range reps {
		r.waitReady()
	}
	lap("replicas ready")
	// nginx in front, passive health only (open-source nginx reads no /readyz).
	nport := freeAddr(t)
	var ups strings.Builder
	for _, r := range reps {
		fmt.Fprintf(&ups, "    server %s max_fails=1 fail_timeout=2s;\n", r.client)
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
	front := "http://" + nport
	eventually(t, 10*time.Second, "nginx to listen", func() bool {
		c, err := net.Dial("tcp", nport)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	// The run: 4 clients, each sending prompts over the same documents, through nginx. Replica 1
	// is killed after a third of them.
	type result struct {
		status   int
		upstream string
		start    time.Time
		err      error
	}
	ds := docs(6)
	const perClient = 30
	var mu sync.Mutex
	var results []result
	var killedAt time.Time
	var wg sync.WaitGroup
	sent := make(chan struct{}, 4*perClient)
	for c := range 4 {
		wg.Go(func() {
			for i := range perClient {
				prompt := ds[(c+i)%len(ds)] + fmt.Sprintf(" Client %d question %d?", c, i)
				body, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": prompt, "max_tokens": 200})
				res := result{start: time.Now()}
				resp, err := http.Post(front+"/v1/completions", "application/json", bytes.NewReader(body))
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
	for range 4 * perClient / 3 {
		<-sent
	}
	mu.Lock()
	killedAt = time.Now()
	mu.Unlock()
	reps[1].kill()
	lap("killed")
	wg.Wait()
	lap("run done")
	var failed, afterKill, servedAfter int
	for _, r := range results {
		ok := r.err == nil && r.status == 200
		if r.start.After(killedAt) {
			afterKill++
			if ok {
				servedAfter++
			} else {
				t.Errorf("a request sent after the kill failed: %d %q %v", r.status, r.upstream, r.err)
			}
			continue
		}
		if !ok {
			failed++
			if r.err == nil && !strings.Contains(r.upstream, reps[1].client) {
				t.Errorf("a request failed on %q, not on the killed replica %s: %d", r.upstream, reps[1].client, r.status)
			}
		}
	}
	if failed > 4 {
		t.Errorf("%d requests failed; at most the 4 in flight on the killed replica may", failed)
	}
	if afterKill == 0 {
		t.Fatal("no request was sent after the kill")
	}
	t.Logf("kill: %d requests in flight on the killed replica failed; of %d sent after it, %d served", failed, afterKill, servedAfter)

	// Restart while e0 cannot replay: not ready, naming e0.
	on, off := true, false
	if _, err := p.sims[0].SetFaults(sim.FaultPatch{ReplayOff: &on}); err != nil {
		t.Fatal(err)
	}
	reps[1].start()
	lap("restarted")
	eventually(t, 10*time.Second, "the restarted replica to report e0 unsynchronized", func() bool {
		code, body := reps[1].readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, `"name":"e0","ready":false,"reason":"events_syncing","unsynchronized":true`)
	})
	if _, err := p.sims[0].SetFaults(sim.FaultPatch{ReplayOff: &off}); err != nil {
		t.Fatal(err)
	}
	reps[1].waitReady()
	lap("restarted replica ready")
	// The same inventory on every replica, key by key (the scores below read only the documents'
	// prefixes).
	for _, s := range p.sims {
		ep := s.Config().Endpoint
		want := reps[0].inventory(ep)
		if len(want) == 0 {
			t.Fatalf("%s: empty inventory on %s after the run", ep, reps[0].client)
		}
		for _, r := range reps[1:] {
			if got := r.inventory(ep); !slices.Equal(got, want) {
				t.Fatalf("%s: replica %s holds %d keys, replica %s %d, not the same", ep, reps[0].client, len(want), r.client, len(got))
			}
		}
	}
	for i, d := range ds {
		prompt := d + " One more question?"
		want := reps[0].explain("llama3", prompt)
		for _, r := range reps[1:] {
			if got := r.explain("llama3", prompt); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("doc %d: replica %s explains %v, replica %s %v", i, reps[0].client, want, r.client, got)
			}
		}
	}
}
