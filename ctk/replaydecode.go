package ctk

import (
	"fmt"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
)

// decodeReplayed decodes one replayed ZeroMQ payload with the family's event decoder (the one the
// gateway's event pipeline uses).
func decodeReplayed(family string, payload []byte) (engines.Batch, error) {
	if f, err := registry.Lookup(family); err == nil && f.EventTransport() == engines.TransportZMQ {
		if decode, err := f.EventDecoder(""); err == nil {
			var b engines.Batch
			err := decode(&b, payload)
			return b, err
		}
	}
	return engines.Batch{}, fmt.Errorf("no ZeroMQ decoder for %s", family)
}
