package main

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kvexact/kvexact/ctk/certificate"
)

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestSIGHUPReloadsCertificates: the running gateway re-reads its --certificate file on SIGHUP; the
// admin status shows the renewed certificate without a restart.
func TestSIGHUPReloadsCertificates(t *testing.T) {
	dir := t.TempDir()
	admin, listen := freePort(t), freePort(t)
	cfg := filepath.Join(dir, "gateway.yaml")
	os.WriteFile(cfg, []byte(`listen: `+listen+`
admin: {listen: "`+admin+`", token: tok}
rules:
  - name: r
    models: [m]
    engine: {family: vllm, release: v0.25.1}
    kvExactMode: 0
    endpoints: [{name: e0, address: "http://127.0.0.1:1"}]
`), 0o644)
	p := certificate.Profile{Family: "vllm", Contract: "vllm-kv-map-v2", Model: "m", BlockSize: 16, Binding: "auto", Algorithm: "sha256"}
	first := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	c := &certificate.Certificate{Format: certificate.FormatVersion, Profile: p, ProfileDigest: p.Digest(), IssuedAt: time.Now(), ExpiresAt: first}
	cert := filepath.Join(dir, "cert.json")
	if err := c.Write(cert); err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"--config", cfg, "--certificate", cert, "--probe-interval", "0", "--reprobe-interval", "0", "--log-level", "error"})
	}()
	expires := func() (time.Time, bool) {
		req, _ := http.NewRequest("GET", "http://"+admin+"/admin/status", nil)
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return time.Time{}, false
		}
		defer resp.Body.Close()
		var st struct {
			CertificateStatus []struct {
				ExpiresAt time.Time `json:"expires_at"`
			} `json:"certificate_status"`
		}
		if json.NewDecoder(resp.Body).Decode(&st) != nil || len(st.CertificateStatus) != 1 {
			return time.Time{}, false
		}
		return st.CertificateStatus[0].ExpiresAt, true
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			select {
			case code := <-done:
				t.Fatalf("gateway exited %d while waiting for %s", code, what)
			default:
			}
			if cond() {
				return
			}
		}
		t.Fatalf("timed out waiting for %s", what)
	}
	wait("the admin status", func() bool { e, ok := expires(); return ok && e.Equal(first) })
	renewed := first.Add(24 * time.Hour)
	c.ExpiresAt = renewed
	if err := c.Write(cert); err != nil {
		t.Fatal(err)
	}
	// The gateway is serving, so its SIGHUP handler is installed (run leaves it only on return).
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	wait("the renewed certificate", func() bool { e, ok := expires(); return ok && e.Equal(renewed) })
	syscall.Kill(os.Getpid(), syscall.SIGINT)
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("gateway exited %d", code)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("gateway did not stop on SIGINT")
	}
}
