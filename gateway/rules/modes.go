package rules

// KV-exact modes: a rule's kvExactMode, the integer users write. The router builds its ladder from
// it (gateway/route/ladder.go); validation checks that the endpoints' roles fit it.
const (
	// KVExactOff: KV-exact never runs; the selector (single pool) or the P/D ladder without it decides.
	KVExactOff = 0
	// KVExactPD: KV-exact is one tier of the P/D ladder, choosing the prefill endpoint.
	KVExactPD = 1
	// KVExactPool: KV-exact runs ahead of the selector over a single pool of role-less endpoints.
	KVExactPool = 3

	// kvExactReserved is refused with a hint that it is reserved (not a typo of 1 or 3).
	kvExactReserved = 2
)
