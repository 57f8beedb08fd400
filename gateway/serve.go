package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvexact/kvexact/gateway/admin"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/keypair"
	"github.com/kvexact/kvexact/internal/linger"
)

// ParseFunc turns a client request body into what the router needs (the proxy's parser), so that
// /admin/explain decides exactly as the data path does.
type ParseFunc func(r *http.Request, body []byte) (*route.Request, error)

// Servers are the gateway's running HTTP servers.
type Servers struct {
	// Client maps each listener address (as configured) to its bound address.
	Client map[string]string
	// Admin is the admin listener's bound address.
	Admin string
	// Metrics is the metrics-only listener's bound address ("" when admin.metricsListen is unset).
	Metrics string

	servers []server
	wg      sync.WaitGroup
	errs    chan error
}

// server is what Servers runs.
type server interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

// Serve binds every client listener and the admin listener and serves until Shutdown. handler
// builds the client handler of a listener (the proxy; assemble.Gateway.Start is the caller). Both kinds of listener are net/http servers
// with the configured timeouts and header limits (rules.Server); with TLS configured, HTTP/2 is
// offered by ALPN, and server.h2c accepts HTTP/2 with prior knowledge on a plain client listener.
func (g *Gateway) Serve(handler func(listener string) http.Handler, parse ParseFunc) (*Servers, error) {
	s := &Servers{Client: map[string]string{}, errs: make(chan error, 16)}
	sc := g.cfg.Server.WithDefaults()
	start := func(addr string, srv *http.Server) (string, error) {
		l, err := listen(addr)
		if err != nil {
			return "", err
		}
		// Every listener's connections close lingering (beneath TLS: the drain reads the socket),
		// so that a refused upload reads its status rather than a reset.
		l = linger.Listen(l, linger.Bounds{Timeout: time.Duration(sc.LingerTimeout), Bytes: sc.LingerBytes})
		if srv.TLSConfig != nil {
			l = tls.NewListener(l, srv.TLSConfig)
		}
		s.servers = append(s.servers, srv)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.errs <- fmt.Errorf("%s: %w", addr, err)
			}
		}()
		return l.Addr().String(), nil
	}
	clientTLS, err := g.tlsConfig("server.tls", sc.TLS)
	if err != nil {
		return nil, err
	}
	for _, l := range g.Listeners() {
		srv := NewHTTPServer(g.probes(handler(l)), sc, clientTLS, g.log)
		bound, err := start(l, srv)
		if err != nil {
			s.Shutdown(context.Background())
			return nil, fmt.Errorf("listen %s: %w", l, err)
		}
		s.Client[l] = bound
	}
	adminTLS, err := g.tlsConfig("admin.tls", g.cfg.Admin.TLS)
	if err != nil {
		s.Shutdown(context.Background())
		return nil, err
	}
	adminSC := sc
	adminSC.H2C = false
	adminSrv := NewHTTPServer(admin.Handler(&adminBackend{g: g, parse: parse}, g.cfg.Admin.Token), adminSC, adminTLS, g.log)
	// Every admin request, authenticated or not, is read within the header and body deadlines
	// together: net/http discards an unread body (up to 256 KiB) before closing, and without a
	// read deadline a client that declares a body and never sends it would hold the connection.
	// (The client listeners arm the body deadline per request instead: their response streams
	// must not be cut by it.)
	adminSrv.ReadTimeout = time.Duration(adminSC.ReadHeaderTimeout + adminSC.BodyTimeout)
	bound, err := start(g.cfg.Admin.Listen, adminSrv)
	if err != nil {
		s.Shutdown(context.Background())
		return nil, fmt.Errorf("admin listen %s: %w", g.cfg.Admin.Listen, err)
	}
	s.Admin = bound
	if addr := g.cfg.Admin.MetricsListen; addr != "" {
		msrv := NewHTTPServer(metricsHandler(g.reg), adminSC, nil, g.log)
		msrv.ReadTimeout = adminSrv.ReadTimeout
		if s.Metrics, err = start(addr, msrv); err != nil {
			s.Shutdown(context.Background())
			return nil, fmt.Errorf("admin.metricsListen %s: %w", addr, err)
		}
	}
	return s, nil
}

// metricsHandler serves GET /metrics and nothing else: the metrics-only listener needs no token
// because it exposes nothing but the series (every label a closed set or a validated name).
func metricsHandler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// NewHTTPServer is a client or admin listener's server: net/http with sc's header timeout, idle
// timeout and header-size limit (the per-request body deadline and header-field count are the
// handler's: see proxy.Config), HTTP/1.1, HTTP/2 when tlsConf is set, and h2c when sc.H2C.
func NewHTTPServer(h http.Handler, sc rules.Server, tlsConf *tls.Config, log *slog.Logger) *http.Server {
	sc = sc.WithDefaults()
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: time.Duration(sc.ReadHeaderTimeout),
		IdleTimeout:       time.Duration(sc.IdleTimeout),
		MaxHeaderBytes:    sc.MaxHeaderBytes,
		TLSConfig:         tlsConf,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		Protocols:         new(http.Protocols),
	}
	srv.Protocols.SetHTTP1(true)
	if tlsConf != nil {
		srv.Protocols.SetHTTP2(true)
	}
	srv.Protocols.SetUnencryptedHTTP2(sc.H2C && tlsConf == nil)
	return srv
}

