package kvbench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// TraceLine is one request of a cell's trace (KVBENCH_TRACE=dir writes one JSON line per request
// to dir/<workload>-<load>-<policy>.jsonl): where it went, what it hit, and where the earlier
// request sharing its longest block prefix went, so a follow-up routed away from the engine holding
// its prefix shows as Prev != Endpoint with Shared > 0.
type TraceLine struct {
	I         int     `json:"i"`
	ArrivalMS float64 `json:"arrivalMs"`
	Blocks    int     `json:"blocks"`
	Prompt    int     `json:"prompt"`
	Cached    int     `json:"cached"`
	Endpoint  string  `json:"endpoint"`
	Tier      string  `json:"tier,omitempty"`
	// Prev is the earlier request (by arrival) sharing the longest block prefix, Shared those
	// blocks, PrevEndpoint where it went and PrevDoneMS when it finished (from the run's start).
	Prev         int     `json:"prev"`
	Shared       int     `json:"shared"`
	PrevEndpoint string  `json:"prevEndpoint,omitempty"`
	PrevDoneMS   float64 `json:"prevDoneMs,omitempty"`
	TTFTMS       float64 `json:"ttftMs"`
	// SentTTFTMS is the time to first token from the request's send, what the ttft law's
	// prediction (PredictedMS, the target's totalMs) is compared against.
	SentTTFTMS  float64         `json:"sentTtftMs,omitempty"`
	PredictedMS float64         `json:"predictedMs,omitempty"`
	Decision    json.RawMessage `json:"decision,omitempty"`
}

func writeTrace(dir string, pool *Pool, w *Workload, pol Policy, load float64, rs []Result, start time.Time) {
	keys := make([][]uint64, len(w.Requests))
	for i := range w.Requests {
		keys[i], _ = pool.Hasher.Keys(w.Requests[i].Tokens, w.Requests[i].extras(), nil)
	}
	name := fmt.Sprintf("%s-%g-%s.jsonl", w.Name, load, strings.NewReplacer(" ", "_", "/", "_", "(", "", ")", "").Replace(pol.Name))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "kvbench: KVBENCH_TRACE: %v\n", err)
		return
	}
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench: KVBENCH_TRACE: %v\n", err)
		return
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for i, r := range rs {
		q := &w.Requests[i]
		ep := r.Endpoint
		if ep == "" {
			ep = r.Want
		}
		l := TraceLine{I: i, ArrivalMS: ms(q.Arrival), Blocks: len(keys[i]), Prompt: r.Prompt, Cached: r.Cached, Endpoint: ep, Tier: r.Tier, Prev: -1, TTFTMS: ms(r.TTFT),
			SentTTFTMS: ms(r.SentTTFT), PredictedMS: ms(r.PredictedTTFT)}
		for j := 0; j < i; j++ {
			n := 0
			for n < len(keys[i]) && n < len(keys[j]) && keys[i][n] == keys[j][n] {
				n++
			}
			if n > l.Shared || (n == l.Shared && n > 0) {
				pe := rs[j].Endpoint
				if pe == "" {
					pe = rs[j].Want
				}
				l.Prev, l.Shared, l.PrevEndpoint = j, n, pe
				l.PrevDoneMS = ms(w.Requests[j].Arrival + rs[j].E2E)
			}
		}
		if r.Decision != "" {
			l.Decision = json.RawMessage(r.Decision)
		}
		enc.Encode(l)
	}
}
