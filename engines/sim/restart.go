package sim

import (
	"context"
	"fmt"
	"net"
	"strings"
)

// Restart stops e and starts a new engine process in its place: the same HTTP and event ports, the
// configuration e ran with, changed by mod (another seed, block size, tokenizer…). It is what an
// operator's restart or upgrade looks like from outside: the event sequence starts again at 0 and
// the cache is empty. The old engine must have been started on concrete or port-0 addresses; its
// bound ports are reused.
func Restart(ctx context.Context, e *Engine, mod func(*Config)) (*Engine, error) {
	cfg := e.Config()
	cfg.HTTPAddr = e.Addr()
	if pubs := e.PublishAddrs(); len(pubs) > 0 {
		cfg.PublishAddr = bindAll(pubs[0])
		if reps := e.ReplayAddrs(); len(reps) > 0 {
			cfg.ReplayAddr = bindAll(reps[0])
		}
	}
	if mod != nil {
		mod(&cfg)
	}
	if err := e.Close(); err != nil {
		return nil, err
	}
	n, err := New(cfg)
	if err != nil {
		return nil, fmt.Errorf("sim: restart: %w", err)
	}
	if err := n.Start(ctx); err != nil {
		return nil, fmt.Errorf("sim: restart: %w", err)
	}
	return n, nil
}

// bindAll turns a dialable tcp://host:port into the binding tcp://*:port.
func bindAll(addr string) string {
	rest, ok := strings.CutPrefix(addr, "tcp://")
	if !ok {
		return addr
	}
	if _, port, err := net.SplitHostPort(rest); err == nil {
		return "tcp://*:" + port
	}
	return addr
}
