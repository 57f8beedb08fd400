package gateway

import (
	"fmt"
	"io"
	"strings"
)

// WriteStatusText writes the readable view of st (what `gateway status` and `kvbench status`
// print): per rule, whether KV-exact runs and why not; per endpoint, its certificate verdict, its
// runtime exactness (suspended or verifying: every hold with what lifts it) and its health when
// it is not routable. rule "" writes every rule; it reports whether anything was written.
func WriteStatusText(w io.Writer, st Status, rule string) bool {
	found := false
	for _, r := range st.Rules {
		if rule != "" && r.Name != rule {
			continue
		}
		found = true
		if r.Exact.Enabled {
			fmt.Fprintf(w, "rule %s: KV-exact enabled (%s binding)\n", r.Name, r.Exact.Binding)
		} else {
			fmt.Fprintf(w, "rule %s: KV-exact off: %s\n", r.Name, r.Exact.Reason)
		}
		for _, e := range r.Endpoints {
			verdict := e.Certified
			if verdict == "" {
				verdict = "no certificate verdict (KV-exact is off for the rule)"
			}
			line := "  " + e.Name + ": " + verdict
			if x := e.Exact; x != nil && (x.State == "suspended" || x.State == "verifying") {
				// Each hold with what lifts it, as the fence's log line says.
				why := make([]string, len(x.Reasons))
				for i, r := range x.Reasons {
					why[i] = r
					if i < len(x.Lifts) {
						why[i] += " (" + x.Lifts[i] + ")"
					}
				}
				line += ", SUSPENDED while running: " + strings.Join(why, "; ")
			}
			if e.Excluded != "" {
				line += ", NOT ROUTABLE: " + e.Excluded
			}
			if e.Breaker != "" && e.Breaker != "closed" && e.Excluded != "breaker_open" {
				line += ", breaker " + e.Breaker
			}
			if e.EventErr != "" {
				line += ", event source stopped: " + e.EventErr
			}
			fmt.Fprintln(w, line)
		}
	}
	return found
}
