package gateway_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/rules"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a leaf certificate and key (PEM) for 127.0.0.1 (server) or a client.
func (ca *testCA) issue(t *testing.T, serial int64, client bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "kvexact-test"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	if client {
		tmpl.ExtKeyUsage, tmpl.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

func writeTestFile(t *testing.T, path string, b []byte) {
	t.Helper()
	// Written aside and renamed, as certificate managers do: a reader never sees half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// tlsFiles is a server key pair, an admin client CA and the files naming them.
type tlsFiles struct {
	dir, cert, key, clientCA string
	serverCA, clientCAs      *testCA
}

func newTLSFiles(t *testing.T) *tlsFiles {
	t.Helper()
	dir := t.TempDir()
	f := &tlsFiles{dir: dir, cert: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key"), clientCA: filepath.Join(dir, "client-ca.crt"),
		serverCA: newTestCA(t, "server CA"), clientCAs: newTestCA(t, "admin client CA")}
	c, k := f.serverCA.issue(t, 100, false)
	writeTestFile(t, f.cert, c)
	writeTestFile(t, f.key, k)
	writeTestFile(t, f.clientCA, f.clientCAs.pem)
	writeTestFile(t, filepath.Join(dir, "ca.crt"), f.serverCA.pem)
	return f
}

func (f *tlsFiles) roots() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(f.serverCA.cert)
	return p
}

// TestTLSAndHTTP2 serves the client listener over TLS: HTTP/2 is negotiated (ALPN h2) and carries
// completions and streams; HTTP/1.1 over TLS still works; a renewed key pair is served from the
// next handshake on without a restart; the admin listener asks for a client certificate from its CA.
func TestTLSAndHTTP2(t *testing.T) {
	f := newTLSFiles(t)
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, cfgMod: func(c *rules.Config) {
		c.Server.TLS = rules.TLS{CertFile: f.cert, KeyFile: f.key}
		c.Admin.TLS = rules.TLS{CertFile: f.cert, KeyFile: f.key, ClientCAFile: f.clientCA}
	}})
	if !strings.HasPrefix(p.base, "https://") {
		t.Fatalf("client listener at %s", p.base)
	}
	h2 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.roots()}, ForceAttemptHTTP2: true}}
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.roots()}}}
	h1.Transport.(*http.Transport).TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{} // HTTP/1.1 only
	for _, tc := range []struct {
		client *http.Client
		proto  int
		stream bool
	}{{h2, 2, false}, {h2, 2, true}, {h1, 1, false}, {h1, 1, true}} {
		body, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": "hello over TLS", "max_tokens": 4, "stream": tc.stream})
		resp, err := tc.client.Post(p.base+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || resp.ProtoMajor != tc.proto || resp.Header.Get(proxy.HeaderEndpoint) == "" {
			t.Fatalf("HTTP/%d stream=%v: %d proto %s err %v: %s", tc.proto, tc.stream, resp.StatusCode, resp.Proto, err, b)
		}
		if tc.stream && !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			t.Fatalf("HTTP/%d stream incomplete: %q", tc.proto, b)
		}
	}

	serial := func() int64 {
		t.Helper()
		c, err := tls.Dial("tcp", strings.TrimPrefix(p.base, "https://"), &tls.Config{RootCAs: f.roots()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	if s := serial(); s != 100 {
		t.Fatalf("serial %d", s)
	}
	c, k := f.serverCA.issue(t, 200, false)
	writeTestFile(t, f.key, k)
	writeTestFile(t, f.cert, c)
	eventually(t, 10*time.Second, "the renewed certificate to be served", func() bool { return serial() == 200 })

	// Admin: TLS with a required client certificate from the admin client CA.
	adminURL := "https://" + p.srv.Admin + "/admin/status"
	get := func(cl *http.Client) (int, error) {
		req, _ := http.NewRequest("GET", adminURL, nil)
		req.Header.Set("Authorization", "Bearer "+p.token)
		resp, err := cl.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := get(h1); err == nil {
		t.Fatalf("the admin listener answered %d without a client certificate", code)
	}
	cc, ck := f.clientCAs.issue(t, 300, true)
	pair, err := tls.X509KeyPair(cc, ck)
	if err != nil {
		t.Fatal(err)
	}
	withCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.roots(), Certificates: []tls.Certificate{pair}}}}
	if code, err := get(withCert); err != nil || code != 200 {
		t.Fatalf("admin with a client certificate: %d %v", code, err)
	}
	// A client certificate from another CA is refused.
	oc, ok := newTestCA(t, "other").issue(t, 400, true)
	other, _ := tls.X509KeyPair(oc, ok)
	wrong := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.roots(), Certificates: []tls.Certificate{other}}}}
	if code, err := get(wrong); err == nil {
		t.Fatalf("a foreign client certificate got %d", code)
	}
}

// TestH2C: with server.h2c, a plain client listener speaks HTTP/2 with prior knowledge; without it,
// it does not.
func TestH2C(t *testing.T) {
	for _, on := range []bool{true, false} {
		p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 0, cfgMod: func(c *rules.Config) { c.Server.H2C = on }})
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		body := `{"model":"llama3","prompt":"hi","max_tokens":2}`
		resp, err := (&http.Client{Transport: tr}).Post(p.base+"/v1/completions", "application/json", strings.NewReader(body))
		if !on {
			if err == nil {
				resp.Body.Close()
				t.Fatalf("h2c off, yet HTTP/2 answered %d", resp.StatusCode)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
			t.Fatalf("h2c: %d %s %s", resp.StatusCode, resp.Proto, b)
		}
		tr.CloseIdleConnections()
	}
}
