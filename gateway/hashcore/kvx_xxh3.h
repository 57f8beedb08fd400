/* XXH3 entry points of the kvexact hash core (internal). */
#ifndef KVX_XXH3_H
#define KVX_XXH3_H

#include <stddef.h>
#include <stdint.h>

/* XXH3-128 of p[0:n] as its canonical 16 bytes (big-endian high64 ‖ low64); returns low64, which
 * is also the last 8 digest bytes read big-endian (vLLM's 64-bit key). */
uint64_t kvx_xxh3_128_canonical(const uint8_t *p, size_t n, uint8_t out[16]);
/* XXH3-64 with seed 0. */
uint64_t kvx_xxh3_64(const uint8_t *p, size_t n);

#endif
