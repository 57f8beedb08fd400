/*
 * The kvexact hash core: per-block pre-images (canonical CBOR, CPython pickle protocol 5, raw
 * little-endian) written into one buffer reused for every block of a call, then hashed and chained.
 * See kvx_hashcore.h for the contract.
 */
#include <stdlib.h>
#include <string.h>

#include "kvx_encode.h"
#include "kvx_hashcore.h"
#include "kvx_sha256.h"
#include "kvx_xxh3.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define KVX_LE 1
#else
#define KVX_LE 0
#endif

/* ---- the pre-image buffer ---------------------------------------------------------------- */

/* Pre-images up to half this size live on the stack (two buffers); a larger one moves its buffer to
 * the heap once per call (then it is reused for the remaining blocks). 8 KiB holds a 1024-token
 * pickle block. */
#define STACK_BUF 16384
/* Writers may store 8 bytes at a time past the logical end, and the SHA-NI digest loads up to 64
 * bytes past it (masked off): every reservation keeps this slack. */
#define SLACK 64

typedef struct {
	uint8_t *p;
	size_t len, cap;
	uint8_t *heap; /* non-NULL once the buffer moved to the heap */
} buf_t;

static int buf_reserve(buf_t *b, size_t n) {
	if (n > SIZE_MAX / 2 - b->len - SLACK) return KVX_E_TOO_LARGE;
	size_t need = b->len + n + SLACK;
	if (need <= b->cap) return KVX_OK;
	size_t cap = b->cap * 2 > need ? b->cap * 2 : need;
	uint8_t *q = b->heap ? realloc(b->heap, cap) : malloc(cap);
	if (q == NULL) return KVX_E_NOMEM;
	if (b->heap == NULL && b->len > 0) memcpy(q, b->p, b->len);
	b->heap = q;
	b->p = q;
	b->cap = cap;
	return KVX_OK;
}

/* Unchecked writers: callers reserve first. */
static inline void put1(buf_t *b, uint8_t v) { b->p[b->len++] = v; }
static inline void putn(buf_t *b, const void *s, size_t n) {
	if (n > 0) memcpy(b->p + b->len, s, n);
	b->len += n;
}
static inline void put_le32(buf_t *b, uint32_t v) {
	for (int i = 0; i < 4; i++) b->p[b->len++] = (uint8_t)(v >> (8 * i));
}
static inline void put_le64(buf_t *b, uint64_t v) {
	for (int i = 0; i < 8; i++) b->p[b->len++] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t load_be64(const uint8_t *p) {
	uint64_t v;
	memcpy(&v, p, 8);
#if KVX_LE
	return __builtin_bswap64(v);
#else
	return v;
#endif
}

/* Copies a digest-sized span with inline moves for the common sizes (a libc call otherwise). */
static inline void copy_digest(uint8_t *dst, const uint8_t *src, size_t n) {
	switch (n) {
	case 32: memcpy(dst, src, 32); break;
	case 16: memcpy(dst, src, 16); break;
	case 8: memcpy(dst, src, 8); break;
	default: if (n > 0) memcpy(dst, src, n);
	}
}

/* ---- reading packed extras --------------------------------------------------------------- */

typedef struct {
	const uint8_t *p;
	size_t len, off;
} rd_t;

static int rd_u8(rd_t *r, uint8_t *v) {
	if (r->len - r->off < 1) return KVX_E_EXTRAS;
	*v = r->p[r->off++];
	return KVX_OK;
}

static int rd_u32(rd_t *r, uint32_t *v) {
	if (r->len - r->off < 4) return KVX_E_EXTRAS;
	const uint8_t *q = r->p + r->off;
	*v = (uint32_t)q[0] | ((uint32_t)q[1] << 8) | ((uint32_t)q[2] << 16) | ((uint32_t)q[3] << 24);
	r->off += 4;
	return KVX_OK;
}

static int rd_i64(rd_t *r, int64_t *v) {
	if (r->len - r->off < 8) return KVX_E_EXTRAS;
	uint64_t u = 0;
	for (int i = 7; i >= 0; i--) u = (u << 8) | r->p[r->off + i];
	r->off += 8;
	*v = (int64_t)u;
	return KVX_OK;
}

/* A length-prefixed span (str or bytes payload). */
static int rd_span(rd_t *r, const uint8_t **s, size_t *n) {
	uint32_t l;
	int rc = rd_u32(r, &l);
	if (rc) return rc;
	if (l > KVX_MAX_ITEM) return KVX_E_TOO_LARGE;
	if (r->len - r->off < l) return KVX_E_EXTRAS;
	*s = r->p + r->off;
	*n = l;
	r->off += l;
	return KVX_OK;
}

static int utf8_valid(const uint8_t *s, size_t n) {
	size_t i = 0;
	while (i < n) {
		uint8_t c = s[i];
		if (c < 0x80) {
			i++;
			continue;
		}
		size_t k;
		uint32_t cp;
		if (c >= 0xC2 && c <= 0xDF) k = 1, cp = c & 0x1F;
		else if (c >= 0xE0 && c <= 0xEF) k = 2, cp = c & 0x0F;
		else if (c >= 0xF0 && c <= 0xF4) k = 3, cp = c & 0x07;
		else return 0;
		if (n - i <= k) return 0;
		for (size_t j = 1; j <= k; j++) {
			if ((s[i + j] & 0xC0) != 0x80) return 0;
			cp = (cp << 6) | (s[i + j] & 0x3F);
		}
		if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
		    (cp >= 0xD800 && cp <= 0xDFFF))
			return 0; /* overlong, out of range, or a surrogate */
		i += k + 1;
	}
	return 1;
}

