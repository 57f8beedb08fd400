package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/ingest"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/rules"
)

// PeerSnapshot configures seeding a starting replica's inventories from a peer replica's admin
// API (docs/replicas.md, "Starting from a peer's snapshot"). Each endpoint's snapshot is accepted
// only where the engine's own replay continues from its sequence (package ingest, seed.go); any
// failure falls back to rebuilding from replay.
type PeerSnapshot struct {
	// URL is the peer's admin listener, e.g. http://10.0.0.7:9090 (http or https; no path).
	URL string
	// Token is the peer's admin bearer token.
	Token string
	// MaxBytes bounds one endpoint's snapshot (default DefaultPeerSnapshotMaxBytes); a larger
	// answer is refused before it is decoded.
	MaxBytes int64
	// Timeout bounds one endpoint's fetch, headers to last byte (default DefaultPeerSnapshotTimeout).
	Timeout time.Duration
}

// Peer snapshot limits' defaults. 1 GiB holds about 20M resident keys under the router binding
// and the presence rule (16 + 16 + 21 bytes per key), about 67M under the engine binding; a lower
// tier's keys take 16 bytes each, plus 21 under the router binding.
const (
	DefaultPeerSnapshotMaxBytes = 1 << 30
	DefaultPeerSnapshotTimeout  = 60 * time.Second
)

// check validates the peer's address and fills the defaults.
func (p *PeerSnapshot) check() error {
	u, err := url.Parse(p.URL)
	if err != nil {
		return fmt.Errorf("peer snapshot URL: %v", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" {
		return fmt.Errorf("peer snapshot URL %q: want http(s)://host:port of the peer's admin listener, without a path", p.URL)
	}
	if p.Token == "" {
		return errors.New("peer snapshot: the peer's admin token is empty")
	}
	if p.MaxBytes <= 0 {
		p.MaxBytes = DefaultPeerSnapshotMaxBytes
	}
	if p.Timeout <= 0 {
		p.Timeout = DefaultPeerSnapshotTimeout
	}
	return nil
}

// snapshotPath is the admin API's path of one endpoint's snapshot.
func snapshotPath(rule, endpoint string) string {
	return "/admin/snapshot/" + url.PathEscape(rule) + "/" + url.PathEscape(endpoint)
}

// seedFrom returns the fetch ingest calls as the endpoint's source starts: nil when peer snapshots
// are off, or for an endpoint whose snapshot could not be verified (data-parallel ranks, a rank
// without a replay socket, an HTTP drain), which rebuilds from replay as before.
func (g *Gateway) seedFrom(rule string, e rules.Endpoint) func(context.Context) (*ingest.Snapshot, error) {
	ps := g.opts.PeerSnapshot
	if ps == nil || len(e.Events.ZMQ) != 1 || len(e.Events.Replay) != 1 || e.Events.Replay[0] == "" {
		return nil
	}
	endpoint := e.Name
	return func(ctx context.Context) (*ingest.Snapshot, error) {
		start := time.Now()
		ctx, cancel := context.WithTimeout(ctx, ps.Timeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(ps.URL, "/")+snapshotPath(rule, endpoint), nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+ps.Token)
		resp, err := g.peerClient().Do(req)
		if err != nil {
			return nil, fmt.Errorf("peer snapshot: %v", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			return nil, fmt.Errorf("peer snapshot: %s answered %s: %s", ps.URL, resp.Status, bytes.TrimSpace(msg))
		}
		if resp.ContentLength > ps.MaxBytes {
			return nil, fmt.Errorf("peer snapshot: %d bytes announced, over the limit of %d", resp.ContentLength, ps.MaxBytes)
		}
		data, err := io.ReadAll(io.LimitReader(resp.Body, ps.MaxBytes+1))
		if err != nil {
			return nil, fmt.Errorf("peer snapshot: reading after %d bytes: %v", len(data), err)
		}
		if int64(len(data)) > ps.MaxBytes {
			return nil, fmt.Errorf("peer snapshot: over the limit of %d bytes", ps.MaxBytes)
		}
		s, err := ingest.DecodeSnapshot(data)
		if err != nil {
			return nil, err
		}
		g.log.Info("peer snapshot fetched", "rule", rule, "endpoint", endpoint, "bytes", len(data),
			"keys", len(s.Keys), "seconds", time.Since(start).Seconds())
		return s, nil
	}
}

// peerClient reaches the peer's admin API; the transport is the process default (the peer is
// another gateway, not an engine).
func (g *Gateway) peerClient() *http.Client { return &http.Client{} }

// EndpointSnapshot writes the endpoint's snapshot, taken while its events are not applied, and
// streams its encoding to w (an error before the first write is the answer's status). It refuses
// (409) an endpoint this replica is not synchronized with right now: a peer must not start from a
// view this replica itself does not trust.
func (g *Gateway) EndpointSnapshot(rule, endpoint string, w io.Writer) error {
	rt, ok := g.runtime(rule)
	if !ok {
		return &statusError{http.StatusNotFound, fmt.Errorf("%w: %q", ErrNoRule, rule)}
	}
	src := rt.sources[endpoint] // fixed once the runtime is published
	var id inventory.EndpointID
	found := false
	for _, e := range rt.eps {
		if e.Name != endpoint {
			continue
		}
		found, id = true, e.ID
		if !e.Health.EventsSynchronized() {
			return &statusError{http.StatusConflict, fmt.Errorf("endpoint %q is not synchronized with its engine on this replica", endpoint)}
		}
	}
	if !found {
		return &statusError{http.StatusNotFound, fmt.Errorf("%w: endpoint %q in rule %q", ErrNoEndpoint, endpoint, rule)}
	}
	sn, ok := src.snapshotter()
	if !ok {
		return &statusError{http.StatusConflict, fmt.Errorf("endpoint %q has no event source that can be snapshot", endpoint)}
	}
	s, err := sn.Snapshot(func(t engines.Tier) []inventory.KeyCount {
		if t == engines.TierGPU {
			return rt.index.Aged(id)
		}
		for _, l := range rt.lower {
			if l.Tier == t {
				return l.Index.Aged(id)
			}
		}
		return nil
	})
	if err != nil {
		return &statusError{http.StatusConflict, err}
	}
	return s.Encode(w)
}

func (s *source) snapshotter() (ingest.Snapshotter, bool) {
	if s == nil {
		return nil, false
	}
	sn, ok := s.src.(ingest.Snapshotter)
	return sn, ok
}
