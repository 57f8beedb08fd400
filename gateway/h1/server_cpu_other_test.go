//go:build !unix

package h1

import "time"

// processCPU is not measured on this platform.
func processCPU() time.Duration { return 0 }
