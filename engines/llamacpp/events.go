// Package llamacpp is llama.cpp's place among the engine families. Its server (pin b10573) reuses KV
// per slot (cache_prompt, --cache-reuse, --cache-ram) and publishes no KV-cache events and no block
// hashes, so no gateway can mirror what it holds: Exact routing is refused and content affinity
// (CHWBL over the rendered prompt prefix) is the best it gets.
package llamacpp

import (
	"errors"
	"fmt"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
)

// ErrNoEvents is the sentinel every refusal wraps (errors.Is(err, ErrNoEvents)).
var ErrNoEvents = errors.New("llama.cpp publishes no KV-cache events or block hashes (no ZMQ or HTTP event feed; reuse is per slot): Exact routing is refused; content affinity (chwbl) is the best it gets")

// FallbackSelector is the selector a rule uses for llama.cpp endpoints in place of KV-exact.
const FallbackSelector = "chwbl"

// RefusalError names the release the refusal was made for.
type RefusalError struct {
	Release string
}

func (e *RefusalError) Error() string {
	if e.Release == "" {
		return "llamacpp: " + ErrNoEvents.Error()
	}
	return fmt.Sprintf("llamacpp %s: %v", e.Release, ErrNoEvents)
}

func (e *RefusalError) Unwrap() error { return ErrNoEvents }

// NewEventSource is where an event source would be built; for llama.cpp it always refuses, with
// the reason, so callers treat every family alike and report why Exact is off.
func NewEventSource(release string) error {
	return &RefusalError{Release: release}
}

// llama.cpp's event facet: no transport; the decoder refuses with the reason, naming the family.

func (family) EventTransport() engines.Transport { return engines.TransportNone }

func (family) EventDecoder(string) (engines.Decoder, error) {
	return nil, &engines.ConfigError{Field: "family", Msg: "llama.cpp publishes no KV-cache events: exact routing is refused, content affinity (chwbl) is the best it gets"}
}

func (family) CheckEventConfig(*engines.EventConfig) error {
	return &engines.ConfigError{Field: "family", Msg: "llama.cpp publishes no KV-cache events"}
}

func (family) EventResidency(string) string { return contracts.ResidencyCopies }

func (family) RouterBinder(int) engines.RouterBinder { return nil }

func (family) EventDrain(string) engines.Drain { return nil }