/* ---- canonical CBOR ---------------------------------------------------------------------- */

/* A head with the shortest argument (RFC 8949 preferred serialization). Reserve 9 bytes first. */
static inline void cbor_head(buf_t *b, unsigned major, uint64_t v) {
	uint8_t m = (uint8_t)(major << 5);
	if (v < 24) {
		put1(b, m | (uint8_t)v);
	} else if (v <= 0xFF) {
		put1(b, m | 24);
		put1(b, (uint8_t)v);
	} else if (v <= 0xFFFF) {
		put1(b, m | 25);
		put1(b, (uint8_t)(v >> 8));
		put1(b, (uint8_t)v);
	} else if (v <= 0xFFFFFFFFu) {
		put1(b, m | 26);
		for (int i = 3; i >= 0; i--) put1(b, (uint8_t)(v >> (8 * i)));
	} else {
		put1(b, m | 27);
		for (int i = 7; i >= 0; i--) put1(b, (uint8_t)(v >> (8 * i)));
	}
}

static int cbor_blob(buf_t *b, unsigned major, const uint8_t *s, size_t n) {
	int rc = buf_reserve(b, 9 + n);
	if (rc) return rc;
	cbor_head(b, major, n);
	putn(b, s, n);
	return KVX_OK;
}

/* One packed item as CBOR. */
static int cbor_item(buf_t *b, rd_t *r, int depth) {
	uint8_t tag;
	int rc = rd_u8(r, &tag);
	if (rc) return rc;
	switch (tag) {
	case KVX_TAG_STR:
	case KVX_TAG_BYTES: {
		const uint8_t *s;
		size_t n;
		if ((rc = rd_span(r, &s, &n))) return rc;
		return cbor_blob(b, tag == KVX_TAG_STR ? 3 : 2, s, n);
	}
	case KVX_TAG_INT: {
		int64_t v;
		if ((rc = rd_i64(r, &v))) return rc;
		if ((rc = buf_reserve(b, 9))) return rc;
		if (v >= 0) cbor_head(b, 0, (uint64_t)v);
		else cbor_head(b, 1, ~(uint64_t)v); /* -1 - v */
		return KVX_OK;
	}
	case KVX_TAG_TUPLE: {
		uint32_t n;
		if (depth >= KVX_MAX_DEPTH) return KVX_E_EXTRAS;
		if ((rc = rd_u32(r, &n))) return rc;
		if ((rc = buf_reserve(b, 9))) return rc;
		cbor_head(b, 4, n);
		for (uint32_t i = 0; i < n; i++)
			if ((rc = cbor_item(b, r, depth + 1))) return rc;
		return KVX_OK;
	}
	}
	return KVX_E_EXTRAS;
}

/* A block's packed extras as a CBOR array, or `none_byte` (null) / nothing when it has none. */
static int cbor_extras(buf_t *b, rd_t *r, int absent_as_null) {
	uint32_t n = 0;
	int rc;
	if (r != NULL && (rc = rd_u32(r, &n))) return rc;
	if ((rc = buf_reserve(b, 9))) return rc;
	if (n == 0) {
		if (absent_as_null) put1(b, 0xF6);
		return KVX_OK;
	}
	cbor_head(b, 4, n);
	for (uint32_t i = 0; i < n; i++)
		if ((rc = cbor_item(b, r, 1))) return rc;
	return KVX_OK;
}

/* ---- MessagePack, as msgspec.msgpack.Encoder writes it ------------------------------------ */

/* Shortest unsigned integer: positive fixint, uint8/16/32/64. Reserve 9 bytes first. */
static inline void mp_uint(buf_t *b, uint64_t v) {
	if (v < 0x80) {
		put1(b, (uint8_t)v);
		return;
	}
	int n;
	if (v <= 0xFF) put1(b, 0xCC), n = 1;
	else if (v <= 0xFFFF) put1(b, 0xCD), n = 2;
	else if (v <= 0xFFFFFFFFu) put1(b, 0xCE), n = 4;
	else put1(b, 0xCF), n = 8;
	for (int i = n - 1; i >= 0; i--) put1(b, (uint8_t)(v >> (8 * i)));
}

/* Shortest signed integer (negative fixint, int8/16/32/64) for v < 0. Reserve 9 bytes first. */
static inline void mp_neg(buf_t *b, int64_t v) {
	int n;
	if (v >= -32) {
		put1(b, (uint8_t)v);
		return;
	}
	if (v >= -128) put1(b, 0xD0), n = 1;
	else if (v >= -32768) put1(b, 0xD1), n = 2;
	else if (v >= -2147483648LL) put1(b, 0xD2), n = 4;
	else put1(b, 0xD3), n = 8;
	for (int i = n - 1; i >= 0; i--) put1(b, (uint8_t)((uint64_t)v >> (8 * i)));
}

/* A head with a length: fix form when short < fix_max, else 8-, 16- or 32-bit lengths (op8 0 when
 * the family has no 8-bit form). Reserve 5 bytes first. */
