package vllme2e_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/replicatest"
)

// TestReplicasBehindNginx: standalone gateway processes (this test binary as each, TestMain) over
// the package's real engines, behind Debian's nginx. Two replicas serve a run through nginx and
// one is killed mid-run (SIGKILL): every request not in flight on it is served. A third replica,
// started after the engines cached the run's prompts, is not ready while an engine's replay does
// not answer (naming the endpoint); started with the replay it is ready only once synchronized,
// then holds the same inventory as the surviving replica, both explain the same scores for the
// same prompts, and the cached tokens each predicts equal the engine's cached_tokens.
func TestReplicasBehindNginx(t *testing.T) {
	needEngines(t)
	t0 := time.Now()
	lap := func(what string) { t.Logf("%6.1fs %s", time.Since(t0).Seconds(), what) }
	dir := t.TempDir()
	cert := filepath.Join(dir, "certificate.json")
	if err := certs[0].Write(cert); err != nil {
		t.Fatal(err)
	}
	rule := vllmpool.Rule("pool", prof, engines)
	off := rules.OffDuration(0)
	rule.PredictOnRoute = &off // predictions rest on engine-confirmed blocks only
	replica := func(name string, r rules.Rule) *replicatest.Proc {
		p := &replicatest.Proc{T: t, Cert: cert, Client: replicatest.FreeAddr(t), Admin: replicatest.FreeAddr(t), Token: "tok",
			Config: filepath.Join(dir, name+".yaml")}
		b, err := yaml.Marshal(&rules.Config{Listen: p.Client, Admin: rules.Admin{Listen: p.Admin, Token: p.Token}, DebugHeader: true,
			Tokenizers: rules.Tokenizers{Root: filepath.Dir(model)}, Rules: []rules.Rule{r}})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p.Config, b, 0o644); err != nil {
			t.Fatal(err)
		}
		p.Start()
		t.Cleanup(p.Kill)
		return p
	}
	reps := []*replicatest.Proc{replica("r0", rule), replica("r1", rule)}
	for _, r := range reps {
		r.WaitReady(60 * time.Second)
	}
	lap("two replicas ready")
	front := replicatest.Nginx(t, dir, reps)

	// The run: 2 clients through nginx over 4 documents; replica 1 is killed after a third.
	tag := time.Now().Format(time.RFC3339Nano)
	ds := make([]string, 4)
	for i := range ds {
		ds[i] = doc(fmt.Sprintf("%s replica %d", tag, i), 8)
	}
	failed, afterKill := replicatest.KillMidRun(t, front, 2, 9, func(c, i int) map[string]any {
		return map[string]any{"model": "llama3", "prompt": ds[(c+i)%len(ds)] + fmt.Sprintf(" Client %d question %d?", c, i), "max_tokens": 2}
	}, reps[1])
	lap(fmt.Sprintf("run done: %d in flight on the killed replica failed, %d sent after the kill served", failed, afterKill))

	// A replica started after the engines cached the run, while e0's replay socket does not answer
	// (a port no one listens on): not ready, naming e0.
	dead := rule
	dead.Endpoints = slices.Clone(rule.Endpoints)
	dead.Endpoints[0].Events.Replay = []string{"tcp://" + replicatest.FreeAddr(t)}
	late := replica("late-no-replay", dead)
	held := func() (bool, string) { // not ready, e0 named unsynchronized
		code, body := late.Readyz()
		var rd gateway.Readiness
		if code != http.StatusServiceUnavailable || json.Unmarshal([]byte(body), &rd) != nil || len(rd.Rules) != 1 {
			return false, fmt.Sprint(code, " ", body)
		}
		for _, e := range rd.Rules[0].Endpoints {
			if e.Name == engines[0].Name {
				return !e.Ready && e.Unsynchronized && slices.Contains(rd.Rules[0].Reasons, gateway.ReasonUnsynchronized), body
			}
		}
		return false, body
	}
	var last string
	deadline := time.Now().Add(20 * time.Second)
	for ok := false; !ok; {
		if ok, last = held(); !ok && time.Now().After(deadline) {
			t.Fatalf("the late replica does not report %s unsynchronized without its replay: %s", engines[0].Name, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Well past the replay timeout (500 ms): still held on e0 alone, e1 (whose replay answers)
	// synchronized and ready.
	time.Sleep(2 * time.Second)
	if ok, body := held(); !ok || !strings.Contains(body, fmt.Sprintf(`{"name":%q,"ready":true}`, engines[1].Name)) {
		t.Fatalf("the late replica without %s's replay: %s", engines[0].Name, body)
	}
	t.Logf("late replica without %s's replay: %s", engines[0].Name, last)
	_, last = held()
	t.Logf("2 s later: %s", last)
	late.Kill()
	late = replica("late", rule)
	late.WaitReady(60 * time.Second)
	lap("late replica ready")
	live := []*replicatest.Proc{reps[0], late}
	for _, e := range engines {
		var a, b []string
		eventually(t, 10*time.Second, e.Name+"'s inventory to agree on the replicas", func() bool {
			a, b = live[0].Inventory(e.Name), live[1].Inventory(e.Name)
			return slices.Equal(a, b)
		})
		if len(a) == 0 {
			t.Fatalf("%s: empty inventory after the run", e.Name)
		}
	}
	for i, d := range ds {
		prompt := d + " One more question?"
		a, b := live[0].Explain("llama3", prompt), live[1].Explain("llama3", prompt)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("doc %d: replica %s explains %v, the late replica %v", i, live[0].Client, a, b)
		}
	}
	// Each replica's prediction is the engine's own count: a follow-up of a run document, sent
	// to the replica directly, goes KV-exact and the predicted cached tokens equal cached_tokens.
	for i, r := range live {
		got := send(t, "http://"+r.Client, "/v1/completions", map[string]any{"model": "llama3", "prompt": ds[i] + " One more question?"}, false)
		d := got.decision
		if d.Tier != route.TierKVExact || d.Score == 0 || d.Score*vllmpool.BlockSize != got.cached {
			t.Fatalf("replica %s: served by %s (tier %q), predicted %d blocks of %d, the engine cached %d of %d tokens",
				r.Client, got.endpoint, d.Tier, d.Score, vllmpool.BlockSize, got.cached, got.prompt)
		}
	}
	lap("done")
}
