package ingest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/trtllm"
)

// ErrDrainBusy: another source of this process already polls the drain URL. TensorRT-LLM's
// /kv_cache_events hands each event to exactly one caller, so a second poller would silently steal
// events from the first.
var ErrDrainBusy = errors.New("ingest: drain URL already polled by another source in this process")

// drainOwners holds the drain URLs being polled, so two sources can never share one.
var drainOwners sync.Map

// drainSource polls one TensorRT-LLM server's destructive /kv_cache_events.
type drainSource struct {
	cfg    Config
	base   string
	url    string
	client *http.Client
}

func newDrainSource(cfg Config) (*drainSource, error) {
	base := strings.TrimRight(cfg.DrainURL, "/")
	if !strings.HasPrefix(base, "http://") && !strings.HasPrefix(base, "https://") {
		return nil, cfgErr("drain_url", "%q: want http://host:port (the server's base URL)", cfg.DrainURL)
	}
	return &drainSource{
		cfg:    cfg,
		base:   base,
		url:    base + trtllm.DrainPath,
		client: &http.Client{Timeout: cfg.HTTPTimeout},
	}, nil
}

// Run polls until ctx is done. It refuses to start (ErrDrainBusy) when another source of this
// process already polls the same URL.
func (d *drainSource) Run(ctx context.Context, apply func(Update)) error {
	if _, busy := drainOwners.LoadOrStore(d.url, struct{}{}); busy {
		return fmt.Errorf("%w: %s", ErrDrainBusy, d.url)
	}
	defer drainOwners.Delete(d.url)
	defer d.client.CloseIdleConnections()

	s := newStream(d.cfg, apply)
	s.clear(0, "start")
	lab := s.lab
	defer lab.connected(0, false)

	windows := map[int]*seqWindow{}
	filters := map[int]*trtllm.WindowFilter{}
	interval := d.cfg.PollMin
	backoff := d.cfg.DialBackoffMin
	up := false
	for ctx.Err() == nil {
		events, err := d.poll(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var de *engines.DecodeError
			if errors.As(err, &de) {
				// The whole body is refused; its events are lost, which the next event_id shows as a gap.
				s.reject(0, 0, false, err)
				interval = d.cfg.PollMin
				if !sleepCtx(ctx, interval) {
					return nil
				}
				continue
			}
			lab.reject(0, "http")
			s.trace(Trace{Type: "error", Addr: d.url, Reason: "http", Detail: err.Error()})
			d.cfg.Logger.Warn("ingest: drain poll failed", "endpoint", d.cfg.Endpoint, "url", d.url, "err", err)
			if up {
				lab.connected(0, false)
				up = false
			}
			if !sleepCtx(ctx, backoff) {
				return nil
			}
			backoff = min(backoff*2, d.cfg.DialBackoffMax)
			continue
		}
		backoff = d.cfg.DialBackoffMin
		if !up {
			lab.connected(0, true)
			s.trace(Trace{Type: "connect", Addr: d.url})
			up = true
		}
		if len(events) == 0 {
			interval = min(time.Duration(float64(interval)*1.5), d.cfg.PollMax)
		} else {
			interval = d.cfg.PollMin
		}
		for i := range events {
			ev := &events[i]
			rank := 0
			if ev.HasDPRank {
				rank = ev.DPRank
			}
			w := windows[rank]
			if w == nil {
				w = &seqWindow{noDup: true}
				windows[rank] = w
			}
			if v, _ := s.sequence(rank, w, ev.EventID, 0, false); v == Regression || filters[rank] == nil {
				// A new engine life: its created events say again which window is the global one.
				filters[rank] = &trtllm.WindowFilter{}
			}
			if !filters[rank].Keep(ev) {
				lab.skip(rank, "window", 1)
				s.trace(Trace{Type: "skip", Rank: rank, Seq: ev.EventID, HasSeq: true, Reason: "window", Count: 1,
					Detail: fmt.Sprintf("window_size %d", ev.WindowSize)})
				continue
			}
			s.event(rank, ev)
		}
		if !sleepCtx(ctx, interval) {
			return nil
		}
	}
	return nil
}

// poll makes one POST and decodes the body (at most MaxDrainBytes). A body that does not decode
// comes back as an *engines.DecodeError; transport and status failures as plain errors.
func (d *drainSource) poll(ctx context.Context) ([]engines.Event, error) {
	req, err := trtllm.NewDrainRequest(ctx, d.base)
	if err != nil {
		return nil, err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return trtllm.ReadDrainResponse(resp, d.cfg.MaxDrainBytes)
}
