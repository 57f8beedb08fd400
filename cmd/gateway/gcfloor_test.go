package main

import (
	"runtime"
	"testing"
)

var sink []byte

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

// The floor is what keeps a small-heap gateway from collecting a dozen times a second: 64 MiB of
// garbage runs several collections without it and at most one with a 256 MiB floor.
func TestGCFloorDefersCollections(t *testing.T) {
	runtime.GC()
	without := churn(64 << 20)
	floor := setGCFloor(256 << 20)
	runtime.GC() // the collector sizes its goal from the heap this cycle marks: floor included
	with := churn(64 << 20)
	keepGCFloor(floor)
	if without < 4 || with > 1 {
		t.Fatalf("64 MiB of garbage ran %d collections without a floor and %d with one; want ≥ 4 and ≤ 1", without, with)
	}
	if setGCFloor(0) != nil {
		t.Fatal("a zero floor allocated")
	}
}
