package sim

import (
	"strings"
	"testing"
)

// TestReportModeByRelease: "full" exists only for releases with kv_cache_report_mode.
func TestReportModeByRelease(t *testing.T) {
	for _, tc := range []struct{ release, mode, want string }{
		{"v0.30.0", ReportFull, ""},
		{"v0.26.0", "", ""},
		{"v0.25.1", ReportFull, `"full" needs a release with kv_cache_report_mode`},
		{"v0.30.0", "partial", `"partial" is not one of incremental, full`},
	} {
		c := Config{Family: "vllm", Release: tc.release, ReportMode: tc.mode}
		err := c.resolve()
		switch {
		case tc.want == "" && err != nil && strings.Contains(err.Error(), "report mode"):
			t.Errorf("%s %q: %v", tc.release, tc.mode, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s %q: want %q, got %v", tc.release, tc.mode, tc.want, err)
		}
	}
}
