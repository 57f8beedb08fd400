package trtllm

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/kvexact/kvexact/engines"
)

// DrainPath is trtllm-serve's destructive event drain: POST, no body, blocks up to about 2 s when
// idle, and hands every event to exactly one caller — the gateway must be the only consumer.
const DrainPath = "/kv_cache_events"

// MaxDrainBytes caps one drain response (64 MiB) so a runaway engine cannot exhaust memory.
const MaxDrainBytes = 64 << 20

// NewDrainRequest builds the POST for baseURL (e.g. "http://10.0.0.5:8000"). The poll loop itself
// (interval, timeout, single outstanding request) belongs to the ingest stream.
func NewDrainRequest(ctx context.Context, baseURL string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(baseURL, "/")+DrainPath, http.NoBody)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	return req, nil
}

// ReadDrainResponse checks the status, reads at most limit bytes (MaxDrainBytes when limit ≤ 0) and
// decodes the events. It does not close resp.Body.
func ReadDrainResponse(resp *http.Response, limit int64) ([]engines.Event, error) {
	if limit <= 0 {
		limit = MaxDrainBytes
	}
	if resp.StatusCode != http.StatusOK {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return nil, fmt.Errorf("trtllm: POST %s: status %d: %s", DrainPath, resp.StatusCode, strings.TrimSpace(string(snippet)))
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("trtllm: POST %s: reading body: %w", DrainPath, err)
	}
	if int64(len(body)) > limit {
		return nil, &engines.DecodeError{Reason: engines.ReasonDecodeError, Offset: int(limit), Field: "$",
			Err: fmt.Errorf("drain response larger than %d bytes", limit)}
	}
	return DecodeDrain(body)
}