static inline void mp_len(buf_t *b, uint8_t fix, size_t fix_max, uint8_t op8, uint8_t op16, uint8_t op32, size_t n) {
	if (fix && n < fix_max) {
		put1(b, (uint8_t)(fix | n));
	} else if (op8 && n <= 0xFF) {
		put1(b, op8);
		put1(b, (uint8_t)n);
	} else if (n <= 0xFFFF) {
		put1(b, op16);
		put1(b, (uint8_t)(n >> 8));
		put1(b, (uint8_t)n);
	} else {
		put1(b, op32);
		for (int i = 3; i >= 0; i--) put1(b, (uint8_t)(n >> (8 * i)));
	}
}

static inline void mp_array(buf_t *b, size_t n) { mp_len(b, 0x90, 16, 0, 0xDC, 0xDD, n); }

static int mp_blob(buf_t *b, int is_str, const uint8_t *s, size_t n) {
	int rc = buf_reserve(b, 5 + n);
	if (rc) return rc;
	if (is_str) mp_len(b, 0xA0, 32, 0xD9, 0xDA, 0xDB, n);
	else mp_len(b, 0, 0, 0xC4, 0xC5, 0xC6, n);
	putn(b, s, n);
	return KVX_OK;
}

/* One packed item as MessagePack. */
static int mp_item(buf_t *b, rd_t *r, int depth) {
	uint8_t tag;
	int rc = rd_u8(r, &tag);
	if (rc) return rc;
	switch (tag) {
	case KVX_TAG_STR:
	case KVX_TAG_BYTES: {
		const uint8_t *s;
		size_t n;
		if ((rc = rd_span(r, &s, &n))) return rc;
		if (tag == KVX_TAG_STR && !utf8_valid(s, n)) return KVX_E_UTF8;
		return mp_blob(b, tag == KVX_TAG_STR, s, n);
	}
	case KVX_TAG_INT: {
		int64_t v;
		if ((rc = rd_i64(r, &v))) return rc;
		if ((rc = buf_reserve(b, 9))) return rc;
		if (v >= 0) mp_uint(b, (uint64_t)v);
		else mp_neg(b, v);
		return KVX_OK;
	}
	case KVX_TAG_TUPLE: {
		uint32_t n;
		if (depth >= KVX_MAX_DEPTH) return KVX_E_EXTRAS;
		if ((rc = rd_u32(r, &n))) return rc;
		if ((rc = buf_reserve(b, 5))) return rc;
		mp_array(b, n);
		for (uint32_t i = 0; i < n; i++)
			if ((rc = mp_item(b, r, depth + 1))) return rc;
		return KVX_OK;
	}
	}
	return KVX_E_EXTRAS;
}

/* ---- pickle protocol 5, as CPython's C pickler writes it ----------------------------------- */
/*
 * Framing (checked against CPython 3.11's pickle.dumps on random inputs up to 300 KiB): the body is
 * cut into frames, each announced by FRAME (0x95) + u64le length. At the start of every object's save,
 * a frame that has reached 64 KiB is closed; the next write opens a new one. A str or bytes payload
 * of 64 KiB or more closes the current frame and is written (with its opcode header) outside any
 * frame. A frame shorter than 4 bytes gets no FRAME header at all.
 *
 * Memo: every str, bytes and non-empty tuple is MEMOIZEd. CPython memoizes by object identity, so
 * only strings that are necessarily the same object repeat as BINGET: its cached singletons, the
 * empty string and one-character strings with a code point below 256 (same rule as the Go
 * reference).
 */

#define PK_FRAME_TARGET 65536
#define PK_FRAME_MIN 4
#define PK_FRAME_HDR 9

typedef struct {
	buf_t *b;
	const kvx_encoders *enc;
	ptrdiff_t fs;    /* offset of the open frame's reserved header, -1 when none is open */
	uint32_t memo;   /* next memo index */
	uint32_t gen;    /* current pickle (block) number, for the singleton table */
	uint32_t single_gen[261]; /* singleton string key -> gen it was memoized in */
	uint32_t single_idx[261]; /* ... and its memo index */
} pk_t;

static void pk_commit(pk_t *k) {
	if (k->fs < 0) return;
	buf_t *b = k->b;
	size_t at = (size_t)k->fs;
	size_t flen = b->len - at - PK_FRAME_HDR;
	if (flen >= PK_FRAME_MIN) {
		b->p[at] = 0x95;
		for (int i = 0; i < 8; i++) b->p[at + 1 + i] = (uint8_t)((uint64_t)flen >> (8 * i));
	} else {
		memmove(b->p + at, b->p + at + PK_FRAME_HDR, flen);
		b->len -= PK_FRAME_HDR;
	}
	k->fs = -1;
}

/* Called at the start of every object's save. */
static void pk_boundary(pk_t *k) {
	if (k->fs >= 0 && k->b->len - (size_t)k->fs - PK_FRAME_HDR >= PK_FRAME_TARGET) pk_commit(k);
}

/* Makes room for n framed bytes, opening a frame when none is open. */
static int pk_open(pk_t *k, size_t n) {
	int rc = buf_reserve(k->b, n + PK_FRAME_HDR);
	if (rc) return rc;
	if (k->fs < 0) {
		k->fs = (ptrdiff_t)k->b->len;
		k->b->len += PK_FRAME_HDR;
	}
	return KVX_OK;
}

static int pk_op(pk_t *k, uint8_t op) {
	int rc = pk_open(k, 1);
	if (rc) return rc;
	put1(k->b, op);
	return KVX_OK;
}

