package gateway

import (
	"context"
	"time"
)

// A rule whose tokenizer cannot be loaded is in one named state: ExactStatus code "tokenizer"
// (its reason names the folder or hub call that failed and how to provide the files), the
// kvexact_rule_exact_enabled series with reason="tokenizer", and one WARN line when it enters the
// state and one INFO line when it leaves. The rule serves by its selector meanwhile, and
// runTokenizerRetry rebuilds it until the files load, so it becomes exact by itself.

// noteTokenizer logs a rule's entry into and exit from the missing-tokenizer state, once each.
func (g *Gateway) noteTokenizer(old, rt *ruleRuntime) {
	was := old != nil && old.exact.Code == "tokenizer"
	is := rt.exact.Code == "tokenizer"
	switch {
	case is && !was:
		g.log.Warn("tokenizer missing: the rule routes by its selector, not KV-exact, until the files load (retried on its own)",
			"rule", rt.rule.Name, "model", rt.rule.Models[0], "retry", g.opts.TokenizerRetry, "reason", rt.exact.Reason)
	case was && !is:
		attrs := []any{"rule", rt.rule.Name, "model", rt.rule.Models[0]}
		if t := rt.exact.Tokenizer; t != nil {
			attrs = append(attrs, "dir", t.Dir)
			if t.Commit != "" {
				attrs = append(attrs, "repo", t.Repo, "commit", t.Commit)
			}
		}
		g.log.Info("tokenizer loaded", append(attrs, "exact", rt.exact.Enabled, "code", rt.exact.Code)...)
	}
}

// runTokenizerRetry rebuilds every rule in the missing-tokenizer state each interval.
func (g *Gateway) runTokenizerRetry(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g.mu.RLock()
		var due []string
		for name, rt := range g.runtimes {
			if rt.exact.Code == "tokenizer" {
				due = append(due, name)
			}
		}
		g.mu.RUnlock()
		for _, name := range due {
			r, ok := g.store.Get(name)
			if !ok {
				continue
			}
			if err := g.apply(r.Clone()); err != nil {
				g.log.Error("gateway: rule could not be rebuilt to retry its tokenizer", "rule", name, "err", err)
			}
		}
	}
}

// certWhy is what an endpoint's exactness records as its certification: the certificate's verdict
// for it, or — when the rule stopped before any certificate was read (no tokenizer, mode off, …) —
// the rule's reason, so no endpoint says "uncertified" without saying why.
func (st ExactStatus) certWhy(endpoint string) string {
	if why := st.Endpoints[endpoint]; why != "" {
		return why
	}
	return st.Reason
}
