// Package kubetest runs a real Kubernetes API server for tests: the pinned etcd and kube-apiserver
// that scripts/kube-apiserver.sh builds into .cache/kube/bin, on free 127.0.0.1 ports with their
// data in a temporary folder, a static bearer token in system:masters, and service-account keys
// generated for the run. No kubelet, scheduler or controller manager runs: pods are API objects
// whose status the test writes through the status subresource.
//
// One API server serves a whole test package: Shared starts it on first use and Main (called from
// the package's TestMain) stops it. When the binaries are absent the test skips naming the script
// (fails under CI=true, which .ci/run sets).
package kubetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/kvexact/kvexact/internal/lateport"
)

// StartTimeout bounds etcd's and the API server's start (each); a loaded two-core machine takes
// a few seconds for both.
const StartTimeout = 120 * time.Second

//go:embed inferencepool-crd.yaml
var inferencePoolCRD []byte

// Server is a running etcd and kube-apiserver.
type Server struct {
	// Config reaches the API server as a cluster administrator (a static token in system:masters).
	Config  *rest.Config
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface

	dir   string
	procs []*exec.Cmd
	logs  []string
}

var (
	shared    *Server
	sharedErr error
	once      sync.Once
	stopped   bool
	mu        sync.Mutex
)

// Main runs the package's tests, stops the shared API server if one was started, and exits with
// the tests' code: the whole of a TestMain. (Without it the processes still die with the test
// binary, but their temporary folder stays.)
func Main(m *testing.M) {
	code := m.Run()
	mu.Lock()
	stopped = true
	if shared != nil {
		shared.stop()
	}
	mu.Unlock()
	os.Exit(code)
}

// Shared returns the package's API server, starting it on first use. It skips t (fails it under
// CI=true) when the binaries are not built.
func Shared(t testing.TB) *Server {
	t.Helper()
	etcd, apiserver, err := binaries()
	if err != nil {
		const hint = "run scripts/kube-apiserver.sh (builds the pinned kube-apiserver and etcd into .cache/kube/bin; .ci/run does)"
		if os.Getenv("CI") != "" {
			t.Fatalf("%v: %s", err, hint)
		}
		t.Skipf("%v: %s", err, hint)
	}
	once.Do(func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			sharedErr = errors.New("kubetest: the package's tests are over")
			return
		}
		began := time.Now()
		if shared, sharedErr = start(etcd, apiserver); sharedErr == nil {
			t.Logf("kubetest: etcd and kube-apiserver ready at %s in %.1f s", shared.Config.Host, time.Since(began).Seconds())
		}
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// binaries finds etcd and kube-apiserver in the repository's .cache/kube/bin, else on PATH.
func binaries() (etcd, apiserver string, err error) {
	for d, _ := os.Getwd(); ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			bin := filepath.Join(d, ".cache", "kube", "bin")
			if executable(filepath.Join(bin, "etcd")) && executable(filepath.Join(bin, "kube-apiserver")) {
				return filepath.Join(bin, "etcd"), filepath.Join(bin, "kube-apiserver"), nil
			}
			break
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	etcd, err1 := exec.LookPath("etcd")
	apiserver, err2 := exec.LookPath("kube-apiserver")
	if err1 != nil || err2 != nil {
		return "", "", errors.New("kube-apiserver and etcd not found in .cache/kube/bin nor on PATH")
	}
	return etcd, apiserver, nil
}

func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// freePort is a port for etcd or the API server, which bind it only after they start: outside the
// kernel's ephemeral range, where no other listener's ":0" takes it meanwhile.
func freePort() (int, error) { return lateport.Pick("127.0.0.1", 1) }

func start(etcdBin, apiserverBin string) (s *Server, err error) {
	dir, err := os.MkdirTemp("", "kubetest-")
	if err != nil {
		return nil, err
	}
	s = &Server{dir: dir}
	defer func() {
		if err != nil {
			s.kill() // an exiting process flushes its log
			err = fmt.Errorf("%w\n%s", err, s.tail())
			s.stop()
		}
	}()
	var ports [3]int
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return s, err
		}
	}
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	if err := s.run(etcdBin, "etcd",
		"--name", "kubetest", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "kubetest="+peerURL, "--unsafe-no-fsync", "--log-level", "warn"); err != nil {
		return s, err
	}
	if err := waitHTTP(http.DefaultClient, clientURL+"/health", "", s.procs[0]); err != nil {
		return s, fmt.Errorf("etcd: %w", err)
	}

	token, err := secret(16)
	if err != nil {
		return s, err
	}
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+`,kubetest-admin,kubetest-admin,"system:masters"`+"\n"), 0o600); err != nil {
		return s, err
	}
	saKey, saPub := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := serviceAccountKeys(saKey, saPub); err != nil {
		return s, err
	}
	certDir := filepath.Join(dir, "pki")
	if err := s.run(apiserverBin, "kube-apiserver",
		"--etcd-servers", clientURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", fmt.Sprint(ports[2]),
		// The reconciler of the kubernetes Service's endpoints refuses a loopback address; nothing
		// here reaches the API server through that Service.
		"--endpoint-reconciler-type", "none",
		"--cert-dir", certDir, // a self-signed serving certificate for 127.0.0.1, made at start
		"--token-auth-file", tokens, "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", saPub, "--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", "10.96.0.0/24",
		"--v", "1"); err != nil {
		return s, err
	}
	host := fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	// The serving certificate is written at start: read it once it exists, then trust only it.
	caFile := filepath.Join(certDir, "apiserver.crt")
	var ca []byte
	for deadline := time.Now().Add(StartTimeout); ; time.Sleep(50 * time.Millisecond) {
		if ca, err = os.ReadFile(caFile); err == nil && bytes.Contains(ca, []byte("END CERTIFICATE")) {
			break
		}
		if exited(s.procs[1]) {
			return s, errors.New("kube-apiserver exited before writing its serving certificate")
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("kube-apiserver wrote no serving certificate in %s", StartTimeout)
		}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return s, fmt.Errorf("%s: no certificate", caFile)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if err := waitHTTP(hc, host+"/readyz", token, s.procs[1]); err != nil {
		return s, fmt.Errorf("kube-apiserver: %w", err)
	}
	s.Config = &rest.Config{Host: host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: ca}, QPS: 200, Burst: 400}
	if s.Kube, err = kubernetes.NewForConfig(s.Config); err != nil {
		return s, err
	}
	if s.Dynamic, err = dynamic.NewForConfig(s.Config); err != nil {
		return s, err
	}
	if err := s.installCRD(inferencePoolCRD); err != nil {
		return s, err
	}
	return s, nil
}

