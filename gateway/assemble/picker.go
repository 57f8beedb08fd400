package assemble

import (
	"context"
	"errors"
	"net"

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
	rc, log := a.cfg.Options.Config, a.cfg.Log
	m, err := epp.NewMetrics(a.Runtime.Registry())
	if err != nil {
		return err
	}
	srv, err := epp.New(epp.Config{Routes: a.Runtime.Routes(), RecordUsage: a.Runtime.RecordUsage, Parse: proxy.ParseRequest, Surface: proxy.SurfaceCheck, Limits: pk.Limits, Listener: rc.Listen, MaxBodyBytes: rc.MaxBodyBytes,
		Fallbacks: pk.Fallbacks, DebugHeader: rc.DebugHeader, Metrics: m, Log: log})
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
	d := pk.Discovery
	if d == nil {
		srv.SetReady(true)
		log.Info("endpoint picker ready", "addr", addr)
		return nil
	}
	go func() {
		if err := d.Run(ctx); err != nil && ctx.Err() == nil {
			log.Error("discovery stopped", "err", err)
		}
	}()
	go func() {
		select {
		case <-d.Synced():
			srv.SetReady(true)
			log.Info("endpoint picker ready", "addr", addr)
		case <-ctx.Done():
		}
	}()
	return nil
}

// Picker is the running Endpoint Picker (nil unless StartPicker ran).
func (a *Gateway) Picker() *epp.Server {
	if a.picker == nil {
		return nil
	}
	return a.picker.srv
}
