package discovery_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/discovery"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
	"github.com/kvexact/kvexact/internal/kubetest"
	inferencev1 "github.com/kvexact/kvexact/third_party/gateway-api-inference-extension/api/v1"
)

// TestKubernetesAdmission: the certificate comes from ctk certify --admit probe run once against
// one engine (the CI gate); the InferencePool's pods (in client-go's fake clientsets, and on a
// real API server where pods are API objects whose status the test writes as the kubelet would)
// then join without anyone re-running ctk. A pod's two ranks are two simulators: rank 0 is configured like
// the certified engine and is admitted by the gateway's probe on join, rank 1 runs another block
// size and is refused naming it. The pod replaced by another (a rollout) is admitted anew under
// its new name, after its engine restarts (the pod not ready, then ready again) it is probed and
// admitted again, as it is when the pod is recreated under the same name (a new UID); rank 1's
// engine replaced by one with another seed is refused naming the seed; and when the address
// changes under the same name it is probed at the new one.
func TestKubernetesAdmission(t *testing.T) {
	kubetest.Each(t, "llm", testKubernetesAdmission)
}

func testKubernetesAdmission(t *testing.T, c kubetest.Cluster) {
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
		c := sim.Config{Family: "vllm", Release: "v0.25.1", Model: "llama3", Tokenizer: tok, ServedModelName: "llama3",
			Endpoint: fmt.Sprintf("rank%d", r), Seed: &seed, PublishAddr: fmt.Sprintf("tcp://*:%d", zmq+r), DrainWait: 50 * time.Millisecond}
		if r == 1 {
			c.BlockSize = 32
		}
		e, err := sim.New(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(ctx); err != nil {
			t.Fatal(err)
		}
		sims = append(sims, e)
		_, port, _ := strings.Cut(strings.TrimPrefix(e.URL(), "http://"), ":")
		var n int32
		fmt.Sscan(port, &n)
		httpPorts = append(httpPorts, n)
	}
	defer func() {
		for _, e := range sims {
			e.Close()
		}
	}()

	// The CI gate: ctk certify --admit probe against rank 0, under a name no pod has.
	pool, err := ctk.ParsePool([]byte(fmt.Sprintf("model: llama3\nengine: {family: vllm, release: v0.25.1}\nseed: \"0\"\nendpoints:\n  - name: ci-gate\n    address: %s\n    events: {zmq: [%s]}\n",
		sims[0].URL(), sims[0].PublishAddrs()[0])))
	if err != nil {
		t.Fatal(err)
	}
	adm, err := ctk.NewAdmission(certificate.AdmitProbe, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	res, err := ctk.Certify(ctx, pool, ctk.Options{Tokenizer: tok, Admission: adm, EventTimeout: 2 * time.Second, SubscribeTimeout: 3 * time.Second})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("the CI gate's certification: %v %+v", err, res)
	}

	cfg := &rules.Config{Listen: "127.0.0.1:0", Admin: rules.Admin{Listen: "127.0.0.1:0", Token: "t"}, Rules: []rules.Rule{{
		Name: "pool", Models: []string{"llama3"}, Engine: rules.EngineRef{Family: "vllm", Release: "v0.25.1"}, KVExactMode: 3, Seed: &seed, Selector: "chwbl",
		Endpoints: []rules.Endpoint{{Name: "placeholder", Address: "http://127.0.0.1:1", AdminDown: true}},
	}}}
	if err := cfg.Normalize(); err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(gateway.Options{Config: cfg, Tokenizers: toks, Registry: prometheus.NewRegistry(), ProbeInterval: -1, ReprobeInterval: -1,
		Certificates: res.Certificates, AdmissionBackoff: 200 * time.Millisecond, AdmissionEventTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	ip := poolObj(httpPorts...)
	if err := c.CreateInferencePool(ctx, ip); err != nil {
		t.Fatal(err)
	}
	d, err := discovery.New(discovery.Config{Store: g.Store(), Rule: "pool", Namespace: c.Namespace, Pool: "llama", Kube: c.Kube, Dynamic: c.Dynamic})
	if err != nil {
		t.Fatal(err)
	}
	go d.Run(ctx)
	<-d.Synced()

	status := func(name string) (gateway.EndpointStatus, bool) {
		for _, e := range g.Status().Rules[0].Endpoints {
			if e.Name == name {
				return e, true
			}
		}
		return gateway.EndpointStatus{}, false
	}
	wait := func(name, what string, ok func(gateway.EndpointStatus) bool) gateway.EndpointStatus {
		t.Helper()
		var last gateway.EndpointStatus
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if e, found := status(name); found {
				if last = e; ok(e) {
					return e
				}
			}
		}
		t.Fatalf("%s: %s not reached: certified %q, admission %+v, exact %+v", name, what, last.Certified, last.Admission, last.Exact)
		return last
	}
	admitted := func(e gateway.EndpointStatus) bool {
		return strings.Contains(e.Certified, "admitted by probe at") && e.Exact != nil && e.Exact.State == "eligible"
	}
	refusedBlockSize := func(e gateway.EndpointStatus) bool {
		return e.Admission != nil && len(e.Admission.FailedLegs) > 0 && e.Admission.FailedLegs[0] == ctk.LegBlockSize && e.Exact.State == "uncertified"
	}

	app := map[string]string{"app": "llm"}
	ann := map[string]string{discovery.AnnotationEventsPort: fmt.Sprint(zmq)}
	if _, err := c.CreatePod(ctx, pod("p1", "127.0.0.1", true, app, ann)); err != nil {
		t.Fatal(err)
	}
	first := wait("p1-r0", "admitted on join", admitted)
	wait("p1-r1", "refused naming the block size", refusedBlockSize)

	// A rollout replaces p1 by p2: p2's endpoints are new names, admitted (or refused) anew.
	if err := c.DeletePod(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreatePod(ctx, pod("p2", "127.0.0.1", true, app, ann)); err != nil {
		t.Fatal(err)
	}
	replaced := wait("p2-r0", "admitted after the rollout", admitted)
	if !replaced.Admission.Admitted.After(first.Admission.Admitted) {
		t.Fatalf("p2-r0 carries p1-r0's admission: %+v", replaced.Admission)
	}
	wait("p2-r1", "refused naming the block size", refusedBlockSize)
	if _, ok := status("p1-r0"); ok {
		t.Fatal("p1 left but is still listed")
	}

	// p2's engine restarts: the pod goes not ready, a new process starts on the same ports, the
	// pod is ready again with its container's restart counted (the same pod, the same UID). The
	// restart is seen on the event stream and the admission is probed again.
	if err := c.SetPodStatus(ctx, "p2", func(s *corev1.PodStatus) { s.Conditions[0].Status = corev1.ConditionFalse }); err != nil {
		t.Fatal(err)
	}
	n, err := sim.Restart(ctx, sims[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	sims[0] = n
	if err := c.SetPodStatus(ctx, "p2", func(s *corev1.PodStatus) {
		s.Conditions[0].Status = corev1.ConditionTrue
		s.ContainerStatuses = []corev1.ContainerStatus{{Name: "engine", Image: "engine.invalid/engine:test", Ready: true, RestartCount: 1,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	}); err != nil {
		t.Fatal(err)
	}
	// The restart is seen on the stream once the new process publishes.
	subscribed(t, g, n, "p2-r0")
	again := wait("p2-r0", "admitted again after the restart", func(e gateway.EndpointStatus) bool {
		return admitted(e) && e.Admission.Admitted.After(replaced.Admission.Admitted) && e.Exact.Restarts > 0
	})

	// p2 is deleted and created again under the same name (a StatefulSet's pod: a new UID, the
	// same name and address) with a new engine process: the endpoint list may not change at all
	// between the two informer events, so the new process is known from its event stream, and it
	// is probed and admitted again.
	oldUID := func() string {
		p, _ := c.Kube.CoreV1().Pods(c.Namespace).Get(ctx, "p2", metav1.GetOptions{})
		return string(p.UID)
	}()
	if err := c.DeletePod(ctx, "p2"); err != nil {
		t.Fatal(err)
	}
	if n, err = sim.Restart(ctx, sims[0], nil); err != nil {
		t.Fatal(err)
	}
	sims[0] = n
	recreated, err := c.CreatePod(ctx, pod("p2", "127.0.0.1", true, app, ann))
	if err != nil {
		t.Fatal(err)
	}
	if c.Config != nil && string(recreated.UID) == oldUID {
		t.Fatalf("p2 recreated with its old UID %s", oldUID)
	}
	subscribed(t, g, n, "p2-r0")
	again = wait("p2-r0", "admitted again after it was recreated", func(e gateway.EndpointStatus) bool {
		return admitted(e) && e.Admission.Admitted.After(again.Admission.Admitted) && e.Exact.Restarts > again.Exact.Restarts
	})

	// Rank 1's engine is replaced by one with the certified block size but another hash seed:
	// still refused, now naming the seed.
	if sims[1], err = sim.Restart(ctx, sims[1], func(sc *sim.Config) { other := "1"; sc.Seed, sc.BlockSize = &other, 0 }); err != nil {
		t.Fatal(err)
	}
	wait("p2-r1", "refused naming the seed", func(e gateway.EndpointStatus) bool {
		return e.Admission != nil && len(e.Admission.FailedLegs) > 0 && e.Admission.FailedLegs[0] == ctk.LegSeed && e.Exact.State == "uncertified"
	})

	// p2-r0 moves to another address under the same name (what a pod's new IP looks like to the
	// gateway): the engine on rank 0's event port now serves HTTP elsewhere, and the pool's target
	// port follows. The admission does not follow the name; the new address is probed.
	sims[0].Close()
	moved, err := sim.New(sim.Config{Family: "vllm", Release: "v0.25.1", Model: "llama3", Tokenizer: tok, ServedModelName: "llama3",
		Endpoint: "moved", Seed: &seed, PublishAddr: fmt.Sprintf("tcp://*:%d", zmq), DrainWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := moved.Start(ctx); err != nil {
		t.Fatal(err)
	}
	sims[0] = moved
	_, port, _ := strings.Cut(strings.TrimPrefix(moved.URL(), "http://"), ":")
	var np int32
	fmt.Sscan(port, &np)
	ip.Spec.TargetPorts[0].Number = inferencev1.PortNumber(np)
	if err := c.SetInferencePoolPorts(ctx, "llama", ip.Spec.TargetPorts); err != nil {
		t.Fatal(err)
	}
	wait("p2-r0", "admitted at its new address", func(e gateway.EndpointStatus) bool {
		return admitted(e) && e.Address == moved.URL() && e.Admission.Admitted.After(again.Admission.Admitted)
	})
}

// TestKubernetesAdmissionRefusesTensorRTLLM: TensorRT-LLM's events are drained over HTTP by one
// consumer, which is the gateway's own ingest, so the gateway's probe cannot run the event specs
// an admission requires. ctk certify --admit probe refuses such a pool as unusable input, and a
// gateway refuses a TensorRT-LLM certificate that says admit probe (at start and on reload)
// naming the drained events and ctk certify, before any pod could be admitted by it; the same
// certificate without the policy is taken.
func TestKubernetesAdmissionRefusesTensorRTLLM(t *testing.T) {
	toks := tokenize.NewPool("")
	tok, err := toks.Get("llama3")
	if err != nil {
		t.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, err := sim.New(sim.Config{Family: "trtllm", Release: "1.2", Model: "llama3", Tokenizer: tok, ServedModelName: "llama3", Endpoint: "ci", DrainWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	pool, err := ctk.ParsePool([]byte(fmt.Sprintf("model: llama3\nengine: {family: trtllm, release: \"1.2\"}\nendpoints:\n  - name: ci-gate\n    address: %s\n    events: {drain: %s}\n",
		e.URL(), e.URL())))
	if err != nil {
		t.Fatal(err)
	}
	adm, err := ctk.NewAdmission(certificate.AdmitProbe, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	opts := ctk.Options{Tokenizer: tok, Admission: adm, EventTimeout: 2 * time.Second, SubscribeTimeout: 3 * time.Second}
	if _, err := ctk.Certify(ctx, pool, opts); err == nil || !strings.Contains(err.Error(), "drained over HTTP by one consumer") {
		t.Fatalf("ctk certify --admit probe of a TensorRT-LLM pool: %v, want it refused naming the drained events", err)
	}
	opts.Admission = nil
	res, err := ctk.Certify(ctx, pool, opts)
	if err != nil || len(res.Certificates) != 1 || res.ExitCode != 0 {
		t.Fatalf("the CI gate's certification: %v %+v", err, res)
	}

	cfg := &rules.Config{Listen: "127.0.0.1:0", Admin: rules.Admin{Listen: "127.0.0.1:0", Token: "t"}, Rules: []rules.Rule{{
		Name: "pool", Models: []string{"llama3"}, Engine: rules.EngineRef{Family: "trtllm", Release: "1.2"}, KVExactMode: 3, Selector: "chwbl",
		Endpoints: []rules.Endpoint{{Name: "placeholder", Address: "http://127.0.0.1:1", AdminDown: true}},
	}}}
	if err := cfg.Normalize(); err != nil {
		t.Fatal(err)
	}
	admitting := *res.Certificates[0]
	admitting.Admission = adm // the policy is outside the profile: an unsigned file edited so
	gopts := gateway.Options{Config: cfg, Tokenizers: toks, Registry: prometheus.NewRegistry(), ProbeInterval: -1, ReprobeInterval: -1,
		Certificates: []*certificate.Certificate{&admitting}}
	if _, err := gateway.New(gopts); err == nil || !strings.Contains(err.Error(), "drained over HTTP by one consumer") || !strings.Contains(err.Error(), "ctk certify") {
		t.Fatalf("a gateway started with a TensorRT-LLM certificate that admits by probe: %v, want it refused naming the drained events and ctk certify", err)
	}
	gopts.Certificates = res.Certificates
	g, err := gateway.New(gopts)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.SetCertificates([]*certificate.Certificate{&admitting}); err == nil || !strings.Contains(err.Error(), "drained over HTTP") {
		t.Fatalf("a reload to a TensorRT-LLM certificate that admits by probe: %v, want it refused", err)
	}
}
