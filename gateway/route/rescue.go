package route

import "context"

// rescueTier is the P/D ladder's last rung: with no prefill endpoint left, the least-loaded healthy
// role-less endpoint serves the whole request (no decode pick follows).
type rescueTier struct{ rt *Router }

func (t rescueTier) pick(_ context.Context, c *choice) (pick, error) {
	return pick{ep: minLoad(t.rt.candidates(c.retry, RoleNormal), &t.rt.tieMinLoad), tier: TierRescue}, nil
}
