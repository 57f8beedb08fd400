package epp_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

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
