package epp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvexact/kvexact/gateway/epp"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/route"
)

// benchWorld is a 4-endpoint KV-exact pool whose inventory holds 8 shared prefixes of about 1,000
// tokens each; requests are a prefix plus a unique question (KV-exact hits).
func benchWorld(b *testing.B) (*world, func(i int) []byte) {
	w := startWorld(b, worldSpec{n: 4})
	var groups []string
	for gi := 0; gi < 8; gi++ {
		var s strings.Builder
		for j := 0; j < 90; j++ {
			fmt.Fprintf(&s, "Benchmark group %d, sentence %d: the quick brown fox jumps. ", gi, j)
		}
		groups = append(groups, s.String())
		ep, _ := w.proxied(completionBody(s.String()))
		rt, _ := w.g.Router("pool")
		eventually(b, 10*time.Second, "group warm", func() bool {
			hr, _ := http.NewRequest("POST", "/v1/completions", nil)
			r, _ := proxy.ParseRequest(hr, completionBody(groups[gi]+" probe"))
			d, err := rt.Explain(context.Background(), r)
			return err == nil && d.Tier == route.TierKVExact && d.TargetN == ep
		})
	}
	return w, func(i int) []byte { return completionBody(groups[i%len(groups)] + fmt.Sprintf(" question %d?", i)) }
}

// standaloneDecision is the standalone gateway's decision for one request: the proxy's parse and
// Router.Route (load taken and given back), what its handler runs before forwarding.
func standaloneDecision(b *testing.B, w *world, body []byte) {
	hr, _ := http.NewRequest("POST", "/v1/completions", nil)
	r, err := proxy.ParseRequest(hr, body)
	if err != nil {
		b.Error(err)
		return
	}
	rt, _ := w.g.Router("pool")
	d, err := rt.Route(context.Background(), r, inventory.Mask{})
	if err != nil {
		b.Error(err)
		return
	}
	if d.Tier != route.TierKVExact {
		b.Errorf("tier %s: the workload must hit", d.Tier)
	}
	d.Release()
}

// pickerDecision is one request's ext_proc exchange as Envoy has it before forwarding: stream
// opened, headers and body sent, destination and body received, stream closed. It returns the time
// to the destination (the decision with its gRPC round trips).
func pickerDecision(b *testing.B, w *world, body []byte) time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t0 := time.Now()
	st, err := w.client.Process(ctx)
	if err != nil {
		b.Error(err)
		return 0
	}
	st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: hdrs(":method", "POST", ":path", "/v1/completions", "content-type", "application/json")}}})
	st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}})
	resp, err := st.Recv()
	if err != nil || resp.GetRequestHeaders() == nil {
		b.Errorf("picker: %v %v", resp, err)
		return 0
	}
	took := time.Since(t0)
	if _, err := st.Recv(); err != nil { // the body given back
		b.Error(err)
		return 0
	}
	st.CloseSend()
	st.Recv() // EOF: the picker released the decision
	return took
}

// BenchmarkDecision: the standalone gateway's decision and the picker's (gRPC round trip included)
// on the same warm pool, back to back (-count alternates them round by round).
func BenchmarkDecision(b *testing.B) {
	w, body := benchWorld(b)
	b.Run("standalone", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			standaloneDecision(b, w, body(i))
		}
	})
	b.Run("picker", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			pickerDecision(b, w, body(i))
		}
	})
}

