package keypair

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func selfSigned(t *testing.T, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "t"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

func serialOf(t *testing.T, f *Files) int64 {
	t.Helper()
	c, err := x509.ParseCertificate(f.Certificate().Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return c.SerialNumber.Int64()
}

// TestReload: a renewed pair is served after the next look; a broken renewal is reported and the
// previous pair kept; fixing it is picked up again.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	cf, kf := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	write := func(c, k []byte) {
		if err := os.WriteFile(cf, c, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(kf, k, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c1, k1 := selfSigned(t, 1)
	write(c1, k1)
	f, err := Load(cf, kf)
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	f.OnError = func(err error) { errs = append(errs, err) }
	if s := serialOf(t, f); s != 1 {
		t.Fatalf("serial %d", s)
	}
	wait := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for serialOf(t, f) != want {
			if time.Now().After(deadline) {
				t.Fatalf("serial %d never served", want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	c2, k2 := selfSigned(t, 2)
	write(c2, k2)
	wait(2)
	// A certificate whose key does not match: reported, the previous pair stays.
	c3, _ := selfSigned(t, 3)
	write(c3, k2)
	deadline := time.Now().Add(10 * time.Second)
	for len(errs) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a broken renewal was never reported")
		}
		if s := serialOf(t, f); s != 2 {
			t.Fatalf("a broken renewal replaced the pair (serial %d)", s)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(errs[0].Error(), cf) {
		t.Fatalf("the error does not name the files: %v", errs[0])
	}
	c4, k4 := selfSigned(t, 4)
	write(c4, k4)
	wait(4)
	if _, err := Load(filepath.Join(dir, "missing.pem"), kf); err == nil {
		t.Fatal("a missing certificate file loaded")
	}
}
