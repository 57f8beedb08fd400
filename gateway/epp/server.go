package epp

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
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
	body   budget // the request-body bytes all streams buffer (Limits.BodyBudget)
	health *health.Server
	ready  atomic.Bool
}

// New builds a Server. It is not ready (readiness NOT_SERVING) until SetReady(true).
func New(cfg Config) (*Server, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, health: health.NewServer(), body: budget{limit: cfg.Limits.BodyBudget}}
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

// Ready reports the readiness SetReady last set.
func (s *Server) Ready() bool { return s.ready.Load() }

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
	st := &stream{s: s, srv: srv, start: time.Now(), echo: true}
	s.cfg.Metrics.streamStarted()
	defer func() {
		st.finish()
		s.cfg.Metrics.streamEnded()
	}()
	// Recv blocks; it runs on its own goroutine so that an idle stream can be ended (returning
	// cancels the stream's context, which ends the Recv).
	type received struct {
		msg *extprocv3.ProcessingRequest
		err error
	}
	ctx := srv.Context()
	msgs := make(chan received)
	goRecv(func() {
		for {
			msg, err := srv.Recv()
			select {
			case msgs <- received{msg, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	})
	idle := time.NewTimer(s.cfg.Limits.RequestIdle)
	defer idle.Stop()
	for {
		var r received
		select {
		case r = <-msgs:
		case <-ctx.Done():
			return nil // Envoy cancelled the stream (the client went away)
		case <-idle.C:
			s.cfg.Metrics.idle()
			phase, d := "request", s.cfg.Limits.RequestIdle
			if st.p != nil {
				phase, d = "response", s.cfg.Limits.ResponseIdle
			}
			return status.Errorf(codes.DeadlineExceeded, "ext_proc stream: no message for %s during the %s (the picker's %s idle limit)", d, phase, phase)
		}
		if r.err == io.EOF || status.Code(r.err) == codes.Canceled {
			return nil
		}
		if r.err != nil {
			return r.err
		}
		done, err := st.handle(r.msg)
		if err != nil {
			s.cfg.Metrics.malformed()
			return err
		}
		if done {
			return nil
		}
		d := s.cfg.Limits.RequestIdle
		if st.p != nil {
			d = s.cfg.Limits.ResponseIdle
		}
		idle.Reset(d)
	}
}

// stream is the state of one request's ext_proc stream.
type stream struct {
	s     *Server
	srv   extprocv3.ExternalProcessor_ProcessServer
	start time.Time

	hr        *http.Request // the request headers, as the parser wants them
	sent      []string      // the routing headers the client sent (routingHeaders), to remove
	body      []byte        // cap(body) bytes are taken from the process's body budget
	bodyDone  bool
	subset    []string
	hasSubset bool

	p          *pick
	respStatus int
	served     string // "ip:port" Envoy reports
	// echo: the response body comes full duplex (FULL_DUPLEX_STREAMED, as the first message's
	// protocol_config says, or without one), so each chunk is given back; otherwise (STREAMED,
	// deploy/envoy's) it is answered without a mutation and no bytes travel back.
	echo      bool
	tail      []byte // the response body's last bytes, for its usage
	accounted bool
}

func malformed(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "ext_proc stream: "+format, args...)
}

// handle processes one message; done means the stream has nothing more to do (an immediate
// response was sent).
func (st *stream) handle(msg *extprocv3.ProcessingRequest) (done bool, err error) {
	if pc := msg.ProtocolConfig; pc != nil {
		st.echo = pc.ResponseBodyMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	switch m := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if st.hr != nil {
			return false, malformed("request_headers received twice")
		}
		if e, err := st.requestHeaders(m.RequestHeaders, msg.MetadataContext); err != nil || e != nil {
			if err != nil {
				return false, err
			}
			return true, st.immediate(e)
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
		if e := st.buffer(b.Body); e != nil {
			return true, st.immediate(e)
		}
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

// requestHeaders turns Envoy's header map into an *http.Request and reads the subset hint. A
// request past the header limits, with a body over the cap announced by its Content-Length, or for
// a path no rule of the listener serves is answered at once (the returned error), before any body
// is buffered.
func (st *stream) requestHeaders(h *extprocv3.HttpHeaders, md *corev3.Metadata) (*apierror.Error, error) {
	lim := st.s.cfg.Limits
	hs := h.GetHeaders().GetHeaders()
	if len(hs) > lim.MaxHeaderFields {
		return invalid(http.StatusRequestHeaderFieldsTooLarge, "request_header_fields_too_large", "the request has %d header fields; at most %d are accepted", len(hs), lim.MaxHeaderFields), nil
	}
	hr := &http.Request{Method: http.MethodPost, Header: http.Header{}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
	path, size := "", 0
	for i, kv := range hs {
		v := kv.Value
		if len(kv.RawValue) > 0 {
			v = string(kv.RawValue)
		}
		if size += len(kv.Key) + len(v); size > lim.MaxHeaderBytes {
			return invalid(http.StatusRequestHeaderFieldsTooLarge, "request_header_fields_too_large", "the request's header fields exceed %d bytes", lim.MaxHeaderBytes), nil
		}
		switch kv.Key {
		case ":path":
			path = v
		case ":method":
			hr.Method = v
		case ":authority":
			hr.Host = v
		case "":
			return nil, malformed("request_headers.headers[%d]: empty key", i)
		default:
			if kv.Key[0] != ':' {
				hr.Header.Add(kv.Key, v)
			}
		}
	}
	if path == "" {
		return nil, malformed("request_headers: no :path header")
	}
	u, err := url.ParseRequestURI(path)
	if err != nil {
		return nil, malformed("request_headers: :path %q: %v", path, err)
	}
	hr.URL, hr.RequestURI = u, path
	for _, k := range routingHeaders {
		if _, ok := hr.Header[http.CanonicalHeaderKey(k)]; ok {
			st.sent = append(st.sent, k)
		}
	}
	subset, has, err := subsetHint(md)
	if err != nil {
		return nil, err
	}
	st.hr, st.subset, st.hasSubset = hr, subset, has
	if e := st.s.surface(nil, hr); e != nil {
		return e, nil
	}
	if cl := hr.Header.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n > st.s.cfg.MaxBodyBytes {
			return tooLarge(st.s.cfg.MaxBodyBytes), nil
		}
	}
	return nil, nil
}

// routingHeaders are the request headers that steer the data plane or carry the picker's evidence:
// whatever the client sent under these names is removed, and the picker's own values overwrite.
var routingHeaders = []string{DestinationHeader, PrefillHeader, DecisionHeader, ServedKey, SubsetKey}

// surface is nil when the request's path may get a destination: in canonical form (Envoy forwards
// the :path as sent, so no dot segments, doubled slashes or escapes an engine could resolve
// elsewhere) and on the API surface of rt's rule (proxy.SurfaceCheck), or before the rule is known
// (rt nil) of some rule of the listener.
func (s *Server) surface(rt *route.Router, hr *http.Request) *apierror.Error {
	if u := hr.URL; u.RawPath != "" || path.Clean(u.Path) != u.Path {
		return s.cfg.Surface(nil, hr)
	}
	if rt != nil {
		return s.cfg.Surface(rt, hr)
	}
	var first *apierror.Error
	for _, r := range s.cfg.Routes.Routers(s.cfg.Listener) {
		e := s.cfg.Surface(r, hr)
		if e == nil {
			return nil
		}
		first = cmp.Or(first, e)
	}
	if first == nil {
		first = s.cfg.Surface(nil, hr)
	}
	return first
}

// buffer appends a body chunk within the stream's cap and the process's body budget. Capacity is
// what is taken from the budget, so growth is done here (doubling up to the cap).
func (st *stream) buffer(chunk []byte) *apierror.Error {
	max := st.s.cfg.MaxBodyBytes
	need := int64(len(st.body)) + int64(len(chunk))
	if need > max {
		return tooLarge(max)
	}
	if need > int64(cap(st.body)) {
		// Not sized by Content-Length: a stream would take the budget without sending the bytes.
		grow := min(max, maxOf(need, 2*int64(cap(st.body)), 4096))
		if !st.s.body.take(grow - int64(cap(st.body))) {
			st.s.cfg.Metrics.budgetExhausted()
			return unavailable(http.StatusServiceUnavailable, "body_budget_exhausted",
				"the picker holds %d bytes of request bodies, its budget; retry later", st.s.cfg.Limits.BodyBudget)
		}
		st.s.cfg.Metrics.buffered(grow - int64(cap(st.body)))
		nb := make([]byte, len(st.body), grow)
		copy(nb, st.body)
		st.body = nb
	}
	st.body = append(st.body, chunk...)
	return nil
}

// release gives the body's bytes back to the budget.
func (st *stream) release() {
	if c := int64(cap(st.body)); c > 0 {
		st.s.body.give(c)
		st.s.cfg.Metrics.buffered(-c)
	}
	st.body = nil
}

func maxOf(xs ...int64) int64 {
	m := xs[0]
	for _, x := range xs[1:] {
		m = max(m, x)
	}
	return m
}

func tooLarge(max int64) *apierror.Error {
	return invalid(http.StatusRequestEntityTooLarge, "request_too_large", "the request body exceeds %d bytes", max)
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
	ctx, span := st.startSpan()
	p, cerr := st.s.decide(ctx, st.hr, st.body, st.subset, st.hasSubset)
	endSpan(span, p, cerr)
	if cerr != nil {
		return true, st.immediate(cerr)
	}
	st.p = p
	dest := joinList(p.list)
	set := []*corev3.HeaderValueOption{header(DestinationHeader, dest)}
	set = appendTraceContext(set, ctx, span)
	if p.prefill != "" {
		set = append(set, header(PrefillHeader, p.prefill))
	}
	if p.rankHeader != "" {
		set = append(set, header(strings.ToLower(p.rankHeader), strconv.Itoa(p.rank)))
	}
	if st.s.cfg.DebugHeader {
		set = append(set, header(DecisionHeader, p.evidence()))
	}
	// The client's routing headers go; those the picker sets overwrite (header() says so), the
	// rest are removed, so the origin sees exactly the picker's values.
	var remove []string
	for _, k := range st.sent {
		if !slices.ContainsFunc(set, func(o *corev3.HeaderValueOption) bool { return o.Header.Key == k }) {
			remove = append(remove, k)
		}
	}
	resp := &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
			ClearRouteCache: true,
			HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: remove},
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
	defer st.release()
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

// responseBody keeps the body's tail, where the usage object is, and lets the chunk through
// unchanged at once, so a stream is not delayed: given back in full duplex, answered without a
// mutation otherwise (no body bytes travel back).
func (st *stream) responseBody(b *extprocv3.HttpBody) error {
	st.tail = append(st.tail, b.Body...)
	if len(st.tail) > maxUsageScan {
		st.tail = append(st.tail[:0], st.tail[len(st.tail)-maxUsageScan:]...)
	}
	if b.EndOfStream {
		st.account()
	}
	answer := &extprocv3.CommonResponse{}
	if st.echo {
		answer.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b.Body, EndOfStream: b.EndOfStream}}}
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: answer}}})
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
	st.release()
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

// header sets k to v, replacing every value the request or response had under k.
func header(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
}