// BenchmarkPaced1000 offers 1,000 requests/s open loop (one goroutine per arrival, 2,000 arrivals
// per round) to each front end and reports the latency percentiles of the decision: p50-µs and
// p99-µs. b.N is ignored beyond running the rounds once per -count.
func BenchmarkPaced1000(b *testing.B) {
	w, body := benchWorld(b)
	const rate, arrivals = 1000, 2000
	run := func(b *testing.B, one func(i int) time.Duration) {
		lat := make([]time.Duration, arrivals)
		var wg sync.WaitGroup
		start := time.Now()
		for i := 0; i < arrivals; i++ {
			if d := time.Until(start.Add(time.Duration(i) * time.Second / rate)); d > 0 {
				time.Sleep(d)
			}
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				lat[i] = one(i)
			}(i)
		}
		wg.Wait()
		offered := float64(arrivals) / time.Since(start).Seconds()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[arrivals/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[arrivals*99/100].Microseconds()), "p99-µs")
		b.ReportMetric(offered, "req/s")
	}
	b.Run("standalone", func(b *testing.B) {
		run(b, func(i int) time.Duration {
			t0 := time.Now()
			standaloneDecision(b, w, body(i))
			return time.Since(t0)
		})
	})
	b.Run("picker", func(b *testing.B) {
		run(b, func(i int) time.Duration { return pickerDecision(b, w, body(i)) })
	})
}

// BenchmarkStream is one small request's whole ext_proc stream as Envoy runs it with the deployed
// processing modes: request headers and body in, destination and body back, then response headers
// (with the served address) and the response body (carrying the usage) in and let through, then the
// end. The response is canned, so the figure is the picker's per-request cost: gRPC framing,
// protobuf, the stream's goroutines and the decision for a prompt shorter than a block.
func BenchmarkStream(b *testing.B) {
	w := startWorld(b, worldSpec{n: 4})
	// streamed is deploy/envoy's response body mode (each chunk answered without a mutation),
	// duplex the full-duplex one (each chunk given back).
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED} {
		name := map[filterv3.ProcessingMode_BodySendMode]string{filterv3.ProcessingMode_STREAMED: "streamed", filterv3.ProcessingMode_FULL_DUPLEX_STREAMED: "duplex"}[mode]
		b.Run(name, func(b *testing.B) { benchmarkStream(b, w, mode) })
	}
}

func benchmarkStream(b *testing.B, w *world, respMode filterv3.ProcessingMode_BodySendMode) {
	body := completionBody("Say hello.")
	answer := []byte(`{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"Hello","finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}`)
	one := func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st, err := w.client.Process(ctx)
		if err != nil {
			b.Fatal(err)
		}
		st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: hdrs(":method", "POST", ":path", "/v1/completions", ":authority", "127.0.0.1", "content-type", "application/json", "user-agent", "wrk")}},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: respMode}})
		st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}})
		hr, err := st.Recv()
		if err != nil || hr.GetRequestHeaders() == nil {
			b.Fatalf("picker: %v %v", hr, err)
		}
		if _, err := st.Recv(); err != nil { // the body given back
			b.Fatal(err)
		}
		target, _, _ := strings.Cut(headerOf(hr, epp.DestinationHeader), ",")
		sv, _ := structpb.NewStruct(map[string]any{epp.ServedKey: target})
		st.Send(&extprocv3.ProcessingRequest{
			Request:         &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":status", "200", "content-type", "application/json")}},
			MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.DestinationNamespace: sv}},
		})
		if _, err := st.Recv(); err != nil {
			b.Fatal(err)
		}
		st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: answer, EndOfStream: true}}})
		if _, err := st.Recv(); err != nil {
			b.Fatal(err)
		}
		st.CloseSend()
		if _, err := st.Recv(); err != io.EOF {
			b.Fatalf("after the response the picker should end the stream, got %v", err)
		}
	}
	b.ReportAllocs()
	c0 := processCPU()
	n := 0
	for b.Loop() {
		one()
		n++
	}
	// CPU rather than wall time: on a shared machine the wall time is mostly waiting for a core.
	b.ReportMetric(float64((processCPU()-c0).Microseconds())/float64(n), "cpu-µs/op")
}

// processCPU is this process's user and system time (the picker's and its client's).
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func headerOf(r *extprocv3.ProcessingResponse, key string) string {
	for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.Header.Key == key {
			return string(h.Header.RawValue)
		}
	}
	return ""
}
