package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway/discovery"
	"github.com/kvexact/kvexact/gateway/tokenize"
	"github.com/kvexact/kvexact/internal/kubetest"
	inferencev1 "github.com/kvexact/kvexact/third_party/gateway-api-inference-extension/api/v1"
)

// TestMain stops the package's API server (kubetest) after the tests.
func TestMain(m *testing.M) { kubetest.Main(m) }

// TestCertifyFromInferencePool: ctk certify --from-inferencepool lists the pool's ready pods
// (in client-go's fake clientsets, and on a real API server), certifies them under the names the
// gateway's discovery gives them, writes the pool it certified and stores the certificate, with
// the admission policy, in a Secret; a second run replaces the Secret's content. A pool whose pod
// fails certification leaves the Secret as it was.
func TestCertifyFromInferencePool(t *testing.T) {
	kubetest.Each(t, "llm", testCertifyFromInferencePool)
}

func testCertifyFromInferencePool(t *testing.T, c kubetest.Cluster) {
	tdir, err := tokenize.FindModelDir(tokenize.DefaultRoots(), "llama3")
	if err != nil {
		t.Skipf("the llama3 tokenizer is not available (run make tokenizers or set KVEXACT_TOKENIZERS): %v", err)
	}
	seed := "0"
	e, err := sim.New(sim.Config{Family: "vllm", Release: "v0.25.1", Model: tdir, ServedModelName: "llama3", Seed: &seed,
		PublishAddr: "tcp://*:0", PrefillPerToken: time.Microsecond, DecodePerToken: time.Microsecond, DrainWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	_, port, _ := strings.Cut(strings.TrimPrefix(e.URL(), "http://"), ":")
	_, zport, _ := strings.Cut(strings.TrimPrefix(e.PublishAddrs()[0], "tcp://"), ":")
	var hp int32
	fmt.Sscan(port, &hp)

	ip := &inferencev1.InferencePool{TypeMeta: metav1.TypeMeta{APIVersion: "inference.networking.k8s.io/v1", Kind: "InferencePool"},
		ObjectMeta: metav1.ObjectMeta{Name: "llama", Namespace: "llm"},
		Spec: inferencev1.InferencePoolSpec{Selector: inferencev1.LabelSelector{MatchLabels: map[inferencev1.LabelKey]inferencev1.LabelValue{"app": "llm"}},
			TargetPorts: []inferencev1.Port{{Number: inferencev1.PortNumber(hp)}}}}
	ctx := context.Background()
	if err := c.CreateInferencePool(ctx, ip); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, ann map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: map[string]string{"app": "llm"}, Annotations: ann},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	}
	// The picker's Secret exists with its admin token, which the run must keep.
	if _, err := c.CreatePod(ctx, pod("llm-0", map[string]string{discovery.AnnotationEventsPort: zport})); err != nil {
		t.Fatal(err)
	}
	kube := c.Kube
	if _, err := kube.CoreV1().Secrets(c.Namespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kvexact-certificate", Namespace: c.Namespace},
		Data: map[string][]byte{"token": []byte("admin-token")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	old := kubeClients
	kubeClients = func(string) (kubernetes.Interface, dynamic.Interface, error) { return kube, c.Dynamic, nil }
	t.Cleanup(func() { kubeClients = old })

	dir := t.TempDir()
	profile := filepath.Join(dir, "profile.yaml")
	if err := os.WriteFile(profile, []byte(fmt.Sprintf("model: llama3\ntokenizer: %s\nengine: {family: vllm, release: v0.25.1}\nseed: \"0\"\n", tdir)), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func() (int, string) {
		var out, errb bytes.Buffer
		code := certify(context.Background(), []string{"--pool", profile, "--from-inferencepool", "llama", "--namespace", c.Namespace, "--admit", "probe",
			"--secret", "kvexact-certificate", "--write-pool", filepath.Join(dir, "certified-pool.yaml"), "--out", filepath.Join(dir, "out"), "--event-timeout", "2s"}, &out, &errb)
		return code, out.String() + errb.String()
	}
	if code, out := run(); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	sec, err := kube.CoreV1().Secrets(c.Namespace).Get(context.Background(), "kvexact-certificate", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(sec.Data["token"]) != "admin-token" {
		t.Fatalf("the Secret's other keys must stay: %v", sec.Data)
	}
	cert, err := certificate.Parse(sec.Data["certificate.json"], nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cert.Endpoints) != 1 || cert.Endpoints[0].Name != "llm-0" || cert.Endpoints[0].Address != e.URL() || !cert.AdmitsByProbe() {
		t.Fatalf("the Secret's certificate: %+v, admission %+v", cert.Endpoints, cert.Admission)
	}
	if err := ctk.CheckAdmission(cert.Admission); err != nil || !slices.Equal(cert.Admission.Specs, ctk.AdmissionSpecs()) {
		t.Fatalf("the written admission %+v (%v): want every spec an admission runs listed explicitly: %v", cert.Admission, err, ctk.AdmissionSpecs())
	}
	pool, _ := os.ReadFile(filepath.Join(dir, "certified-pool.yaml"))
	if !strings.Contains(string(pool), "name: llm-0") || !strings.Contains(string(pool), e.URL()) {
		t.Fatalf("the written pool lacks the pod:\n%s", pool)
	}

	// A second pod whose events are elsewhere fails certification: the run exits 1 and the
	// Secret keeps the certificate in force.
	if _, err := c.CreatePod(ctx, pod("llm-1", map[string]string{discovery.AnnotationEventsPort: "1"})); err != nil {
		t.Fatal(err)
	}
	if code, out := run(); code != 1 || !strings.Contains(out, "not written") {
		t.Fatalf("exit %d, want 1 with the Secret not written:\n%s", code, out)
	}
	sec2, _ := kube.CoreV1().Secrets(c.Namespace).Get(context.Background(), "kvexact-certificate", metav1.GetOptions{})
	if !bytes.Equal(sec2.Data["certificate.json"], sec.Data["certificate.json"]) || sec2.ResourceVersion != sec.ResourceVersion {
		t.Fatalf("a failed run replaced the Secret (resource version %s, %s before)", sec2.ResourceVersion, sec.ResourceVersion)
	}
}
