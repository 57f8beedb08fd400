// Package inventory is one rule's block index: block key → which endpoints hold it, with the
// residency rule of DESIGN.md (Decisions). To the index a key is a uint64 whichever binding made
// it (engine keys as published, router keys computed by the gateway).
//
// # Residency
//
// Each (endpoint, key) has a copy count: +1 per stored copy the engine reports (duplicates and
// each KV-cache group included), −1 per removed copy (never below zero; a remove of a key the
// endpoint does not hold is counted in Stats.UnknownRemoves, not an error), reset by Clear. The
// key is resident while the count is positive. Only the GPU medium makes a block resident: the
// caller filters media. A rule that wants the optional other-media signal (SGLang host memory)
// keeps a second Index for it; the two never mix.
//
// Each endpoint keeps a FIFO of its keys in the order they became resident. It gives the
// per-endpoint capacity cap (Config.CapacityPerEndpoint; above it the oldest resident key is
// retired with all its copies, which repairs missed removes) and Clear in time proportional to
// that endpoint's keys. Re-storing a resident key keeps its age; a key removed and stored again
// is young again. Removes do not search the FIFO: the table keeps, per (endpoint, key), how many
// FIFO entries are pending, so an entry is known dead when popped; a key whose count fell to zero
// lingers in the table (invisible to Score and Snapshot) until its last entry leaves the FIFO.
// Engines evict oldest first, so a remove usually meets its key at the FIFO's head and drops it
// at once; otherwise the FIFO is compacted when dead entries exceed half the resident keys + 1024.
//
// # Layout and memory
//
// The table is 256 shards of open addressing with Robin Hood probing and backward-shift
// deletion (no tombstones), over the key's murmur3-mixed hash (a bijection). A slot is 10 bytes:
// the hash's low 56 bits (the top 8 are the shard number) with 8 meta bits in the freed top byte,
// plus a 16-bit field; six slots fill one 64-byte cache line. The 24-bit meta holds the common
// case inline — one endpoint, count ≤ 1023, ≤ 31 pending FIFO entries — and otherwise points to
// a chain of 64-byte overflow nodes from a per-shard arena (no per-entry allocation, no
// pointers for the GC to scan), whose head starts with a 256-bit bitmap of the endpoints holding
// the key. Slot counts are not powers of two (fast range reduction), a shard grows by 1.25× at
// 0.9 load, and shard i starts i/256 of a growth step above shard 0, so shards sit at evenly
// spread points of their growth cycle and the average load stays near 0.8 at every size instead
// of all shards halving together. Cost per resident (endpoint, key) with one endpoint per key:
// 10/0.8 ≈ 12.5 bytes of table + 8 bytes of FIFO (chunks of 1024 keys) + allocation rounding
// ≈ 21–22.5 bytes, within the 24-byte budget (docs/benchmarks/inventory.md).
//
// # Concurrency
//
// Readers never lock: each shard is a seqlock. A writer holds the shard's mutex and makes every
// visible change between two increments of its sequence; a reader reads the sequence, probes
// with atomic loads, and retries the key if the sequence moved (after 64 tries it waits for the
// shard's mutex, so a descheduled writer cannot starve it). Resizes build a new array outside
// the write window and publish it with an atomic pointer, so readers keep probing the old one
// meanwhile. Score therefore reads each key consistently and never waits on anything wider than
// one shard; a prompt's keys are not read at one instant, which routing does not need. Writers of
// one endpoint are serialized by the endpoint's mutex (its FIFO and counts are its own), and
// writers of different endpoints meet only on shard mutexes, held for one key at a time.
//
// Endpoint ids are dense and reused after RemoveEndpoint; stop an endpoint's event stream before
// removing it. Counters (Stats, Endpoints) feed the metrics collector in package invprom.
package inventory
