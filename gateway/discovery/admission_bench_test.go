package discovery_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/discovery"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// BenchmarkPodReadyToExact measures, through the InferencePool discovery (fake clientsets) and a
// simulator, the time from a pod's creation in the Ready state to KV-exact being eligible on it,
// and what the admission probe costs the engine. Two variants alternate in each round:
//   - admit-probe: the pod is not in the certificate, which says admit: probe (the gateway runs
//     ctk's specs on it);
//   - listed: the pod is the certificate's own entry (name and address), covered at once — the
//     baseline of discovery and rule application alone.
//
// Reported per pod: ms/ready-to-exact, and for admit-probe the probe's HTTP requests, prompt
// tokens the engine prefilled and blocks left in its prefix cache (the engine's cache is cleared
// before each, as a new pod's is empty).
func BenchmarkPodReadyToExact(b *testing.B) {
	toks := tokenize.NewPool("")
	tok, err := toks.Get("llama3")
	if err != nil {
		b.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seed := "0"
	zmq := freePortsB(b)
	e, err := sim.New(sim.Config{Family: "vllm", Release: "v0.25.1", Model: "llama3", Tokenizer: tok, ServedModelName: "llama3",
		Seed: &seed, PublishAddr: fmt.Sprintf("tcp://*:%d", zmq), DrainWait: 50 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	if err := e.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	_, port, _ := strings.Cut(strings.TrimPrefix(e.URL(), "http://"), ":")
	var hp int32
	fmt.Sscan(port, &hp)

	// The certificate: ctk certify --admit probe on the engine, listed as pod "listed".
	pool, err := ctk.ParsePool([]byte(fmt.Sprintf("model: llama3\nengine: {family: vllm, release: v0.25.1}\nseed: \"0\"\nendpoints:\n  - name: listed\n    address: %s\n    events: {zmq: [%s]}\n",
		e.URL(), fmt.Sprintf("tcp://127.0.0.1:%d", zmq))))
	if err != nil {
		b.Fatal(err)
	}
	adm, _ := ctk.NewAdmission(certificate.AdmitProbe, nil, 0)
	res, err := ctk.Certify(ctx, pool, ctk.Options{Tokenizer: tok, Admission: adm, EventTimeout: 2 * time.Second})
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("certify: %v %+v", err, res)
	}
	cfg := &rules.Config{Listen: "127.0.0.1:0", Admin: rules.Admin{Listen: "127.0.0.1:0", Token: "t"}, Rules: []rules.Rule{{
		Name: "pool", Models: []string{"llama3"}, Engine: rules.EngineRef{Family: "vllm", Release: "v0.25.1"}, KVExactMode: 3, Seed: &seed, Selector: "chwbl",
		Endpoints: []rules.Endpoint{{Name: "placeholder", Address: "http://127.0.0.1:1", AdminDown: true}},
	}}}
	if err := cfg.Normalize(); err != nil {
		b.Fatal(err)
	}
	g, err := gateway.New(gateway.Options{Config: cfg, Tokenizers: toks, Registry: prometheus.NewRegistry(), ProbeInterval: -1, ReprobeInterval: -1,
		Certificates: res.Certificates, AdmissionEventTimeout: 2 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	if err := g.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	ip := poolObj(hp)
	u, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(ip)
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{discovery.PoolResource: "InferencePoolList"}, &unstructured.Unstructured{Object: u})
	kube := kubefake.NewClientset()
	d, err := discovery.New(discovery.Config{Store: g.Store(), Rule: "pool", Namespace: "llm", Pool: "llama", Kube: kube, Dynamic: dyn})
	if err != nil {
		b.Fatal(err)
	}
	go d.Run(ctx)
	<-d.Synced()
	app := map[string]string{"app": "llm"}
	ann := map[string]string{discovery.AnnotationEventsPort: fmt.Sprint(zmq)}

	eligible := func(name string) (gateway.EndpointStatus, bool) {
		for _, s := range g.Status().Rules[0].Endpoints {
			if s.Name == name && s.Exact != nil && s.Exact.State == "eligible" {
				return s, true
			}
		}
		return gateway.EndpointStatus{}, false
	}
	// join creates the pod, waits until KV-exact is eligible on it, deletes it and waits until it
	// is gone; it returns the time to eligible and the pod's admission account.
	join := func(b *testing.B, name string) (time.Duration, *gateway.AdmissionStatus) {
		start := time.Now()
		if _, err := kube.CoreV1().Pods("llm").Create(ctx, pod(name, "127.0.0.1", true, app, ann), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		var st gateway.EndpointStatus
		for ok := false; !ok; st, ok = eligible(name) {
			if time.Since(start) > time.Minute {
				b.Fatalf("%s not eligible within a minute", name)
			}
			time.Sleep(2 * time.Millisecond)
		}
		took := time.Since(start)
		if err := kube.CoreV1().Pods("llm").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if r, _ := g.Store().Get("pool"); len(r.Endpoints) == 1 && r.Endpoints[0].AdminDown || len(r.Endpoints) == 1 && r.Endpoints[0].Name != name {
				break
			}
		}
		return took, st.Admission
	}
	var probeT, listedT time.Duration
	var reqs, tokens, blocks float64
	for i := 0; i < b.N; i++ {
		// A new pod's engine starts with an empty cache.
		if err := e.ClearCache(); err != nil {
			b.Fatal(err)
		}
		t0, b0 := promptTokens(b, e), len(e.CacheKeys(0))
		d, a := join(b, fmt.Sprintf("new-%d", i))
		if a == nil {
			b.Fatal("the new pod was not admitted by probe")
		}
		probeT += d
		reqs += float64(a.Requests)
		tokens += promptTokens(b, e) - t0
		blocks += float64(len(e.CacheKeys(0)) - b0)
		d, _ = join(b, "listed")
		listedT += d
	}
	n := float64(b.N)
	b.ReportMetric(float64(probeT.Milliseconds())/n, "ms-admit-probe/pod")
	b.ReportMetric(float64(listedT.Milliseconds())/n, "ms-listed/pod")
	b.ReportMetric(reqs/n, "probe-requests/pod")
	b.ReportMetric(tokens/n, "probe-prompt-tokens/pod")
	b.ReportMetric(blocks/n, "probe-cache-blocks/pod")
}

func freePortsB(b *testing.B) int {
	var t testing.T
	p := freePorts(&t, 1)
	if t.Failed() {
		b.Fatal("no free port")
	}
	return p
}

// promptTokens reads the simulator's vllm:prompt_tokens_total.
func promptTokens(b *testing.B, e *sim.Engine) float64 {
	resp, err := http.Get(e.URL() + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "vllm:prompt_tokens_total") {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}
