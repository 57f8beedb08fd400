/*
 * Token-id encoders of the kvexact hash core (internal): a block's token ids as canonical CBOR uints
 * or as pickle ints, written branch-free with 8-byte stores (the caller reserves 8 bytes of slack).
 * The portable versions are plain C; the AVX2 versions (kvx_encode_x86.c) do four ids per step and
 * are chosen at run time when the CPU and OS support AVX2.
 */
#ifndef KVX_ENCODE_H
#define KVX_ENCODE_H

#include <stddef.h>
#include <stdint.h>

/* Writes n ids at p and returns the end. */
typedef uint8_t *(*kvx_tokens_fn)(uint8_t *p, const uint32_t *t, size_t n);

typedef struct {
	kvx_tokens_fn cbor;   /* major type 0, shortest head: 1, 2, 3 or 5 bytes per id */
	kvx_tokens_fn pickle; /* BININT1 / BININT2 / BININT / LONG1: 2, 3, 5 or 7 bytes per id */
} kvx_encoders;

uint8_t *kvx_cbor_tokens_portable(uint8_t *p, const uint32_t *t, size_t n);
/* Token ids as MessagePack uints in their shortest form; writes up to 8 bytes past the last one. */
uint8_t *kvx_msgpack_tokens(uint8_t *p, const uint32_t *t, size_t n);
uint8_t *kvx_pickle_tokens_portable(uint8_t *p, const uint32_t *t, size_t n);
#if defined(__x86_64__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define KVX_HAVE_AVX2_BUILD 1
uint8_t *kvx_cbor_tokens_avx2(uint8_t *p, const uint32_t *t, size_t n);
uint8_t *kvx_pickle_tokens_avx2(uint8_t *p, const uint32_t *t, size_t n);
#endif

/* The encoders in use (portable when kvx_force_portable is set or the CPU lacks AVX2). */
kvx_encoders kvx_token_encoders(void);

/* Whether the portable code is forced (kvx_force_portable), shared with the SHA-256 choice. */
int kvx_portable_forced(void);

#endif