static int pk_memoize(pk_t *k) {
	k->memo++;
	return pk_op(k, 0x94);
}

/* Opcode header + payload of a str or bytes; payloads of 64 KiB or more go outside frames. */
static int pk_blob(pk_t *k, uint8_t short_op, uint8_t long_op, const uint8_t *s, size_t n) {
	uint8_t hdr[5];
	size_t hl;
	if (n < 256) {
		hdr[0] = short_op, hdr[1] = (uint8_t)n, hl = 2;
	} else {
		hdr[0] = long_op, hl = 5;
		for (int i = 0; i < 4; i++) hdr[1 + i] = (uint8_t)(n >> (8 * i)); /* n <= KVX_MAX_ITEM */
	}
	int rc;
	if (n >= PK_FRAME_TARGET) {
		pk_commit(k);
		if ((rc = buf_reserve(k->b, hl + n))) return rc;
	} else if ((rc = pk_open(k, hl + n))) {
		return rc;
	}
	putn(k->b, hdr, hl);
	putn(k->b, s, n);
	return KVX_OK;
}

static int pk_bytes(pk_t *k, const uint8_t *s, size_t n) {
	pk_boundary(k);
	int rc = pk_blob(k, 'C', 'B', s, n); /* SHORT_BINBYTES / BINBYTES */
	if (rc) return rc;
	return pk_memoize(k);
}

/* The singleton-table key of s (0..255 code point, 256 empty, 257..260 the tag constants of vLLM's
 * tagged extra keys, one code object each), or -1 when s is not a singleton. */
static int singleton_key(const uint8_t *s, size_t n) {
	if (n == 0) return 256;
	if (n == 2 && memcmp(s, "mm", 2) == 0) return 257;
	if (n == 4 && memcmp(s, "lora", 4) == 0) return 258;
	if (n == 10 && memcmp(s, "cache_salt", 10) == 0) return 259;
	if (n == 13 && memcmp(s, "prompt_embeds", 13) == 0) return 260;
	if (n == 1 && s[0] < 0x80) return s[0];
	if (n == 2 && (s[0] == 0xC2 || s[0] == 0xC3) && (s[1] & 0xC0) == 0x80)
		return ((s[0] & 0x1F) << 6) | (s[1] & 0x3F);
	return -1;
}

static int pk_str(pk_t *k, const uint8_t *s, size_t n) {
	pk_boundary(k);
	if (!utf8_valid(s, n)) return KVX_E_UTF8;
	int key = singleton_key(s, n), rc;
	if (key >= 0 && k->single_gen[key] == k->gen) {
		uint32_t idx = k->single_idx[key];
		if ((rc = pk_open(k, 5))) return rc;
		if (idx < 256) {
			put1(k->b, 'h'); /* BINGET */
			put1(k->b, (uint8_t)idx);
		} else {
			put1(k->b, 'j'); /* LONG_BINGET */
			put_le32(k->b, idx);
		}
		return KVX_OK;
	}
	if ((rc = pk_blob(k, 0x8C, 'X', s, n))) return rc; /* SHORT_BINUNICODE / BINUNICODE */
	if (key >= 0) {
		k->single_gen[key] = k->gen;
		k->single_idx[key] = k->memo;
	}
	return pk_memoize(k);
}

/* pickle's save_long for an int64: BININT1, BININT2, BININT, else LONG1 with the fewest
 * two's-complement bytes that keep the sign. Reserve 10 bytes first. */
static void pk_int_raw(buf_t *b, int64_t v) {
	if (v >= 0 && v <= 0xFF) {
		put1(b, 'K');
		put1(b, (uint8_t)v);
	} else if (v >= 0 && v <= 0xFFFF) {
		put1(b, 'M');
		put1(b, (uint8_t)v);
		put1(b, (uint8_t)(v >> 8));
	} else if (v >= INT32_MIN && v <= INT32_MAX) {
		put1(b, 'J');
		put_le32(b, (uint32_t)(int32_t)v);
	} else {
		uint8_t e[8];
		uint64_t u = (uint64_t)v;
		int n = 8;
		for (int i = 0; i < 8; i++) e[i] = (uint8_t)(u >> (8 * i));
		while (n > 1 && ((v >= 0 && e[n - 1] == 0x00 && !(e[n - 2] & 0x80)) ||
		                 (v < 0 && e[n - 1] == 0xFF && (e[n - 2] & 0x80))))
			n--;
		put1(b, 0x8A);
		put1(b, (uint8_t)n);
		putn(b, e, (size_t)n);
	}
}

static int pk_item(pk_t *k, rd_t *r, int depth);

/* A tuple of n items read from r (the items' saves follow the tuple's own boundary check). */
static int pk_tuple_items(pk_t *k, rd_t *r, uint32_t n, int depth) {
	int rc;
	pk_boundary(k);
	if (n == 0) return pk_op(k, ')'); /* EMPTY_TUPLE, never memoized */
	if (n > 3 && (rc = pk_op(k, '('))) return rc;
	for (uint32_t i = 0; i < n; i++)
		if ((rc = pk_item(k, r, depth + 1))) return rc;
	if ((rc = pk_op(k, n > 3 ? 't' : (uint8_t)(0x84 + n)))) return rc; /* TUPLE / TUPLE1..3 */
	return pk_memoize(k);
}

