package main

import "runtime"

// A gateway that routes without KV-exact (round robin, CHWBL) keeps a live heap of a few MiB, and
// Go's collector runs each time the heap doubles: at tens of thousands of small requests per second
// that is a dozen collections a second, ≈ 10 % of the gateway's CPU (docs/benchmarks/proxy.md).
// Go has a ceiling for the heap (GOMEMLIMIT) but no floor, so the floor is a pointer-free
// allocation kept alive for the life of the process: it raises the heap the collector sizes its
// goal from without being touched, so it is neither resident nor scanned. Once the real heap is
// larger (tokenizers and inventories of a KV-exact gateway are hundreds of MiB), the floor no longer
// changes anything.
//
// Bigger is not better: between collections the heap grows into fresh memory (page faults, spans
// cut from the page heap, cold caches) for as long as the goal allows. On the proxy benchmark a
// 16 MiB floor cost least; 64 MiB cost ≈ 10 % more CPU per request and 256 MiB nearly twice as
// much (docs/benchmarks/proxy.md).

// setGCFloor allocates the floor (nil for 0 bytes).
func setGCFloor(bytes int) []byte {
	if bytes <= 0 {
		return nil
	}
	return make([]byte, bytes)
}

// keepGCFloor keeps the floor reachable until the caller returns.
func keepGCFloor(floor []byte) { runtime.KeepAlive(floor) }
