package containers

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"

	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
)

// Network is a user-defined bridge network of the harness. A container on it has its own network
// namespace, reached from the host only through the ports it publishes on 127.0.0.1, so its link
// can be cut for real (Container.Disconnect) without touching the host's network, which the
// machine's other users share.
type Network struct {
	h        *Harness
	ID, Name string
}

// CreateNetwork creates a bridge network named kvexact-<name>-<pid>-<n>, labelled like the
// harness's containers so that Reap removes it once its owner is gone.
func (h *Harness) CreateNetwork(ctx context.Context, name string) (*Network, error) {
	full := fmt.Sprintf("kvexact-%s-%d-%d", name, os.Getpid(), h.seq.Add(1))
	res, err := h.cli.NetworkCreate(ctx, full, client.NetworkCreateOptions{Driver: "bridge", Labels: map[string]string{
		LabelHarness: "containers", LabelOwner: strconv.Itoa(os.Getpid()), LabelHost: hostname(), LabelRole: "network",
	}})
	if err != nil {
		return nil, fmt.Errorf("create network %s: %w", full, err)
	}
	return &Network{h: h, ID: res.ID, Name: full}, nil
}

// Remove deletes the network; its containers must be gone first.
func (n *Network) Remove(ctx context.Context) error {
	if n == nil {
		return nil
	}
	if _, err := n.h.cli.NetworkRemove(context.WithoutCancel(ctx), n.ID, client.NetworkRemoveOptions{}); err != nil {
		return fmt.Errorf("remove network %s: %w", n.Name, err)
	}
	return nil
}

// Disconnect cuts the container off its network (docker network disconnect): its interface goes,
// Docker stops forwarding its published ports, so the host's connections to them are closed and
// new ones refused, while the process inside runs on, unaware, with its sockets open.
func (c *Container) Disconnect(ctx context.Context) error {
	if c.spec.Network == nil {
		return fmt.Errorf("disconnect %s: it runs on the host's network", c.Name)
	}
	if _, err := c.h.cli.NetworkDisconnect(ctx, c.spec.Network.ID, client.NetworkDisconnectOptions{Container: c.ID, Force: true}); err != nil {
		return fmt.Errorf("disconnect %s from %s: %w", c.Name, c.spec.Network.Name, err)
	}
	return nil
}

// Connect joins the container to its network again; Docker publishes its ports again.
func (c *Container) Connect(ctx context.Context) error {
	if c.spec.Network == nil {
		return fmt.Errorf("connect %s: it runs on the host's network", c.Name)
	}
	if _, err := c.h.cli.NetworkConnect(ctx, c.spec.Network.ID, client.NetworkConnectOptions{Container: c.ID}); err != nil {
		return fmt.Errorf("connect %s to %s: %w", c.Name, c.spec.Network.Name, err)
	}
	return nil
}

// bindHost is the address a server binds: 127.0.0.1 on the host's network, every interface of its
// own namespace on a network of its own (where only the published ports reach it).
func bindHost(nw *Network) string {
	if nw == nil {
		return "127.0.0.1"
	}
	return "0.0.0.0"
}

// loopback is where published ports listen: tests talk only to 127.0.0.1.
var loopback = netip.MustParseAddr("127.0.0.1")

// publish is the ports published on 127.0.0.1 under their own numbers: testcontainers' exposed
// ports and the bindings it keeps for them (it drops bindings of ports not exposed).
func publish(ports []int) ([]string, network.PortMap, error) {
	var exposed []string
	m := network.PortMap{}
	for _, p := range ports {
		port, err := network.ParsePort(strconv.Itoa(p) + "/tcp")
		if err != nil {
			return nil, nil, err
		}
		exposed = append(exposed, port.String())
		m[port] = []network.PortBinding{{HostIP: loopback, HostPort: strconv.Itoa(p)}}
	}
	return exposed, m, nil
}