// tlsConfig is a listener's TLS configuration (nil without TLS): the key pair re-read when its
// files change, and for the admin listener an optional client CA every client must chain to.
func (g *Gateway) tlsConfig(field string, t rules.TLS) (*tls.Config, error) {
	if !t.Enabled() {
		return nil, nil
	}
	kp, err := keypair.Load(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	kp.OnError = func(err error) {
		g.log.Warn("TLS certificate reload failed; serving the previous one", "field", field, "err", err)
	}
	c := &tls.Config{GetCertificate: kp.GetCertificate, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("%s.clientCAFile: %w", field, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.clientCAFile: %s holds no PEM certificate", field, t.ClientCAFile)
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// Err reports the first server failure.
func (s *Servers) Err() <-chan error { return s.errs }

// Shutdown stops accepting, lets in-flight requests and streams finish until ctx ends, then closes.
func (s *Servers) Shutdown(ctx context.Context) error {
	var first error
	for _, srv := range s.servers {
		if err := srv.Shutdown(ctx); err != nil && first == nil {
			first = err
			srv.Close()
		}
	}
	s.wg.Wait()
	return first
}

// adminBackend adapts the gateway to the admin API.
type adminBackend struct {
	g     *Gateway
	parse ParseFunc
}

func (a *adminBackend) Status() any                      { return a.g.Status() }
func (a *adminBackend) ReloadCertificates() (any, error) { return a.g.ReloadCertificates() }
func (a *adminBackend) Rules() *rules.Store              { return a.g.store }
func (a *adminBackend) Registry() *prometheus.Registry   { return a.g.reg }
func (a *adminBackend) Inventory(rule, ep string) ([]inventory.KeyCount, bool) {
	return a.g.Inventory(rule, ep)
}
func (a *adminBackend) EndpointSnapshot(rule, ep string, w io.Writer) error {
	return a.g.EndpointSnapshot(rule, ep, w)
}
func (a *adminBackend) SetEndpointState(rule, ep, state string) bool {
	return a.g.SetEndpointState(rule, ep, state)
}
func (a *adminBackend) ClearExactHold(rule, ep, hold string) (any, error) {
	st, err := a.g.ClearExactHold(rule, ep, hold)
	switch {
	case errors.Is(err, ErrNoRule):
		// The admin API answered an unknown rule in these words before ErrNoRule existed: the
		// path names no endpoint. The answer stays byte for byte.
		return nil, &statusError{http.StatusNotFound, fmt.Errorf("%w: rule %q", ErrNoEndpoint, rule)}
	case errors.Is(err, ErrNoEndpoint):
		return nil, &statusError{http.StatusNotFound, err}
	case err != nil:
		return nil, &statusError{http.StatusBadRequest, err}
	}
	return st, nil
}

// statusError carries an HTTP status for the admin API.
type statusError struct {
	code int
	err  error
}

func (e *statusError) Error() string   { return e.err.Error() }
func (e *statusError) StatusCode() int { return e.code }

func (a *adminBackend) Explain(ctx context.Context, listener string, r *http.Request) (any, error) {
	if a.parse == nil {
		return nil, &statusError{http.StatusNotImplemented, errors.New("explain is not available: no request parser")}
	}
	if listener == "" {
		listener = a.g.cfg.Listen
	}
	// The data path's body limit, with the data path's answer (413).
	limit := a.g.cfg.MaxBodyBytes
	if limit <= 0 {
		limit = 16 << 20 // rules.Config's default, for configs never normalized
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, &statusError{http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err)}
	}
	if int64(len(body)) > limit {
		return nil, &statusError{http.StatusRequestEntityTooLarge, fmt.Errorf("the request body exceeds %d bytes", limit)}
	}
	req, err := a.parse(r, body)
	if err != nil {
		return nil, err // the data path's status (StatusCode), else 400
	}
	router, err := a.g.routes.Resolve(listener, req.Model)
	if err != nil {
		return nil, &statusError{http.StatusNotFound, err}
	}
	d, err := router.Explain(ctx, req)
	if err != nil {
		return nil, &statusError{http.StatusServiceUnavailable, err}
	}
	return struct {
		Rule     string          `json:"rule"`
		Decision *route.Decision `json:"decision"`
	}{router.Rule().Name, d}, nil
}
