// Package eppcheck holds an Endpoint Picker to the Gateway API Inference Extension's picker
// protocol (proposal 004, v1): it plays the data plane's side of ext_proc against any picker and
// checks, one requirement at a time, what the picker answers. ctk epp runs it (docs/epp.md says
// what each check means in the protocol's words and how to point it at another picker).
package eppcheck

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Protocol names (proposal 004): written here rather than imported from kvexact's picker, so the
// check does not share a mistake with the code it checks.
const (
	destHeader = "x-gateway-destination-endpoint"
	lbNS       = "envoy.lb"
	servedKey  = "x-gateway-destination-endpoint-served"
	subsetNS   = "envoy.lb.subset_hint"
	subsetKey  = "x-gateway-destination-endpoint-subset"
)

// Config is what a run needs: a client to the picker and the pool it serves.
type Config struct {
	Client extprocv3.ExternalProcessorClient
	// Pool is the picker's endpoints as the protocol spells them ("ip:port"), at least one.
	Pool []string
	// Model, Path and Body make the probe request: a completion for Model on Path (default
	// /v1/completions); Body, when set, replaces the generated body.
	Model, Path string
	// AdminPath is a path outside the OpenAI API surface (default /reset_prefix_cache).
	AdminPath string
	Timeout   time.Duration // per stream (default 10 s)
}

// Result is one requirement's outcome.
type Result struct {
	Name   string // short, stable: the report's first column
	Pass   bool
	Detail string // what was seen; on a failure, what the protocol asks instead
}

// Run checks every requirement and returns one result each, in a fixed order.
func Run(ctx context.Context, c Config) []Result {
	if c.Path == "" {
		c.Path = "/v1/completions"
	}
	if c.AdminPath == "" {
		c.AdminPath = "/reset_prefix_cache"
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	r := &runner{c: c}
	return []Result{
		r.destination(ctx),
		r.fallbacks(ctx),
		r.subset(ctx),
		r.emptySubset(ctx),
		r.served(ctx),
		r.surface(ctx),
		r.override(ctx),
	}
}

type runner struct{ c Config }

// answer is the picker's reply to one request's messages up to its decision.
type answer struct {
	st        extprocv3.ExternalProcessor_ProcessClient
	cancel    context.CancelFunc
	set       []*corev3.HeaderValueOption
	removed   []string
	metadata  string
	immediate *extprocv3.ImmediateResponse
}

func (a *answer) header(k string) (string, *corev3.HeaderValueOption) {
	for _, h := range a.set {
		if strings.EqualFold(h.GetHeader().GetKey(), k) {
			v := h.Header.Value
			if len(h.Header.RawValue) > 0 {
				v = string(h.Header.RawValue)
			}
			return v, h
		}
	}
	return "", nil
}

func (r *runner) body(prompt string) []byte {
	b, _ := json.Marshal(map[string]any{"model": r.c.Model, "prompt": prompt, "max_tokens": 1})
	return b
}

// ask sends request headers (with extra headers and an optional subset hint) and the body, and reads
// the picker's answers up to the body given back or an immediate response.
func (r *runner) ask(ctx context.Context, path string, body []byte, subset []string, extra ...string) (*answer, error) {
	ctx, cancel := context.WithTimeout(ctx, r.c.Timeout)
	st, err := r.c.Client.Process(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	a := &answer{st: st, cancel: cancel}
	hm := &corev3.HeaderMap{}
	kv := append([]string{":method", "POST", ":path", path, ":authority", "eppcheck", ":scheme", "http", "content-type", "application/json"}, extra...)
	for i := 0; i+1 < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}}
	if subset != nil {
		vals := []any{}
		for _, s := range subset {
			vals = append(vals, s)
		}
		sv, _ := structpb.NewStruct(map[string]any{subsetKey: vals})
		msg.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{subsetNS: sv}}
	}
	if err := st.Send(msg); err != nil {
		cancel()
		return nil, err
	}
	// The body in one chunk, as FULL_DUPLEX_STREAMED delivers a small one; a picker that already
	// answered may have closed the stream (the send error is then not the picker's fault).
	_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}})
	for {
		resp, err := st.Recv()
		if err != nil {
			cancel()
			return nil, fmt.Errorf("the picker's stream ended before an answer: %w", err)
		}
		switch m := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			a.immediate = m.ImmediateResponse
			return a, nil
		case *extprocv3.ProcessingResponse_RequestHeaders:
			mut := m.RequestHeaders.GetResponse().GetHeaderMutation()
			a.set, a.removed = mut.GetSetHeaders(), mut.GetRemoveHeaders()
			a.metadata = resp.GetDynamicMetadata().GetFields()[lbNS].GetStructValue().GetFields()[destHeader].GetStringValue()
		case *extprocv3.ProcessingResponse_RequestBody:
			if m.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() || m.RequestBody.GetResponse().GetBodyMutation() == nil {
				return a, nil
			}
		}
	}
}

