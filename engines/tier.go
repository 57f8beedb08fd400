package engines

import "strings"

// Tier is the cache level a medium names: the GPU pool, or a lower tier an engine offloads blocks
// to. Each tier has its own residency (DESIGN.md, Decisions): a block removed from the GPU may stay
// on the host, and a host copy is not a GPU hit.
type Tier uint8

const (
	TierGPU    Tier = iota // the engine's GPU block pool (no medium given is GPU)
	TierCPU                // host memory: vLLM "CPU" (Mooncake "cpu"), SGLang HiCache "CPU_PINNED"
	TierDisk               // local storage: vLLM "STORAGE", SGLang "DISK"
	TierShared             // a store outside the engine: SGLang "EXTERNAL"
)

// LowerTiers are the tiers below the GPU, nearest first: the order a hit continues in.
var LowerTiers = []Tier{TierCPU, TierDisk, TierShared}

// String is the tier's name as metrics, headers and /admin/explain show it (a closed set).
func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierCPU:
		return "cpu"
	case TierDisk:
		return "disk"
	case TierShared:
		return "shared"
	}
	return "unknown"
}

// TierOf is the tier an event's medium names; false for a medium no release documents (its events
// are skipped, never guessed into a tier).
func TierOf(medium string) (Tier, bool) {
	switch strings.ToUpper(medium) {
	case "", MediumGPU:
		return TierGPU, true
	case "CPU", "CPU_PINNED":
		return TierCPU, true
	case "STORAGE", "DISK":
		return TierDisk, true
	case "EXTERNAL":
		return TierShared, true
	}
	return 0, false
}
