// Package assemble owns the assembled gateway: the one place a configuration becomes a running
// gateway. It builds the rule runtimes (package gateway), the OpenAI proxy in front of them
// (gateway/proxy) wired to their routers and to their usage accounting, binds the client and admin
// listeners, and, in Endpoint Picker mode, serves the picker (gateway/epp) over gRPC with the same
// runtimes. cmd/gateway, kvbench, the end-to-end tests and the demo (through cmd/gateway) all
// start a gateway here, so what they exercise is what production runs.
//
// It is a package of its own, not part of package gateway, because package gateway owns the rule
// runtimes and their control (certificates, exactness, status, rule changes) and knows nothing of
// the front ends that ask it where a request goes: the proxy and the picker are its clients, and
// the assembly is what connects them. Keeping the wiring here keeps gRPC and the proxy out of
// package gateway and lets the tests of gateway/ and gateway/epp assemble from their external test
// packages.
//
// From a configuration file to running listeners (cmd/gateway; docs/assembly.md says more):
//
//	cmd/gateway/main.go           flags → assemble.Config
//	gateway/rules/rules.go        Load: gateway.yaml parsed, validated, normalized
//	gateway/certificates.go       LoadCertificates: the --certificate files, signatures checked
//	gateway/assemble/assemble.go  New: gateway.New, then proxy.New wired to it
//	gateway/gateway.go            New (tokenizer pool, metrics, rule store); Start: each rule's
//	                              runtime (inventory, certificate verdict, keyer, router, sources)
//	gateway/proxy/proxy.go        New, Handler: each client listener's handler
//	gateway/serve.go              Serve: client and admin listeners (NewHTTPServer, TLS)
//	cmd/gateway/epp.go            --epp flags → assemble.Picker (listener, TLS, discovery)
//	gateway/assemble/picker.go    StartPicker: epp.New on a gRPC server, readiness
package assemble

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/rules"
)

// Config is everything a gateway is assembled from.
type Config struct {
	// Options are the rule runtimes' configuration: Options.Config is gateway.yaml's contents
	// (rules, listeners, admin listener and token, TLS, limits), with the certificates, the
	// metrics registry, the logger and the tuning of the exactness checks.
	gateway.Options
	// Transport sends every upstream request when set (tests, benchmarks: one shared transport
	// whose idle connections they can drop). Nil: each rule gets its own transport from its
	// upstream settings.
	Transport http.RoundTripper
	// Wrap, when set, wraps every client listener's handler (tests observe requests with it).
	Wrap func(http.Handler) http.Handler
	// AccessLog, when set, gets one line per client request (proxy.Config.AccessLog).
	AccessLog *slog.Logger
	// Tracer, when set, traces every client request (proxy.Config.Tracer; gateway/tracing).
	Tracer trace.Tracer
}

// Gateway is an assembled gateway: the rule runtimes, the proxy in front of them and, once
// started, the listeners (and the picker when StartPicker ran).
type Gateway struct {
	// Runtime is the rule runtimes and their control: status, rule store, certificates, inventory.
	Runtime *gateway.Gateway
	// Proxy is the client listeners' handler.
	Proxy *proxy.Proxy
	// Servers are the bound client and admin listeners (nil before Start).
	Servers *gateway.Servers

	cfg     Config
	started bool
	picker  *picker
	leader  interface{ Leading() bool } // Picker.Leader
	once    sync.Once
}

// New assembles a gateway from cfg; it starts nothing (see Start).
func New(cfg Config) (*Gateway, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	g, err := gateway.New(cfg.Options)
	if err != nil {
		return nil, err
	}
	rc := cfg.Options.Config
	p := proxy.New(proxy.Config{
		Routes:          g.Routes(),
		MaxBodyBytes:    rc.MaxBodyBytes,
		MaxHeaderFields: rc.Server.MaxHeaderFields,
		BodyTimeout:     time.Duration(rc.Server.BodyTimeout),
		WriteTimeout:    time.Duration(rc.Server.WriteTimeout),
		DebugHeader:     rc.DebugHeader,
		Transport:       cfg.Transport,
		Log:             cfg.Log,
		AccessLog:       cfg.AccessLog,
		Tracer:          cfg.Tracer,
		Metrics:         proxy.NewMetrics(g.Registry()),
		Usage: func(u proxy.UsageReport) {
			g.RecordUsage(u.Rule, u.Endpoint, u.KVExact, u.PredictedTokens, u.RealizedTokens, u.BlockSize)
			g.CheckRoutedPrompt(u.Rule, u.Endpoint, u.LastBlockKey, u.Blocks)
		},
	})
	g.OnRuleRemoved(p.Forget)
	return &Gateway{Runtime: g, Proxy: p, cfg: cfg}, nil
}

// Start builds every rule's runtime (event subscribers dial with retry, so engines may come up
// later), starts the health prober and binds the client and admin listeners. ctx bounds the
// runtimes; the listeners run until Shutdown.
func (a *Gateway) Start(ctx context.Context) error {
	if a.started {
		return errors.New("assemble: gateway already started")
	}
	a.started = true
	if err := a.Runtime.Start(ctx); err != nil {
		return err
	}
	handler := a.Proxy.Handler
	if w := a.cfg.Wrap; w != nil {
		handler = func(l string) http.Handler { return w(a.Proxy.Handler(l)) }
	}
	srv, err := a.Runtime.Serve(handler, proxy.ParseRequest)
	if err != nil {
		return err
	}
	a.Servers = srv
	log := a.cfg.Log
	for l, bound := range srv.Client {
		log.Info("gateway listening", "listener", l, "addr", bound)
	}
	log.Info("admin listening", "addr", srv.Admin)
	for _, rs := range a.Runtime.Status().Rules {
		if rs.Exact.Mode != rules.KVExactOff && !rs.Exact.Enabled {
			log.Warn("KV-exact is off for this rule", "rule", rs.Name, "reason", rs.Exact.Reason)
		} else if rs.Exact.Enabled {
			log.Info("KV-exact enabled", "rule", rs.Name, "binding", rs.Exact.Binding, "profile", rs.Exact.ProfileDigest)
		}
	}
	return nil
}

// Err reports the first failure of a listener (nil before Start: it never fires).
func (a *Gateway) Err() <-chan error {
	if a.Servers == nil {
		return nil
	}
	return a.Servers.Err()
}

// Shutdown stops the gateway: the listeners stop accepting and let in-flight requests and streams
// finish until ctx ends (then close them), the picker stops, and the rule runtimes and the prober
// stop. A second call does nothing.
func (a *Gateway) Shutdown(ctx context.Context) error {
	var err error
	a.once.Do(func() {
		if a.Servers != nil {
			err = a.Servers.Shutdown(ctx)
		}
		if a.picker != nil {
			a.picker.stop()
		}
		a.Runtime.Close()
	})
	return err
}