func (r *runner) inPool(addr string) bool { return slices.Contains(r.c.Pool, strings.TrimSpace(addr)) }

func fail(name, format string, args ...any) Result {
	return Result{Name: name, Detail: fmt.Sprintf(format, args...)}
}

// destination: "the EPP MUST set the x-gateway-destination-endpoint header and the same value in
// the envoy.lb dynamic metadata"; the endpoint is one of the pool's.
func (r *runner) destination(ctx context.Context) Result {
	const name = "destination header and metadata agree"
	a, err := r.ask(ctx, r.c.Path, r.body("eppcheck destination"), nil)
	if err != nil {
		return fail(name, "%v", err)
	}
	defer a.cancel()
	if a.immediate != nil {
		return fail(name, "an immediate response %d instead of a destination", a.immediate.GetStatus().GetCode())
	}
	h, _ := a.header(destHeader)
	if h == "" {
		return fail(name, "no %s header in the request headers response", destHeader)
	}
	if a.metadata != h {
		return fail(name, "header %q, %s.%s metadata %q: the protocol asks for the same value", h, lbNS, destHeader, a.metadata)
	}
	first, _, _ := strings.Cut(h, ",")
	if !r.inPool(first) {
		return fail(name, "destination %q is not an endpoint of the pool %v", first, r.c.Pool)
	}
	return Result{Name: name, Pass: true, Detail: h}
}

// fallbacks: "a comma-separated list of endpoints … the data plane tries them in order"; every entry
// is a pool endpoint and none repeats.
func (r *runner) fallbacks(ctx context.Context) Result {
	const name = "fallback endpoints are pool endpoints, distinct"
	a, err := r.ask(ctx, r.c.Path, r.body("eppcheck fallbacks"), nil)
	if err != nil {
		return fail(name, "%v", err)
	}
	defer a.cancel()
	h, _ := a.header(destHeader)
	list := strings.Split(h, ",")
	seen := map[string]bool{}
	for _, e := range list {
		e = strings.TrimSpace(e)
		if !r.inPool(e) {
			return fail(name, "%q in %q is not a pool endpoint", e, h)
		}
		if seen[e] {
			return fail(name, "%q appears twice in %q", e, h)
		}
		seen[e] = true
	}
	return Result{Name: name, Pass: true, Detail: fmt.Sprintf("%d endpoint(s): %s", len(list), h)}
}

// subset: "if the subset hint is present, the EPP MUST pick from the endpoints in it".
func (r *runner) subset(ctx context.Context) Result {
	const name = "subset hint honoured"
	for _, only := range r.c.Pool {
		a, err := r.ask(ctx, r.c.Path, r.body("eppcheck subset "+only), []string{only})
		if err != nil {
			return fail(name, "subset [%s]: %v", only, err)
		}
		a.cancel()
		h, _ := a.header(destHeader)
		for _, e := range strings.Split(h, ",") {
			if strings.TrimSpace(e) != only {
				return fail(name, "subset [%s]: destination list %q leaves the subset", only, h)
			}
		}
	}
	return Result{Name: name, Pass: true, Detail: fmt.Sprintf("each of %d endpoints alone", len(r.c.Pool))}
}

