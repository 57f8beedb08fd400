// Package lateport picks TCP ports for a process that binds them later: an engine that loads for
// seconds to minutes before it listens (vLLM), a container, a kube-apiserver. A port the kernel
// hands out for ":0" lies in its ephemeral range, and until the late binder listens any other
// listener on the machine may be given the same port — on a machine running tests in parallel, a
// simulated engine whose /health then answers for the engine still loading. Ports picked here lie
// outside that range, where no ":0" listener is ever placed, are checked free when picked, and are
// not handed out twice by one process.
package lateport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// low is the lowest port picked: below it lie the well-known and registered services a machine is
// likelier to run.
const low = 10000

// minSpan is the narrowest free span (outside the ephemeral range, from low) worth drawing from;
// with less, ports come from the ephemeral range as ":0" gives them.
const minSpan = 2000

var (
	mu    sync.Mutex
	given = map[int]bool{} // ports this process handed out
)

// Pick returns the first of n consecutive ports free on host ("127.0.0.1", or "0.0.0.0" for every
// interface), outside the kernel's ephemeral range.
func Pick(host string, n int) (int, error) {
	lo, hi := span(ephemeral())
	if hi-lo < minSpan {
		mu.Lock()
		defer mu.Unlock()
		return fromKernel(host, n)
	}
	return pick(host, n, lo, hi)
}

// PickDistinct returns n ports free on host, each picked as Pick picks one.
func PickDistinct(host string, n int) ([]int, error) {
	out := make([]int, n)
	for i := range out {
		p, err := Pick(host, 1)
		if err != nil {
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}

// pick draws n consecutive ports from [lo, hi).
func pick(host string, n, lo, hi int) (int, error) {
	mu.Lock()
	defer mu.Unlock()
	for range 200 {
		p := lo + rand.IntN(hi-lo-n+1)
		if free(host, p, n) {
			for r := range n {
				given[p+r] = true
			}
			return p, nil
		}
	}
	return 0, fmt.Errorf("lateport: no %d free consecutive ports on %s in %d–%d after 200 draws", n, host, lo, hi-1)
}

// free reports whether p..p+n-1 are all unhanded and bindable on host now.
func free(host string, p, n int) bool {
	for r := range n {
		if given[p+r] {
			return false
		}
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p+r)))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// fromKernel is the fallback on a machine whose ephemeral range leaves no span: ":0"'s port and the
// ones after it.
func fromKernel(host string, n int) (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !given[p] && free(host, p, n) {
			for r := range n {
				given[p+r] = true
			}
			return p, nil
		}
	}
	return 0, errors.New("lateport: no free port range from the kernel")
}

// ephemeral is the kernel's ephemeral port range (Linux: /proc/sys/net/ipv4/ip_local_port_range),
// else Linux's default.
func ephemeral() (first, last int) {
	first, last = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return first, last
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return first, last
	}
	a, err1 := strconv.Atoi(f[0])
	z, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || a > z {
		return first, last
	}
	return a, z
}

// span is the wider of the spans outside [first, last] within [low, 65535]: [lo, hi).
func span(first, last int) (lo, hi int) {
	below := [2]int{low, max(low, first)}
	above := [2]int{max(low, last+1), 65536}
	if above[1]-above[0] > below[1]-below[0] {
		return above[0], above[1]
	}
	return below[0], below[1]
}
