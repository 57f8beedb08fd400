package main

import (
	"runtime"
	"testing"
)

var sink []byte

// nextGC is the collector's current goal in bytes.
func nextGC() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.NextGC
}

// churn allocates n bytes of short-lived garbage and returns how many collections ran meanwhile.
func churn(n int) uint32 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < n/1024; i++ {
		sink = make([]byte, 1024)
	}
	runtime.ReadMemStats(&after)
	return after.NumGC - before.NumGC
}

// The floor is what keeps a small-heap gateway from collecting a dozen times a second: it raises
// the collector's goal (the heap size that triggers the next cycle) above 256 MiB, so 64 MiB of
// garbage runs at most one collection. The no-floor side is asserted on the goal, not on a count
// of cycles: how many concurrent cycles finish during a burst depends on how much CPU the
// collector gets, and this machine is shared.
func TestGCFloorDefersCollections(t *testing.T) {
	runtime.GC()
	if goal := nextGC(); goal >= 64<<20 {
		t.Fatalf("without a floor the collector's goal is %d MiB; want < 64 MiB (the test needs a small heap)", goal>>20)
	}
	floor := setGCFloor(256 << 20)
	runtime.GC() // the collector sizes its goal from the heap this cycle marks: floor included
	goal := nextGC()
	with := churn(64 << 20)
	keepGCFloor(floor)
	if goal < 256<<20 || with > 1 {
		t.Fatalf("with a 256 MiB floor the collector's goal is %d MiB and 64 MiB of garbage ran %d collections; want ≥ 256 MiB and ≤ 1", goal>>20, with)
	}
	if setGCFloor(0) != nil {
		t.Fatal("a zero floor allocated")
	}
}
