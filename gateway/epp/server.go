package epp

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvexact/kvexact/gateway/apierror"
	kvhealth "github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/route"
)

// Health service names the protocol defines.
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
	HealthExtProc   = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// Server is the ext_proc ExternalProcessor and its gRPC health services.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	cfg    Config
	health *health.Server
	ready  atomic.Bool
}

// New builds a Server. It is not ready (readiness NOT_SERVING) until SetReady(true).
func New(cfg Config) (*Server, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, health: health.NewServer()}
	s.health.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	s.SetReady(false)
	return s, nil
}

// Register adds the ExternalProcessor and the health services to g.
func (s *Server) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
}

// SetReady flips readiness and the ExternalProcessor's health: ready once the endpoint set is known
// (static configuration loaded, or the Kubernetes informers synced).
func (s *Server) SetReady(ok bool) {
	s.ready.Store(ok)
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus(HealthReadiness, st)
	s.health.SetServingStatus(HealthExtProc, st)
	s.health.SetServingStatus("", st)
}

// Shutdown marks every service NOT_SERVING (the gRPC server's GracefulStop follows).
func (s *Server) Shutdown() {
	s.ready.Store(false)
	s.health.Shutdown()
}

// Process serves one HTTP request's ext_proc stream. The request must come with body mode
// FULL_DUPLEX_STREAMED (docs/epp.md): the picker holds the body until its end, decides, then
// answers the headers (destination) and gives the body back in streamed chunks. A malformed
// stream ends with InvalidArgument naming the message; whatever the end, the decision's load units
// are given back.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	st := &stream{s: s, srv: srv, start: time.Now()}
	s.cfg.Metrics.streamStarted()
	defer func() {
		st.finish()
		s.cfg.Metrics.streamEnded()
	}()
	for {
		msg, err := srv.Recv()
		if err == io.EOF || status.Code(err) == codes.Canceled {
			return nil
		}
		if err != nil {
			return err
		}
		done, err := st.handle(msg)
		if err != nil {
			s.cfg.Metrics.malformed()
			return err
		}
		if done {
			return nil
		}
	}
}

// stream is the state of one request's ext_proc stream.
type stream struct {
	s     *Server
	srv   extprocv3.ExternalProcessor_ProcessServer
	start time.Time

	hr        *http.Request // the request headers, as the parser wants them
	body      []byte
	bodyDone  bool
	subset    []string
	hasSubset bool

	p          *pick
	respStatus int
	served     string // "ip:port" Envoy reports
	tail       []byte // the response body's last bytes, for its usage
	accounted  bool
}

func malformed(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "ext_proc stream: "+format, args...)
}

// handle processes one message; done means the stream has nothing more to do (an immediate
// response was sent).
func (st *stream) handle(msg *extprocv3.ProcessingRequest) (done bool, err error) {
	switch m := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if st.hr != nil {
			return false, malformed("request_headers received twice")
		}
		if err := st.requestHeaders(m.RequestHeaders, msg.MetadataContext); err != nil {
			return false, err
		}
		if m.RequestHeaders.EndOfStream {
			st.bodyDone = true
			return st.decide()
		}
	case *extprocv3.ProcessingRequest_RequestBody:
		if st.hr == nil {
			return false, malformed("request_body before request_headers")
		}
		if st.bodyDone {
			return false, malformed("request_body after the request's end of stream")
		}
		b := m.RequestBody
		if int64(len(st.body))+int64(len(b.Body)) > st.s.cfg.MaxBodyBytes {
			return true, st.immediate(invalid(http.StatusRequestEntityTooLarge, "request_too_large", "the request body exceeds %d bytes", st.s.cfg.MaxBodyBytes))
		}
		st.body = append(st.body, b.Body...)
		if b.EndOfStream {
			st.bodyDone = true
			if st.body == nil {
				st.body = []byte{}
			}
			return st.decide()
		}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if st.hr == nil {
			return false, malformed("request_trailers before request_headers")
		}
		st.bodyDone = true
		if st.p == nil {
			if st.body == nil {
				st.body = []byte{}
			}
			if done, err := st.decide(); done || err != nil {
				return done, err
			}
		}
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		if st.p == nil {
			return false, malformed("response_headers before the request was decided (request_headers and the whole request body come first)")
		}
		return false, st.responseHeaders(m.ResponseHeaders, msg.MetadataContext)
	case *extprocv3.ProcessingRequest_ResponseBody:
		if st.p == nil {
			return false, malformed("response_body before the request was decided")
		}
		return false, st.responseBody(m.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		if st.p == nil {
			return false, malformed("response_trailers before the request was decided")
		}
		st.account()
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	case nil:
		return false, malformed("a ProcessingRequest without any request field")
	default:
		return false, malformed("unsupported message %T", m)
	}
	return false, nil
}

