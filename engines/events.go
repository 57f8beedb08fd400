package engines

import (
	"context"
	"fmt"
	"net/http"

	"github.com/kvexact/kvexact/contracts"
)

// Events is the event facet of a Family: how its engines publish KV-cache events and what the
// gateway's event pipeline (gateway/ingest) needs from the family to mirror them. The pipeline
// itself (sockets, sequence window, binding, inventory) is the same for every family and names
// none; everything that differs is asked here.
type Events interface {
	// EventTransport is how the family's engines publish events: ZeroMQ, an HTTP drain, or none.
	EventTransport() Transport
	// EventDecoder returns the ZeroMQ payload decoder for release ("" for any), or a *ConfigError
	// naming the field that refuses it (a release without usable events; a family without events).
	// A drain family returns nil: its Drain decodes the bodies it polls.
	EventDecoder(release string) (Decoder, error)
	// CheckEventConfig applies the family's rules to an endpoint's event config: the bindings it
	// allows (filling in its default when Binding is empty), the block size they need and the
	// transport fields it takes. Errors are *ConfigError; address syntax is the pipeline's to check.
	CheckEventConfig(c *EventConfig) error
	// EventResidency is release's residency rule: contracts.ResidencyCopies or ResidencyPresence.
	EventResidency(release string) string
	// RouterBinder returns fresh router-binding state for one endpoint whose rule keys blockSize
	// tokens per block.
	RouterBinder(blockSize int) RouterBinder
	// EventDrain returns the drain of the server at base (an http:// base URL, already checked);
	// a ZeroMQ family returns nil.
	EventDrain(base string) Drain
}

// Transport is how a family's engines publish KV-cache events.
type Transport uint8

const (
	// TransportNone: the engines publish no events (no exact routing).
	TransportNone Transport = iota
	// TransportZMQ: a PUB socket (and optionally a replay ROUTER) per data-parallel rank.
	TransportZMQ
	// TransportDrain: a destructive HTTP drain the gateway polls.
	TransportDrain
)

// Decoder decodes one ZeroMQ payload into dst, reusing dst's buffers; errors are *DecodeError.
type Decoder func(dst *Batch, payload []byte) error

// The key bindings an endpoint's inventory can hold.
const (
	// BindingEngine: the engine's own 64-bit block ids, as published.
	BindingEngine = "engine"
	// BindingRouter: the gateway's kvexact-xxh3-v1 keys, rehashed from the tokens in each event.
	BindingRouter = "router"
)

// EventConfig is the part of an endpoint's event config a family rules on.
type EventConfig struct {
	Release   string
	Binding   string // BindingEngine or BindingRouter; CheckEventConfig fills in the default
	BlockSize int    // tokens per block of the rule
	Publish   []string
	Replay    []string
	DrainURL  string
}

// ConfigError is a family's verdict on an event config field; the pipeline wraps it into its own
// configuration error, so the message reads "<field>: <msg>".
type ConfigError struct {
	Field, Msg string
}

func (e *ConfigError) Error() string { return e.Field + ": " + e.Msg }

func configErr(field, format string, args ...any) error {
	return &ConfigError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// CheckZMQEventConfig is the rule every ZeroMQ family shares: the engine binding by default, the
// router binding when the rule states a block size, and no drain URL. name is the family's config
// name, for the message.
func CheckZMQEventConfig(name string, c *EventConfig) error {
	if c.Binding == "" {
		c.Binding = BindingEngine
	}
	if c.Binding != BindingEngine && c.Binding != BindingRouter {
		return configErr("binding", "want %q or %q, got %q", BindingEngine, BindingRouter, c.Binding)
	}
	if c.Binding == BindingRouter && c.BlockSize <= 0 {
		return configErr("block_size", "the router binding needs the rule's block size (> 0), got %d", c.BlockSize)
	}
	if c.DrainURL != "" {
		return configErr("drain_url", "%s publishes over ZeroMQ; use publish", name)
	}
	return nil
}

// ContractResidency reads the residency rule of a family's release from its contract; "copies"
// (every stored copy counts) when the release is unknown or the contract says nothing.
func ContractResidency(family, release string) string {
	if release == "" {
		return contracts.ResidencyCopies
	}
	ct, err := contracts.Lookup(family, release)
	if err != nil {
		return contracts.ResidencyCopies
	}
	return ct.Events.ResidencyRule()
}

// A Drain is one server's destructive HTTP event drain: each poll hands over the events buffered
// since the last one, to this caller only.
type Drain interface {
	// URL is what the drain polls; the pipeline allows one poller per URL in a process.
	URL() string
	// Poll makes one request and decodes the body (at most limit bytes). A body that does not
	// decode is a *DecodeError; transport and status failures are plain errors.
	Poll(ctx context.Context, c *http.Client, limit int64) ([]Event, error)
	// NewFilter returns the filter of one rank's events for one engine life (nil: keep all).
	NewFilter() EventFilter
}

// An EventFilter drops events a family publishes that the inventory must not see.
type EventFilter interface {
	// Keep reports whether ev goes on to the binding; when it does not, reason is the skip reason
	// (a metric label) and detail says why for the trace.
	Keep(ev *Event) (ok bool, reason, detail string)
}
