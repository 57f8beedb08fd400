package ingest

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
)

// A Source turns one endpoint's event stream into inventory updates. Run blocks until ctx is done
// (then it returns nil) or the source cannot run at all (then it returns why). apply is called from
// one goroutine at a time, in stream order per rank.
type Source interface {
	Run(ctx context.Context, apply func(Update)) error
}

// New validates cfg against its family's rules and returns the source of the family's transport:
// a ZeroMQ subscriber or an HTTP drain poller.
func New(cfg Config) (Source, error) {
	cfg.defaults()
	if cfg.Release != "" {
		if _, err := contracts.ParseVersion(cfg.Release); err != nil {
			return nil, cfgErr("release", "%v", err)
		}
	}
	fam, err := eventFamily(cfg.Family)
	if err != nil {
		return nil, err
	}
	decode, err := fam.EventDecoder(cfg.Release)
	if err != nil {
		return nil, familyErr(err)
	}
	ec := engines.EventConfig{Release: cfg.Release, Binding: string(cfg.Binding), BlockSize: cfg.BlockSize,
		Publish: cfg.Publish, Replay: cfg.Replay, DrainURL: cfg.DrainURL}
	if err := fam.CheckEventConfig(&ec); err != nil {
		return nil, familyErr(err)
	}
	cfg.Binding = Binding(ec.Binding)
	switch fam.EventTransport() {
	case engines.TransportDrain:
		return newDrainSource(cfg, fam)
	default:
		if err := checkZMQ(&cfg); err != nil {
			return nil, err
		}
		return newZMQSource(cfg, fam, decode), nil
	}
}

// eventFamily looks the family up; an unknown name, or one whose engines publish no events, gets
// the message listing the families that do.
func eventFamily(name string) (engines.Family, error) {
	fam, err := registry.Lookup(name)
	if err == nil {
		return fam, nil
	}
	var with []string
	for _, f := range registry.All() {
		if f.EventTransport() != engines.TransportNone {
			with = append(with, f.Name())
		}
	}
	want := strings.Join(with, ", ")
	if n := len(with); n > 1 {
		want = strings.Join(with[:n-1], ", ") + " or " + with[n-1]
	}
	if name == "" {
		return nil, cfgErr("family", "missing; want %s", want)
	}
	return nil, cfgErr("family", "%q: want %s", name, want)
}

// familyErr wraps a family's *engines.ConfigError as this package's configuration error.
func familyErr(err error) error {
	var ce *engines.ConfigError
	if errors.As(err, &ce) {
		return cfgErr(ce.Field, "%s", ce.Msg)
	}
	return fmt.Errorf("%w: %v", ErrConfig, err)
}

// checkZMQ checks the ZeroMQ addresses: one publish address per rank, replay none or one per rank.
func checkZMQ(cfg *Config) error {
	if len(cfg.Publish) == 0 {
		return cfgErr("publish", "need one publish address per data-parallel rank")
	}
	for i, a := range cfg.Publish {
		if err := checkAddr(a); err != nil {
			return cfgErr(fmt.Sprintf("publish[%d]", i), "%v", err)
		}
	}
	if len(cfg.Replay) != 0 && len(cfg.Replay) != len(cfg.Publish) {
		return cfgErr("replay", "%d replay addresses for %d ranks: give one per rank (\"\" for none) or none", len(cfg.Replay), len(cfg.Publish))
	}
	for i, a := range cfg.Replay {
		if a == "" {
			continue
		}
		if err := checkAddr(a); err != nil {
			return cfgErr(fmt.Sprintf("replay[%d]", i), "%v", err)
		}
	}
	return nil
}
