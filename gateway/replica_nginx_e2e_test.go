package gateway_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/internal/replicatest"
)

// TestE2EThreeReplicasBehindNginx: three gateway processes (this test binary running the gateway's
// assembly, replica_main_test.go) behind Debian's nginx over a simulated
// pool. Killed mid-run (SIGKILL), one replica loses only the requests in flight on it: nginx
// retries a request whose connection to the dead replica was refused on the next one
// (proxy_next_upstream error), and never re-sends a POST it already sent, so an in-flight one
// reaches the client as a 502 (or a cut response). Restarted while an engine cannot replay, the
// replica is not ready, naming the endpoint; once the replay answers it is ready, and every
// replica's /admin/explain gives the same scores for the same prompts.
func TestE2EThreeReplicasBehindNginx(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 3, seed: strp("0"), mode: 3, certify: true, replay: true})
	t0 := time.Now()
	lap := func(what string) { t.Logf("%6.1fs %s", time.Since(t0).Seconds(), what) }
	dir := t.TempDir()
	cert := filepath.Join(dir, "certificate.json")
	if err := p.opts.Certificates[0].Write(cert); err != nil {
		t.Fatal(err)
	}
	var eps strings.Builder
	for _, s := range p.sims {
		c := s.Config()
		fmt.Fprintf(&eps, "      - {name: %s, address: %q, events: {zmq: [%q], replay: [%q]}}\n", c.Endpoint, s.URL(), s.PublishAddrs()[0], s.ReplayAddrs()[0])
	}
	reps := make([]*replicatest.Proc, 3)
	for i := range reps {
		r := &replicatest.Proc{T: t, Cert: cert, Client: replicatest.FreeAddr(t), Admin: replicatest.FreeAddr(t), Token: "tok",
			Config: filepath.Join(dir, fmt.Sprintf("gateway%d.yaml", i))}
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
%s`, r.Client, r.Admin, eps.String())
		if err := os.WriteFile(r.Config, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		r.Start()
		t.Cleanup(r.Kill)
		reps[i] = r
	}
	for _, r := range reps {
		r.WaitReady(15 * time.Second)
	}
	lap("replicas ready")
	front := replicatest.Nginx(t, dir, reps)

	// The run: 4 clients, each sending prompts over the same documents, through nginx. Replica 1
	// is killed after a third of them.
	ds := docs(6)
	failed, afterKill := replicatest.KillMidRun(t, front, 4, 30, func(c, i int) map[string]any {
		return map[string]any{"model": "llama3", "prompt": ds[(c+i)%len(ds)] + fmt.Sprintf(" Client %d question %d?", c, i), "max_tokens": 200}
	}, reps[1])
	lap("killed mid-run, run done")
	t.Logf("kill: %d requests in flight on the killed replica failed; %d sent after it, all served", failed, afterKill)

	// Restart while e0 cannot replay: not ready, naming e0.
	on, off := true, false
	if _, err := p.sims[0].SetFaults(sim.FaultPatch{ReplayOff: &on}); err != nil {
		t.Fatal(err)
	}
	reps[1].Start()
	lap("restarted")
	eventually(t, 10*time.Second, "the restarted replica to report e0 unsynchronized", func() bool {
		code, body := reps[1].Readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, `"name":"e0","ready":false,"reason":"events_syncing","unsynchronized":true`)
	})
	if _, err := p.sims[0].SetFaults(sim.FaultPatch{ReplayOff: &off}); err != nil {
		t.Fatal(err)
	}
	reps[1].WaitReady(15 * time.Second)
	lap("restarted replica ready")
	// The same inventory on every replica, key by key (the scores below read only the documents'
	// prefixes).
	for _, s := range p.sims {
		ep := s.Config().Endpoint
		want := reps[0].Inventory(ep)
		if len(want) == 0 {
			t.Fatalf("%s: empty inventory on %s after the run", ep, reps[0].Client)
		}
		for _, r := range reps[1:] {
			if got := r.Inventory(ep); !slices.Equal(got, want) {
				t.Fatalf("%s: replica %s holds %d keys, replica %s %d, not the same", ep, reps[0].Client, len(want), r.Client, len(got))
			}
		}
	}
	for i, d := range ds {
		prompt := d + " One more question?"
		want := reps[0].Explain("llama3", prompt)
		for _, r := range reps[1:] {
			if got := r.Explain("llama3", prompt); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("doc %d: replica %s explains %v, replica %s %v", i, reps[0].Client, want, r.Client, got)
			}
		}
	}
}