// emptySubset: "if none of the subset's endpoints can serve, the EPP MUST return an error (503)";
// the immediate response is shaped as an HTTP answer (a status and a body).
func (r *runner) emptySubset(ctx context.Context) Result {
	const name = "immediate response shaped (503 for an unservable subset)"
	a, err := r.ask(ctx, r.c.Path, r.body("eppcheck empty subset"), []string{"192.0.2.1:1"})
	if err != nil {
		return fail(name, "%v", err)
	}
	defer a.cancel()
	if a.immediate == nil {
		h, _ := a.header(destHeader)
		return fail(name, "destination %q for a subset of no pool endpoint; the protocol asks for 503", h)
	}
	if c := a.immediate.GetStatus().GetCode(); c != 503 {
		return fail(name, "status %d; want 503", c)
	}
	if len(a.immediate.Body) == 0 {
		return fail(name, "503 without a body")
	}
	return Result{Name: name, Pass: true, Detail: "503 " + string(a.immediate.Body)}
}

// served: the data plane reports "x-gateway-destination-endpoint-served" in envoy.lb metadata on
// the response path; the picker must take it and go on serving the stream.
func (r *runner) served(ctx context.Context) Result {
	const name = "served-endpoint receipt read"
	a, err := r.ask(ctx, r.c.Path, r.body("eppcheck served"), nil)
	if err != nil {
		return fail(name, "%v", err)
	}
	defer a.cancel()
	h, _ := a.header(destHeader)
	first, _, _ := strings.Cut(h, ",")
	sv, _ := structpb.NewStruct(map[string]any{servedKey: first})
	if err := a.st.Send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{lbNS: sv}},
	}); err != nil {
		return fail(name, "sending the response headers: %v", err)
	}
	resp, err := a.st.Recv()
	if err != nil {
		return fail(name, "the picker ended the stream on the served-endpoint metadata: %v", err)
	}
	if resp.GetResponseHeaders() == nil {
		return fail(name, "answered %T to the response headers", resp.Response)
	}
	a.st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(`{}`), EndOfStream: true}}})
	if resp, err = a.st.Recv(); err != nil && err != io.EOF {
		return fail(name, "the response body: %v", err)
	}
	return Result{Name: name, Pass: true, Detail: "served " + first}
}

// surface: no destination for a path outside the OpenAI API surface (an engine's admin route),
// even with a completion-shaped body.
func (r *runner) surface(ctx context.Context) Result {
	name := "no destination outside the API surface (" + r.c.AdminPath + ")"
	a, err := r.ask(ctx, r.c.AdminPath, r.body("eppcheck admin path"), nil)
	if err != nil {
		return fail(name, "%v", err)
	}
	defer a.cancel()
	if h, _ := a.header(destHeader); h != "" {
		return fail(name, "destination %q for %s", h, r.c.AdminPath)
	}
	if a.immediate == nil {
		return fail(name, "neither a destination nor an immediate response")
	}
	return Result{Name: name, Pass: true, Detail: fmt.Sprintf("%d", a.immediate.GetStatus().GetCode())}
}

// override: a client's own routing headers cannot steer the request: the picker's destination is
// set with overwrite semantics (or the client's removed) and differs from the forged value.
func (r *runner) override(ctx context.Context) Result {
	const name = "client routing headers cannot override"
	const forged = "192.0.2.1:1"
	a, err := r.ask(ctx, r.c.Path, r.body("eppcheck forged"), nil, destHeader, forged)
	if err != nil {
		return fail(name, "%v", err)
	}
	defer a.cancel()
	h, opt := a.header(destHeader)
	if h == "" || strings.Contains(h, forged) {
		return fail(name, "destination %q with the client's %s: %s", h, destHeader, forged)
	}
	if opt.AppendAction != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD && !slices.Contains(a.removed, destHeader) {
		return fail(name, "%s set with %v and the client's not removed: the data plane keeps %s beside it", destHeader, opt.AppendAction, forged)
	}
	return Result{Name: name, Pass: true, Detail: "set with " + opt.AppendAction.String()}
}

// Report writes one line per requirement (PASS or FAIL, its name, what was seen) and returns the
// exit status: 0 when every requirement holds, 1 otherwise.
func Report(w io.Writer, rs []Result) int {
	code := 0
	for _, r := range rs {
		v := "PASS"
		if !r.Pass {
			v, code = "FAIL", 1
		}
		fmt.Fprintf(w, "%s  %-58s %s\n", v, r.Name, r.Detail)
	}
	return code
}
