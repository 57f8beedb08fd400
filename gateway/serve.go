package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/admin"
	"github.com/kvexact/kvexact/gateway/h1"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
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

	servers []server
	wg      sync.WaitGroup
	errs    chan error
}

// server is what Servers runs: an h1.Server on client listeners, a net/http.Server for admin.
type server interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

// Serve binds every client listener and the admin listener and serves until Shutdown. handler
// builds the client handler of a listener (the proxy). Client listeners run gateway/h1's server:
// the data path's small requests cost a third less CPU than through net/http's (docs/benchmarks/
// proxy.md); the admin listener keeps net/http.
func (g *Gateway) Serve(handler func(listener string) http.Handler, parse ParseFunc) (*Servers, error) {
	s := &Servers{Client: map[string]string{}, errs: make(chan error, 16)}
	start := func(addr string, srv server) (string, error) {
		l, err := listen(addr)
		if err != nil {
			return "", err
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
	for _, l := range g.Listeners() {
		bound, err := start(l, &h1.Server{Handler: handler(l), ReadHeaderTimeout: 10 * time.Second, ErrorBody: g.opts.ErrorBody, Log: g.log})
		if err != nil {
			s.Shutdown(context.Background())
			return nil, fmt.Errorf("listen %s: %w", l, err)
		}
		s.Client[l] = bound
	}
	bound, err := start(g.cfg.Admin.Listen, &http.Server{Handler: admin.Handler(&adminBackend{g: g, parse: parse}, g.cfg.Admin.Token), ReadHeaderTimeout: 10 * time.Second})
	if err != nil {
		s.Shutdown(context.Background())
		return nil, fmt.Errorf("admin listen %s: %w", g.cfg.Admin.Listen, err)
	}
	s.Admin = bound
	return s, nil
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

func (a *adminBackend) Status() any                    { return a.g.Status() }
func (a *adminBackend) Rules() *rules.Store            { return a.g.store }
func (a *adminBackend) Registry() *prometheus.Registry { return a.g.reg }
func (a *adminBackend) Inventory(rule, ep string) ([]inventory.KeyCount, bool) {
	return a.g.Inventory(rule, ep)
}
func (a *adminBackend) SetEndpointState(rule, ep, state string) bool {
	return a.g.SetEndpointState(rule, ep, state)
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
	router, err := a.g.Resolve(listener, req.Model)
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
