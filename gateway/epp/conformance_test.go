package epp_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvexact/kvexact/ctk/eppcheck"
	"github.com/kvexact/kvexact/deploy"
	"github.com/kvexact/kvexact/gateway/rules"
)

// TestConformanceCheck: ctk epp's checks all pass against kvexact's picker, one line each, exit 0;
// and a picker that ignores the subset hint, serves any path and appends its destination fails
// exactly those checks, exit 1 (the checks can fail).
func TestConformanceCheck(t *testing.T) {
	w := startWorld(t, worldSpec{n: 3})
	var pool []string
	for a := range w.byAddr {
		pool = append(pool, a)
	}
	rs := eppcheck.Run(context.Background(), eppcheck.Config{Client: w.client, Pool: pool, Model: "llama3"})
	var out bytes.Buffer
	if code := eppcheck.Report(&out, rs); code != 0 || len(rs) != 7 {
		t.Fatalf("against kvexact's picker: exit %d, %d checks:\n%s", code, len(rs), out.String())
	}
	if n := strings.Count(out.String(), "PASS  "); n != 7 {
		t.Fatalf("want 7 PASS lines:\n%s", out.String())
	}
	w.noLeak()

	// A naive picker: always the first endpoint, appended, whatever the path or the hint.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, naivePicker{dest: pool[0]})
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rs = eppcheck.Run(context.Background(), eppcheck.Config{Client: extprocv3.NewExternalProcessorClient(conn), Pool: pool, Model: "llama3"})
	out.Reset()
	if code := eppcheck.Report(&out, rs); code != 1 {
		t.Fatalf("a naive picker: exit %d:\n%s", code, out.String())
	}
	want := map[string]bool{"destination header and metadata agree": true, "fallback endpoints are pool endpoints, distinct": true,
		"subset hint honoured": false, "immediate response shaped (503 for an unservable subset)": false, "served-endpoint receipt read": true,
		"no destination outside the API surface (/reset_prefix_cache)": false, "client routing headers cannot override": false}
	for _, r := range rs {
		if p, ok := want[r.Name]; !ok || p != r.Pass {
			t.Fatalf("naive picker, %q: pass %v (%s)\n%s", r.Name, r.Pass, r.Detail, out.String())
		}
	}
}

type naivePicker struct {
	extprocv3.UnimplementedExternalProcessorServer
	dest string
}

func (p naivePicker) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	// Naive in what it picks, correct in the protocol: a STREAMED response body (deploy/envoy's)
	// is answered without a mutation, a full-duplex one is echoed back chunk by chunk.
	echo := true
	for {
		m, err := srv.Recv()
		if err != nil {
			return nil
		}
		if pc := m.ProtocolConfig; pc != nil {
			echo = pc.ResponseBodyMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		}
		var r *extprocv3.ProcessingResponse
		switch m.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			r = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte(p.dest)}}}}}}},
				DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"envoy.lb": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
					"x-gateway-destination-endpoint": structpb.NewStringValue(p.dest)}})}}}
		case *extprocv3.ProcessingRequest_RequestBody:
			r = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
				BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: m.GetRequestBody().Body, EndOfStream: m.GetRequestBody().EndOfStream}}}}}}}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			r = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			answer := &extprocv3.CommonResponse{}
			if echo {
				answer.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: m.GetResponseBody().Body, EndOfStream: m.GetResponseBody().EndOfStream}}}
			}
			r = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: answer}}}
		default:
			continue
		}
		if err := srv.Send(r); err != nil {
			return nil
		}
	}
}

// TestConformanceThroughEnvoy is ctk epp's default mode against kvexact's picker: ctk starts a
// simulated pool on the addresses the picker serves and a real Envoy (deploy/envoy, as it is) in
// front of the picker, and every check passes through Envoy, one line each, exit 0. The naive
// picker fails the subset, 503, surface and override checks there too (exit 1).
func TestConformanceThroughEnvoy(t *testing.T) {
	bin := envoyBinary(t)
	var pool []string
	w := startWorld(t, worldSpec{n: 3, mod: func(r *rules.Rule) {
		for i := range r.Endpoints {
			a := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			r.Endpoints[i].Address = "http://" + a
			pool = append(pool, a)
		}
	}})
	run := func(picker string) (int, string, []eppcheck.Result) {
		t.Helper()
		var log bytes.Buffer
		rs, err := eppcheck.RunThroughEnvoy(context.Background(), eppcheck.EnvoyConfig{Picker: picker,
			Dial: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
			Pool: pool, Model: "llama3", Envoy: bin, Template: deploy.EnvoyTemplate, Log: &log})
		if err != nil {
			t.Fatalf("ctk epp could not start its pool and Envoy: %v\n%s", err, log.String())
		}
		var out bytes.Buffer
		code := eppcheck.Report(&out, rs)
		return code, out.String(), rs
	}
	code, out, rs := run(w.conn.Target())
	t.Logf("kvexact's picker through Envoy:\n%s", out)
	if code != 0 || len(rs) != 7 || strings.Count(out, "PASS  ") != 7 {
		t.Fatalf("against kvexact's picker through Envoy: exit %d:\n%s", code, out)
	}
	w.noLeak()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, naivePicker{dest: pool[0]})
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	code, out, rs = run(l.Addr().String())
	t.Logf("the naive picker through Envoy:\n%s", out)
	want := map[string]bool{"destination header and metadata agree": true, "fallback endpoints are pool endpoints, distinct": true,
		"subset hint honoured": false, "immediate response shaped (503 for an unservable subset)": false, "served-endpoint receipt read": true,
		"no destination outside the API surface (/reset_prefix_cache)": false, "client routing headers cannot override": false}
	for _, r := range rs {
		if p, ok := want[r.Name]; !ok || p != r.Pass {
			t.Errorf("naive picker through Envoy, %q: pass %v (%s)", r.Name, r.Pass, r.Detail)
		}
	}
	if code != 1 {
		t.Fatalf("a naive picker through Envoy: exit %d", code)
	}
}
