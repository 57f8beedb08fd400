package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/discovery"
	"github.com/kvexact/kvexact/gateway/epp"
	"github.com/kvexact/kvexact/gateway/leader"
)

// eppFlags are the Endpoint Picker mode's flags (docs/epp.md): with --epp the gateway also serves
// Envoy's ext_proc on that address, deciding with the same routers as its HTTP listeners.
type eppFlags struct {
	addr, certFile, keyFile, clientCA string
	fallbacks                         int
	pool, rule, kubeconfig            string
	lease, identity                   string
	limits                            epp.Limits
	maxStreams                        uint
}

func (f *eppFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "epp", "", "serve the Gateway API Inference Extension Endpoint Picker (Envoy ext_proc, gRPC) on this address, e.g. :9002")
	fs.StringVar(&f.certFile, "epp-tls-cert", "", "TLS certificate (PEM) of the picker's gRPC listener (with --epp-tls-key; default plaintext)")
	fs.StringVar(&f.keyFile, "epp-tls-key", "", "TLS key (PEM) of the picker's gRPC listener")
	fs.StringVar(&f.clientCA, "epp-tls-client-ca", "", "CA bundle (PEM): the picker then requires a client certificate it signed (mutual TLS; needs --epp-tls-cert)")
	fs.Int64Var(&f.limits.BodyBudget, "epp-body-budget", epp.DefaultBodyBudget, "request-body bytes the picker buffers across all streams (503 body_budget_exhausted past it)")
	fs.IntVar(&f.limits.MaxHeaderFields, "epp-max-header-fields", epp.DefaultMaxHeaderFields, "header fields of one request (431 above)")
	fs.IntVar(&f.limits.MaxHeaderBytes, "epp-max-header-bytes", epp.DefaultMaxHeaderBytes, "bytes of one request's header names and values (431 above)")
	fs.DurationVar(&f.limits.RequestIdle, "epp-request-idle", epp.DefaultRequestIdle, "longest wait for the next ext_proc message before the request is decided")
	fs.DurationVar(&f.limits.ResponseIdle, "epp-response-idle", epp.DefaultResponseIdle, "longest wait for the next ext_proc message after the decision (the response, time to first token included)")
	fs.UintVar(&f.maxStreams, "epp-max-streams-per-conn", epp.DefaultMaxStreamsPerConn, "concurrent ext_proc streams on one HTTP/2 connection")
	fs.DurationVar(&f.limits.KeepaliveTime, "epp-keepalive-time", epp.DefaultKeepaliveTime, "ping an idle connection after this long")
	fs.DurationVar(&f.limits.KeepaliveTimeout, "epp-keepalive-timeout", epp.DefaultKeepaliveTimeout, "close a connection whose ping goes unanswered this long")
	fs.DurationVar(&f.limits.KeepaliveMinTime, "epp-keepalive-min-time", epp.DefaultKeepaliveMinTime, "shortest ping interval a client may use (GOAWAY too_many_pings below)")
	fs.IntVar(&f.fallbacks, "epp-fallbacks", 2, fmt.Sprintf("fallback endpoints listed after the destination (0..%d)", epp.MaxFallbacks))
	fs.StringVar(&f.pool, "discover-pool", "", "NAMESPACE/NAME of an InferencePool whose ready pods × target ports become the endpoints of --discover-rule")
	fs.StringVar(&f.rule, "discover-rule", "", "the rule (from --config) whose endpoints follow --discover-pool")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig for --discover-pool and --epp-leader-lease (default: the in-cluster service account)")
	fs.StringVar(&f.lease, "epp-leader-lease", "", "NAMESPACE/NAME of a Lease: pickers sharing it run active-passive, only the holder is ready (default: active-active)")
	fs.StringVar(&f.identity, "epp-leader-identity", "", "this replica's identity in the Lease (default: $POD_NAME, else the host name)")
}

