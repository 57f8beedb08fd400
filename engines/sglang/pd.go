package sglang

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/kvexact/kvexact/engines"
)

func (family) PDDialect() engines.PDDialect { return bootstrap{} }

// bootstrap is the sglang-bootstrap-v1 dialect: the same body, carrying the prefill's bootstrap
// rendezvous (host, port, room), goes to prefill and decode concurrently — never sequentially:
// prefill answers only once decode has joined the room. The client gets the decode answer only;
// the prefill answer is drained and discarded.
type bootstrap struct{}

func (bootstrap) Name() string { return "sglang-bootstrap-v1" }

const (
	// defaultBootstrapPort is SGLang's --disaggregation-bootstrap-port default.
	defaultBootstrapPort = 8998
	// prefillGrace is how long a finished decode waits for its prefill leg to end on its own
	// before the leg is closed (real prefill legs end before decode's first token).
	prefillGrace = time.Second
)

func (bootstrap) Serve(legs engines.PDLegs) {
	req, pre := legs.Request(), legs.Endpoint(engines.PDPrefill)
	host, port := bootstrapHost(pre.Address), pre.BootstrapPort
	if port <= 0 {
		port = defaultBootstrapPort
	}
	body, err := engines.PatchJSON(req.Body, func(m map[string]json.RawMessage) {
		if n := req.Batch; n > 1 {
			hosts, ports, rooms := make([]string, n), make([]int, n), make([]int64, n)
			for i := range n {
				hosts[i], ports[i], rooms[i] = host, port, rand.Int64()
			}
			m["bootstrap_host"], m["bootstrap_port"], m["bootstrap_room"] = engines.RawJSON(hosts), engines.RawJSON(ports), engines.RawJSON(rooms)
			return
		}
		// rand.Int64 is uniform over [0, 2^63-1], SGLang's room range.
		m["bootstrap_host"], m["bootstrap_port"], m["bootstrap_room"] = engines.RawJSON(host), engines.RawJSON(port), engines.RawJSON(rand.Int64())
	})
	if err != nil {
		legs.InternalError(err)
		return
	}
	dctx, dcancel := context.WithCancel(legs.Context())
	defer dcancel()
	pctx, pcancel := legs.PrefillContext()
	defer pcancel()
	co := &coupling{abort: dcancel}
	pdone := make(chan engines.LegAnswer, 1)
	go func() {
		a := legs.DrainPrefill(pctx, body)
		if a.Failed() {
			co.prefillFailed()
		}
		pdone <- a
	}()

	res := legs.StreamDecode(dctx, body, co.commit)
	if res.Err != nil {
		// Decode unreachable (close the prefill leg too and re-run the pair elsewhere), or not
		// aborted by a prefill failure: the client left, or the request could not be built.
		if res.Unreachable || co.commit() {
			pcancel()
			<-pdone
			legs.SendFailed(engines.PDDecode, res.Err)
			return
		}
		prefillFailure(legs, <-pdone)
		return
	}
	if res.Refused {
		prefillFailure(legs, <-pdone)
		return
	}
	if !res.Relayed || res.Status >= 400 {
		pcancel() // decode failed: the prefill would wait for a decode that never joins
	}
	t := time.NewTimer(prefillGrace)
	defer t.Stop()
	select {
	case a := <-pdone:
		if res.Relayed && a.Err == nil && a.Status == http.StatusOK {
			legs.AccountPrefill(a)
		}
	case <-t.C:
		legs.Warn("SGLang prefill leg still open after decode finished; closing it", "prefill", pre.Name)
		pcancel()
		<-pdone
	}
}

// prefillFailure answers a request whose decode leg was aborted because its prefill failed.
func prefillFailure(legs engines.PDLegs, p engines.LegAnswer) {
	if legs.Context().Err() != nil {
		return
	}
	switch {
	case p.Unreachable:
		legs.SendFailed(engines.PDPrefill, p.Err) // one more pair, with a fresh room, without this prefill
	case p.TimedOut:
		legs.PrefillTimedOut()
	case p.Err == nil && p.Status >= 400 && p.Status < 500:
		legs.RelayPrefill(p) // the prefill engine's own verdict on the client's body
	case p.Failed():
		reason := fmt.Sprintf("status %d", p.Status)
		if p.Err != nil {
			reason = p.Err.Error()
		}
		legs.Fail(http.StatusBadGateway, "pd_sg_prefill_failed", "the SGLang prefill endpoint %s failed (%s) before the decode endpoint sent anything", legs.Endpoint(engines.PDPrefill).Name, reason)
	default:
		legs.Fail(http.StatusBadGateway, "pd_decode_backend_died", "the decode endpoint %s failed", legs.Endpoint(engines.PDDecode).Name)
	}
}

// coupling ties the two concurrent legs: a prefill failure aborts the decode leg unless decode
// bytes already reached the client.
type coupling struct {
	mu        sync.Mutex
	committed bool
	aborted   bool
	abort     func()
}

func (s *coupling) prefillFailed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.committed {
		s.aborted = true
		s.abort()
	}
}

func (s *coupling) commit() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aborted {
		return false
	}
	s.committed = true
	return true
}

// bootstrapHost is the prefill endpoint's host as SGLang expects it (IPv6 bracketed).
func bootstrapHost(address string) string {
	u, err := url.Parse(address)
	if err != nil {
		return address
	}
	h := u.Hostname()
	if strings.Contains(h, ":") {
		return "[" + h + "]"
	}
	return h
}
