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
)

// ErrDrainBusy: another source of this process already polls the drain URL. A destructive drain
// hands each event to exactly one caller, so a second poller would silently steal events from the
// first.
var ErrDrainBusy = errors.New("ingest: drain URL already polled by another source in this process")

// drainOwners holds the drain URLs being polled, so two sources can never share one.
var drainOwners sync.Map

// drainSource polls one server's destructive HTTP event drain (the family's engines.Drain). Its
// bodies decode to events that carry their own sequence (event_id), so here the order is source
// and decode → window (per rank, by event id) → the family's event filter → bind.
type drainSource struct {
	cfg    Config
	fam    engines.Family
	drain  engines.Drain
	client *http.Client
}

func newDrainSource(cfg Config, fam engines.Family) (*drainSource, error) {
	base := strings.TrimRight(cfg.DrainURL, "/")
	if !strings.HasPrefix(base, "http://") && !strings.HasPrefix(base, "https://") {
		return nil, cfgErr("drain_url", "%q: want http://host:port (the server's base URL)", cfg.DrainURL)
	}
	return &drainSource{
		cfg:    cfg,
		fam:    fam,
		drain:  fam.EventDrain(base),
		client: &http.Client{Timeout: cfg.HTTPTimeout},
	}, nil
}

// Run polls until ctx is done. It refuses to start (ErrDrainBusy) when another source of this
// process already polls the same URL.
func (d *drainSource) Run(ctx context.Context, apply func(Update)) error {
	url := d.drain.URL()
	if _, busy := drainOwners.LoadOrStore(url, struct{}{}); busy {
		return fmt.Errorf("%w: %s", ErrDrainBusy, url)
	}
	defer drainOwners.Delete(url)
	defer d.client.CloseIdleConnections()

	p := newPipeline(d.cfg, d.fam, apply)
	p.clear(0, "start")
	lab := p.lab
	defer lab.connected(0, false)

	windows := map[int]*seqWindow{}
	filters := map[int]engines.EventFilter{}
	interval := d.cfg.PollMin
	backoff := d.cfg.DialBackoffMin
	up := false
	for ctx.Err() == nil {
		events, err := d.drain.Poll(ctx, d.client, d.cfg.MaxDrainBytes)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var de *engines.DecodeError
			if errors.As(err, &de) {
				// The whole body is refused; its events are lost, which the next event_id shows as a gap.
				p.reject(0, 0, false, err)
				interval = d.cfg.PollMin
				if !sleepCtx(ctx, interval) {
					return nil
				}
				continue
			}
			lab.reject(0, "http")
			p.trace(Trace{Type: "error", Addr: url, Reason: "http", Detail: err.Error()})
			d.cfg.Logger.Warn("ingest: drain poll failed", "endpoint", d.cfg.Endpoint, "url", url, "err", err)
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
			p.trace(Trace{Type: "connect", Addr: url})
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
			_, seen := filters[rank]
			v, missing := w.Check(ev.EventID, 0, false)
			p.admit(rank, w, ev.EventID, 0, v, missing, false)
			if v == Regression || !seen {
				// A new engine life: its first events say again what the filter keeps.
				filters[rank] = d.drain.NewFilter()
			}
			if f := filters[rank]; f != nil {
				if ok, reason, detail := f.Keep(ev); !ok {
					lab.skip(rank, reason, 1)
					p.trace(Trace{Type: "skip", Rank: rank, Seq: ev.EventID, HasSeq: true, Reason: reason, Count: 1,
						Detail: detail})
					continue
				}
			}
			p.event(rank, ev)
		}
		if !sleepCtx(ctx, interval) {
			return nil
		}
	}
	return nil
}