// run starts a process whose output goes to a log file in the server's folder. It dies with the
// test binary even when Main is not reached (a panic, a killed test).
func (s *Server) run(bin, name string, args ...string) error {
	logPath := filepath.Join(s.dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", name, err)
	}
	f.Close()
	go cmd.Wait() // reaps it; ProcessState says it exited
	s.procs = append(s.procs, cmd)
	s.logs = append(s.logs, logPath)
	return nil
}

func exited(c *exec.Cmd) bool {
	if c.Process == nil {
		return true
	}
	// Signal 0 checks the process is there without disturbing it.
	return c.Process.Signal(syscall.Signal(0)) != nil
}

func waitHTTP(hc *http.Client, url, token string, proc *exec.Cmd) error {
	deadline := time.Now().Add(StartTimeout)
	var last string
	for {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if exited(proc) {
			return fmt.Errorf("exited before %s answered 200 (last: %s)", url, last)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not 200 within %s (last: %s)", url, StartTimeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop kills the processes and removes their data.
func (s *Server) stop() {
	s.kill()
	os.RemoveAll(s.dir)
}

// kill ends the processes (the API server first) and waits until they have exited.
func (s *Server) kill() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
		p.Process.Signal(syscall.SIGTERM)
		term := time.Now().Add(5 * time.Second)
		for !exited(p) && time.Now().Before(term.Add(5*time.Second)) {
			if time.Now().After(term) {
				p.Process.Kill()
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// tail is the end of each process's log, for a start that failed.
func (s *Server) tail() string {
	var b bytes.Buffer
	for _, p := range s.logs {
		out, _ := os.ReadFile(p)
		if len(out) > 4000 {
			out = out[len(out)-4000:]
		}
		fmt.Fprintf(&b, "--- %s:\n%s\n", filepath.Base(p), out)
	}
	return b.String()
}

func secret(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// serviceAccountKeys writes a P-256 key pair: the API server signs service-account tokens with
// it (it refuses to start without one).
func serviceAccountKeys(keyPath, pubPath string) error {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installCRD creates a CustomResourceDefinition and waits until its resource is served.
func (s *Server) installCRD(manifest []byte) error {
	var u unstructured.Unstructured
	if err := yaml.Unmarshal(manifest, &u.Object); err != nil {
		return fmt.Errorf("CRD manifest: %w", err)
	}
	ctx := context.Background()
	if _, err := s.Dynamic.Resource(crdResource).Create(ctx, &u, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("CRD %s: %w", u.GetName(), err)
	}
	group, _, _ := unstructured.NestedString(u.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(u.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(u.Object, "spec", "versions")
	version, _, _ := unstructured.NestedString(versions[0].(map[string]any), "name")
	gvr := schema.GroupVersionResource{Group: group, Version: version, Resource: plural}
	var last error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if _, last = s.Dynamic.Resource(gvr).Namespace("default").List(ctx, metav1.ListOptions{}); last == nil {
			return nil
		}
	}
	return fmt.Errorf("CRD %s not served within 30 s: %w", u.GetName(), last)
}

// Namespace creates a namespace of its own for t, with the default service account a pod needs
// (the controller manager, which would make it, does not run here). Namespaces are not deleted:
// nothing finalizes them without the controller manager, and the API server goes away with the
// package's tests.
func (s *Server) Namespace(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	ns, err := s.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "kubetest-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns.Name}}
	if _, err := s.Kube.CoreV1().ServiceAccounts(ns.Name).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return ns.Name
}