static int pk_item(pk_t *k, rd_t *r, int depth) {
	uint8_t tag;
	int rc = rd_u8(r, &tag);
	if (rc) return rc;
	switch (tag) {
	case KVX_TAG_STR:
	case KVX_TAG_BYTES: {
		const uint8_t *s;
		size_t n;
		if ((rc = rd_span(r, &s, &n))) return rc;
		return tag == KVX_TAG_STR ? pk_str(k, s, n) : pk_bytes(k, s, n);
	}
	case KVX_TAG_INT: {
		int64_t v;
		if ((rc = rd_i64(r, &v))) return rc;
		pk_boundary(k);
		if ((rc = pk_open(k, 10))) return rc;
		pk_int_raw(k->b, v);
		return KVX_OK;
	}
	case KVX_TAG_TUPLE: {
		uint32_t n;
		if (depth >= KVX_MAX_DEPTH) return KVX_E_EXTRAS;
		if ((rc = rd_u32(r, &n))) return rc;
		return pk_tuple_items(k, r, n, depth);
	}
	}
	return KVX_E_EXTRAS;
}

/*
 * pickle.dumps((parent, tuple(tokens), extras), protocol=5) into b. The fixed part up to the token
 * tuple is written directly: it always lies in the first frame (a parent of at most 64 bytes and at
 * most 4096 ids of at most 7 bytes stay far below 64 KiB, so no boundary check there can fire).
 */
static int pk_block(pk_t *k, const uint8_t *parent, size_t parent_len, const uint32_t *t, size_t n,
                    rd_t *r) {
	int rc;
	buf_t *b = k->b;
	b->len = 0;
	k->gen++;
	if ((rc = buf_reserve(b, 2 + PK_FRAME_HDR + 2 + parent_len + 1 + 1 + 8 * n + 8 + 2 + 5))) return rc;
	uint8_t *p = b->p;
	p[0] = 0x80; /* PROTO 5 */
	p[1] = 5;
	/* p[2..10]: FRAME header, filled in by pk_commit */
	p[11] = 'C'; /* SHORT_BINBYTES parent, MEMOIZE */
	p[12] = (uint8_t)parent_len;
	copy_digest(p + 13, parent, parent_len);
	uint8_t *q = p + 13 + parent_len;
	*q++ = 0x94;
	if (n > 3) *q++ = '(';
	q = k->enc->pickle(q, t, n);
	*q++ = n > 3 ? 't' : (uint8_t)(0x84 + n); /* TUPLE / TUPLE1..3 (n >= 1), MEMOIZE */
	*q++ = 0x94;
	k->fs = 2;
	k->memo = 2;
	uint32_t ne = 0;
	if (r != NULL && (rc = rd_u32(r, &ne))) return rc;
	if (ne == 0) {
		*q++ = 'N';    /* NONE */
		*q++ = 0x87;   /* TUPLE3 */
		*q++ = 0x94;   /* MEMOIZE */
		*q++ = '.';    /* STOP */
		b->len = (size_t)(q - p);
	} else {
		b->len = (size_t)(q - p);
		if ((rc = pk_tuple_items(k, r, ne, 1))) return rc;
		if ((rc = pk_op(k, 0x87))) return rc; /* TUPLE3 */
		if ((rc = pk_memoize(k))) return rc;
		if ((rc = pk_op(k, '.'))) return rc; /* STOP */
	}
	pk_commit(k);
	return KVX_OK;
}

/* ---- digests ----------------------------------------------------------------------------- */

size_t kvx_digest_len(int32_t algo) {
	switch (algo) {
	case KVX_VLLM_SHA256:
	case KVX_VLLM_SHA256_CBOR:
	case KVX_VLLM_SHA256_MSGPACK:
	case KVX_SGLANG_SHA256:
		return 32;
	case KVX_VLLM_XXHASH:
	case KVX_VLLM_XXHASH_CBOR:
	case KVX_VLLM_XXHASH_MSGPACK:
		return 16;
	case KVX_ROUTER_XXH3_V1:
		return 8;
	}
	return 0;
}

/* Digest of p[0:n] under algo into d (kvx_digest_len bytes); returns the block's 64-bit key. */
static uint64_t digest(int32_t algo, kvx_sha256_compress_fn f, const uint8_t *p, size_t n, uint8_t *d) {
	switch (algo) {
	case KVX_VLLM_SHA256:
	case KVX_VLLM_SHA256_CBOR:
	case KVX_VLLM_SHA256_MSGPACK:
		kvx_sha256_oneshot(f, p, n, d);
		return load_be64(d + 24); /* vLLM: the last 8 bytes */
	case KVX_SGLANG_SHA256:
		kvx_sha256_oneshot(f, p, n, d);
		return load_be64(d); /* SGLang: the first 8 bytes (bit pattern of its int64) */
	case KVX_VLLM_XXHASH:
	case KVX_VLLM_XXHASH_CBOR:
	case KVX_VLLM_XXHASH_MSGPACK:
		return kvx_xxh3_128_canonical(p, n, d); /* low64 = the last 8 bytes, big-endian */
	default: { /* KVX_ROUTER_XXH3_V1 */
		uint64_t key = kvx_xxh3_64(p, n);
		for (int i = 0; i < 8; i++) d[i] = (uint8_t)(key >> (8 * i));
		return key;
	}
	}
}

/* ---- the chain --------------------------------------------------------------------------- */

