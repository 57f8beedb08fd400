package kvbench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ---- latency: added latency at a fixed rate, and streaming time to first byte ----

// LatencyFigure is one target's latency over one run: percentiles in microseconds, the requests
// completed and failed, and (for a proxy) its CPU µs per completed request.
type LatencyFigure struct {
	P50us    float64 `json:"p50Us"`
	P99us    float64 `json:"p99Us"`
	Requests int     `json:"requests"`
	Errors   int     `json:"errors,omitempty"`
	CPUus    float64 `json:"cpuUsPerRequest,omitempty"`
	// Failures counts the failed requests by cause: "status 503", or the client's error.
	Failures map[string]int `json:"failures,omitempty"`
}

// LatencyRound measures every target back to back under the same load, the order rotating.
type LatencyRound struct {
	Order   string                   `json:"order"`
	Targets map[string]LatencyFigure `json:"targets"`
}

// AddedLatency is a proxy's latency over direct access: medians over the rounds of the per-round
// differences (target − direct) in microseconds.
type AddedLatency struct {
	P50us float64 `json:"p50Us"`
	P99us float64 `json:"p99Us"`
}

// added is the per-target medians over rounds of (target − direct).
func added(rounds []LatencyRound) map[string]AddedLatency { return addedOver(rounds, "direct") }

// addedOver is the per-target medians over rounds of (target − base).
func addedOver(rounds []LatencyRound, base string) map[string]AddedLatency {
	p50, p99 := map[string][]float64{}, map[string][]float64{}
	for _, r := range rounds {
		d, ok := r.Targets[base]
		if !ok {
			continue
		}
		for name, f := range r.Targets {
			if name != base {
				p50[name] = append(p50[name], f.P50us-d.P50us)
				p99[name] = append(p99[name], f.P99us-d.P99us)
			}
		}
	}
	out := map[string]AddedLatency{}
	for name := range p50 {
		out[name] = AddedLatency{P50us: median(p50[name]), P99us: median(p99[name])}
	}
	return out
}

// percentiles returns p50 and p99 of ds in microseconds (nearest rank).
func percentiles(ds []time.Duration) (p50, p99 float64) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(q*float64(len(s))+0.999999) - 1
		return float64(s[max(0, min(i, len(s)-1))]) / float64(time.Microsecond)
	}
	return at(0.50), at(0.99)
}

func benchClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, DisableCompression: true, IdleConnTimeout: 30 * time.Second}}
}

// fixedRate sends the small request to url at rate requests/s for d, open loop: each request is
// due at its own instant whatever the earlier ones are doing, and its latency counts from that
// instant (a proxy that stalls is charged for the wait it causes, no coordinated omission).
func fixedRate(ctx context.Context, url string, rate int, d time.Duration) LatencyFigure {
	client := benchClient()
	defer client.CloseIdleConnections()
	n := int(float64(rate) * d.Seconds())
	interval := time.Second / time.Duration(rate)
	lat := make([]time.Duration, n)
	ok := make([]bool, n)
	why := make([]string, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < n && ctx.Err() == nil; i++ {
		due := start.Add(time.Duration(i) * interval)
		if w := time.Until(due); w > 0 {
			time.Sleep(w)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Post(url, "application/json", strings.NewReader(smallRequest))
			if err != nil {
				why[i] = failure(err)
				return
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			lat[i], ok[i] = time.Since(due), err == nil && resp.StatusCode == 200
			switch {
			case err != nil:
				why[i] = failure(err)
			case resp.StatusCode != 200:
				why[i] = fmt.Sprintf("status %d", resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	var f LatencyFigure
	var good []time.Duration
	for i := range lat {
		if ok[i] {
			good = append(good, lat[i])
		} else {
			f.Errors++
			if f.Failures == nil {
				f.Failures = map[string]int{}
			}
			f.Failures[cmp.Or(why[i], "not sent")]++
		}
	}
	f.Requests = len(good)
	f.P50us, f.P99us = percentiles(good)
	return f
}

// streamRequest asks the tiny upstream for a stream (three events, the first at once).
const streamRequest = `{"model":"llama3","prompt":"Say hello.","max_tokens":3,"stream":true}`

// ttfb sends n streaming requests to url one after another and times each to the first body byte
// (the first event), then reads the stream to its end.
func ttfb(ctx context.Context, url string, n int) LatencyFigure {
	client := benchClient()
	defer client.CloseIdleConnections()
	var f LatencyFigure
	var lat []time.Duration
	buf := make([]byte, 1)
	for i := 0; i < n && ctx.Err() == nil; i++ {
		start := time.Now()
		resp, err := client.Post(url, "application/json", strings.NewReader(streamRequest))
		if err != nil {
			f.Errors++
			continue
		}
		_, err = io.ReadFull(resp.Body, buf)
		first := time.Since(start)
		rest, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || rerr != nil || resp.StatusCode != 200 || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
			f.Errors++
			continue
		}
		lat = append(lat, first)
	}
	f.Requests = len(lat)
	f.P50us, f.P99us = percentiles(lat)
	return f
}

// serveStream answers the tiny upstream's stream: the first event flushed at once, two more and
// [DONE] after it.
func serveStream(w http.ResponseWriter, name string) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	for i := range 3 {
		fmt.Fprintf(w, "data: {\"id\":\"cmpl-up\",\"object\":\"text_completion\",\"model\":\"llama3\",\"choices\":[{\"index\":0,\"text\":\" t%d\",\"finish_reason\":null}],\"served_by\":%q}\n\n", i, name)
		_ = rc.Flush()
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

var wrkPercentile = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)\s*$`)

// parseWrkLatency reads p50 and p99 from wrk --latency's "Latency Distribution" (µs; 0 if absent).
func parseWrkLatency(out []byte) (p50, p99 float64) {
	for _, m := range wrkPercentile.FindAllSubmatch(out, -1) {
		v, err := strconv.ParseFloat(string(m[2]), 64)
		if err != nil {
			continue
		}
		switch string(m[3]) {
		case "ms":
			v *= 1e3
		case "s":
			v *= 1e6
		}
		if string(m[1]) == "50" {
			p50 = v
		} else {
			p99 = v
		}
	}
	return p50, p99
}

// failure names a client error without what differs between requests (ports, addresses).
func failure(err error) string {
	var ne *net.OpError
	if errors.As(err, &ne) {
		return ne.Op + ": " + ne.Err.Error()
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return "connection closed before the response ended"
	}
	return err.Error()
}
