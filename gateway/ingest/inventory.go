package ingest

import (
	"log/slog"

	"github.com/kvexact/kvexact/gateway/inventory"
)

// Into returns the apply function that writes one endpoint's updates into a rule's inventory and
// keeps the endpoint's blocks gauge current. m and logger may be nil.
func Into(idx *inventory.Index, ep inventory.EndpointID, m *Metrics, rule, endpoint string, logger *slog.Logger) func(Update) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return func(u Update) {
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
