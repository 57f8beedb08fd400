// Command minpicker is the least an Endpoint Picker can do behind deploy/envoy's Envoy: it answers
// every ext_proc message the template's processing mode sends, the way the protocol requires
// (destination header and envoy.lb metadata, the request body given back full duplex, each
// response message answered), and decides nothing: the destination is the next upstream in a
// fixed round robin, with the two after it as fallbacks. Nothing is parsed and no state is kept.
//
// kvbench overhead measures it behind its own Envoy beside the real picker, in the same rounds:
// what "envoy+minpicker" adds over Envoy alone is the cost of the ext_proc exchange itself (Envoy's
// filter, the gRPC transport on both sides), which no picker can avoid; what the real picker adds
// over that is its own.
//
// Usage: minpicker --listen 127.0.0.1:PORT --upstreams ip:port,ip:port,...
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address of the ext_proc gRPC listener")
	upstreams := flag.String("upstreams", "", "comma-separated ip:port list the destinations rotate over")
	flag.Parse()
	ups := strings.Split(*upstreams, ",")
	if *upstreams == "" || len(ups) == 0 {
		fmt.Fprintln(os.Stderr, "minpicker: --upstreams is required (ip:port,ip:port,...)")
		os.Exit(2)
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "minpicker: --listen %s: %v\n", *listen, err)
		os.Exit(1)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, &picker{ups: ups})
	fmt.Printf("minpicker ready listen=%s\n", l.Addr())
	if err := gs.Serve(l); err != nil {
		fmt.Fprintf(os.Stderr, "minpicker: %v\n", err)
		os.Exit(1)
	}
}

type picker struct {
	extprocv3.UnimplementedExternalProcessorServer
	ups  []string
	next atomic.Uint64
}

// destination is the next upstream and the two after it, comma-separated.
func (p *picker) destination() string {
	i := int(p.next.Add(1))
	n := len(p.ups)
	return p.ups[i%n] + "," + p.ups[(i+1)%n] + "," + p.ups[(i+2)%n]
}

func (p *picker) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	var body []byte
	for {
		msg, err := srv.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var out []*extprocv3.ProcessingResponse
		switch m := msg.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			if m.RequestHeaders.EndOfStream {
				out = p.decided(nil)
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			body = append(body, m.RequestBody.Body...)
			if m.RequestBody.EndOfStream {
				out = p.decided(body)
				body = nil
			}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			out = []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			out = []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			out = []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}}
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			out = []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}}
		}
		for _, r := range out {
			if err := srv.Send(r); err != nil {
				return err
			}
		}
	}
}

// decided is the headers answer with the destination, then (for a request with a body) the body
// given back in one streamed chunk, as FULL_DUPLEX_STREAMED requires.
func (p *picker) decided(body []byte) []*extprocv3.ProcessingResponse {
	dest := p.destination()
	h := &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
			ClearRouteCache: true,
			HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
				Header:       &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte(dest)},
				AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
			}}},
		}}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"envoy.lb": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"x-gateway-destination-endpoint": structpb.NewStringValue(dest),
			}}),
		}},
	}
	if body == nil {
		return []*extprocv3.ProcessingResponse{h}
	}
	return []*extprocv3.ProcessingResponse{h, {Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: true}}},
	}}}}}
}
