package sglang

import "github.com/kvexact/kvexact/engines"

// SGLang's event facet: ZeroMQ batches, engine or router binding, the contract's residency rule.

func (family) EventTransport() engines.Transport { return engines.TransportZMQ }

func (family) EventDecoder(string) (engines.Decoder, error) { return DecodeBatchInto, nil }

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
