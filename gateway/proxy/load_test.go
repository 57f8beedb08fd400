package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestThousandConcurrentStreams: 1000 streaming requests at once through the proxy to a small
// upstream pool all complete, every decision is released, and no goroutine outlives them.
func TestThousandConcurrentStreams(t *testing.T) {
	const n = 1000
	before := runtime.NumGoroutine()
	func() {
		a, b := newUpstream(t, "a", streamEvents(3)), newUpstream(t, "b", streamEvents(3))
		defer a.srv.Close()
		defer b.srv.Close()
		p := newPool(t, "vllm", 0, []epSpec{{name: "a", addr: a.srv.URL}, {name: "b", addr: b.srv.URL}}, nil, nil, nil)
		defer p.front.Close()
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, DisableCompression: true}}
		defer client.CloseIdleConnections()
		defer p.proxy.CloseIdleConnections()

		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		var failures atomic.Int64
		var firstErr atomic.Value
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				err := func() error {
					body := fmt.Sprintf(`{"model":"m","prompt":"request %d","stream":true}`, i)
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.front.URL+"/v1/completions", strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					resp, err := client.Do(req)
					if err != nil {
						return err
					}
					defer resp.Body.Close()
					out, err := io.ReadAll(resp.Body)
					if err != nil {
						return err
					}
					ep := resp.Header.Get(HeaderEndpoint)
					if resp.StatusCode != 200 || len(sseData(out)) != 4 || !strings.HasSuffix(string(out), "data: [DONE]\n\n") || !strings.Contains(string(out), `"`+ep+`-c"`) {
						return fmt.Errorf("status %d receipt %q body %q", resp.StatusCode, ep, out)
					}
					return nil
				}()
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if f := failures.Load(); f != 0 {
			t.Fatalf("%d of %d streams failed; first: %v", f, n, firstErr.Load())
		}
		if a.count()+b.count() != n || a.count() == 0 || b.count() == 0 {
			t.Fatalf("upstreams served a=%d b=%d", a.count(), b.count())
		}
		p.allReleased(t)
		if got := p.metric(t, "kvexact_proxy_requests_total", map[string]string{"status": "200"}); got != n {
			t.Fatalf("requests counted %v", got)
		}
	}()
	noLeak(t, before)
}

// BenchmarkProxyOverhead compares one small completion sent straight to a tiny upstream with the
// same request through the proxy (round-robin rule), in the same run.
func BenchmarkProxyOverhead(b *testing.B) {
	u := newUpstream(b, "a", completion)
	p := newPool(b, "vllm", 0, []epSpec{{name: "a", addr: u.srv.URL}}, nil, nil, nil)
	body := `{"model":"m","prompt":"Say hello in one word.","max_tokens":4}`
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
	defer client.CloseIdleConnections()
	run := func(b *testing.B, base string) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		})
	}
	b.Run("direct", func(b *testing.B) { run(b, u.srv.URL) })
	b.Run("proxy", func(b *testing.B) { run(b, p.front.URL) })
}