static int is_vllm(int32_t a) {
	return (a >= KVX_VLLM_SHA256 && a <= KVX_VLLM_XXHASH_CBOR) || a == KVX_VLLM_SHA256_MSGPACK || a == KVX_VLLM_XXHASH_MSGPACK;
}
static int is_msgpack(int32_t a) { return a == KVX_VLLM_SHA256_MSGPACK || a == KVX_VLLM_XXHASH_MSGPACK; }
static int is_pickle(int32_t a) { return a == KVX_VLLM_SHA256 || a == KVX_VLLM_XXHASH; }

static int check_args(const kvx_chain_args *a, size_t dl) {
	if (dl == 0) return KVX_E_ALGO;
	if (a->block_size < 1 || a->block_size > KVX_MAX_BLOCK_SIZE) return KVX_E_BLOCK_SIZE;
	if (a->bigram && a->algo != KVX_SGLANG_SHA256) return KVX_E_BIGRAM;
	if (a->parent_len > 0 && a->parent == NULL) return KVX_E_PARENT;
	if (is_vllm(a->algo) && (a->parent_len < 1 || a->parent_len > KVX_MAX_PARENT)) return KVX_E_PARENT;
	if (a->algo == KVX_SGLANG_SHA256 && a->parent_len != 0 && a->parent_len != 32) return KVX_E_PARENT;
	if (a->algo == KVX_ROUTER_XXH3_V1 && a->parent_len != 8) return KVX_E_PARENT;
	if (a->n_blocks == 0) return KVX_OK;
	if (a->n_blocks > (SIZE_MAX / 8) / a->block_size) return KVX_E_TOO_LARGE;
	size_t need = a->n_blocks * a->block_size + (a->bigram ? 1 : 0);
	if (a->tokens == NULL || a->n_tokens < need) return KVX_E_TOKENS;
	if (a->keys == NULL || a->keys_len < a->n_blocks) return KVX_E_OUTPUT;
	if (a->digests != NULL && a->digests_len / dl < a->n_blocks) return KVX_E_OUTPUT;
	if (a->digests == NULL && a->digests_len != 0) return KVX_E_OUTPUT;
	if (a->extras == NULL && a->extras_len != 0) return KVX_E_EXTRAS;
	return KVX_OK;
}

/*
 * Builds block i's pre-image in b with `parent` at its place and returns, in *parent_off, where the
 * parent bytes start: only those bytes depend on the previous block, so the chain can build block
 * i+1 before block i's digest exists and patch the digest in afterwards.
 */
static int build_block(const kvx_chain_args *a, const kvx_encoders *e, pk_t *k, buf_t *b, rd_t *r,
                       const uint8_t *parent, size_t parent_len, size_t i, size_t *parent_off) {
	const size_t bs = a->block_size;
	const uint32_t *t = a->tokens + i * bs;
	int rc;
	switch (a->algo) {
	case KVX_VLLM_SHA256:
	case KVX_VLLM_XXHASH:
		*parent_off = 2 + PK_FRAME_HDR + 2; /* PROTO 5, FRAME, SHORT_BINBYTES len (parent < 256) */
		return pk_block(k, parent, parent_len, t, bs, r);
	case KVX_VLLM_SHA256_CBOR:
	case KVX_VLLM_XXHASH_CBOR:
		b->len = 0;
		if ((rc = buf_reserve(b, 1 + 9 + parent_len + 9 + 5 * bs + 8))) return rc;
		put1(b, 0x83); /* array(3) */
		cbor_head(b, 2, parent_len);
		*parent_off = b->len;
		copy_digest(b->p + b->len, parent, parent_len);
		b->len += parent_len;
		cbor_head(b, 4, bs);
		b->len = (size_t)(e->cbor(b->p + b->len, t, bs) - b->p);
		if (r == NULL) {
			put1(b, 0xF6); /* null: reserved above */
			return KVX_OK;
		}
		return cbor_extras(b, r, 1);
	case KVX_VLLM_SHA256_MSGPACK:
	case KVX_VLLM_XXHASH_MSGPACK: {
		uint32_t ne = 0;
		b->len = 0;
		if ((rc = buf_reserve(b, 1 + 5 + parent_len + 5 + 5 * bs + 8 + 5))) return rc;
		put1(b, 0x93); /* fixarray(3) */
		mp_len(b, 0, 0, 0xC4, 0xC5, 0xC6, parent_len);
		*parent_off = b->len;
		copy_digest(b->p + b->len, parent, parent_len);
		b->len += parent_len;
		mp_array(b, bs);
		b->len = (size_t)(kvx_msgpack_tokens(b->p + b->len, t, bs) - b->p);
		if (r != NULL && (rc = rd_u32(r, &ne))) return rc;
		if (ne == 0) {
			put1(b, 0xC0); /* nil: reserved above */
			return KVX_OK;
		}
		mp_array(b, ne); /* reserved above */
		for (uint32_t j = 0; j < ne; j++)
			if ((rc = mp_item(b, r, 1))) return rc;
		return KVX_OK;
	}
	case KVX_SGLANG_SHA256: {
		uint32_t ne = 0;
		if (r != NULL && (rc = rd_u32(r, &ne))) return rc;
		if (ne != 0) return KVX_E_EXTRAS; /* SGLang hashes no extra keys */
		b->len = 0;
		if ((rc = buf_reserve(b, parent_len + 8 * bs))) return rc;
		*parent_off = 0;
		copy_digest(b->p, parent, parent_len);
		b->len = parent_len;
		if (a->bigram) {
			for (size_t j = 0; j < bs; j++) {
				put_le32(b, t[j]);
				put_le32(b, t[j + 1]);
			}
		} else {
#if KVX_LE
			putn(b, t, 4 * bs);
#else
			for (size_t j = 0; j < bs; j++) put_le32(b, t[j]);
#endif
		}
		return KVX_OK;
	}
	default: /* KVX_ROUTER_XXH3_V1 */
		b->len = 0;
		if ((rc = buf_reserve(b, 8 + 4 * bs))) return rc;
		*parent_off = 0;
		copy_digest(b->p, parent, 8);
		b->len = 8;
#if KVX_LE
		putn(b, t, 4 * bs);
#else
		for (size_t j = 0; j < bs; j++) put_le32(b, t[j]);
#endif
		return r == NULL ? KVX_OK : cbor_extras(b, r, 0);
	}
}

