package vllm

import "github.com/kvexact/kvexact/engines"

// vLLM's event facet: ZeroMQ batches in either layout, engine or router binding, the contract's
// residency rule (presence from v0.26 on).

func (family) EventTransport() engines.Transport { return engines.TransportZMQ }

// EventDecoder: DecodeBatchInto reads both event layouts (array ≤ v0.23, map ≥ v0.24) whatever the
// release; the release is still checked so that one without usable events (before v0.10.2) is
// refused up front.
func (family) EventDecoder(release string) (engines.Decoder, error) {
	if release != "" {
		if _, err := LayoutForRelease(release); err != nil {
			return nil, &engines.ConfigError{Field: "release", Msg: err.Error()}
		}
	}
	return DecodeBatchInto, nil
}

func (f family) CheckEventConfig(c *engines.EventConfig) error {
	return engines.CheckZMQEventConfig(f.Name(), c)
}

func (f family) EventResidency(release string) string {
	return engines.ContractResidency(f.Name(), release)
}

func (family) RouterBinder(blockSize int) engines.RouterBinder {
	return engines.NewTokenBinder(blockSize)
}

func (family) EventDrain(string) engines.Drain { return nil }
