package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/discovery"
	"github.com/kvexact/kvexact/gateway/epp"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/rules"
)

// eppFlags are the Endpoint Picker mode's flags (docs/epp.md): with --epp the gateway also serves
// Envoy's ext_proc on that address, deciding with the same routers as its HTTP listeners.
type eppFlags struct {
	addr, certFile, keyFile string
	fallbacks               int
	pool, rule, kubeconfig  string
}

func (f *eppFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "epp", "", "serve the Gateway API Inference Extension Endpoint Picker (Envoy ext_proc, gRPC) on this address, e.g. :9002")
	fs.StringVar(&f.certFile, "epp-tls-cert", "", "TLS certificate (PEM) of the picker's gRPC listener (with --epp-tls-key; default plaintext)")
	fs.StringVar(&f.keyFile, "epp-tls-key", "", "TLS key (PEM) of the picker's gRPC listener")
	fs.IntVar(&f.fallbacks, "epp-fallbacks", 2, fmt.Sprintf("fallback endpoints listed after the destination (0..%d)", epp.MaxFallbacks))
	fs.StringVar(&f.pool, "discover-pool", "", "NAMESPACE/NAME of an InferencePool whose ready pods × target ports become the endpoints of --discover-rule")
	fs.StringVar(&f.rule, "discover-rule", "", "the rule (from --config) whose endpoints follow --discover-pool")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig for --discover-pool (default: the in-cluster service account)")
}

// start runs discovery (when asked) and the picker; stop ends both. The picker turns ready once
// discovery has synced (at once without discovery).
func (f *eppFlags) start(ctx context.Context, g *gateway.Gateway, cfg *rules.Config, log *slog.Logger) (stop func(), err error) {
	if f.addr == "" {
		if f.pool != "" || f.rule != "" {
			return nil, errors.New("--discover-pool and --discover-rule need --epp")
		}
		return func() {}, nil
	}
	if (f.certFile == "") != (f.keyFile == "") {
		return nil, errors.New("--epp-tls-cert and --epp-tls-key go together")
	}
	if f.fallbacks < 0 || f.fallbacks > epp.MaxFallbacks {
		return nil, fmt.Errorf("--epp-fallbacks: %d is outside 0..%d", f.fallbacks, epp.MaxFallbacks)
	}
	fb := f.fallbacks
	if fb == 0 {
		fb = -1 // epp.Config: negative lists none, 0 takes the default
	}
	var d *discovery.Discovery
	if f.pool != "" || f.rule != "" {
		if d, err = f.discovery(g, log); err != nil {
			return nil, err
		}
	}
	m, err := epp.NewMetrics(g.Registry())
	if err != nil {
		return nil, err
	}
	picker, err := epp.New(epp.Config{Routes: g.Routes(), RecordUsage: g.RecordUsage, Parse: proxy.ParseRequest, Listener: cfg.Listen, MaxBodyBytes: cfg.MaxBodyBytes, Fallbacks: fb, DebugHeader: cfg.DebugHeader, Metrics: m, Log: log})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	ready := make(chan struct{})
	if d != nil {
		go func() {
			if err := d.Run(ctx); err != nil && ctx.Err() == nil {
				log.Error("discovery stopped", "err", err)
			}
		}()
		go func() {
			select {
			case <-d.Synced():
				close(ready)
			case <-ctx.Done():
			}
		}()
	} else {
		close(ready)
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(4 << 20), // Envoy streams the body in chunks far below this
		grpc.MaxConcurrentStreams(100_000),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}
	if f.certFile != "" {
		creds, err := credentials.NewServerTLSFromFile(f.certFile, f.keyFile)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("--epp-tls-cert/--epp-tls-key: %w", err)
		}
		opts = append(opts, grpc.Creds(creds))
	}
	gs := grpc.NewServer(opts...)
	picker.Register(gs)
	l, err := net.Listen("tcp", f.addr)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("--epp %s: %w", f.addr, err)
	}
	go func() {
		if err := gs.Serve(l); err != nil {
			log.Error("endpoint picker stopped", "err", err)
		}
	}()
	go func() {
		select {
		case <-ready:
			picker.SetReady(true)
			log.Info("endpoint picker ready", "addr", l.Addr().String())
		case <-ctx.Done():
		}
	}()
	log.Info("endpoint picker listening", "addr", l.Addr().String())
	return func() {
		picker.Shutdown()
		cancel()
		gs.GracefulStop()
	}, nil
}

func (f *eppFlags) discovery(g *gateway.Gateway, log *slog.Logger) (*discovery.Discovery, error) {
	ns, name, ok := strings.Cut(f.pool, "/")
	if !ok || ns == "" || name == "" || f.rule == "" {
		return nil, errors.New("--discover-pool NAMESPACE/NAME and --discover-rule RULE go together")
	}
	var rc *rest.Config
	var err error
	if f.kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return discovery.New(discovery.Config{Store: g.Store(), Rule: f.rule, Namespace: ns, Pool: name, Kube: kube, Dynamic: dyn, Resync: 10 * time.Minute, Log: log})
}