// requestHeaders turns Envoy's header map into an *http.Request and reads the subset hint.
func (st *stream) requestHeaders(h *extprocv3.HttpHeaders, md *corev3.Metadata) error {
	hr := &http.Request{Method: http.MethodPost, Header: http.Header{}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
	path := ""
	for i, kv := range h.GetHeaders().GetHeaders() {
		v := kv.Value
		if len(kv.RawValue) > 0 {
			v = string(kv.RawValue)
		}
		switch kv.Key {
		case ":path":
			path = v
		case ":method":
			hr.Method = v
		case ":authority":
			hr.Host = v
		case "":
			return malformed("request_headers.headers[%d]: empty key", i)
		default:
			if kv.Key[0] != ':' {
				hr.Header.Add(kv.Key, v)
			}
		}
	}
	if path == "" {
		return malformed("request_headers: no :path header")
	}
	u, err := url.ParseRequestURI(path)
	if err != nil {
		return malformed("request_headers: :path %q: %v", path, err)
	}
	hr.URL, hr.RequestURI = u, path
	subset, has, err := subsetHint(md)
	if err != nil {
		return err
	}
	st.hr, st.subset, st.hasSubset = hr, subset, has
	return nil
}

// subsetHint reads metadata_context.filter_metadata["envoy.lb.subset_hint"]
// ["x-gateway-destination-endpoint-subset"]: a list of "ip:port" strings.
func subsetHint(md *corev3.Metadata) ([]string, bool, error) {
	ns, ok := md.GetFilterMetadata()[SubsetNamespace]
	if !ok {
		return nil, false, nil
	}
	v, ok := ns.GetFields()[SubsetKey]
	if !ok {
		return nil, false, nil
	}
	lv := v.GetListValue()
	if lv == nil {
		return nil, false, malformed("metadata_context %s.%s: a list of \"ip:port\" strings expected", SubsetNamespace, SubsetKey)
	}
	if len(lv.Values) > maxSubset {
		return nil, false, malformed("metadata_context %s.%s: %d entries; at most %d", SubsetNamespace, SubsetKey, len(lv.Values), maxSubset)
	}
	out := make([]string, 0, len(lv.Values))
	for i, x := range lv.Values {
		sv, ok := x.Kind.(*structpb.Value_StringValue)
		if !ok {
			return nil, false, malformed("metadata_context %s.%s[%d]: not a string", SubsetNamespace, SubsetKey, i)
		}
		out = append(out, sv.StringValue)
	}
	return out, true, nil
}

// decide routes the request and answers: the headers response carrying the destination (header and
// dynamic metadata, the same value), then the body given back unchanged.
func (st *stream) decide() (bool, error) {
	t0 := time.Now()
	p, cerr := st.s.decide(st.srv.Context(), st.hr, st.body, st.subset, st.hasSubset)
	if cerr != nil {
		return true, st.immediate(cerr)
	}
	st.p = p
	dest := joinList(p.list)
	set := []*corev3.HeaderValueOption{header(DestinationHeader, dest)}
	if p.prefill != "" {
		set = append(set, header(PrefillHeader, p.prefill))
	}
	if st.s.cfg.DebugHeader {
		set = append(set, header(DecisionHeader, p.evidence()))
	}
	resp := &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
			ClearRouteCache: true,
			HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set},
		}}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			DestinationNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				DestinationHeader: structpb.NewStringValue(dest),
			}}),
		}},
	}
	if err := st.send(resp); err != nil {
		return false, err
	}
	st.s.cfg.Metrics.decided(p.router.Rule().Name, time.Since(t0))
	if st.body == nil {
		return false, nil // headers-only request: nothing to give back
	}
	for off := 0; ; off += maxChunk {
		end := min(off+maxChunk, len(st.body))
		if err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
			BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: st.body[off:end], EndOfStream: end == len(st.body)}}},
		}}}}); err != nil {
			return false, err
		}
		if end == len(st.body) {
			break
		}
	}
	st.body = nil
	return false, nil
}

