package engines_test

import (
	"errors"
	"testing"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
)

// TestEventFacets checks that every registered family's event facet is consistent with its
// transport: a ZeroMQ family has a decoder and no drain, a drain family a drain and no decoder, a
// family without events refuses with a ConfigError naming a field; and that CheckEventConfig fills
// in a default binding the family then accepts.
func TestEventFacets(t *testing.T) {
	for _, f := range registry.All() {
		dec, derr := f.EventDecoder("")
		switch f.EventTransport() {
		case engines.TransportZMQ:
			if dec == nil || derr != nil {
				t.Errorf("%s: ZeroMQ family: decoder %v, err %v", f.Name(), dec != nil, derr)
			}
			if f.EventDrain("http://127.0.0.1:1") != nil {
				t.Errorf("%s: ZeroMQ family with a drain", f.Name())
			}
			c := engines.EventConfig{Publish: []string{"tcp://127.0.0.1:1"}}
			if err := f.CheckEventConfig(&c); err != nil || c.Binding == "" {
				t.Errorf("%s: default config: binding %q, err %v", f.Name(), c.Binding, err)
			}
		case engines.TransportDrain:
			if dec != nil || derr != nil {
				t.Errorf("%s: drain family: decoder %v, err %v", f.Name(), dec != nil, derr)
			}
			d := f.EventDrain("http://127.0.0.1:1")
			if d == nil || d.URL() == "" {
				t.Fatalf("%s: drain family without a drain", f.Name())
			}
			c := engines.EventConfig{BlockSize: 16, DrainURL: "http://127.0.0.1:1"}
			if err := f.CheckEventConfig(&c); err != nil || c.Binding == "" {
				t.Errorf("%s: default config: binding %q, err %v", f.Name(), c.Binding, err)
			}
		case engines.TransportNone:
			var ce *engines.ConfigError
			if !errors.As(derr, &ce) || ce.Field == "" {
				t.Errorf("%s: no events, but the decoder's refusal %v names no field", f.Name(), derr)
			}
		}
		if r := f.EventResidency(""); r != contracts.ResidencyCopies {
			t.Errorf("%s: residency without a release %q, want copies", f.Name(), r)
		}
		if f.EventTransport() != engines.TransportNone && f.RouterBinder(16) == nil {
			t.Errorf("%s: publishes events but has no router binder", f.Name())
		}
	}
}
