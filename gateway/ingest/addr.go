package ingest

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// checkAddr accepts the endpoints a subscriber can dial: tcp://host:port (never a wildcard host:
// the gateway connects, the engine binds) and ipc://path.
func checkAddr(a string) error {
	switch {
	case strings.HasPrefix(a, "ipc://"):
		if len(a) == len("ipc://") {
			return fmt.Errorf("%q: empty ipc path", a)
		}
		return nil
	case strings.HasPrefix(a, "tcp://"):
		host, port, err := net.SplitHostPort(strings.TrimPrefix(a, "tcp://"))
		if err != nil {
			return fmt.Errorf("%q: %v", a, err)
		}
		if host == "" || host == "*" || host == "0.0.0.0" || host == "::" {
			return fmt.Errorf("%q: a subscriber dials the engine's host, not the wildcard %q", a, host)
		}
		if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
			return fmt.Errorf("%q: port %q outside 1..65535", a, port)
		}
		return nil
	}
	return fmt.Errorf("%q: want tcp://host:port or ipc://path", a)
}

// ExpandRanks lists the addresses of ranks 0..n-1 of an engine whose rank 0 uses base, following
// the engines' own rule (offset_endpoint_port): a tcp port becomes port + rank, an
// ipc or inproc path gets the suffix _dp<rank> (rank 0 unchanged).
func ExpandRanks(base string, n int) ([]string, error) {
	if n <= 0 {
		return nil, fmt.Errorf("ingest: ranks: want at least 1, got %d", n)
	}
	out := make([]string, n)
	switch {
	case strings.HasPrefix(base, "tcp://"):
		host, port, err := net.SplitHostPort(strings.TrimPrefix(base, "tcp://"))
		if err != nil {
			return nil, fmt.Errorf("ingest: base address %q: %v", base, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p <= 0 || p+n-1 > 65535 {
			return nil, fmt.Errorf("ingest: base address %q: port %q with %d ranks leaves 1..65535", base, port, n)
		}
		for r := range n {
			out[r] = "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+r))
		}
	case strings.HasPrefix(base, "ipc://"), strings.HasPrefix(base, "inproc://"):
		for r := range n {
			out[r] = base
			if r > 0 {
				out[r] = base + "_dp" + strconv.Itoa(r)
			}
		}
	default:
		return nil, fmt.Errorf("ingest: base address %q: want tcp://host:port, ipc:// or inproc://", base)
	}
	return out, nil
}