// responseHeaders reads the origin status and the served endpoint, reports the outcome to the
// endpoint's breaker, and stamps the receipt.
func (st *stream) responseHeaders(h *extprocv3.HttpHeaders, md *corev3.Metadata) error {
	for _, kv := range h.GetHeaders().GetHeaders() {
		if kv.Key == ":status" {
			v := kv.Value
			if len(kv.RawValue) > 0 {
				v = string(kv.RawValue)
			}
			st.respStatus, _ = strconv.Atoi(v)
		}
	}
	if ns, ok := md.GetFilterMetadata()[DestinationNamespace]; ok {
		st.served = ns.GetFields()[ServedKey].GetStringValue()
	}
	served := st.servedEndpoint()
	var set []*corev3.HeaderValueOption
	if served != nil {
		set = append(set, header(ReceiptHeader, served.Name))
		if served != st.p.dest {
			// Envoy failed over: the destination did not answer.
			st.s.cfg.Metrics.failover(st.p.router.Rule().Name)
			report(st.p.dest.Health, kvhealth.TransportFailure, 0)
		}
		report(served.Health, kvhealth.Success, st.respStatus)
	} else if st.served != "" {
		st.s.cfg.Metrics.servedUnknown(st.p.router.Rule().Name)
	}
	if h.EndOfStream {
		st.account()
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
		HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set},
	}}}})
}

// servedEndpoint is the endpoint Envoy says served; without the metadata, the destination.
func (st *stream) servedEndpoint() *route.Endpoint {
	if st.served == "" {
		return st.p.dest
	}
	first, _, _ := strings.Cut(st.served, ",")
	return st.p.byAddr[strings.TrimSpace(first)]
}

func report(h *kvhealth.Endpoint, o kvhealth.Outcome, code int) {
	if h == nil || h.Breaker == nil || !h.Breaker.Acquire() {
		return
	}
	h.Breaker.Report(o, code)
}

// responseBody gives each chunk back at once (streams are not delayed) and keeps the tail, where the
// usage object is.
func (st *stream) responseBody(b *extprocv3.HttpBody) error {
	st.tail = append(st.tail, b.Body...)
	if len(st.tail) > maxUsageScan {
		st.tail = append(st.tail[:0], st.tail[len(st.tail)-maxUsageScan:]...)
	}
	if b.EndOfStream {
		st.account()
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b.Body, EndOfStream: b.EndOfStream}}},
	}}}})
}

// account records, once per request, the served response: the picker's request count, and the
// gateway's predicted-vs-realized account where the served endpoint is known and its 200 response
// carried a cached-token receipt (what the standalone proxy reports, so both front ends feed the
// same counters and the same shortfall suspension).
func (st *stream) account() {
	if st.accounted || st.p == nil {
		return
	}
	st.accounted = true
	served := st.servedEndpoint()
	name := ""
	if served != nil {
		name = served.Name
	}
	rt, d := st.p.router, st.p.d
	st.s.cfg.Metrics.served(rt.Rule().Name, name, st.respStatus)
	if served == nil || st.respStatus != http.StatusOK {
		return
	}
	u, err := ParseUsage(st.tail)
	if err != nil {
		st.s.cfg.Log.Debug("epp: response usage not read", "rule", rt.Rule().Name, "endpoint", name, "err", err)
	}
	if !u.HasCached {
		return
	}
	blockSize := rt.Rule().BlockSize
	predicted, confirmed := 0, 0
	for _, ev := range d.Endpoints {
		if ev.Name == name {
			predicted, confirmed = ev.Prefix*blockSize, ev.Prefix-ev.Predicted
		}
	}
	// As the proxy's UsageReport.KVExact: a hit only predict-on-route predicted is left out of the
	// shortfall rule (it says nothing about the engine's parity).
	kvExact := d.Tier == route.TierKVExact && d.Target == served && confirmed > 0
	if st.s.cfg.RecordUsage == nil {
		return
	}
	st.s.cfg.RecordUsage(rt.Rule().Name, name, kvExact, predicted, u.CachedTokens, blockSize)
}

// finish gives back the decision's load units, whatever ended the stream.
func (st *stream) finish() {
	if st.p != nil {
		st.p.d.Release()
	}
}

// immediate answers the client without an upstream request (an ext_proc ImmediateResponse).
func (st *stream) immediate(e *apierror.Error) error {
	st.s.cfg.Metrics.rejected(e.Status)
	set := []*corev3.HeaderValueOption{header("content-type", "application/json")}
	if e.RetryAfter() {
		set = append(set, header("retry-after", "1"))
	}
	err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.Status)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: set},
		Body:    e.Body(),
		Details: e.Code,
	}}})
	if err != nil {
		return err
	}
	return nil
}

func (st *stream) send(r *extprocv3.ProcessingResponse) error {
	if err := st.srv.Send(r); err != nil {
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil
		}
		return fmt.Errorf("ext_proc send: %w", err)
	}
	return nil
}

func header(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}}
}
