package epp

import "sync/atomic"

// streamWorkers is how many goroutines serve streams and how many run streams' receive loops
// without being started for each: a fresh goroutine grows its stack through gRPC's framing and
// protobuf's decoding on every stream (a tenth of the picker's CPU when each request started two),
// a kept one has grown it once. A stream past that many at once gets a goroutine of its own, as
// before, so the count bounds only what stays parked between requests.
const streamWorkers = 16

var (
	recvWork    = make(chan func())
	recvWorkers atomic.Int32
)

// goRecv runs f on a parked receive worker, else on a new worker while fewer than streamWorkers
// exist, else on a goroutine of its own.
func goRecv(f func()) {
	select {
	case recvWork <- f:
		return
	default:
	}
	if recvWorkers.Add(1) > streamWorkers {
		recvWorkers.Add(-1)
		go f()
		return
	}
	go func() {
		for ; f != nil; f = <-recvWork {
			f()
		}
	}()
}