int kvx_chain(kvx_chain_args *a) {
	const size_t dl = kvx_digest_len(a->algo);
	a->pre0_len = 0;
	a->err_block = 0;
	a->err_offset = 0;
	int rc = check_args(a, dl);
	if (rc || a->n_blocks == 0) return rc;

	/* Two pre-image buffers: block i+1 is built (all but its parent bytes) while block i is hashed,
	 * so the CPU can overlap serialization with the digest of the previous block, and the digest
	 * never reads bytes that were stored just before it. */
	uint8_t stack[2][STACK_BUF / 2];
	buf_t bufs[2] = {{stack[0], 0, sizeof stack[0], NULL}, {stack[1], 0, sizeof stack[1], NULL}};
	size_t off[2] = {0, 0};
	const kvx_encoders enc = kvx_token_encoders();
	pk_t *k = NULL;
	pk_t pk_local;
	if (is_pickle(a->algo)) {
		k = &pk_local;
		k->enc = &enc;
		k->gen = 0;
		memset(k->single_gen, 0, sizeof k->single_gen);
	}
	rd_t rd = {a->extras, a->extras_len, 0};
	rd_t *r = a->extras != NULL ? &rd : NULL;
	kvx_sha256_compress_fn f = kvx_sha256_compressor();

	/* With SHA-NI, SHA-256 chains keep the previous digest as state words and the digest function
	 * splices it into the next pre-image in registers (kvx_sha256_shani_digest), so nothing is
	 * patched into the buffer and re-read. Otherwise the digest bytes are patched in. */
	int shani = 0;
#if defined(KVX_HAVE_SHANI_BUILD)
	shani = f == kvx_sha256_compress_shani && dl == 32;
#endif
	uint32_t st[2][8] __attribute__((aligned(16)));
	/* Placeholder parent for blocks built ahead; patched with the real digest before hashing. */
	uint8_t prev[KVX_MAX_PARENT] = {0};
	int pre0_short = 0;
	size_t i = 0;
	if (k) k->b = &bufs[0];
	if ((rc = build_block(a, &enc, k, &bufs[0], r, a->parent, a->parent_len, 0, &off[0]))) goto fail;
	a->pre0_len = bufs[0].len;
	if (a->pre0 != NULL) {
		if (a->pre0_cap >= bufs[0].len) memcpy(a->pre0, bufs[0].p, bufs[0].len);
		else pre0_short = 1;
	}
	for (; i < a->n_blocks; i++) {
		buf_t *cur = &bufs[i & 1], *next = &bufs[(i + 1) & 1];
		if (i + 1 < a->n_blocks) {
			if (k) k->b = next;
			if ((rc = build_block(a, &enc, k, next, r, prev, dl, i + 1, &off[(i + 1) & 1]))) {
				i++;
				goto fail;
			}
		}
#if defined(KVX_HAVE_SHANI_BUILD)
		if (shani) {
			uint32_t *out = st[i & 1];
			kvx_sha256_shani_digest(cur->p, cur->len, i == 0 ? NULL : st[(i - 1) & 1], off[i & 1], out);
			a->keys[i] = a->algo == KVX_SGLANG_SHA256 ? ((uint64_t)out[0] << 32 | out[1])
			                                          : ((uint64_t)out[6] << 32 | out[7]);
			if (a->digests != NULL) kvx_sha256_shani_bytes(out, a->digests + i * dl);
			continue;
		}
#endif
		a->keys[i] = digest(a->algo, f, cur->p, cur->len, prev);
		if (a->digests != NULL) copy_digest(a->digests + i * dl, prev, dl);
		if (i + 1 < a->n_blocks) copy_digest(next->p + off[(i + 1) & 1], prev, dl);
	}
	if (r != NULL && rd.off != rd.len) {
		a->err_block = a->n_blocks;
		a->err_offset = rd.off;
		rc = KVX_E_EXTRAS; /* trailing bytes: the caller packed more blocks than it asked for */
	}
	if (rc == KVX_OK && pre0_short) rc = KVX_E_PRE0_SPACE;
	goto out;
fail:
	a->err_block = i;
	a->err_offset = rd.off;
out:
	free(bufs[0].heap);
	free(bufs[1].heap);
	return rc;
}

/* ---- roots ------------------------------------------------------------------------------- */

