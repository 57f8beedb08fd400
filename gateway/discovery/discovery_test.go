package discovery_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/discovery"
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
	"github.com/kvexact/kvexact/internal/kubetest"
	inferencev1 "github.com/kvexact/kvexact/third_party/gateway-api-inference-extension/api/v1"
)

func pod(name, ip string, ready bool, lbl map[string]string, ann map[string]string) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: lbl, Annotations: ann},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

func poolObj(ports ...int32) *inferencev1.InferencePool {
	p := &inferencev1.InferencePool{
		TypeMeta:   metav1.TypeMeta{APIVersion: "inference.networking.k8s.io/v1", Kind: "InferencePool"},
		ObjectMeta: metav1.ObjectMeta{Name: "llama", Namespace: "llm"},
		Spec:       inferencev1.InferencePoolSpec{Selector: inferencev1.LabelSelector{MatchLabels: map[inferencev1.LabelKey]inferencev1.LabelValue{"app": "llm"}}},
	}
	for _, n := range ports {
		p.Spec.TargetPorts = append(p.Spec.TargetPorts, inferencev1.Port{Number: inferencev1.PortNumber(n)})
	}
	return p
}

func TestEndpointsDerivation(t *testing.T) {
	vllm, _ := contracts.Lookup("vllm", "v0.25.1")
	trt, _ := contracts.Lookup("trtllm", "1.2")
	app := map[string]string{"app": "llm"}
	terminating := pod("gone", "10.0.0.9", true, app, nil)
	now := metav1.Now()
	terminating.DeletionTimestamp = &now
	pods := []*corev1.Pod{
		pod("b", "10.0.0.2", true, app, map[string]string{discovery.AnnotationEventsPort: "6000", discovery.AnnotationReplayPort: "6100", discovery.AnnotationRole: "prefill"}),
		pod("a", "fd00::1", true, app, nil),
		pod("notready", "10.0.0.3", false, app, nil),
		pod("other", "10.0.0.4", true, map[string]string{"app": "else"}, nil),
		terminating,
	}
	eps, err := discovery.Endpoints(poolObj(8000, 8001), pods, vllm)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(eps)
	want := `[{"name":"a-r0","address":"http://[fd00::1]:8000","events":{"zmq":["tcp://[fd00::1]:5557"]}},` +
		`{"name":"a-r1","address":"http://[fd00::1]:8001","events":{"zmq":["tcp://[fd00::1]:5558"]}},` +
		`{"name":"b-r0","address":"http://10.0.0.2:8000","role":"prefill","events":{"zmq":["tcp://10.0.0.2:6000"],"replay":["tcp://10.0.0.2:6100"]}},` +
		`{"name":"b-r1","address":"http://10.0.0.2:8001","role":"prefill","events":{"zmq":["tcp://10.0.0.2:6001"],"replay":["tcp://10.0.0.2:6101"]}}]`
	if string(got) != want {
		t.Fatalf("endpoints\n got %s\nwant %s", got, want)
	}
	eps, err = discovery.Endpoints(poolObj(8000), pods[:1], trt)
	if err != nil || len(eps) != 1 || eps[0].Name != "b" || eps[0].Events.Drain != "http://10.0.0.2:8000" || len(eps[0].Events.ZMQ) != 0 {
		t.Fatalf("TensorRT-LLM drains over HTTP from the endpoint's address: %+v, %v", eps, err)
	}
	for ann, want := range map[string]string{discovery.AnnotationRole: "kvexact.io/role", discovery.AnnotationEventsPort: "kvexact.io/events-port"} {
		bad := pod("bad", "10.0.0.5", true, app, map[string]string{ann: "nonsense"})
		if _, err := discovery.Endpoints(poolObj(8000), []*corev1.Pod{bad}, vllm); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "llm/bad") {
			t.Fatalf("a bad %s annotation must be an error naming it and the pod, got %v", ann, err)
		}
	}
	if _, err := discovery.Endpoints(poolObj(), pods, vllm); err == nil || !strings.Contains(err.Error(), "targetPorts") {
		t.Fatalf("no target ports: %v", err)
	}
}

// freePorts finds n consecutive free TCP ports on 127.0.0.1 (ZeroMQ ranks publish on base + rank).
func freePorts(t *testing.T, n int) int {
	for try := 0; try < 50; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := l.Addr().(*net.TCPAddr).Port
		l.Close()
		ok := base+n < 65535
		for i := 0; ok && i < n; i++ {
			if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i)); err != nil {
				ok = false
			} else {
				l.Close()
			}
		}
		if ok {
			return base
		}
	}
	t.Fatal("no consecutive free ports")
	return 0
}

