/*
 * XXH3 for the kvexact hash core, from the vendored single-header xxHash (third_party/xxhash,
 * BSD-2-Clause; see its README.kvexact.md for the commit). XXH_INLINE_ALL keeps every xxHash symbol
 * static to this file, so nothing clashes with another copy linked into the same binary.
 */
#define XXH_INLINE_ALL
#include "third_party/xxhash/xxhash.h"

#include "kvx_xxh3.h"

uint64_t kvx_xxh3_128_canonical(const uint8_t *p, size_t n, uint8_t out[16]) {
	XXH128_hash_t h = XXH3_128bits(p, n);
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, h); /* big-endian high64 then low64, as Python's xxh3_128_digest */
	memcpy(out, c.digest, 16);
	return h.low64;
}

uint64_t kvx_xxh3_64(const uint8_t *p, size_t n) { return XXH3_64bits(p, n); }
