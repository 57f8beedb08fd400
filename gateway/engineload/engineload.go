// Package engineload owns the engine's own report of its load: the request gauges an engine
// serves on its metrics path (engines.LoadGauges), scraped on a short interval. Gateway replicas
// in front of the same engines each count only their own in-flight requests; the engine counts
// everyone's. A replica's load for an endpoint is its own in-flight count now plus what the engine
// reported beyond the replica's own share at the scrape (route.Endpoint.Load), so replicas share
// load through a system that already exists — the engine's metrics — and no protocol of their own.
package engineload

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/kvexact/kvexact/engines"
)

// Limits and defaults, each documented in docs/scale.md.
const (
	// DefaultInterval is how often each engine's gauges are scraped.
	DefaultInterval = 250 * time.Millisecond
	// MinInterval is the shortest interval accepted.
	MinInterval = 50 * time.Millisecond
	// StaleAfter is how many intervals a report stays in use: past it the replica falls back to
	// its own in-flight count alone (and says so in the status and the age metric).
	StaleAfter = 4
	// MaxBodyBytes bounds one metrics response; a larger one is an error, not truncated.
	MaxBodyBytes = 4 << 20
	// MaxRequests caps a reported count (a gauge beyond it is a bad report, not a load).
	MaxRequests = 1_000_000
)

// Report is one scrape's result: the requests the engine runs and holds waiting (every replica's),
// and how many of them were this replica's own when the scrape was sent (Own in flight, Pending of
// them not yet past their first token).
type Report struct {
	Running, Waiting int
	Own, Pending     int
	At               time.Time     // when the scrape was sent
	Stale            time.Duration // the report is not used after At+Stale
}

// Others is the engine's count beyond this replica's share (never negative: the engine may not
// have admitted a request the replica already counts).
func (r Report) Others() int { return max(0, r.Running+r.Waiting-r.Own) }

// WaitingOthers is the engine's waiting requests beyond this replica's pending ones: a request past
// its first token is running, not waiting, so only pending ones can be among the waiting, and
// subtracting them all counts none of the replica's twice (never negative).
func (r Report) WaitingOthers() int { return max(0, r.Waiting-r.Pending) }

// Fresh reports whether the report may still be used at now.
func (r Report) Fresh(now time.Time) bool { return !now.After(r.At.Add(r.Stale)) }

// Error kinds (the scrape error metric's closed label set).
const (
	KindConnect = "connect"
	KindStatus  = "status"
	KindSize    = "size"
	KindParse   = "parse"
	KindMissing = "missing"
)

// Kinds is every error kind.
var Kinds = []string{KindConnect, KindStatus, KindSize, KindParse, KindMissing}

// ScrapeError is a failed scrape, with its kind.
type ScrapeError struct {
	Kind string
	Err  error
}

func (e *ScrapeError) Error() string { return "engine load " + e.Kind + ": " + e.Err.Error() }
func (e *ScrapeError) Unwrap() error { return e.Err }

// Scrape fetches base+g.Path once and reads the gauges.
func Scrape(ctx context.Context, hc *http.Client, base string, g engines.LoadGauges) (running, waiting int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+g.Path, nil)
	if err != nil {
		return 0, 0, &ScrapeError{KindConnect, err}
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, 0, &ScrapeError{KindConnect, err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return 0, 0, &ScrapeError{KindStatus, fmt.Errorf("GET %s: status %d", g.Path, resp.StatusCode)}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBodyBytes+1))
	if err != nil {
		return 0, 0, &ScrapeError{KindConnect, err}
	}
	if len(body) > MaxBodyBytes {
		return 0, 0, &ScrapeError{KindSize, fmt.Errorf("GET %s: response over %d bytes", g.Path, MaxBodyBytes)}
	}
	return Parse(body, g)
}

// Parse reads the gauges from a Prometheus text exposition: each named gauge summed over its
// samples. It reads only the lines of the named families (a scrape runs every interval for every
// engine, so the other families' histograms are skipped, not parsed). A gauge family missing from
// the text, declared as another type, or with a sample value that is not a count in
// [0, MaxRequests] is an error naming it and the line.
func Parse(body []byte, g engines.LoadGauges) (running, waiting int, err error) {
	want := make(map[string]*family, len(g.Running)+len(g.Waiting))
	for _, n := range g.Running {
		want[n] = &family{}
	}
	for _, n := range g.Waiting {
		want[n] = &family{}
	}
	line := 0
	for len(body) > 0 {
		line++
		var l []byte
		if k := bytes.IndexByte(body, '\n'); k >= 0 {
			l, body = body[:k], body[k+1:]
		} else {
			l, body = body, nil
		}
		if len(l) == 0 {
			continue
		}
		if l[0] == '#' {
			// "# TYPE name type": the family's declared type.
			f := bytes.Fields(l)
			if len(f) == 4 && string(f[1]) == "TYPE" {
				if fam, ok := want[string(f[2])]; ok {
					fam.typ = string(f[3])
				}
			}
			continue
		}
		end := bytes.IndexAny(l, "{ ")
		if end <= 0 {
			continue
		}
		fam, ok := want[string(l[:end])]
		if !ok {
			continue
		}
		name := string(l[:end])
		rest := l[end:]
		if rest[0] == '{' {
			// Label values may hold '}' inside quotes: the label set ends at the last '}'.
			k := bytes.LastIndexByte(rest, '}')
			if k < 0 {
				return 0, 0, &ScrapeError{KindParse, fmt.Errorf("line %d: %s: unterminated label set", line, name)}
			}
			rest = rest[k+1:]
		}
		f := bytes.Fields(rest) // value [timestamp]
		if len(f) < 1 || len(f) > 2 {
			return 0, 0, &ScrapeError{KindParse, fmt.Errorf("line %d: %s: want a value and an optional timestamp", line, name)}
		}
		v, perr := strconv.ParseFloat(string(f[0]), 64)
		if perr != nil || math.IsNaN(v) || v < 0 || v > MaxRequests || v != math.Trunc(v) {
			return 0, 0, &ScrapeError{KindParse, fmt.Errorf("line %d: %s: value %q is not a request count in [0, %d]", line, name, f[0], MaxRequests)}
		}
		fam.sum += v
		fam.seen = true
	}
	sum := func(names []string) (int, error) {
		total := 0.0
		for _, n := range names {
			fam := want[n]
			if !fam.seen {
				return 0, &ScrapeError{KindMissing, fmt.Errorf("gauge %s not reported", n)}
			}
			if fam.typ != "" && fam.typ != "gauge" {
				return 0, &ScrapeError{KindParse, fmt.Errorf("%s: type %s, want gauge", n, fam.typ)}
			}
			total += fam.sum
		}
		if total > MaxRequests {
			return 0, &ScrapeError{KindParse, fmt.Errorf("%v: sum %v over %d", names, total, MaxRequests)}
		}
		return int(total), nil
	}
	if running, err = sum(g.Running); err != nil {
		return 0, 0, err
	}
	if waiting, err = sum(g.Waiting); err != nil {
		return 0, 0, err
	}
	return running, waiting, nil
}

// family is one wanted gauge family's samples as Parse reads them.
type family struct {
	typ  string
	sum  float64
	seen bool
}

// KindOf is err's kind (KindConnect for an error without one).
func KindOf(err error) string {
	var se *ScrapeError
	if errors.As(err, &se) {
		return se.Kind
	}
	return KindConnect
}