int kvx_root(int32_t algo, const uint8_t *s, size_t n, uint8_t *out, size_t out_cap, size_t *out_len) {
	static const char salt_prefix[] = "sglang-cache-salt-v1"; /* + its NUL */
	const size_t dl = kvx_digest_len(algo);
	if (dl == 0 || algo == KVX_ROUTER_XXH3_V1) return KVX_E_ALGO;
	if (out == NULL || out_cap < dl || out_len == NULL) return KVX_E_OUTPUT;
	if (n > 0 && s == NULL) return KVX_E_EXTRAS;
	if (n > KVX_MAX_ITEM) return KVX_E_TOO_LARGE;
	*out_len = 0;
	uint8_t stack[512];
	buf_t b = {stack, 0, sizeof stack, NULL};
	int rc = KVX_OK;
	kvx_sha256_compress_fn f = kvx_sha256_compressor();
	if (algo == KVX_SGLANG_SHA256) {
		if ((rc = buf_reserve(&b, sizeof salt_prefix + n))) goto out;
		putn(&b, salt_prefix, sizeof salt_prefix); /* includes the terminating NUL */
		putn(&b, s, n);
	} else if (is_pickle(algo)) {
		pk_t k;
		k.b = &b;
		k.enc = NULL;
		k.fs = -1;
		k.memo = 0;
		k.gen = 1;
		memset(k.single_gen, 0, sizeof k.single_gen);
		if ((rc = buf_reserve(&b, 2))) goto out;
		put1(&b, 0x80);
		put1(&b, 5);
		if ((rc = pk_str(&k, s, n))) goto out;
		if ((rc = pk_op(&k, '.'))) goto out;
		pk_commit(&k);
	} else if (is_msgpack(algo)) {
		if (!utf8_valid(s, n)) {
			rc = KVX_E_UTF8;
			goto out;
		}
		if ((rc = mp_blob(&b, 1, s, n))) goto out;
	} else {
		if ((rc = cbor_blob(&b, 3, s, n))) goto out;
	}
	digest(algo, f, b.p, b.len, out);
	*out_len = dl;
out:
	free(b.heap);
	return rc;
}

/* ---- the benchmark floor ----------------------------------------------------------------- */

int kvx_digest_many(int32_t algo, const uint8_t *buf, size_t buf_len, const size_t *ends, size_t n,
                    uint8_t *out, size_t out_len, ptrdiff_t chain_off) {
	const size_t dl = kvx_digest_len(algo);
	if (dl == 0) return KVX_E_ALGO;
	if (n > 0 && (ends == NULL || out == NULL || buf == NULL)) return KVX_E_OUTPUT;
	if (out_len / dl < n) return KVX_E_OUTPUT;
	kvx_sha256_compress_fn f = kvx_sha256_compressor();
	int shani = 0;
#if defined(KVX_HAVE_SHANI_BUILD)
	shani = f == kvx_sha256_compress_shani && dl == 32;
#endif
	uint32_t st[2][8] __attribute__((aligned(16)));
	size_t start = 0;
	uint64_t dep = 0;
	for (size_t i = 0; i < n; i++) {
		if (ends[i] < start || ends[i] > buf_len) return KVX_E_TOO_LARGE;
		const uint8_t *p = buf + start;
		size_t len = ends[i] - start;
		int chained = chain_off >= 0 && i > 0;
		if (chained && (size_t)chain_off + dl > len) return KVX_E_TOO_LARGE;
#if defined(KVX_HAVE_SHANI_BUILD)
		if (shani && buf_len - ends[i] >= 64 && (!chained || chain_off <= 16)) {
			/* kvx_chain's digest code; chained, the parent bytes come from the previous state
			 * exactly as in kvx_chain (they are equal to the bytes in buf for a real chain). */
			kvx_sha256_shani_digest(p, len, chained ? st[(i - 1) & 1] : NULL, (size_t)(chained ? chain_off : 0),
			                        st[i & 1]);
			kvx_sha256_shani_bytes(st[i & 1], out + i * dl);
			start = ends[i];
			continue;
		}
#endif
		if (chained) {
			/* A false data dependency on the previous digest: block i cannot start before block
			 * i-1's digest exists (an approximation of the chain's dependency for this path). */
			__asm__("" : "+r"(p) : "r"(dep));
		}
		uint64_t key = digest(algo, f, p, len, out + i * dl);
		memcpy(&dep, out + i * dl, sizeof dep);
		dep ^= key;
		start = ends[i];
	}
	return KVX_OK;
}

const char *kvx_status_text(int status) {
	switch (status) {
	case KVX_OK: return "ok";
	case KVX_E_ALGO: return "unknown algorithm";
	case KVX_E_BLOCK_SIZE: return "block size out of range 1..4096";
	case KVX_E_BIGRAM: return "bigram pages are an SGLang mode only";
	case KVX_E_PARENT: return "parent digest has a length this algorithm cannot chain on";
	case KVX_E_TOKENS: return "fewer tokens than the requested full blocks need";
	case KVX_E_OUTPUT: return "output buffer too small";
	case KVX_E_EXTRAS: return "packed extra keys malformed";
	case KVX_E_UTF8: return "string is not valid UTF-8";
	case KVX_E_TOO_LARGE: return "size too large";
	case KVX_E_NOMEM: return "out of memory";
	case KVX_E_PRE0_SPACE: return "block 0 pre-image buffer too small";
	}
	return "unknown status";
}