// start turns the flags into the picker's setup (its listener, TLS and, when asked, discovery) and
// starts it on the assembled gateway, which stops it on Shutdown. The picker turns ready once
// discovery has synced (at once without discovery).
func (f *eppFlags) start(ctx context.Context, gw *assemble.Gateway, log *slog.Logger) error {
	if f.addr == "" {
		if f.pool != "" || f.rule != "" || f.lease != "" {
			return errors.New("--discover-pool, --discover-rule and --epp-leader-lease need --epp")
		}
		return nil
	}
	if (f.certFile == "") != (f.keyFile == "") {
		return errors.New("--epp-tls-cert and --epp-tls-key go together")
	}
	if f.fallbacks < 0 || f.fallbacks > epp.MaxFallbacks {
		return fmt.Errorf("--epp-fallbacks: %d is outside 0..%d", f.fallbacks, epp.MaxFallbacks)
	}
	if f.clientCA != "" && f.certFile == "" {
		return errors.New("--epp-tls-client-ca needs --epp-tls-cert and --epp-tls-key")
	}
	if f.maxStreams > 1<<31-1 {
		return fmt.Errorf("--epp-max-streams-per-conn: %d is above %d", f.maxStreams, 1<<31-1)
	}
	f.limits.MaxStreamsPerConn = uint32(f.maxStreams)
	for name, v := range map[string]int64{"--epp-body-budget": f.limits.BodyBudget, "--epp-max-header-fields": int64(f.limits.MaxHeaderFields), "--epp-max-header-bytes": int64(f.limits.MaxHeaderBytes),
		"--epp-request-idle": int64(f.limits.RequestIdle), "--epp-response-idle": int64(f.limits.ResponseIdle), "--epp-keepalive-time": int64(f.limits.KeepaliveTime),
		"--epp-keepalive-timeout": int64(f.limits.KeepaliveTimeout), "--epp-keepalive-min-time": int64(f.limits.KeepaliveMinTime)} {
		if v < 0 {
			return fmt.Errorf("%s must not be negative (0 takes the default)", name)
		}
	}
	pk := assemble.Picker{Fallbacks: f.fallbacks, Limits: f.limits}
	if pk.Fallbacks == 0 {
		pk.Fallbacks = -1 // epp.Config: negative lists none, 0 takes the default
	}
	var err error
	if f.pool != "" || f.rule != "" {
		if pk.Discovery, err = f.discovery(gw.Runtime, log); err != nil {
			return err
		}
	}
	if f.lease != "" {
		if pk.Leader, err = f.elector(ctx, log); err != nil {
			return err
		}
	}
	if f.certFile != "" {
		if pk.Creds, err = epp.ServerTLS(f.certFile, f.keyFile, f.clientCA); err != nil {
			return err
		}
	}
	if pk.Listener, err = net.Listen("tcp", f.addr); err != nil {
		return fmt.Errorf("--epp %s: %w", f.addr, err)
	}
	if err := gw.StartPicker(ctx, pk); err != nil {
		pk.Listener.Close()
		return err
	}
	return nil
}

// elector competes for --epp-leader-lease until ctx is done.
func (f *eppFlags) elector(ctx context.Context, log *slog.Logger) (*leader.Elector, error) {
	ns, name, ok := strings.Cut(f.lease, "/")
	if !ok || ns == "" || name == "" {
		return nil, errors.New("--epp-leader-lease: want NAMESPACE/NAME")
	}
	id := f.identity
	if id == "" {
		id = os.Getenv("POD_NAME")
	}
	if id == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("--epp-leader-identity: %w", err)
		}
		id = h
	}
	kube, err := f.kubeClient()
	if err != nil {
		return nil, err
	}
	return leader.Start(ctx, leader.Config{Client: kube, Namespace: ns, Name: name, Identity: id, Log: log})
}

func (f *eppFlags) kubeClient() (*kubernetes.Clientset, error) {
	rc, err := f.restConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}

func (f *eppFlags) restConfig() (*rest.Config, error) {
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
	return rc, nil
}

func (f *eppFlags) discovery(g *gateway.Gateway, log *slog.Logger) (*discovery.Discovery, error) {
	ns, name, ok := strings.Cut(f.pool, "/")
	if !ok || ns == "" || name == "" || f.rule == "" {
		return nil, errors.New("--discover-pool NAMESPACE/NAME and --discover-rule RULE go together")
	}
	rc, err := f.restConfig()
	if err != nil {
		return nil, err
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
