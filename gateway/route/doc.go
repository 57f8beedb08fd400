// Package route owns the routing decision: which endpoint (and, for prefill/decode rules, which
// pair) serves a request, and why. A rule's router is a ladder of tiers (ladder.go) over the
// endpoints health has not excluded; each tier picks or passes, the first pick decides:
//
//	single pool (kvExactMode 3, or 0): kv-exact (or its mode_off pass), the rule's selector
//	P/D (kvExactMode 1, or 0): admission, session, trie, kv-exact, min-load, rescue; a prefill
//	                            winner then gets its decode endpoint (decode.go)
//
// KV-exact is keys (keys.go: the guard ladder and PromptKeyer), score (score.go: the inventory's
// overlap and prefix depth per endpoint, predict-on-route's extension), evidence (evidence.go), the
// bounded-load law (law.go), cold-start seeding (coldstart.go) and the zero-hit watchdog
// (watchdog.go). Every decision carries its evidence: per-endpoint overlap and prefix depth, the
// tier that decided, and the reason KV-exact missed when it did.
package route
