package sim

import (
	"fmt"

	"github.com/kvexact/kvexact/contracts"
)

// The kv_cache_report_mode values of vLLM (PR #45261).
const (
	ReportIncremental = "incremental"
	ReportFull        = "full"
)

// resolveReportMode checks ReportMode against the release: "full" exists only where the contract
// says the engine may repeat stores (events.residency: presence).
func (c *Config) resolveReportMode() error {
	switch c.ReportMode {
	case "":
		c.ReportMode = ReportIncremental
		return nil
	case ReportIncremental:
		return nil
	case ReportFull:
		if c.contract.Events.ResidencyRule() != contracts.ResidencyPresence {
			return fmt.Errorf("sim: report mode: %q needs a release with kv_cache_report_mode (vllm v0.26+); %s %s has none", ReportFull, c.Family, c.Release)
		}
		return nil
	}
	return fmt.Errorf("sim: report mode: %q is not one of %s, %s", c.ReportMode, ReportIncremental, ReportFull)
}
