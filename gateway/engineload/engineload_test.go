package engineload

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
)

func gauges(t testing.TB, family string) engines.LoadGauges {
	t.Helper()
	f, err := registry.Lookup(family)
	if err != nil {
		t.Fatal(err)
	}
	return f.LoadGauges()
}

// TestParse: each named gauge summed over its samples (two vLLM engine cores); a gauge missing, of
// another type, negative, fractional or past MaxRequests is an error naming it, at the bound and
// one past it.
func TestParse(t *testing.T) {
	g := gauges(t, "vllm")
	ok := `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
`
	r, w, err := Parse([]byte(ok), g)
	if err != nil || r != 5 || w != 7 {
		t.Fatalf("running %d waiting %d err %v, want 5 7", r, w, err)
	}
	for _, tc := range []struct{ name, body, kind, names string }{
		{"missing", strings.Split(ok, "# TYPE vllm:num_requests_waiting")[0], KindMissing, "vllm:num_requests_waiting"},
		{"counter", strings.ReplaceAll(ok, "waiting gauge", "waiting counter"), KindParse, "vllm:num_requests_waiting"},
		{"negative", strings.ReplaceAll(ok, "} 7.0", "} -1"), KindParse, "vllm:num_requests_waiting"},
		{"fraction", strings.ReplaceAll(ok, "} 7.0", "} 0.5"), KindParse, "vllm:num_requests_waiting"},
		{"one past the bound", strings.ReplaceAll(ok, "} 7.0", "} 1000001"), KindParse, "vllm:num_requests_waiting"},
		{"sum past the bound", strings.ReplaceAll(strings.ReplaceAll(ok, "} 3.0", "} 500000"), "} 2.0", "} 500001"), KindParse, "vllm:num_requests_running"},
		{"garbage", "vllm:num_requests_running{ 3\n", KindParse, ""},
	} {
		_, _, err := Parse([]byte(tc.body), g)
		if err == nil || KindOf(err) != tc.kind || !strings.Contains(err.Error(), tc.names) {
			t.Errorf("%s: err %v (kind %s), want kind %s naming %q", tc.name, err, KindOf(err), tc.kind, tc.names)
		}
	}
	if _, w, err := Parse([]byte(strings.ReplaceAll(ok, "} 7.0", "} 1000000")), g); err != nil || w != MaxRequests {
		t.Fatalf("at the bound: %d %v", w, err)
	}
}

// TestScrapeLimits: a body of MaxBodyBytes is read, one byte more is a size error; a non-200 is a
// status error; a closed address a connect error.
func TestScrapeLimits(t *testing.T) {
	g := gauges(t, "sglang")
	body := "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 1\n# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 2\n"
	pad := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(body))
		w.Write([]byte(strings.Repeat("#", pad-1) + "\n")[:max(pad, 0)])
	}))
	defer srv.Close()
	ctx := context.Background()
	pad = MaxBodyBytes - len(body)
	if r, w, err := Scrape(ctx, srv.Client(), srv.URL, g); err != nil || r != 1 || w != 2 {
		t.Fatalf("at the size bound: %d %d %v", r, w, err)
	}
	pad++
	if _, _, err := Scrape(ctx, srv.Client(), srv.URL, g); KindOf(err) != KindSize {
		t.Fatalf("one past the size bound: %v", err)
	}
	g.Path = "/nope"
	if _, _, err := Scrape(ctx, srv.Client(), srv.URL, g); KindOf(err) != KindStatus {
		t.Fatalf("404: %v", err)
	}
	srv.Close()
	if _, _, err := Scrape(ctx, &http.Client{Timeout: time.Second}, srv.URL, gauges(t, "sglang")); KindOf(err) != KindConnect {
		t.Fatalf("closed: %v", err)
	}
	var se *ScrapeError
	if !errors.As(&ScrapeError{KindParse, errors.New("x")}, &se) {
		t.Fatal("ScrapeError does not unwrap to itself")
	}
}

// TestReport: Others never goes negative; the report is fresh up to and at At+Stale, stale after.
func TestReport(t *testing.T) {
	at := time.Unix(100, 0)
	r := Report{Running: 3, Waiting: 2, Own: 4, At: at, Stale: time.Second}
	if r.Others() != 1 {
		t.Fatalf("others %d", r.Others())
	}
	r.Own = 9
	if r.Others() != 0 {
		t.Fatalf("others %d with own above the engine's count", r.Others())
	}
	if !r.Fresh(at.Add(time.Second)) || r.Fresh(at.Add(time.Second+1)) {
		t.Fatal("freshness bound")
	}
}

// TestReportWaitingOthers: the engine's waiting requests beyond the replica's pending ones (those
// not past their first token, the only ones that can be waiting), never negative: pending equal
// to the waiting count leaves none, one fewer leaves one.
func TestReportWaitingOthers(t *testing.T) {
	r := Report{Running: 4, Waiting: 5, Own: 6, Pending: 2}
	if got := r.WaitingOthers(); got != 3 {
		t.Fatalf("waiting others %d, want 3", got)
	}
	for _, tc := range []struct{ pending, want int }{{5, 0}, {4, 1}, {9, 0}} {
		r.Pending = tc.pending
		if got := r.WaitingOthers(); got != tc.want {
			t.Fatalf("pending %d: waiting others %d, want %d", tc.pending, got, tc.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 2\n"))
	f.Add([]byte("vllm:num_requests_running{a=\"\\\"\"} NaN\n"))
	g := engines.LoadGauges{Path: "/metrics", Running: []string{"vllm:num_requests_running"}, Waiting: []string{"vllm:num_requests_waiting"}}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, w, err := Parse(b, g)
		if err == nil && (r < 0 || w < 0 || r > MaxRequests || w > MaxRequests) {
			t.Fatalf("accepted %d %d", r, w)
		}
		if err != nil && KindOf(err) == KindConnect {
			t.Fatalf("parse error without a parse kind: %v", err)
		}
	})
}

// BenchmarkParseVLLMPage: one scrape's parse cost, on a page shaped like vLLM's /metrics (its
// request gauges among ~60 families of histograms and counters, 2 engine cores).
func BenchmarkParseVLLMPage(b *testing.B) {
	var sb strings.Builder
	for f := range 60 {
		fmt.Fprintf(&sb, "# HELP vllm:family_%d some histogram\n# TYPE vllm:family_%d histogram\n", f, f)
		for core := range 2 {
			for _, le := range []string{"0.01", "0.1", "1", "10", "+Inf"} {
				fmt.Fprintf(&sb, "vllm:family_%d_bucket{engine=\"%d\",le=\"%s\",model_name=\"m\"} %d\n", f, core, le, f*7+core)
			}
			fmt.Fprintf(&sb, "vllm:family_%d_sum{engine=\"%d\",model_name=\"m\"} 12.5\nvllm:family_%d_count{engine=\"%d\",model_name=\"m\"} 9\n", f, core, f, core)
		}
	}
	sb.WriteString("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\nvllm:num_requests_running{engine=\"1\",model_name=\"m\"} 1.0\n")
	sb.WriteString("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\nvllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0.0\n")
	page := []byte(sb.String())
	g := gauges(b, "vllm")
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := Parse(page, g); err != nil {
			b.Fatal(err)
		}
	}
}
