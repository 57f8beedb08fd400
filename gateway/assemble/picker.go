package assemble

import (
	"context"
	"errors"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvexact/kvexact/gateway/discovery"
	"github.com/kvexact/kvexact/gateway/epp"
	"github.com/kvexact/kvexact/gateway/proxy"
)

// Picker sets up the Endpoint Picker front end (gateway --epp, docs/epp.md): Envoy's ext_proc over
// gRPC, deciding with the same rule runtimes as the client listeners.
type Picker struct {
	// Listener is where the picker serves gRPC (bound by the caller: the --epp address).
	Listener net.Listener
	// Creds secure the gRPC listener; nil serves plaintext.
	Creds credentials.TransportCredentials
	// Fallbacks is how many endpoints follow the destination (epp.Config.Fallbacks: 0 takes the
	// default, negative lists none).
	Fallbacks int
	// Limits bound the picker's streams, buffered bodies, headers and connections (zero fields:
	// epp's defaults).
	Limits epp.Limits
	// Discovery, when set, keeps its rule's endpoints following a Kubernetes InferencePool; it runs
	// until Shutdown and the picker turns ready once it has synced (at once without it).
	Discovery *discovery.Discovery
	// Leader, when set, makes the picker active-passive: it is ready only while Leading (a
	// Kubernetes Lease, gateway/leader) and the gateway is ready; a standby keeps its inventory
	// warm. Nil: active-active, every ready replica serves.
	Leader interface{ Leading() bool }
}

// picker is the running picker.
type picker struct {
	srv    *epp.Server
	grpc   *grpc.Server
	cancel context.CancelFunc
}

func (p *picker) stop() {
	p.srv.Shutdown()
	p.cancel()
	p.grpc.GracefulStop()
}

// StartPicker serves the Endpoint Picker on pk.Listener beside the listeners, with the request
// parser, body limit and debug header of the client listeners, for the rules of the configuration's
// default listener. Shutdown stops it.
func (a *Gateway) StartPicker(ctx context.Context, pk Picker) error {
	if a.picker != nil {
		return errors.New("assemble: the picker already runs")
	}
	a.leader = pk.Leader
	rc, log := a.cfg.Options.Config, a.cfg.Log
	m, err := epp.NewMetrics(a.Runtime.Registry())
	if err != nil {
		return err
	}
	srv, err := epp.New(epp.Config{Routes: a.Runtime.Routes(), RecordUsage: a.Runtime.RecordUsage, Parse: proxy.ParseRequest, Surface: proxy.SurfaceCheck, Limits: pk.Limits, Listener: rc.Listen, MaxBodyBytes: rc.MaxBodyBytes,
		Fallbacks: pk.Fallbacks, DebugHeader: rc.DebugHeader, Metrics: m, Log: log, Tracer: a.cfg.Tracer})
	if err != nil {
		return err
	}
	opts, err := pk.Limits.ServerOptions()
	if err != nil {
		return err
	}
	if pk.Creds != nil {
		opts = append(opts, grpc.Creds(pk.Creds))
	}
	gs := grpc.NewServer(opts...)
	srv.Register(gs)
	ctx, cancel := context.WithCancel(ctx)
	a.picker = &picker{srv: srv, grpc: gs, cancel: cancel}
	addr := pk.Listener.Addr().String()
	go func() {
		if err := gs.Serve(pk.Listener); err != nil {
			log.Error("endpoint picker stopped", "err", err)
		}
	}()
	log.Info("endpoint picker listening", "addr", addr)
	var synced <-chan struct{}
	if d := pk.Discovery; d == nil {
		now := make(chan struct{})
		close(now)
		synced = now
	} else {
		go func() {
			if err := d.Run(ctx); err != nil && ctx.Err() == nil {
				log.Error("discovery stopped", "err", err)
			}
		}()
		synced = d.Synced()
	}
	ready := false
	if pk.Discovery == nil {
		ready = a.setPickerReady(srv, false, addr) // without discovery, ready (or not) on return
	}
	go a.followReadiness(ctx, srv, synced, addr, ready)
	return nil
}

// setPickerReady sets the picker's gRPC readiness to the gateway's when it changed from was, and
// returns it.
func (a *Gateway) setPickerReady(srv *epp.Server, was bool, addr string) bool {
	now := a.Runtime.Readiness().Ready && (a.leader == nil || a.leader.Leading())
	if now == was {
		return now
	}
	srv.SetReady(now)
	if now {
		a.cfg.Log.Info("endpoint picker ready", "addr", addr)
	} else {
		a.cfg.Log.Warn("endpoint picker not ready: see /readyz", "addr", addr)
	}
	return now
}

// ReadinessPoll is how often the picker's gRPC readiness re-reads the gateway's readiness.
var ReadinessPoll = 500 * time.Millisecond

// followReadiness keeps the picker's gRPC readiness (the readiness, ext_proc and "" services)
// equal to the gateway's /readyz, once discovery (if any) has synced: the same readiness, read
// from the same state, on the picker's port.
func (a *Gateway) followReadiness(ctx context.Context, srv *epp.Server, synced <-chan struct{}, addr string, was bool) {
	select {
	case <-synced:
	case <-ctx.Done():
		return
	}
	t := time.NewTicker(ReadinessPoll)
	defer t.Stop()
	for {
		was = a.setPickerReady(srv, was, addr)
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// Picker is the running Endpoint Picker (nil unless StartPicker ran).
func (a *Gateway) Picker() *epp.Server {
	if a.picker == nil {
		return nil
	}
	return a.picker.srv
}
