// Package keypair serves a TLS certificate and key from PEM files, re-read when either file
// changes, so that a renewed certificate (cert-manager, an ACME client) is served from the next
// handshake on without a restart.
package keypair

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"
)

// recheck is how often a handshake may look at the files again (a stat of each).
const recheck = time.Second

// Files is a certificate and key loaded from CertFile and KeyFile.
type Files struct {
	certFile, keyFile string
	// OnError, when set, hears a reload that failed (the previous pair keeps being served).
	OnError func(error)

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   [2]fileStamp
	checked time.Time
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// Load reads the pair once; an unreadable or mismatched pair is an error naming the files.
func Load(certFile, keyFile string) (*Files, error) {
	f := &Files{certFile: certFile, keyFile: keyFile}
	st, err := f.stamps()
	if err != nil {
		return nil, err
	}
	if err := f.load(st); err != nil {
		return nil, err
	}
	f.checked = time.Now()
	return f, nil
}

func (f *Files) stamps() ([2]fileStamp, error) {
	var st [2]fileStamp
	for i, p := range []string{f.certFile, f.keyFile} {
		fi, err := os.Stat(p)
		if err != nil {
			return st, err
		}
		st[i] = fileStamp{fi.ModTime(), fi.Size()}
	}
	return st, nil
}

func (f *Files) load(st [2]fileStamp) error {
	c, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
	if err != nil {
		return fmt.Errorf("TLS key pair %s, %s: %w", f.certFile, f.keyFile, err)
	}
	f.cert, f.stamp = &c, st
	return nil
}

// Certificate returns the current pair, re-reading the files first when they changed since the
// last look (at most once a second). A pair that fails to load (a half-written renewal) is
// reported to OnError and the previous one served; the next look tries again.
func (f *Files) Certificate() *tls.Certificate {
	f.mu.Lock()
	defer f.mu.Unlock()
	if now := time.Now(); now.Sub(f.checked) >= recheck {
		f.checked = now
		st, err := f.stamps()
		if err == nil && st != f.stamp {
			err = f.load(st)
		}
		if err != nil && f.OnError != nil {
			f.OnError(err)
		}
	}
	return f.cert
}

// GetCertificate is Certificate in the shape tls.Config.GetCertificate takes.
func (f *Files) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return f.Certificate(), nil
}
