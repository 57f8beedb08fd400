package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
)

// DefaultTransport is the upstream transport of a rule with default upstream settings
// (rules.Upstream): net/http's client, tuned for a handful of engine hosts each serving hundreds of
// concurrent streams. No environment proxy, no transparent compression (bodies the proxy reads
// itself, P/D legs, arrive as plain JSON).
func DefaultTransport() *http.Transport {
	t, _ := NewTransport(rules.Upstream{}.WithDefaults())
	return t
}

// NewTransport builds the upstream transport of a rule's upstream settings (defaults filled). It
// fails only when the CA file cannot be read or holds no certificate.
func NewTransport(u rules.Upstream) (*http.Transport, error) {
	dialer := &net.Dialer{Timeout: time.Duration(u.DialTimeout), KeepAlive: 30 * time.Second}
	t := &http.Transport{
		DialContext:           dialer.DialContext,
		MaxIdleConns:          0, // bounded per host below
		MaxIdleConnsPerHost:   u.MaxIdleConnsPerHost,
		MaxConnsPerHost:       u.MaxConnsPerHost,
		IdleConnTimeout:       time.Duration(u.IdleConnTimeout),
		ResponseHeaderTimeout: time.Duration(u.ResponseHeaderTimeout),
		TLSHandshakeTimeout:   time.Duration(u.DialTimeout),
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
	if u.CAFile != "" {
		pem, err := os.ReadFile(u.CAFile)
		if err != nil {
			return nil, fmt.Errorf("upstream.caFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("upstream.caFile: %s holds no PEM certificate", u.CAFile)
		}
		t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return t, nil
}

// ruleTransport is the transport built for one version of a rule (a rule change makes a new
// *rules.Rule, hence a new transport; the old one's idle connections are closed).
type ruleTransport struct {
	t   http.RoundTripper
	err error // the rule's upstream settings could not be turned into a transport
}

// transportOf returns the upstream transport of rule: Config.Transport when set, else the rule's
// own, built on first use.
func (p *Proxy) transportOf(rule *rules.Rule) (http.RoundTripper, error) {
	if p.cfg.Transport != nil {
		return p.cfg.Transport, nil
	}
	if rt, ok := p.transports.Load(rule); ok {
		return rt.t, rt.err
	}
	fresh := false
	rt := p.transports.LoadOrCreate(rule, func(r *rules.Rule) ruleTransport {
		fresh = true
		t, err := NewTransport(r.Upstream.WithDefaults())
		if err != nil {
			return ruleTransport{err: err}
		}
		return ruleTransport{t: t}
	})
	if fresh {
		// Earlier versions of the rule serve no new request: drop their idle connections.
		p.transports.DeleteFunc(func(r *rules.Rule, old ruleTransport) bool {
			if r == rule || r.Name != rule.Name {
				return false
			}
			closeIdle(old.t)
			return true
		})
	}
	return rt.t, rt.err
}

// transport is the transport of the call's rule.
func (c *call) transport() (http.RoundTripper, error) {
	if c.rule.rt == nil {
		return nil, errors.New("no rule")
	}
	return c.p.transportOf(c.rule.rt.Rule())
}

// routerTransport is the transport of rt's rule.
func (p *Proxy) routerTransport(rt *route.Router) (http.RoundTripper, error) {
	return p.transportOf(rt.Rule())
}

// Forget drops what the proxy keeps for a deleted rule: its transports (idle connections closed)
// and its metric series.
func (p *Proxy) Forget(rule string) {
	p.transports.DeleteFunc(func(r *rules.Rule, old ruleTransport) bool {
		if r.Name != rule {
			return false
		}
		closeIdle(old.t)
		return true
	})
	p.cfg.Metrics.Forget(rule)
}

func closeIdle(t http.RoundTripper) {
	if c, ok := t.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// CloseIdleConnections closes every rule transport's idle upstream connections (on shutdown, and
// for tests that count goroutines).
func (p *Proxy) CloseIdleConnections() {
	if p.cfg.Transport != nil {
		closeIdle(p.cfg.Transport)
	}
	p.transports.Range(func(_ *rules.Rule, rt ruleTransport) { closeIdle(rt.t) })
}
