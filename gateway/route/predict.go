package route

import (
	"sync"
	"time"

	"github.com/kvexact/kvexact/gateway/inventory"
)

// Predict-on-route (rule field predictOnRoute: rules.DefaultPredictOnRoute on a single pool unless
// set, 0 or off turns it off): the blocks of every prompt the router sends to an endpoint enter a
// per-endpoint side index for a short TTL, so a burst of one new prefix sticks to the first
// endpoint before that engine's KV events arrive. The engine's
// events supersede it: a predicted block the inventory now holds is dropped from the side index,
// and KV-exact extends the inventory's prefix with predicted blocks only past it. Decisions that
// needed a predicted block say so (Decision.Predicted, EndpointEvidence.Predicted), so the
// evidence rules keep predicted hits apart from engine-confirmed ones; the zero-hit watchdog and
// the realized-shortfall rule read engine-confirmed blocks only (predictions say nothing about
// parity).

// MaxPredictedPerEndpoint bounds the side index of one endpoint; past it, new predictions are
// dropped until the expired ones are swept (a burst can never grow the index without bound).
const MaxPredictedPerEndpoint = 1 << 16

type predictions struct {
	mu  sync.Mutex
	ttl time.Duration
	now func() time.Time
	by  map[inventory.EndpointID]map[uint64]time.Time // endpoint → block key → expiry
}

func newPredictions(ttl time.Duration, now func() time.Time) *predictions {
	if ttl <= 0 {
		return nil
	}
	return &predictions{ttl: ttl, now: now, by: map[inventory.EndpointID]map[uint64]time.Time{}}
}

// extend returns the prefix depth of keys on ep when the inventory's own prefix (resident blocks)
// is followed by unexpired predicted blocks, and how many of those blocks are predicted. The
// blocks the inventory already holds leave the side index: the engine confirmed them.
func (p *predictions) extend(ep inventory.EndpointID, keys []uint64, resident int) (prefix, predicted int) {
	if p == nil {
		return resident, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.by[ep]
	if len(m) == 0 {
		return resident, 0
	}
	for _, k := range keys[:min(resident, len(keys))] {
		delete(m, k)
	}
	now := p.now()
	prefix = resident
	for _, k := range keys[min(resident, len(keys)):] {
		exp, ok := m[k]
		if !ok {
			break
		}
		if now.After(exp) {
			delete(m, k)
			break
		}
		prefix++
	}
	return prefix, prefix - resident
}

// add records that ep was sent a prompt with these block keys.
func (p *predictions) add(ep inventory.EndpointID, keys []uint64) {
	if p == nil || len(keys) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.by[ep]
	if m == nil {
		m = map[uint64]time.Time{}
		p.by[ep] = m
	}
	now := p.now()
	if len(m)+len(keys) > MaxPredictedPerEndpoint {
		for k, exp := range m {
			if now.After(exp) {
				delete(m, k)
			}
		}
	}
	exp := now.Add(p.ttl)
	for _, k := range keys {
		if _, ok := m[k]; !ok && len(m) >= MaxPredictedPerEndpoint {
			return
		}
		m[k] = exp
	}
}

// routed records a decision's prompt on its target, past the prefix the engine already confirmed
// there (those blocks stay the inventory's alone).
func (p *predictions) routed(d *Decision) {
	if p == nil || len(d.keys) == 0 {
		return
	}
	confirmed := 0
	for _, ev := range d.Endpoints {
		if ev.Name == d.Target.Name {
			confirmed = ev.Prefix - ev.Predicted
		}
	}
	p.add(d.Target.ID, d.keys[min(max(confirmed, 0), len(d.keys)):])
}

// size is the number of predicted blocks held for ep (expired ones included until swept).
func (p *predictions) size(ep inventory.EndpointID) int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.by[ep])
}