// TestMain stops the package's API server (kubetest) after the tests.
func TestMain(m *testing.M) { kubetest.Main(m) }

// TestKubernetesDiscovery runs the informers against client-go's fake clientsets and against a
// real API server, with a real gateway and two simulators standing for the two data-parallel
// ranks of one pod: pods and the pool added, changed and removed move the router's candidates and
// the event subscriptions.
func TestKubernetesDiscovery(t *testing.T) {
	kubetest.Each(t, "llm", testKubernetesDiscovery)
}

func testKubernetesDiscovery(t *testing.T, c kubetest.Cluster) {
	toks := tokenize.NewPool("")
	tok, err := toks.Get("llama3")
	if err != nil {
		t.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seed := "0"
	zmq := freePorts(t, 2)
	var sims []*sim.Engine
	var httpPorts []int32
	for r := 0; r < 2; r++ {
		e, err := sim.New(sim.Config{Family: "vllm", Release: "v0.25.1", Model: "llama3", Tokenizer: tok, ServedModelName: "llama3",
			Endpoint: fmt.Sprintf("rank%d", r), Seed: &seed, PublishAddr: fmt.Sprintf("tcp://*:%d", zmq+r)})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		sims = append(sims, e)
		_, port, _ := strings.Cut(strings.TrimPrefix(e.URL(), "http://"), ":")
		var n int32
		fmt.Sscan(port, &n)
		httpPorts = append(httpPorts, n)
	}
	cfg := &rules.Config{Listen: "127.0.0.1:0", Admin: rules.Admin{Listen: "127.0.0.1:0", Token: "t"}, Rules: []rules.Rule{{
		Name: "pool", Models: []string{"llama3"}, Engine: rules.EngineRef{Family: "vllm", Release: "v0.25.1"}, KVExactMode: 3, Seed: &seed, Selector: "chwbl",
		Endpoints: []rules.Endpoint{{Name: "placeholder", Address: "http://127.0.0.1:1", AdminDown: true}},
	}}}
	if err := cfg.Normalize(); err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(gateway.Options{Config: cfg, Tokenizers: toks, Registry: prometheus.NewRegistry(), ProbeInterval: -1, ReprobeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	pool := poolObj(httpPorts...)
	if err := c.CreateInferencePool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	d, err := discovery.New(discovery.Config{Store: g.Store(), Rule: "pool", Namespace: c.Namespace, Pool: "llama", Kube: c.Kube, Dynamic: c.Dynamic})
	if err != nil {
		t.Fatal(err)
	}
	go d.Run(ctx)
	select {
	case <-d.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("discovery did not sync")
	}

	type view struct{ names, addrs, zmq, up string }
	current := func() view {
		rt, _ := g.Router("pool")
		var v view
		r, _ := g.Store().Get("pool")
		if len(r.Endpoints) != len(rt.Endpoints()) {
			// The store moved on between the two reads: the router has not applied it yet.
			return view{names: "(router behind the store)"}
		}
		for i, e := range rt.Endpoints() {
			v.names += e.Name + " "
			v.addrs += e.Address + " "
			v.zmq += strings.Join(r.Endpoints[i].Events.ZMQ, ",") + " "
			if e.Health.Excluded() == health.NotExcluded {
				v.up += e.Name + " "
			}
		}
		return v
	}
	waitFor := func(what string, ok func(view) bool) view {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			v := current()
			if ok(v) {
				return v
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the rule's endpoints are %+v", what, v)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("no pod yet: only the placeholder, down", func(v view) bool { return v.names == "placeholder " && v.up == "" })

	app := map[string]string{"app": "llm"}
	ann := map[string]string{discovery.AnnotationEventsPort: fmt.Sprint(zmq)}
	if _, err := c.CreatePod(ctx, pod("p1", "127.0.0.1", true, app, ann)); err != nil {
		t.Fatal(err)
	}
	v := waitFor("pod p1 ready", func(v view) bool { return v.up == "p1-r0 p1-r1 " })
	wantZMQ := fmt.Sprintf("tcp://127.0.0.1:%d tcp://127.0.0.1:%d ", zmq, zmq+1)
	if v.zmq != wantZMQ || v.addrs != fmt.Sprintf("http://127.0.0.1:%d http://127.0.0.1:%d ", httpPorts[0], httpPorts[1]) {
		t.Fatalf("pod × target port: %+v (want events %s)", v, wantZMQ)
	}
	// The subscriptions follow: each rank's events reach the inventory under its endpoint.
	for r, name := range []string{"p1-r0", "p1-r1"} {
		subscribed(t, g, sims[r], name)
	}

	// Pod changes are membership changes: the endpoints that stay keep their inventory (the
	// simulators publish nothing more here, so a rebuilt runtime would hold nothing). pa shares
	// p1's IP (so its ranks are the same two simulators, under other names): it joins, subscribed
	// anew, and leaves again while p1 keeps its blocks.
	held := func(name string) int { keys, _ := g.Inventory("pool", name); return len(keys) }
	h0, h1 := held("p1-r0"), held("p1-r1")
	if _, err := c.CreatePod(ctx, pod("pa", "127.0.0.1", true, app, ann)); err != nil {
		t.Fatal(err)
	}
	waitFor("pod pa joins", func(v view) bool { return v.up == "p1-r0 p1-r1 pa-r0 pa-r1 " })
	if held("p1-r0") < h0 || held("p1-r1") < h1 {
		t.Fatalf("pa joined and p1 lost its inventory: %d and %d blocks, %d and %d before", held("p1-r0"), held("p1-r1"), h0, h1)
	}
	subscribed(t, g, sims[0], "pa-r0")
	h0, h1 = held("p1-r0"), held("p1-r1")
	if err := c.DeletePod(ctx, "pa"); err != nil {
		t.Fatal(err)
	}
	waitFor("pod pa leaves", func(v view) bool { return v.up == "p1-r0 p1-r1 " })
	if held("p1-r0") < h0 || held("p1-r1") < h1 {
		t.Fatalf("pa left and p1 lost its inventory: %d and %d blocks, %d and %d before", held("p1-r0"), held("p1-r1"), h0, h1)
	}
	if _, ok := g.Inventory("pool", "pa-r0"); ok {
		t.Fatal("pa-r0 left but is still in the inventory")
	}

	// Not ready: nothing eligible (the picker then answers 503); the inventory stays.
	if err := c.SetPodStatus(ctx, "p1", func(s *corev1.PodStatus) { s.Conditions[0].Status = corev1.ConditionFalse }); err != nil {
		t.Fatal(err)
	}
	waitFor("pod p1 not ready", func(v view) bool { return v.up == "" && v.names == "p1-r0 p1-r1 " })
	if held("p1-r0") < h0 {
		t.Fatalf("p1 not ready lost its inventory: %d blocks, %d before", held("p1-r0"), h0)
	}

	// A pod the selector does not match changes nothing; relabelled, it joins; p1 deleted leaves.
	if _, err := c.CreatePod(ctx, pod("p2", "127.0.0.1", true, map[string]string{"app": "else"}, ann)); err != nil {
		t.Fatal(err)
	}
	if err := c.DeletePod(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetPodLabels(ctx, "p2", app); err != nil {
		t.Fatal(err)
	}
	waitFor("p2 replaces p1", func(v view) bool { return v.up == "p2-r0 p2-r1 " })
	subscribed(t, g, sims[1], "p2-r1")

	// The pool drops its second target port: one endpoint per pod.
	if err := c.SetInferencePoolPorts(ctx, "llama", pool.Spec.TargetPorts[:1]); err != nil {
		t.Fatal(err)
	}
	waitFor("one target port", func(v view) bool { return v.up == "p2 " })
	if s := d.Stats(); s.Rejected != 0 {
		t.Fatalf("the store refused a rewrite: %+v", s)
	}
}

// subscribed sends the rank's engine prompts directly until the gateway's inventory shows them
// under the endpoint name discovery gave it.
func subscribed(t *testing.T, g *gateway.Gateway, e *sim.Engine, name string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for n := 0; ; n++ {
		if keys, _ := g.Inventory("pool", name); len(keys) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoint %s: no event reached the inventory within 15s", name)
		}
		body, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": strings.Repeat(fmt.Sprintf("discovery warm up %s %d. ", name, n), 8), "max_tokens": 1})
		if resp, err := http.Post(e.URL()+"/v1/completions", "application/json", bytes.NewReader(body)); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		time.Sleep(50 * time.Millisecond)
	}
}
