package ingest

import (
	"log/slog"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/inventory"
)

// Into returns the apply function that writes one endpoint's updates into a rule's inventory and
// keeps the endpoint's blocks gauge current. m and logger may be nil.
func Into(idx *inventory.Index, ep inventory.EndpointID, m *Metrics, rule, endpoint string, logger *slog.Logger) func(Update) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return func(u Update) {
		if u.Tier != engines.TierGPU {
			return // a lower tier's update that no IntoTier took: not a GPU block
		}
		var err error
		switch u.Op {
		case OpStore:
			err = idx.Store(ep, u.Keys)
		case OpRemove:
			err = idx.Remove(ep, u.Keys)
		case OpClear:
			err = idx.Clear(ep)
		}
		if err != nil {
			// Only an endpoint removed under a running source gets here; the source is about to stop.
			logger.Warn("ingest: inventory update failed", "endpoint", endpoint, "op", u.Op.String(), "err", err)
			return
		}
		m.SetBlocks(rule, endpoint, idx.Resident(ep))
	}
}

// IntoTier returns the apply function that writes a lower tier's updates into that tier's
// inventory and hands every other update to next. A clear clears the tier too: a gap, a restart
// or an engine's reset leaves nothing known on any tier (a false miss until the next store, never
// a false hit).
func IntoTier(next func(Update), tier engines.Tier, idx *inventory.Index, ep inventory.EndpointID, logger *slog.Logger) func(Update) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return func(u Update) {
		var err error
		switch {
		case u.Op == OpClear:
			err = idx.Clear(ep)
			next(u)
		case u.Tier != tier:
			next(u)
			return
		case u.Op == OpStore:
			err = idx.Store(ep, u.Keys)
		case u.Op == OpRemove:
			err = idx.Remove(ep, u.Keys)
		}
		if err != nil {
			logger.Warn("ingest: tier inventory update failed", "tier", tier.String(), "op", u.Op.String(), "err", err)
		}
	}
}
