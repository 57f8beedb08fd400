package kvbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway/proxy"
)

// Result is what one request measured and what its receipts say.
type Result struct {
	Sent   bool   `json:"-"`
	Status int    `json:"status"`
	Err    string `json:"err,omitempty"`
	// TTFT and E2E count from the scheduled arrival (open loop: a late send is the system's delay).
	TTFT time.Duration `json:"ttft"`
	E2E  time.Duration `json:"e2e"`
	// From the backend's usage receipt.
	Prompt, Cached, Output int
	// Receipts: the gateway's (X-Kvexact-Endpoint), the simulator's own (X-Kvexact-Served-By), and
	// the decision (X-Kvexact-Decision target and tier). The oracle fills Target itself.
	Endpoint, ServedBy, Target, Tier string
	// Want is the endpoint the oracle chose (it must match every receipt).
	Want string
	// Predicted is the cached prefix (tokens) the decision expected on its target.
	Predicted int
	// Seeded: the load law's cold-start seeding sent this KV-exact hit to a cold endpoint.
	Seeded bool
	// PredictedHit: the decision's score needed predict-on-route blocks (not engine-confirmed).
	PredictedHit bool
	Headers      bool // response headers arrived
	// Upstream is what a load balancer in front names as the upstreams it tried, in order
	// (nginx's $upstream_addr in X-Upstream: "a" or "a, b" after a retry).
	Upstream string
	// PredictedTTFT is the ttft law's prediction for the target (0: none), SentTTFT the time to
	// the first token from the request's send (what the gateway's receipt times, near enough).
	PredictedTTFT, SentTTFT time.Duration
	// Decision is the raw X-Kvexact-Decision header ("" when none), for the request trace.
	Decision string
}

// decision is the part of X-Kvexact-Decision the benchmark reads.
type decision struct {
	Target    string `json:"target"`
	Tier      string `json:"tier"`
	Seeded    bool   `json:"seeded"`
	Predicted bool   `json:"predicted"`
	Endpoints []struct {
		Name   string `json:"name"`
		Prefix int    `json:"prefix"`
		TTFT   *struct {
			TotalMS float64 `json:"totalMs"`
		} `json:"ttft"`
		// Tiers are the blocks past Prefix lower tiers serve: the engine counts them cached.
		Tiers []struct {
			Blocks int `json:"blocks"`
		} `json:"tiers"`
	} `json:"endpoints"`
}

var dataPrefix = []byte("data: ")

// send posts one streaming request and reads it to the end.
func send(ctx context.Context, c *http.Client, url string, q *Request, arrival time.Time, blockSize int) Result {
	var r Result
	path := "/v1/completions"
	if q.Chat {
		path = "/v1/chat/completions"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(q.Body))
	if err != nil {
		r.Err = err.Error()
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	r.Sent = true
	sent := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		r.Err = err.Error()
		r.E2E = time.Since(arrival)
		return r
	}
	defer resp.Body.Close()
	r.Headers = true
	r.Status = resp.StatusCode
	r.Endpoint = resp.Header.Get(proxy.HeaderEndpoint)
	r.ServedBy = resp.Header.Get(sim.ReceiptHeader)
	r.Upstream = resp.Header.Get("X-Upstream")
	if h := resp.Header.Get(proxy.HeaderDecision); h != "" {
		r.Decision = h
		var d decision
		if json.Unmarshal([]byte(h), &d) == nil {
			r.Target, r.Tier, r.Seeded, r.PredictedHit = d.Target, d.Tier, d.Seeded, d.Predicted
			for _, e := range d.Endpoints {
				if e.Name == d.Target {
					r.Predicted = e.Prefix * blockSize
					if e.TTFT != nil {
						r.PredictedTTFT = time.Duration(e.TTFT.TotalMS * float64(time.Millisecond))
					}
					for _, t := range e.Tiers {
						r.Predicted += t.Blocks * blockSize
					}
				}
			}
		}
	}
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		r.E2E = time.Since(arrival)
		return r
	}
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	first := true
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 && bytes.HasPrefix(line, dataPrefix) {
			if first {
				r.TTFT, r.SentTTFT = time.Since(arrival), time.Since(sent)
				first = false
			}
			if bytes.Contains(line, []byte(`"prompt_tokens"`)) {
				var u struct {
					Usage *struct {
						PromptTokens     int `json:"prompt_tokens"`
						CompletionTokens int `json:"completion_tokens"`
						Details          struct {
							CachedTokens int `json:"cached_tokens"`
						} `json:"prompt_tokens_details"`
					} `json:"usage"`
				}
				if json.Unmarshal(line[len(dataPrefix):], &u) == nil && u.Usage != nil {
					r.Prompt, r.Output, r.Cached = u.Usage.PromptTokens, u.Usage.CompletionTokens, u.Usage.Details.CachedTokens
				}
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			if err != io.EOF {
				r.Err = err.Error()
			}
			break
		}
	}
	r.E2E = time.Since(arrival)
	if r.Err == "" && r.Prompt == 0 {
		r.Err = "stream ended without a usage receipt"
	}
	return r
}
