package proxy

import (
	"context"
	"log/slog"
	"time"
)

// accessLog writes the request's access-log line (Config.AccessLog), one per request whatever its
// outcome, with these attributes:
//
//	request_id               X-Request-Id (the client's, else the one the proxy made)
//	method, path             the client's request line
//	rule                     the rule that served ("none" before one was resolved)
//	endpoint                 the endpoint whose answer the client got (absent: none did)
//	prefill                  the P/D prefill endpoint (absent outside P/D)
//	tier                     the routing tier that decided ("none": no decision)
//	predicted_cached_tokens  the decision's cached prefix on its target, in tokens
//	realized_cached_tokens   the engine's usage.prompt_tokens_details.cached_tokens (absent: the
//	                         engine reported none)
//	status                   the status the client got (499: it left before any answer)
//	ttfb, duration           arrival to the response head, and to the last byte relayed
func (c *call) accessLog(took time.Duration) {
	l := c.p.cfg.AccessLog
	if l == nil || !l.Enabled(c.ctx, slog.LevelInfo) {
		return
	}
	tier := c.tier
	if tier == "" {
		tier = "none"
	}
	predicted := 0
	if d := c.d; d != nil && c.rule.rt != nil {
		for _, ev := range d.Endpoints {
			if ev.Name == d.TargetN {
				if r := c.rule.rt.Rule(); r != nil {
					predicted = ev.Prefix * r.BlockSize
				}
			}
		}
	}
	var buf [13]slog.Attr
	a := append(buf[:0], slog.String("request_id", c.id), slog.String("method", c.r.Method), slog.String("path", c.r.URL.Path), slog.String("rule", c.rule.name))
	if n := c.serverName(); n != "" {
		a = append(a, slog.String("endpoint", n))
	}
	if c.resp.prefill != nil {
		a = append(a, slog.String("prefill", c.resp.prefill.Name))
	}
	a = append(a, slog.String("tier", tier), slog.Int("predicted_cached_tokens", predicted))
	if c.resp.realized >= 0 {
		a = append(a, slog.Int("realized_cached_tokens", c.resp.realized))
	}
	a = append(a, slog.Int("status", c.resp.status), slog.Duration("ttfb", c.resp.ttfb), slog.Duration("duration", took))
	l.LogAttrs(context.Background(), slog.LevelInfo, "access", a...)
}
