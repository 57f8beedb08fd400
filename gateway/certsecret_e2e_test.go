package gateway_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/internal/kubetest"
)

// TestE2ECertificateSecretReloads: the certificate lives in a Secret on a real API server and is
// replaced there (as ctk certify --secret replaces it). No kubelet runs here, so the test projects
// each version of the Secret it watches into a Secret volume's layout (a folder per version,
// ..data swapped by rename), as the kubelet does; the gateway, watching its certificate file,
// turns KV-exact off on e0 when the Secret's certificate no longer lists it and on again when the
// original is put back.
func TestE2ECertificateSecretReloads(t *testing.T) {
	c := kubetest.Real(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 3, certify: true, certFile: true,
		gwMod: func(o *gateway.Options) {
			o.CertificateWatch = 20 * time.Millisecond
			b, err := os.ReadFile(o.CertificatePaths[0])
			if err != nil {
				t.Fatal(err)
			}
			sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kvexact-certificate", Namespace: c.Namespace}, Data: map[string][]byte{"certificate.json": b}}
			if _, err := c.Kube.CoreV1().Secrets(c.Namespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			projected := projectSecret(ctx, t, c.Kube, c.Namespace, "kvexact-certificate", dir)
			select {
			case <-projected:
			case <-time.After(30 * time.Second):
				t.Fatal("the Secret was not projected within 30 s")
			}
			o.CertificatePaths = []string{filepath.Join(dir, "certificate.json")}
		}})
	if e := endpointStatus(t, p, "e0"); e.Exact.State != "eligible" {
		t.Fatalf("e0 starts certified: %+v", e.Exact)
	}
	orig, err := os.ReadFile(p.certPath)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := certificate.Load(p.certPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	none := *cert
	none.Endpoints = nil
	emptiedPath := filepath.Join(t.TempDir(), "emptied.json")
	if err := none.Write(emptiedPath); err != nil {
		t.Fatal(err)
	}
	emptied, err := os.ReadFile(emptiedPath)
	if err != nil {
		t.Fatal(err)
	}
	put := func(b []byte) {
		t.Helper()
		sec, err := c.Kube.CoreV1().Secrets(c.Namespace).Get(ctx, "kvexact-certificate", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sec.Data["certificate.json"] = b
		if _, err := c.Kube.CoreV1().Secrets(c.Namespace).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	put(emptied)
	waitStatus(t, p, "e0", "uncertified after the Secret changed", 10*time.Second, func(e gateway.EndpointStatus) bool {
		return e.Exact.State == "uncertified" && strings.Contains(e.Certified, "not in the certificate")
	})
	put(orig)
	waitStatus(t, p, "e0", "certified again", 10*time.Second, func(e gateway.EndpointStatus) bool { return e.Exact.State == "eligible" })
}

// projectSecret watches one Secret and lays each version out in dir as a Secret volume: the keys
// as files in dir/<resourceVersion>/, dir/..data a symlink to that folder replaced by rename, and
// dir/<key> a symlink through ..data. The channel is closed after the first projection.
func projectSecret(ctx context.Context, t *testing.T, kube kubernetes.Interface, namespace, name, dir string) <-chan struct{} {
	t.Helper()
	w, err := kube.CoreV1().Secrets(namespace).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan struct{})
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			sec, ok := ev.Object.(*corev1.Secret)
			if !ok {
				continue
			}
			version := "v" + sec.ResourceVersion
			if err := os.MkdirAll(filepath.Join(dir, version), 0o755); err != nil {
				t.Error(err)
				return
			}
			for k, v := range sec.Data {
				if err := os.WriteFile(filepath.Join(dir, version, k), v, 0o644); err != nil {
					t.Error(err)
					return
				}
			}
			tmp := filepath.Join(dir, "..data_tmp")
			os.Remove(tmp)
			if err := os.Symlink(version, tmp); err != nil {
				t.Error(err)
				return
			}
			if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
				t.Error(err)
				return
			}
			for k := range sec.Data {
				if _, err := os.Lstat(filepath.Join(dir, k)); err != nil {
					os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k))
				}
			}
			select {
			case <-first:
			default:
				close(first)
			}
		}
	}()
	return first
}
