package main

import (
	"context"
	"net"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestAnswersEveryMessage drives one request's stream the way deploy/envoy's processing mode does
// and checks each answer: the destination (three entries, rotating) with the body given back, then
// the response headers and body answered without a mutation.
func TestAnswersEveryMessage(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, &picker{ups: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"}})
	go gs.Serve(l)
	defer gs.Stop()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	for _, want := range []string{"127.0.0.1:2,127.0.0.1:3,127.0.0.1:4", "127.0.0.1:3,127.0.0.1:4,127.0.0.1:1"} {
		s, err := client.Process(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		send := func(r *extprocv3.ProcessingRequest) {
			if err := s.Send(r); err != nil {
				t.Fatal(err)
			}
		}
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}})
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"prompt":`)}}})
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`"hi"}`), EndOfStream: true}}})
		h, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		set := h.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()
		if len(set) != 1 || set[0].Header.Key != "x-gateway-destination-endpoint" || string(set[0].Header.RawValue) != want {
			t.Fatalf("headers answer %v; want the destination %q", set, want)
		}
		if md := h.GetDynamicMetadata().GetFields()["envoy.lb"].GetStructValue().GetFields()["x-gateway-destination-endpoint"].GetStringValue(); md != want {
			t.Fatalf("envoy.lb metadata %q; want %q", md, want)
		}
		b, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if sr := b.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); string(sr.GetBody()) != `{"prompt":"hi"}` || !sr.GetEndOfStream() {
			t.Fatalf("body given back %q (end %v); want the whole body with its end", sr.GetBody(), sr.GetEndOfStream())
		}
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}})
		if r, err := s.Recv(); err != nil || r.GetResponseHeaders() == nil {
			t.Fatalf("response headers answer %v, %v", r, err)
		}
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("{}"), EndOfStream: true}}})
		if r, err := s.Recv(); err != nil || r.GetResponseBody() == nil || r.GetResponseBody().GetResponse().GetBodyMutation() != nil {
			t.Fatalf("response body answer %v, %v; want one without a mutation", r, err)
		}
		s.CloseSend()
	}
}
