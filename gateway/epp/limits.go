package epp

import (
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Limits bound what one Envoy (or anything else reaching the picker's port) can make the picker
// hold: buffered body bytes, header fields, streams and their lifetime, and the connection's
// keepalive traffic. Zero fields take the defaults below (docs/epp.md lists them); every one is a
// gateway flag (--epp-…).
type Limits struct {
	// BodyBudget is the process-wide cap on request-body bytes buffered across all streams until
	// their decision (a stream holds its body until its end: FULL_DUPLEX_STREAMED). A chunk that
	// would pass it is answered 503 body_budget_exhausted (Retry-After: 1); the bytes go back to
	// the budget as soon as a stream's body has been given back or the stream ends.
	BodyBudget int64
	// MaxHeaderFields and MaxHeaderBytes bound a request_headers message (431 above either).
	MaxHeaderFields int
	MaxHeaderBytes  int
	// RequestIdle is the longest wait for the next message before the request is decided (headers
	// to the body's end); ResponseIdle the longest wait for the next message after it (the origin's
	// response headers and body chunks, time to first token included). Past either the stream ends
	// with DeadlineExceeded and its load units are given back.
	RequestIdle  time.Duration
	ResponseIdle time.Duration
	// MaxStreamsPerConn is the HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS of each connection (Envoy
	// opens another connection past it).
	MaxStreamsPerConn uint32
	// KeepaliveTime and KeepaliveTimeout: the picker pings an idle connection after KeepaliveTime
	// and closes it when no answer comes within KeepaliveTimeout. KeepaliveMinTime is the shortest
	// ping interval a client may use (more often: GOAWAY too_many_pings); pings on a connection
	// without streams are allowed at that rate.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	KeepaliveMinTime time.Duration
}

// Default limits.
const (
	DefaultBodyBudget        = 256 << 20
	DefaultMaxHeaderFields   = 200
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultRequestIdle       = 60 * time.Second
	DefaultResponseIdle      = 10 * time.Minute
	DefaultMaxStreamsPerConn = 1024
	DefaultKeepaliveTime     = 30 * time.Second
	DefaultKeepaliveTimeout  = 10 * time.Second
	DefaultKeepaliveMinTime  = 10 * time.Second
	// maxRecvMsg bounds one gRPC message: Envoy streams bodies in chunks far below it, and a
	// request_headers message within MaxHeaderBytes is far below it too.
	maxRecvMsg = 4 << 20
)

// normalize fills the defaults and refuses negative values.
func (l *Limits) normalize() error {
	def := func(name string, v *int64, d int64) error {
		if *v < 0 {
			return fmt.Errorf("epp: %s %d is negative", name, *v)
		}
		if *v == 0 {
			*v = d
		}
		return nil
	}
	defd := func(name string, v *time.Duration, d time.Duration) error {
		if *v < 0 {
			return fmt.Errorf("epp: %s %s is negative", name, *v)
		}
		if *v == 0 {
			*v = d
		}
		return nil
	}
	fields, hbytes, streams := int64(l.MaxHeaderFields), int64(l.MaxHeaderBytes), int64(l.MaxStreamsPerConn)
	for _, err := range []error{
		def("BodyBudget", &l.BodyBudget, DefaultBodyBudget),
		def("MaxHeaderFields", &fields, DefaultMaxHeaderFields),
		def("MaxHeaderBytes", &hbytes, DefaultMaxHeaderBytes),
		def("MaxStreamsPerConn", &streams, DefaultMaxStreamsPerConn),
		defd("RequestIdle", &l.RequestIdle, DefaultRequestIdle),
		defd("ResponseIdle", &l.ResponseIdle, DefaultResponseIdle),
		defd("KeepaliveTime", &l.KeepaliveTime, DefaultKeepaliveTime),
		defd("KeepaliveTimeout", &l.KeepaliveTimeout, DefaultKeepaliveTimeout),
		defd("KeepaliveMinTime", &l.KeepaliveMinTime, DefaultKeepaliveMinTime),
	} {
		if err != nil {
			return err
		}
	}
	l.MaxHeaderFields, l.MaxHeaderBytes, l.MaxStreamsPerConn = int(fields), int(hbytes), uint32(streams)
	return nil
}

// ServerOptions are the gRPC server options that enforce the connection-level limits: the message
// size, the streams per connection and the keepalive policy. The caller adds its credentials.
func (l Limits) ServerOptions() ([]grpc.ServerOption, error) {
	if err := l.normalize(); err != nil {
		return nil, err
	}
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxRecvMsg),
		grpc.NumStreamWorkers(streamWorkers), // marked experimental by grpc-go; workers.go says why
		grpc.MaxConcurrentStreams(l.MaxStreamsPerConn),
		grpc.MaxHeaderListSize(uint32(l.MaxHeaderBytes) + 16<<10), // gRPC's own metadata, not Envoy's headers (those are in messages)
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: l.KeepaliveTime, Timeout: l.KeepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: l.KeepaliveMinTime, PermitWithoutStream: true}),
	}, nil
}

// budget is the process-wide count of buffered request-body bytes.
type budget struct {
	limit int64
	used  atomic.Int64
}

// take reserves n bytes, or reports that they would pass the limit.
func (b *budget) take(n int64) bool {
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *budget) give(n int64) { b.used.Add(-n) }

// Buffered is the request-body bytes all streams hold now (kvexact_epp_buffered_body_bytes).
func (s *Server) Buffered() int64 { return s.body.used.Load() }
