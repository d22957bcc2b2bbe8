/* avx2.c: AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c -mbmi2).
 *
 * Only reached through the kernel table when the CPU has these extensions
 * (dispatch.c checks), so nothing here runs on an older CPU.
 *
 * dequant_*: bit-exact copies of the scalar reference: they multiply and add
 * in the reference's order, never with FMA (the build uses -std=c11, which
 * keeps GCC from contracting a*b+c; do not build this file with
 * -ffp-contract=fast).
 *
 * 32-element formats (vec_dot, gemv, gemm): two blocks per 256-bit dot
 * (see the section below); the weight nibbles stay unsigned (0..15, 0..31)
 * and multiply the signed activations with vpmaddubsw. The fixed offset of
 * Q4_0/Q5_0 is folded into the int32 dot (the activation side precomputes
 * -8 or -16 times its lane sums); the min of Q4_1/Q5_1 adds m * s with one
 * more FMA: sum((dw q + m) * a) = dw * da * sum(q * a) + m * s.
 * gemv: 4 rows at a time share the prepared activation pairs, and every
 * gemv (K-quant and float ones too) prefetches the weights ahead
 * (GEMV_PREFETCH, quants.h); gemm: tiles of GEMM_R rows x GEMM_T
 * activation rows (per format), each row's pair decoded once for every
 * activation row. All three run the same tile code, which fixes
 * each row's float operations (the determinism contract of quants.h).
 *
 * K-quants: one accumulator per row, one step per super-block, the same in
 * vec_dot, gemv (2 rows at a time) and gemm (Q4_K, Q5_K, Q6_K: one row x 4
 * activation rows, each group of 32 weights decoded once for the 4).
 *
 * This file is compiled twice: as itself (kernels_fill_avx2), and by
 * avx2_vnni.c with -mavxvnni (kernels_fill_avx2_vnni), where the integer
 * dots use AVX-VNNI (vpdpbusd, vpdpwssd: Alder Lake and later, Zen 5) in
 * place of vpmaddubsw + vpmaddwd + vpaddd. No step of either form
 * saturates, so both give the same integers, hence the same floats.
 */
#include <immintrin.h>
#include <string.h>

#include "quants.h"

#define INLINE static inline __attribute__((always_inline))

#ifndef KERNELS_FILL_AVX2
#define KERNELS_FILL_AVX2 kernels_fill_avx2
#endif

/* ------------------------------------------------------------------ */
/* helpers                                                             */
/* ------------------------------------------------------------------ */

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE int hsum_i32x8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* acc + the sum of each int32 lane's 4 products u8 x s8 (u: unsigned
 * bytes, s: signed); the pairs of products must fit int16 without VNNI */
INLINE __m256i dot_u8s8_acc(__m256i acc, __m256i u, __m256i s) {
#ifdef __AVXVNNI__
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* acc + the sum of each int32 lane's 2 products int16 x int16 */
INLINE __m256i madd_acc(__m256i acc, __m256i a, __m256i b) {
#ifdef __AVXVNNI__
    return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

INLINE uint32_t ld32(const void *p) { uint32_t v; memcpy(&v, p, 4); return v; }
INLINE uint16_t ld16(const void *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* 16 bytes of packed nibbles -> 32 bytes: low nibbles, then high nibbles
 * (the element order of the 32-element formats) */
INLINE __m256i unpack_nibbles(const uint8_t *qs) {
    const __m128i x = _mm_loadu_si128((const __m128i *)qs);
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* bit j of x -> byte j is 0x10 (the 5th bit of the Q5 formats) */
INLINE __m256i bits_to_0x10(uint32_t x) {
    __m256i v = _mm256_set1_epi32((int)x);
    const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                            0x0202020202020202, 0x0303030303030303);
    v = _mm256_shuffle_epi8(v, shuf);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* bit b of every byte -> bit t of the same byte (other bits: mask them off).
 * A 16-bit shift by |t - b| cannot carry bit b of one byte into bit t of the
 * other byte, since both positions are inside their own byte. */
INLINE __m256i move_bit(__m256i v, int b, int t) {
    return b <= t ? _mm256_sll_epi16(v, _mm_cvtsi32_si128(t - b)) : _mm256_srl_epi16(v, _mm_cvtsi32_si128(b - t));
}

/* the book values (IQ4_NL's or MXFP4's 16 int8) of a block's 32 nibbles, in element order */
INLINE __m256i book_values(const uint8_t *qs, const int8_t *book) {
    const __m128i k = _mm_loadu_si128((const __m128i *)book);
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(k), unpack_nibbles(qs));
}

/* ------------------------------------------------------------------ */
/* 32-element formats: pairs of blocks                                 */
/* ------------------------------------------------------------------ */
/* Two blocks go through one 256-bit dot: the low 128-bit lane holds block
 * i, the high one block i+1. A row's pair (decoded once per row):
 *     lo = [w_i[0:16] w_i+1[0:16]],  hi = [w_i[16:32] w_i+1[16:32]]
 * (unsigned 0..15 / 0..31 for Q4_x / Q5_x; signed values for Q8_0,
 * IQ4_NL and MXFP4, which go through |w| and sign-adjusted activations), the scales
 * dpat = [d_i x4, d_i+1 x4] and, with a min, mz = [0 m_i 0 m_i+1 0 0 0 0].
 * An activation row's pair (prepared once, shared by every weight row): its
 * quants in the same layout, -c * (the sum of each int32 lane's 8
 * activations) for the formats with a fixed offset c (Q4_0: q - 8, Q5_0:
 * q - 16), dapat = [da_i x4, da_i+1 x4] and ds = [da_i s_i da_i+1 s_i+1 0 0 0 0].
 * Per (row, activation row, pair):
 *     dot = the 8 exact int32 lane sums (offset included)
 *     acc = fma(float(dot), dpat * dapat, acc)
 *     acc = fma(mz, ds, acc)                     (Q4_1, Q5_1: lanes 1, 3 += m*s)
 * A row's odd last block is a pair with a zero block. The float result of a
 * row is fixed by this order (the contract of quants.h): the row's blocks
 * are summed in groups of RED_BLOCKS from its start, each group into a fresh
 * acc, reduced by hsum8 and added to the row's sum in group order. vec_dot,
 * gemv and gemm all run the same tile code, so they agree bit for bit. */

#define RED_BLOCKS 64
#define RED_PAIRS (RED_BLOCKS / 2)

typedef struct {
    __m256i lo, hi, negc;
    __m256 dapat, ds;
} actp;

/* the activation pair of blocks y[0], y[1] (two = 0: y[1] is taken as zeros) */
INLINE void actp_load(const block_q8_32 *y, const int two, const int c, actp *A) {
    const __m256i a0 = _mm256_loadu_si256((const __m256i *)y[0].qs);
    const __m256i a1 = two ? _mm256_loadu_si256((const __m256i *)y[1].qs) : _mm256_setzero_si256();
    A->lo = _mm256_permute2x128_si256(a0, a1, 0x20);
    A->hi = _mm256_permute2x128_si256(a0, a1, 0x31);
    const __m128 d0 = _mm_castpd_ps(_mm_load_sd((const double *)(const void *)&y[0].d));
    const __m128 d1 = two ? _mm_castpd_ps(_mm_load_sd((const double *)(const void *)&y[1].d)) : _mm_setzero_ps();
    A->ds = _mm256_zextps128_ps256(_mm_movelh_ps(d0, d1));
    A->dapat = _mm256_permutevar8x32_ps(A->ds, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
    if (c) {
        const __m256i cv = _mm256_set1_epi8((char)c);
        const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(cv, A->lo), _mm256_maddubs_epi16(cv, A->hi));
        A->negc = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(s, _mm256_set1_epi16(1)));
    } else {
        A->negc = _mm256_setzero_si256();
    }
}

/* the pairs of nb blocks of one activation row */
INLINE void actp_prep(const block_q8_32 *y, int64_t nb, const int c, actp *A) {
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) actp_load(y + i, 1, c, &A[i / 2]);
    if (i < nb) actp_load(y + i, 0, c, &A[i / 2]);
}

typedef struct {
    __m256i lo, hi;   /* unsigned, or signed for the signed formats */
    __m256i alo, ahi; /* signed formats: |lo|, |hi| */
    __m256 dpat, mz;
} wpair;

INLINE __m256i load2x128(const uint8_t *p0, const uint8_t *p1, const int two) {
    const __m128i b = two ? _mm_loadu_si128((const __m128i *)p1) : _mm_setzero_si128();
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)), b, 1);
}

/* two fp16 d (at x and x + bs) -> [d_i x4, d_i+1 x4] */
INLINE __m256 dpat_d(const uint8_t *x, const int bs, const int two) {
    const uint32_t h = (uint32_t)ld16(x) | (two ? (uint32_t)ld16(x + bs) << 16 : 0u);
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)h));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(f), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

/* two MXFP4 E8M0 scales (at x and x + bs) -> [d_i x4, d_i+1 x4], as dpat_d (0 for a missing block) */
INLINE __m256 dpat_e8m0(const uint8_t *x, const int bs, const int two) {
    const uint64_t b = (uint64_t)e8m0_half_table[x[0]] | (two ? (uint64_t)e8m0_half_table[x[bs]] << 32 : 0u);
    const __m128 f = _mm_castsi128_ps(_mm_cvtsi64_si128((long long)b));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(f), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

/* two fp16 (d, m) pairs (at x and x + bs) -> dpat, mz */
INLINE void dm_pat(const uint8_t *x, const int bs, const int two, wpair *W) {
    const uint64_t h = (uint64_t)ld32(x) | (two ? (uint64_t)ld32(x + bs) << 32 : 0u);
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)h)); /* [d m d' m'] */
    W->dpat = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(f), _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
    W->mz = _mm256_blend_ps(_mm256_setzero_ps(), _mm256_castps128_ps256(f), 0x0a); /* one op: lanes 1, 3; zeros */
}

INLINE void nibbles_pair(__m256i q, wpair *W) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    W->lo = _mm256_and_si256(q, m4);
    W->hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
}

/* the 5th bits of two Q5 blocks (qh words at p0, p1) into lo / hi */
INLINE void q5_bits_pair(const uint8_t *p0, const uint8_t *p1, const int two, wpair *W) {
    const uint32_t h0 = ld32(p0), h1 = two ? ld32(p1) : 0u;
    W->lo = _mm256_or_si256(W->lo, bits_to_0x10((h0 & 0xffffu) | (h1 << 16)));
    W->hi = _mm256_or_si256(W->hi, bits_to_0x10((h0 >> 16) | (h1 & 0xffff0000u)));
}

INLINE void dec_q4_0(const uint8_t *x, const int two, wpair *W) {
    nibbles_pair(load2x128(x + 2, x + 20, two), W);
    W->dpat = dpat_d(x, 18, two);
}

INLINE void dec_q4_1(const uint8_t *x, const int two, wpair *W) {
    nibbles_pair(load2x128(x + 4, x + 24, two), W);
    dm_pat(x, 20, two, W);
}

INLINE void dec_q5_0(const uint8_t *x, const int two, wpair *W) {
    nibbles_pair(load2x128(x + 6, x + 28, two), W);
    q5_bits_pair(x + 2, x + 24, two, W);
    W->dpat = dpat_d(x, 22, two);
}

INLINE void dec_q5_1(const uint8_t *x, const int two, wpair *W) {
    nibbles_pair(load2x128(x + 8, x + 32, two), W);
    q5_bits_pair(x + 4, x + 28, two, W);
    dm_pat(x, 24, two, W);
}

INLINE void dec_q8_0(const uint8_t *x, const int two, wpair *W) {
    const __m256i a0 = _mm256_loadu_si256((const __m256i *)(x + 2));
    const __m256i a1 = two ? _mm256_loadu_si256((const __m256i *)(x + 36)) : _mm256_setzero_si256();
    W->lo = _mm256_permute2x128_si256(a0, a1, 0x20);
    W->hi = _mm256_permute2x128_si256(a0, a1, 0x31);
    W->alo = _mm256_sign_epi8(W->lo, W->lo);
    W->ahi = _mm256_sign_epi8(W->hi, W->hi);
    W->dpat = dpat_d(x, 34, two);
}

/* IQ4_NL, MXFP4: the nibbles of a pair (q) as book values, signed */
INLINE void book_pair(__m256i q, const int8_t *book, wpair *W) {
    nibbles_pair(q, W);
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)book));
    W->lo = _mm256_shuffle_epi8(tab, W->lo);
    W->hi = _mm256_shuffle_epi8(tab, W->hi);
    W->alo = _mm256_sign_epi8(W->lo, W->lo);
    W->ahi = _mm256_sign_epi8(W->hi, W->hi);
}

INLINE void dec_iq4_nl(const uint8_t *x, const int two, wpair *W) {
    book_pair(load2x128(x + 2, x + 20, two), kvalues_iq4nl, W);
    W->dpat = dpat_d(x, 18, two);
}

INLINE void dec_mxfp4(const uint8_t *x, const int two, wpair *W) {
    book_pair(load2x128(x + 1, x + 18, two), kvalues_mxfp4, W);
    W->dpat = dpat_e8m0(x, 17, two);
}

/* offset c the activation side folds in (signed weights and mins: quants.h) */
#define C_q4_0 8
#define C_q4_1 0
#define C_q5_0 16
#define C_q5_1 0
#define C_q8_0 0
#define C_iq4_nl 0
#define C_mxfp4 0

/* one (row, activation row) pair step */
INLINE __m256 pair_step(const wpair *W, const actp *A, const int sgn, const int c, const int min, __m256 acc) {
    __m256i dot;
    if (sgn) {
        /* |w| * sign(a, w): pairs of products up to 2 * 128 * 127 fit int16, their lo + hi would not */
        dot = dot_u8s8_acc(_mm256_setzero_si256(), W->alo, _mm256_sign_epi8(A->lo, W->lo));
        dot = dot_u8s8_acc(dot, W->ahi, _mm256_sign_epi8(A->hi, W->hi));
    } else {
#ifdef __AVXVNNI__
        dot = dot_u8s8_acc(c ? A->negc : _mm256_setzero_si256(), W->lo, A->lo);
        dot = dot_u8s8_acc(dot, W->hi, A->hi);
#else
        /* u <= 31: 4 products per int16 lane stay below 2^15, so lo and hi add in int16 */
        const __m256i one = _mm256_set1_epi16(1);
        dot = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(W->lo, A->lo), _mm256_maddubs_epi16(W->hi, A->hi)), one);
        if (c) dot = _mm256_add_epi32(dot, A->negc);
#endif
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(W->dpat, A->dapat), acc);
    if (min) acc = _mm256_fmadd_ps(W->mz, A->ds, acc);
    return acc;
}

/* R weight rows x T activation rows over one group of nbk <= RED_BLOCKS
 * blocks (w, L: the rows from the group's first block, quants.h rows_at, units
 * of 16 blocks; A[t * as + p]: the prepared pairs of activation row t):
 * out[t * os + r] += the group's sum.
 * pf: gemv's prefetch plan (quants.h), NULL for none; pf_off: the
 * offset of the group's first block in the rows the pass reads */
/* ROWS4 gemv: pairs of a row read before the next row's (tile_'s U). Q8_0 reads each row's whole
 * unit (544 bytes; pair by pair, row after row, it streamed at 8 GB/s against 25, Zen 4
 * bench_kernels gemv4_cold); the smaller blocks measured best pair by pair (Q4_1, IQ4_NL:
 * 20 GB/s against 17, 15 against 13) */
#define ROWS4_PAIRS_q8_0 8
#define ROWS4_PAIRS_q4_0 1
#define ROWS4_PAIRS_q4_1 1
#define ROWS4_PAIRS_q5_0 1
#define ROWS4_PAIRS_q5_1 1
#define ROWS4_PAIRS_iq4_nl 1
#define ROWS4_PAIRS_mxfp4 1

/* pair p's bytes of row r (its unit: p / 8, a unit being 16 blocks) */
#define Q32_AT(w, L, r, p, bs) row_at(w, L, r, (size_t)((p) >> 3) * 16 * (bs), (size_t)(2 * (p)) * (bs))
/* tile_'s step: row r's pair q (both = 0: its odd last block alone) into its T accumulators */
#define Q32_ROW_PAIR(name, r, q, both)                                                                    \
    do {                                                                                                  \
        wpair W;                                                                                          \
        dec_##name(Q32_AT(w, L, r, q, sizeof(block_##name)), both, &W);                                   \
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)                                               \
            acc[r][t] = pair_step(&W, &A[t * as + (q)], SIGNED_##name, C_##name, HAS_MIN_##name, acc[r][t]); \
    } while (0)
#define DEFINE_Q32(name, block_t)                                                                           \
    INLINE void tile_##name(const int R, const int T, const int U, int nbk, const uint8_t *w, const rows_at *L, \
                            const actp *A, size_t as, float *out, size_t os, const gemv_pf *pf, size_t pf_off) { \
        __m256 acc[4][8];                                                                                     \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                                   \
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();             \
        int p = 0;                                                                                            \
        if (U == 1) /* pair after pair, each of the R rows in turn */                                          \
            for (; 2 * p + 2 <= nbk; p++) {                                                                   \
                if (pf)                                                                                       \
                    gemv_prefetch_step(pf, R, (uintptr_t)w + (size_t)(2 * p) * sizeof(block_t),               \
                                       pf_off + (size_t)(2 * p) * sizeof(block_t), 2 * sizeof(block_t));      \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) Q32_ROW_PAIR(name, r, p, 1);              \
            }                                                                                                 \
        else /* U pairs of a row, then the next row's: U = 8 reads a ROWS4 group's units whole, in order */  \
            for (; 2 * p + 2 <= nbk; p += U) {                                                                \
                const int pe = 2 * (p + U) <= nbk ? p + U : nbk / 2;                                          \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                           \
                    for (int q = p; q < pe; q++) Q32_ROW_PAIR(name, r, q, 1);                                 \
            }                                                                                                 \
        p = nbk / 2;                                                                                          \
        if (2 * p < nbk) /* the row's odd last block */                                                       \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) Q32_ROW_PAIR(name, r, p, 0);                  \
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)                                                   \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) out[t * os + r] += hsum8(acc[r][t]);          \
    }                                                                                                         \
    /* rows4: w in the ROWS4 layout, read front to back without software prefetch */                         \
    INLINE void qgemv_##name(const int rows4, int64_t n, const void *restrict w, size_t rb, int nrows,        \
                             const void *restrict a, float *restrict out) {                                   \
        const block_q8_32 *y = a;                                                                             \
        const int64_t nb = n / QK;                                                                            \
        actp A[ACT_PAIRS];                                                                                    \
        for (int r = 0; r < nrows; r++) out[r] = 0.0f;                                                        \
        for (int64_t c0 = 0; c0 < nb; c0 += 2 * ACT_PAIRS) {                                                  \
            const int64_t cb = nb - c0 < 2 * ACT_PAIRS ? nb - c0 : 2 * ACT_PAIRS;                             \
            actp_prep(y + c0, cb, C_##name, A);                                                               \
            const uint8_t *p = (const uint8_t *)w + (size_t)c0 * sizeof(block_t);                             \
            const size_t len = (size_t)cb * sizeof(block_t);                                                  \
            const gemv_pf pf4 = gemv_prefetch_plan(4, rb, len), pf1 = gemv_prefetch_plan(1, rb, len);         \
            const gemv_pf *pf1p = rb >= len ? &pf1 : NULL; /* rb = 0: vec_dot, one row */                     \
            int r = 0;                                                                                        \
            const rows_at plain = rows_plain(rb);                                                             \
            for (; r + 4 <= nrows; r += 4, p += 4 * rb)                                                       \
                for (int64_t g = 0; g < cb; g += RED_BLOCKS) {                                                \
                    const int nbk = cb - g < RED_BLOCKS ? (int)(cb - g) : RED_BLOCKS;                         \
                    const size_t off = (size_t)(c0 + g) * sizeof(block_t); /* into the row */                \
                    const rows_at group = rows_group(16 * sizeof(block_t), (size_t)nbk * sizeof(block_t));     \
                    if (rows4) /* a part of a group starts at 4 times its offset into the rows */             \
                        tile_##name(4, 1, ROWS4_PAIRS_##name, nbk, p - (size_t)c0 * sizeof(block_t) + 4 * off, &group, A + g / 2, 0, \
                                    out + r, 0, NULL, 0);                                                     \
                    else                                                                                      \
                        tile_##name(4, 1, 1, nbk, p + (size_t)g * sizeof(block_t), &plain, A + g / 2, 0, out + r, 0, \
                                    &pf4, (size_t)g * sizeof(block_t));                                       \
                }                                                                                             \
            for (; r < nrows; r++, p += rb)                                                                   \
                for (int64_t g = 0; g < cb; g += RED_BLOCKS)                                                  \
                    tile_##name(1, 1, 1, cb - g < RED_BLOCKS ? (int)(cb - g) : RED_BLOCKS,                       \
                                p + (size_t)g * sizeof(block_t), &plain, A + g / 2, 0, out + r, 0, pf1p,      \
                                (size_t)g * sizeof(block_t));                                                 \
        }                                                                                                     \
    }                                                                                                         \
    static void gemv_##name(int64_t n, const void *restrict w, size_t rb, int nrows, const void *restrict a,  \
                            float *restrict out) {                                                            \
        qgemv_##name(0, n, w, rb, nrows, a, out);                                                             \
    }                                                                                                         \
    static void gemv4_##name(int64_t n, const void *restrict w, size_t rb, int nrows, const void *restrict a, \
                             float *restrict out) {                                                           \
        qgemv_##name(1, n, w, rb, nrows, a, out);                                                             \
    }                                                                                                         \
    static float vec_dot_##name(int64_t n, const void *restrict w, const void *restrict a) {                 \
        float r;                                                                                              \
        gemv_##name(n, w, 0, 1, a, &r);                                                                       \
        return r;                                                                                             \
    }                                                                                                         \
    static void gemm_##name(int64_t n, const void *restrict w, size_t rb, int nrows, const void *restrict a,  \
                            size_t as, int ncols, float *restrict out, size_t os) {                           \
        const int64_t nb = n / QK;                                                                            \
        const rows_at plain = rows_plain(rb);                                                                 \
        actp A[GEMM_T_##name][RED_PAIRS];                                                                            \
        for (int t = 0; t < ncols; t++)                                                                       \
            for (int r = 0; r < nrows; r++) out[t * os + r] = 0.0f;                                           \
        for (int t0 = 0; t0 < ncols; t0 += GEMM_T_##name) {                                                          \
            const int T = ncols - t0 < GEMM_T_##name ? ncols - t0 : GEMM_T_##name;                                          \
            for (int64_t g0 = 0; g0 < nb; g0 += RED_BLOCKS) {                                                 \
                const int nbk = nb - g0 < RED_BLOCKS ? (int)(nb - g0) : RED_BLOCKS;                           \
                for (int t = 0; t < T; t++)                                                                   \
                    actp_prep((const block_q8_32 *)(const void *)((const char *)a + (t0 + t) * as) + g0, nbk, \
                              C_##name, A[t]);                                                                \
                const uint8_t *p = (const uint8_t *)w + (size_t)g0 * sizeof(block_t);                         \
                float *o = out + (size_t)t0 * os;                                                             \
                int r = 0;                                                                                    \
                if (T == GEMM_T_##name) {                                                                            \
                    for (; r + GEMM_R_##name <= nrows; r += GEMM_R_##name)                                                  \
                        tile_##name(GEMM_R_##name, GEMM_T_##name, 1, nbk, p + r * rb, &plain, A[0], RED_PAIRS, o + r, os, NULL, 0);     \
                    for (; r < nrows; r++) tile_##name(1, GEMM_T_##name, 1, nbk, p + r * rb, &plain, A[0], RED_PAIRS, o + r, os, NULL, 0); \
                } else {                                                                                      \
                    for (int t = 0; t < T; t++) {                                                             \
                        for (r = 0; r + 4 <= nrows; r += 4)                                                   \
                            tile_##name(4, 1, 1, nbk, p + r * rb, &plain, A[t], 0, o + t * os + r, 0, NULL, 0);           \
                        for (; r < nrows; r++) tile_##name(1, 1, 1, nbk, p + r * rb, &plain, A[t], 0, o + t * os + r, 0, NULL, 0); \
                    }                                                                                         \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
    }

#define ACT_PAIRS 128 /* gemv: activation pairs prepared at a time (20 KB of stack) */
/* gemm tiles, weight rows x activation rows (R * T <= 8 accumulators): the
 * 5-bit formats decode a pair of blocks at about the cost of two pair steps,
 * so they take one row against 8 activation rows (each decode shared 8
 * ways; Gemma 3's Q5_0 matmuls ~1.1x faster in a whole prefill); the others
 * 2 x 4. The float steps of a (row, activation row) pair do not depend on
 * the tile, so the contract holds either way. */
#define GEMM_R_q4_0 2
#define GEMM_T_q4_0 4
#define GEMM_R_q4_1 2
#define GEMM_T_q4_1 4
#define GEMM_R_q5_0 1
#define GEMM_T_q5_0 8
#define GEMM_R_q5_1 1
#define GEMM_T_q5_1 8
#define GEMM_R_q8_0 2
#define GEMM_T_q8_0 4
#define GEMM_R_iq4_nl 2
#define GEMM_T_iq4_nl 4
#define GEMM_R_mxfp4 2
#define GEMM_T_mxfp4 4
_Static_assert(2 * ACT_PAIRS % RED_BLOCKS == 0, "activation chunks hold whole groups");

DEFINE_Q32(q4_0, block_q4_0)
DEFINE_Q32(q4_1, block_q4_1)
DEFINE_Q32(q5_0, block_q5_0)
DEFINE_Q32(q5_1, block_q5_1)
DEFINE_Q32(q8_0, block_q8_0)
DEFINE_Q32(iq4_nl, block_iq4_nl)
DEFINE_Q32(mxfp4, block_mxfp4)
/* ------------------------------------------------------------------ */
/* K-quants: one step per super-block                                  */
/* ------------------------------------------------------------------ */
/* step(x, y, acc): acc += this super-block's contribution (8 lanes) */

/* Q4_K/Q5_K 6-bit scales and mins: sc[0..7] and m[0..7] as bytes */
INLINE void k4_scales(const uint8_t *s, uint32_t sc[2], uint32_t m[2]) {
    const uint32_t a = ld32(s), b = ld32(s + 4), c = ld32(s + 8);
    sc[0] = a & 0x3f3f3f3fu;
    m[0] = b & 0x3f3f3f3fu;
    sc[1] = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);
    m[1] = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
}

/* the 8 int32 sums of m[j] * bsums, pairs of bsums per sub-block of 32 */
INLINE __m256i k4_min_dot(const uint32_t m[2], const block_q8_K *y) {
    const __m128i m8 = _mm_set_epi32(0, 0, (int)m[1], (int)m[0]);
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)); /* m0 m0 m1 m1 ... */
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), m16);
}

INLINE void step_q4_K(const block_q4_K *x, const block_q8_K *y, __m256 *acc) {
    uint32_t sc[2], m[2];
    k4_scales(x->scales, sc, m);
    int16_t s16[8];
    _mm_storeu_si128((__m128i *)s16, _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)sc[1], (int)sc[0])));
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * c));
        const __m256i a0 = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c));
        const __m256i a1 = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c + 32));
        const __m256i p0 = _mm256_maddubs_epi16(_mm256_and_si256(q, lo4), a0);
        const __m256i p1 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), lo4), a1);
        sumi = madd_acc(sumi, p0, _mm256_set1_epi16(s16[2 * c]));
        sumi = madd_acc(sumi, p1, _mm256_set1_epi16(s16[2 * c + 1]));
    }
    const float d = _cvtsh_ss(x->d) * y->d, dmin = _cvtsh_ss(x->dmin) * y->d;
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), *acc);
    *acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(k4_min_dot(m, y)), *acc);
}

INLINE void step_q5_K(const block_q5_K *x, const block_q8_K *y, __m256 *acc) {
    uint32_t sc[2], m[2];
    k4_scales(x->scales, sc, m);
    int16_t s16[8];
    _mm_storeu_si128((__m128i *)s16, _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)sc[1], (int)sc[0])));
    const __m256i lo4 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)x->qh);
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * c));
        /* bit 2c of qh -> bit 4 of the first 32, bit 2c+1 -> of the next 32 */
        const __m256i h0 = _mm256_and_si256(move_bit(qh, 2 * c, 4), b4);
        const __m256i h1 = _mm256_and_si256(move_bit(qh, 2 * c + 1, 4), b4);
        const __m256i a0 = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c));
        const __m256i a1 = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c + 32));
        const __m256i p0 = _mm256_maddubs_epi16(_mm256_or_si256(_mm256_and_si256(q, lo4), h0), a0);
        const __m256i p1 =
            _mm256_maddubs_epi16(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), lo4), h1), a1);
        sumi = madd_acc(sumi, p0, _mm256_set1_epi16(s16[2 * c]));
        sumi = madd_acc(sumi, p1, _mm256_set1_epi16(s16[2 * c + 1]));
    }
    const float d = _cvtsh_ss(x->d) * y->d, dmin = _cvtsh_ss(x->dmin) * y->d;
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), *acc);
    *acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(k4_min_dot(m, y)), *acc);
}

/* int16 scale vector [s[j] x 8 | s[j+1] x 8] from 16 scale bytes (signed
 * or not), for the madd of a 32-element group spanning two sub-blocks of 16 */
INLINE __m256i scale_pair(__m128i s8, int j, int is_signed) {
    const __m128i idx = _mm_or_si128(_mm_set1_epi8((char)j), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    const __m128i b = _mm_shuffle_epi8(s8, idx);
    return is_signed ? _mm256_cvtepi8_epi16(b) : _mm256_cvtepu8_epi16(b);
}

/* the 6-bit quants of half h of a Q6_K super-block (128 weights), unsigned
 * (0..63): v[s] holds weights 32 s .. 32 s + 31 of the half */
INLINE void dec_q6_K_half(const block_q6_K *x, int h, __m256i v[4]) {
    const __m256i lo4 = _mm256_set1_epi8(0x0f), hi2 = _mm256_set1_epi8(0x30);
    const __m256i q0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
    const __m256i q1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
    v[0] = _mm256_or_si256(_mm256_and_si256(q0, lo4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2));
    v[1] = _mm256_or_si256(_mm256_and_si256(q1, lo4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2));
    v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q0, 4), lo4), _mm256_and_si256(qh, hi2));
    v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q1, 4), lo4),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2));
}

INLINE void step_q6_K(const block_q6_K *x, const block_q8_K *y, __m256 *acc) {
    const __m128i s8 = _mm_loadu_si128((const __m128i *)x->scales);
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i v[4];
        dec_q6_K_half(x, h, v);
        for (int s = 0; s < 4; s++) {
            const __m256i aq = _mm256_loadu_si256((const __m256i *)(y->qs + 128 * h + 32 * s));
            const __m256i p = _mm256_maddubs_epi16(v[s], aq);
            sumi = madd_acc(sumi, p, scale_pair(s8, 8 * h + 2 * s, 1));
        }
    }
    /* the -32 offset: sum_j scale_j * 32 * bsums_j */
    const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), _mm256_cvtepi8_epi16(s8));
    sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x->d) * y->d), _mm256_cvtepi32_ps(sumi), *acc);
}

/* Q2_K and Q3_K: one weight row's super-blocks against T activation rows
 * (gemm; T = 1: vec_dot and gemv), each 32-element group decoded once */
INLINE void ktile_q2_K(const int T, int64_t nsb, const uint8_t *xr, const block_q8_K *const *y, __m256 *acc) {
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < nsb; i++) {
        const block_q2_K *x = (const block_q2_K *)(const void *)xr + i;
        const __m128i sb = _mm_loadu_si128((const __m128i *)x->scales);
        const __m128i sc = _mm_and_si128(sb, _mm_set1_epi8(0x0f));
        const __m256i mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(0x0f)));
        __m256i sumi[4];
        for (int t = 0; t < T; t++) sumi[t] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                const __m256i v = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * s)), m3);
                const __m256i scv = scale_pair(sc, 8 * h + 2 * s, 0);
                for (int t = 0; t < T; t++) {
                    const __m256i aq = _mm256_loadu_si256((const __m256i *)(y[t][i].qs + 128 * h + 32 * s));
                    sumi[t] = madd_acc(sumi[t], _mm256_maddubs_epi16(v, aq), scv);
                }
            }
        }
        const float d = _cvtsh_ss(x->d), dmin = _cvtsh_ss(x->dmin);
        for (int t = 0; t < T; t++) {
            const __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[t][i].bsums), mn);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y[t][i].d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * y[t][i].d), _mm256_cvtepi32_ps(msum), acc[t]);
        }
    }
}

INLINE void step_q2_K(const block_q2_K *x, const block_q8_K *y, __m256 *acc) {
    ktile_q2_K(1, 1, (const uint8_t *)(const void *)x, &y, acc);
}

/* Q3_K: the 16 6-bit scales, as signed bytes (-32..31) */
INLINE __m128i q3_K_scales8(const uint8_t *s) {
    const uint32_t a = ld32(s), b = ld32(s + 4), c = ld32(s + 8);
    const uint32_t w0 = (a & 0x0f0f0f0fu) | ((c << 4) & 0x30303030u);
    const uint32_t w1 = (b & 0x0f0f0f0fu) | ((c << 2) & 0x30303030u);
    const uint32_t w2 = ((a >> 4) & 0x0f0f0f0fu) | (c & 0x30303030u);
    const uint32_t w3 = ((b >> 4) & 0x0f0f0f0fu) | ((c >> 2) & 0x30303030u);
    return _mm_sub_epi8(_mm_setr_epi32((int)w0, (int)w1, (int)w2, (int)w3), _mm_set1_epi8(32));
}

INLINE void ktile_q3_K(const int T, int64_t nsb, const uint8_t *xr, const block_q8_K *const *y, __m256 *acc) {
    const __m256i m3 = _mm256_set1_epi8(3), b2 = _mm256_set1_epi8(4);
    for (int64_t i = 0; i < nsb; i++) {
        const block_q3_K *x = (const block_q3_K *)(const void *)xr + i;
        const __m128i s8 = q3_K_scales8(x->scales);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x->hmask);
        __m256i sumi[4];
        for (int t = 0; t < T; t++) sumi[t] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                const __m256i v = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * s)), m3),
                                                  _mm256_and_si256(move_bit(hm, 4 * h + s, 2), b2));
                const __m256i scv = scale_pair(s8, 8 * h + 2 * s, 1);
                for (int t = 0; t < T; t++) {
                    const __m256i aq = _mm256_loadu_si256((const __m256i *)(y[t][i].qs + 128 * h + 32 * s));
                    sumi[t] = madd_acc(sumi[t], _mm256_maddubs_epi16(v, aq), scv);
                }
            }
        }
        const __m256i cs = _mm256_cvtepi8_epi16(s8);
        const float d = _cvtsh_ss(x->d);
        for (int t = 0; t < T; t++) {
            const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[t][i].bsums), cs);
            const __m256i si = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(corr, 2));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y[t][i].d), _mm256_cvtepi32_ps(si), acc[t]);
        }
    }
}

INLINE void step_q3_K(const block_q3_K *x, const block_q8_K *y, __m256 *acc) {
    ktile_q3_K(1, 1, (const uint8_t *)(const void *)x, &y, acc);
}

/* IQ4_XS: per sub-block of 32, its nibbles looked up in the book (signed
 * bytes) and multiplied as |w| x sign-adjusted a (vpmaddubsw: a pair of
 * products stays within int16), the int16 pairs times the sub-block's scale
 * ls - 32 added in int32; d * da once per super-block, as Q3_K */
INLINE void ktile_iq4_xs(const int T, int64_t nsb, const uint8_t *xr, const block_q8_K *const *y, __m256 *acc) {
    for (int64_t i = 0; i < nsb; i++) {
        const block_iq4_xs *x = (const block_iq4_xs *)(const void *)xr + i;
        __m256i sumi[4];
        for (int t = 0; t < T; t++) sumi[t] = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / QK; ib++) {
            const __m256i v = book_values(x->qs + 16 * ib, kvalues_iq4nl);
            const __m256i av = _mm256_sign_epi8(v, v);
            const __m256i sc = _mm256_set1_epi16((short)iq4_xs_scale(x, ib));
            for (int t = 0; t < T; t++) {
                const __m256i aq = _mm256_loadu_si256((const __m256i *)(y[t][i].qs + QK * ib));
                sumi[t] = madd_acc(sumi[t], _mm256_maddubs_epi16(av, _mm256_sign_epi8(aq, v)), sc);
            }
        }
        const float d = _cvtsh_ss(x->d);
        for (int t = 0; t < T; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y[t][i].d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
}

INLINE void step_iq4_xs(const block_iq4_xs *x, const block_q8_K *y, __m256 *acc) {
    ktile_iq4_xs(1, 1, (const uint8_t *)(const void *)x, &y, acc);
}

/* IQ3_S: the 32 grid values of sub-block ib (unsigned bytes, 1..15): its 8 points' 9-bit
 * indices (qs, and bit k of qh[ib] as bit 8) gathered from iq3s_grid */
INLINE __m256i iq3_s_grid32(const block_iq3_s *x, int ib) {
    const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(x->qs + 8 * ib)));
    const __m256i hi = _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(x->qh[ib]), _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1)),
                                        _mm256_set1_epi32(0x100));
    return _mm256_i32gather_epi32((const int *)iq3s_grid, _mm256_or_si256(lo, hi), 4);
}

/* 0xff in byte j of 32 where bit j of `bits` is set (the i-quants' signs) */
INLINE __m256i negated32(uint32_t bits) {
    const __m256i byte = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
    return _mm256_cmpeq_epi8(_mm256_and_si256(byte, bit), bit);
}

/* IQ3_XXS: the 32 grid values of sub-block ib (unsigned bytes, 4..62), its 8 points' indices in qs */
INLINE __m256i iq3_xxs_grid32(const block_iq3_xxs *x, int ib) {
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(x->qs + 8 * ib)));
    return _mm256_i32gather_epi32((const int *)iq3xxs_grid, idx, 4);
}

/* IQ2_*: the 32 grid values of sub-block ib (unsigned bytes 8..43), its 4 points' entries (8
 * values each) loaded one by one (a gather of 4 is slower on Zen 4), and their sign bytes as 32 bits */
#define DEFINE_IQ2_SUB(name, grid)                                                                        \
    INLINE __m256i name##_grid32(const block_##name *x, int ib) {                                          \
        return _mm256_setr_epi64x((long long)grid[name##_index(x, 4 * ib)], (long long)grid[name##_index(x, 4 * ib + 1)], \
                                  (long long)grid[name##_index(x, 4 * ib + 2)], (long long)grid[name##_index(x, 4 * ib + 3)]); \
    }                                                                                                      \
    INLINE uint32_t name##_sign_bits(const block_##name *x, int ib) {                                      \
        return (uint32_t)name##_signs(x, 4 * ib) | (uint32_t)name##_signs(x, 4 * ib + 1) << 8 |            \
               (uint32_t)name##_signs(x, 4 * ib + 2) << 16 | (uint32_t)name##_signs(x, 4 * ib + 3) << 24;  \
    }
DEFINE_IQ2_SUB(iq2_xxs, iq2xxs_grid)
DEFINE_IQ2_SUB(iq2_xs, iq2xs_grid)
DEFINE_IQ2_SUB(iq2_s, iq2s_grid)

/* IQ1_*: the 32 values 8 g -+ 1 of sub-block ib (signed bytes, never 0): its 4 points' 11-bit
 * indices side by side in the 16-bit lanes of idx4 (pdep of their low bytes and their tops),
 * their grid entries loaded one by one (g + 1 in each byte, so g << 3 stays in its byte), minus
 * off: 7 in the bytes of a point whose delta is positive, 9 where it is negative */
INLINE __m256i iq1_values32(uint64_t idx4, __m256i off) {
    const __m256i g = _mm256_setr_epi64x((long long)iq1s_grid[idx4 & 0xffff], (long long)iq1s_grid[(idx4 >> 16) & 0xffff],
                                         (long long)iq1s_grid[(idx4 >> 32) & 0xffff], (long long)iq1s_grid[idx4 >> 48]);
    return _mm256_sub_epi8(_mm256_slli_epi16(g, 3), off);
}
/* IQ1_S: one delta sign for the sub-block (bit 15 of its qh word) */
INLINE __m256i iq1_s_values32(const block_iq1_s *x, int ib) {
    return iq1_values32(iq1_s_index4(x, ib), _mm256_set1_epi8(x->qh[ib] >> 15 ? 9 : 7));
}
/* IQ1_M: a delta sign per point, each bit to the 8 bytes of its point */
INLINE __m256i iq1_m_values32(const block_iq1_m *x, int ib) {
    const __m256i neg = _mm256_cvtepi8_epi64(_mm_cvtsi32_si128((int)(_pdep_u32(iq1_m_neg4(x, ib), 0x01010101u) * 0xffu)));
    return iq1_values32(iq1_m_index4(x, ib), _mm256_add_epi8(_mm256_set1_epi8(7), _mm256_and_si256(neg, _mm256_set1_epi8(2))));
}
#define DEFINE_IQ1_MAG32(name)                                                                                \
    INLINE __m256i name##_mag32(const block_##name *x, int ib, __m256i *sgn) {                                 \
        *sgn = name##_values32(x, ib);                                                                         \
        return _mm256_abs_epi8(*sgn);                                                                          \
    }
DEFINE_IQ1_MAG32(iq1_s)
DEFINE_IQ1_MAG32(iq1_m)

/* the grid i-quants (IQ3_S, IQ3_XXS, IQ2_*, IQ1_*): per sub-block of 32, the values'
 * magnitudes x the activations with the values' signs (vpmaddubsw: 62 x 127 x 2 stays within
 * int16), the int16 pairs times the odd scales (per 32 or per 16) added in int32; d (IQ3_XXS:
 * d / 4, IQ2 and IQ1: d / 8) * da once per super-block, as IQ4_XS. name_mag32 gives the
 * magnitudes, and in *sgn a byte per value of its sign (never 0): IQ3 and IQ2 the unsigned
 * grid values and their sign bits */
INLINE uint32_t iq3_s_sign_bits(const block_iq3_s *x, int ib) { return ld32(x->signs + 4 * ib); }
#define DEFINE_GRID_MAG32(name)                                                                           \
    INLINE __m256i name##_mag32(const block_##name *x, int ib, __m256i *sgn) {                             \
        *sgn = _mm256_or_si256(negated32(name##_sign_bits(x, ib)), _mm256_set1_epi8(1)); /* -1/+1 */       \
        return name##_grid32(x, ib);                                                                       \
    }
DEFINE_GRID_MAG32(iq3_s)
DEFINE_GRID_MAG32(iq3_xxs)
DEFINE_GRID_MAG32(iq2_xxs)
DEFINE_GRID_MAG32(iq2_xs)
DEFINE_GRID_MAG32(iq2_s)

/* the odd scales of sub-block ib's two 16-element halves as int16 (low half, high half): where
 * the format has one scale per 32 (SCALE32_name), one broadcast; else from the super-block's 16
 * (GRID_SB16_name, once per super-block: words 2 ib, 2 ib + 1 of s16, by a permute and a shuffle) */
#define SCALE32_iq3_s 1
#define SCALE32_iq3_xxs 1
#define SCALE32_iq2_xxs 1
#define SCALE32_iq2_xs 0
#define SCALE32_iq2_s 0
#define SCALE32_iq1_s 1
#define SCALE32_iq1_m 0
/* 2 s + 1 of 16 bytes s, as int16 */
INLINE __m256i odd16(__m128i s) { return _mm256_cvtepu8_epi16(_mm_add_epi8(_mm_add_epi8(s, s), _mm_set1_epi8(1))); }
/* IQ2_XS, IQ2_S: s is nibble j of the 8 scale bytes */
INLINE __m256i odd16_nibbles(const uint8_t *p) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)p), m = _mm_set1_epi8(0x0f);
    return odd16(_mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m)));
}
/* IQ1_M: s is the 3-bit field j % 4 of scale word j / 4 */
INLINE __m256i iq1_m_odd16(const block_iq1_m *x) {
    uint64_t s[2];
    iq1_m_s16(x, s);
    return odd16(_mm_set_epi64x((long long)s[1], (long long)s[0]));
}
#define GRID_SB16_iq3_s(x) _mm256_setzero_si256()
#define GRID_SB16_iq3_xxs(x) _mm256_setzero_si256()
#define GRID_SB16_iq2_xxs(x) _mm256_setzero_si256()
#define GRID_SB16_iq2_xs(x) odd16_nibbles((x)->scales)
#define GRID_SB16_iq2_s(x) odd16_nibbles((x)->scales)
#define GRID_SB16_iq1_s(x) _mm256_setzero_si256()
#define GRID_SB16_iq1_m(x) iq1_m_odd16(x)
INLINE __m256i scales_pair(__m256i s16, int ib) {
    const __m256i d = _mm256_permutevar8x32_epi32(s16, _mm256_set1_epi32(ib));
    return _mm256_shuffle_epi8(d, _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                                   2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3));
}
#define GRID_SCALES16(name, x, ib, s16) \
    (SCALE32_##name ? _mm256_set1_epi16((short)name##_odd(x, 2 * (ib))) : scales_pair(s16, ib))

/* sub-block ib's sum for one activation row: magnitudes x the activations with the values' signs,
 * the int16 pairs times the odd scales */
INLINE __m256i grid_dot32(__m256i sumi, __m256i mag, __m256i sgn, __m256i sc, const int8_t *q) {
    const __m256i aq = _mm256_loadu_si256((const __m256i *)q);
    return madd_acc(sumi, _mm256_maddubs_epi16(mag, _mm256_sign_epi8(aq, sgn)), sc);
}
#define GRID_D(name, x) (GRID_DMUL_##name * _cvtsh_ss(name##_d(x)))
/* one super-block against one activation row (vec_dot, gemv) */
#define DEFINE_GRID_STEP(name)                                                                              \
    INLINE void step_##name(const block_##name *x, const block_q8_K *y, __m256 *acc) {                      \
        __m256i sumi = _mm256_setzero_si256();                                                              \
        const __m256i s16 = GRID_SB16_##name(x);                                                            \
        for (int ib = 0; ib < QK_K / QK; ib++) {                                                            \
            __m256i sgn;                                                                                    \
            const __m256i g = name##_mag32(x, ib, &sgn);                                                    \
            sumi = grid_dot32(sumi, g, sgn, GRID_SCALES16(name, x, ib, s16), y->qs + QK * ib);              \
        }                                                                                                   \
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(GRID_D(name, x) * y->d), _mm256_cvtepi32_ps(sumi), *acc);     \
    }
DEFINE_GRID_STEP(iq3_s)
DEFINE_GRID_STEP(iq3_xxs)
DEFINE_GRID_STEP(iq2_xxs)
DEFINE_GRID_STEP(iq2_xs)
DEFINE_GRID_STEP(iq2_s)
DEFINE_GRID_STEP(iq1_s)
DEFINE_GRID_STEP(iq1_m)

#define DEFINE_QK(name, block_t)                                                                      \
    static float vec_dot_##name(int64_t n, const void *restrict w, const void *restrict a) {          \
        const block_t *x = w;                                                                          \
        const block_q8_K *y = a;                                                                       \
        __m256 acc = _mm256_setzero_ps();                                                              \
        for (int64_t i = 0; i < n / QK_K; i++) step_##name(&x[i], &y[i], &acc);                        \
        return hsum8(acc);                                                                             \
    }                                                                                                  \
    static void gemv_##name(int64_t n, const void *restrict w, size_t rb, int nrows,                  \
                            const void *restrict a, float *restrict out) {                             \
        const block_q8_K *y = a;                                                                       \
        const char *wr = w;                                                                            \
        const gemv_pf pf = gemv_prefetch_plan(2, rb, (size_t)(n / QK_K) * sizeof(block_t));           \
        int r = 0;                                                                                     \
        for (; r + 2 <= nrows; r += 2, wr += 2 * rb) {                                                 \
            const block_t *x0 = (const block_t *)(const void *)wr;                                     \
            const block_t *x1 = (const block_t *)(const void *)(wr + rb);                              \
            __m256 c0 = _mm256_setzero_ps(), c1 = c0;                                                  \
            for (int64_t i = 0; i < n / QK_K; i++) {                                                   \
                gemv_prefetch_step(&pf, 2, (uintptr_t)(wr + i * sizeof(block_t)), i * sizeof(block_t), sizeof(block_t)); \
                step_##name(&x0[i], &y[i], &c0);                                                       \
                step_##name(&x1[i], &y[i], &c1);                                                       \
            }                                                                                          \
            out[r] = hsum8(c0);                                                                        \
            out[r + 1] = hsum8(c1);                                                                    \
        }                                                                                              \
        for (; r < nrows; r++, wr += rb) out[r] = vec_dot_##name(n, wr, a);                            \
    }                                                                                                  \
    /* gemv over ROWS4 weights (quants.h): a group of 4 rows read front to back, super-block i of     \
     * row q at 4 i + q; per row the steps of vec_dot, in order */                                     \
    static void gemv4_##name(int64_t n, const void *restrict w, size_t rb, int nrows,                 \
                             const void *restrict a, float *restrict out) {                            \
        const block_q8_K *y = a;                                                                       \
        const char *wr = w;                                                                            \
        int r = 0;                                                                                     \
        for (; r + 4 <= nrows; r += 4, wr += 4 * rb) {                                                 \
            const block_t *x = (const block_t *)(const void *)wr;                                      \
            __m256 c[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()}; \
            for (int64_t i = 0; i < n / QK_K; i++)                                                     \
                for (int q = 0; q < 4; q++) step_##name(&x[4 * i + q], &y[i], &c[q]);                  \
            for (int q = 0; q < 4; q++) out[r + q] = hsum8(c[q]);                                      \
        }                                                                                              \
        for (; r < nrows; r++, wr += rb) out[r] = vec_dot_##name(n, wr, a);                            \
    }

DEFINE_QK(q2_K, block_q2_K)
DEFINE_QK(q3_K, block_q3_K)
DEFINE_QK(q4_K, block_q4_K)
DEFINE_QK(q5_K, block_q5_K)
DEFINE_QK(q6_K, block_q6_K)
DEFINE_QK(iq4_xs, block_iq4_xs)
DEFINE_QK(iq3_s, block_iq3_s)
DEFINE_QK(iq3_xxs, block_iq3_xxs)
DEFINE_QK(iq2_xxs, block_iq2_xxs)
DEFINE_QK(iq2_xs, block_iq2_xs)
DEFINE_QK(iq2_s, block_iq2_s)
DEFINE_QK(iq1_s, block_iq1_s)
DEFINE_QK(iq1_m, block_iq1_m)

/* K-quant gemm: one weight row against T activation rows at a time. Each
 * 32-element group of a super-block is decoded once (nibbles, 5th bits,
 * scales) and used for every activation row; per (row, activation row) the
 * integer sums and the float steps are exactly those of step_* (vec_dot,
 * gemv), so the results agree bit for bit. The activation rows (T x the row
 * length) stay in L1 while the tile's weight rows stream past them. */
INLINE void ktile_q45_K(const int T, const int q5, int64_t nsb, const uint8_t *xr, const block_q8_K *const *y,
                        __m256 *acc) {
    const size_t bs = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const __m256i lo4 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t *xb = xr + (size_t)i * bs;
        const block_q4_K *x4 = (const block_q4_K *)(const void *)xb;
        const block_q5_K *x5 = (const block_q5_K *)(const void *)xb;
        uint32_t sc[2], m[2];
        k4_scales(q5 ? x5->scales : x4->scales, sc, m);
        int16_t s16[8];
        _mm_storeu_si128((__m128i *)s16, _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)sc[1], (int)sc[0])));
        const uint8_t *qs = q5 ? x5->qs : x4->qs;
        const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)x5->qh) : _mm256_setzero_si256();
        __m256i sumi[4];
        for (int t = 0; t < T; t++) sumi[t] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i v0 = _mm256_and_si256(q, lo4), v1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), lo4);
            if (q5) {
                v0 = _mm256_or_si256(v0, _mm256_and_si256(move_bit(qh, 2 * c, 4), b4));
                v1 = _mm256_or_si256(v1, _mm256_and_si256(move_bit(qh, 2 * c + 1, 4), b4));
            }
            const __m256i c0 = _mm256_set1_epi16(s16[2 * c]), c1 = _mm256_set1_epi16(s16[2 * c + 1]);
            for (int t = 0; t < T; t++) {
                const int8_t *a = y[t][i].qs + 64 * c;
                const __m256i p0 = _mm256_maddubs_epi16(v0, _mm256_loadu_si256((const __m256i *)a));
                const __m256i p1 = _mm256_maddubs_epi16(v1, _mm256_loadu_si256((const __m256i *)(a + 32)));
                sumi[t] = madd_acc(sumi[t], p0, c0);
                sumi[t] = madd_acc(sumi[t], p1, c1);
            }
        }
        const float d = _cvtsh_ss(q5 ? x5->d : x4->d), dmin = _cvtsh_ss(q5 ? x5->dmin : x4->dmin);
        for (int t = 0; t < T; t++) {
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y[t][i].d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * y[t][i].d), _mm256_cvtepi32_ps(k4_min_dot(m, &y[t][i])), acc[t]);
        }
    }
}

INLINE void ktile_q6_K(const int T, int64_t nsb, const uint8_t *xr, const block_q8_K *const *y, __m256 *acc) {
    for (int64_t i = 0; i < nsb; i++) {
        const block_q6_K *x = (const block_q6_K *)(const void *)xr + i;
        const __m128i s8 = _mm_loadu_si128((const __m128i *)x->scales);
        __m256i sumi[4];
        for (int t = 0; t < T; t++) sumi[t] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i v[4];
            dec_q6_K_half(x, h, v);
            for (int s = 0; s < 4; s++) {
                const __m256i sc = scale_pair(s8, 8 * h + 2 * s, 1);
                for (int t = 0; t < T; t++) {
                    const __m256i aq = _mm256_loadu_si256((const __m256i *)(y[t][i].qs + 128 * h + 32 * s));
                    sumi[t] = madd_acc(sumi[t], _mm256_maddubs_epi16(v[s], aq), sc);
                }
            }
        }
        const __m256i cs = _mm256_cvtepi8_epi16(s8);
        const float d = _cvtsh_ss(x->d);
        for (int t = 0; t < T; t++) {
            const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[t][i].bsums), cs);
            const __m256i s = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(corr, 5));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y[t][i].d), _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
}

#define ktile_q4_K(T, nsb, x, y, acc) ktile_q45_K(T, 0, nsb, x, y, acc)
#define ktile_q5_K(T, nsb, x, y, acc) ktile_q45_K(T, 1, nsb, x, y, acc)

#define DEFINE_QK_GEMM(name, block_t)                                                                        \
    static void gemm_##name(int64_t n, const void *restrict w, size_t rb, int nrows, const void *restrict a,  \
                            size_t as, int ncols, float *restrict out, size_t os) {                           \
        const int64_t nsb = n / QK_K;                                                                         \
        for (int t0 = 0; t0 < ncols; t0 += 4) {                                                               \
            const int T = ncols - t0 < 4 ? ncols - t0 : 4;                                                    \
            const block_q8_K *y[4];                                                                           \
            for (int t = 0; t < T; t++) y[t] = (const block_q8_K *)(const void *)((const char *)a + (t0 + t) * as); \
            for (int r = 0; r < nrows; r++) {                                                                 \
                const uint8_t *xr = (const uint8_t *)w + (size_t)r * rb;                                      \
                __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()}; \
                if (T == 4) {                                                                                 \
                    ktile_##name(4, nsb, xr, y, acc);                                                         \
                } else {                                                                                      \
                    for (int t = 0; t < T; t++) ktile_##name(1, nsb, xr, y + t, acc + t);                     \
                }                                                                                             \
                for (int t = 0; t < T; t++) out[(size_t)(t0 + t) * os + r] = hsum8(acc[t]);                  \
            }                                                                                                 \
        }                                                                                                     \
    }

DEFINE_QK_GEMM(q2_K, block_q2_K)
DEFINE_QK_GEMM(q3_K, block_q3_K)
DEFINE_QK_GEMM(q4_K, block_q4_K)
DEFINE_QK_GEMM(q5_K, block_q5_K)
DEFINE_QK_GEMM(q6_K, block_q6_K)
DEFINE_QK_GEMM(iq4_xs, block_iq4_xs)

/* the grid i-quants' gemm: their decode (grid lookups, signs, scales) costs more than its dot
 * products, so each super-block of a weight row is decoded once (the 8 sub-blocks' magnitudes,
 * signs and scales, kept in L1) for up to GRID_COLS activation rows; per (row, activation row)
 * the integer sums and the float step of ktile (vec_dot, gemv), so the results agree bit for bit */
#define GRID_COLS 16
#define DEFINE_GRID_GEMM(name)                                                                        \
    static void gemm_##name(int64_t n, const void *restrict w, size_t rb, int nrows, const void *restrict a, \
                            size_t as, int ncols, float *restrict out, size_t os) {                           \
        const int64_t nsb = n / QK_K;                                                                         \
        for (int t0 = 0; t0 < ncols; t0 += GRID_COLS) { /* these activation rows stay in L2 */               \
            const int nt = ncols - t0 < GRID_COLS ? ncols - t0 : GRID_COLS;                                   \
            for (int r = 0; r < nrows; r++) {                                                                 \
                const block_##name *x = (const block_##name *)(const void *)((const char *)w + (size_t)r * rb); \
                __m256 acc[GRID_COLS];                                                                        \
                for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();                                    \
                for (int64_t i = 0; i < nsb; i++) {                                                           \
                    __m256i mag[QK_K / QK], sgn[QK_K / QK], sc[QK_K / QK];                                    \
                    const __m256i s16 = GRID_SB16_##name(&x[i]);                                              \
                    for (int ib = 0; ib < QK_K / QK; ib++) {                                                  \
                        mag[ib] = name##_mag32(&x[i], ib, &sgn[ib]);                                          \
                        sc[ib] = GRID_SCALES16(name, &x[i], ib, s16);                                         \
                    }                                                                                         \
                    const float d = GRID_D(name, &x[i]);                                                      \
                    for (int t = 0; t < nt; t++) {                                                            \
                        const block_q8_K *y = (const block_q8_K *)(const void *)((const char *)a + (size_t)(t0 + t) * as) + i; \
                        __m256i sumi = _mm256_setzero_si256();                                                \
                        for (int ib = 0; ib < QK_K / QK; ib++)                                                \
                            sumi = grid_dot32(sumi, mag[ib], sgn[ib], sc[ib], y->qs + QK * ib);               \
                        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(sumi), acc[t]); \
                    }                                                                                         \
                }                                                                                             \
                for (int t = 0; t < nt; t++) out[(size_t)(t0 + t) * os + r] = hsum8(acc[t]);                 \
            }                                                                                                 \
        }                                                                                                     \
    }
DEFINE_GRID_GEMM(iq3_s)
DEFINE_GRID_GEMM(iq3_xxs)
DEFINE_GRID_GEMM(iq2_xxs)
DEFINE_GRID_GEMM(iq2_xs)
DEFINE_GRID_GEMM(iq2_s)
DEFINE_GRID_GEMM(iq1_s)
DEFINE_GRID_GEMM(iq1_m)


/* ------------------------------------------------------------------ */
/* float weights (F32, F16, BF16) x float activations                  */
/* ------------------------------------------------------------------ */

INLINE __m256 load_f16x8(const f16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
INLINE __m256 load_bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
INLINE __m256 load_f32x8(const float *p) { return _mm256_loadu_ps(p); }

#define DEFINE_FDOT(name, wtype, LOAD, SCALAR)                                                        \
    static float name(int64_t n, const wtype *restrict x, const float *restrict y) {                  \
        __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;                                    \
        int64_t i = 0;                                                                                 \
        for (; i + 32 <= n; i += 32) {                                                                 \
            c0 = _mm256_fmadd_ps(LOAD(x + i), _mm256_loadu_ps(y + i), c0);                             \
            c1 = _mm256_fmadd_ps(LOAD(x + i + 8), _mm256_loadu_ps(y + i + 8), c1);                     \
            c2 = _mm256_fmadd_ps(LOAD(x + i + 16), _mm256_loadu_ps(y + i + 16), c2);                   \
            c3 = _mm256_fmadd_ps(LOAD(x + i + 24), _mm256_loadu_ps(y + i + 24), c3);                   \
        }                                                                                              \
        for (; i + 8 <= n; i += 8) c0 = _mm256_fmadd_ps(LOAD(x + i), _mm256_loadu_ps(y + i), c0);      \
        float sum = hsum8(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)));                \
        for (; i < n; i++) sum += SCALAR(x[i]) * y[i];                                                 \
        return sum;                                                                                    \
    }

#define F32_ID(v) (v)
DEFINE_FDOT(dot_f32_x, float, load_f32x8, F32_ID)
DEFINE_FDOT(dot_f16_x, f16_t, load_f16x8, fp16_to_fp32)
DEFINE_FDOT(dot_bf16_x, uint16_t, load_bf16x8, bf16_to_fp32)

/* float weights: one accumulator per row (8 lanes, one FMA per 8 elements),
 * hsum8, then the tail elements in order; vec_dot is the one-row case of
 * gemv (the same float steps, so both agree bit for bit) */
#define DEFINE_FGEMV(name, wtype, LOAD, SCALAR)                                                       \
    INLINE void frows_##name(const int R, int64_t n, const char *w, size_t rb, const float *y,        \
                             float *out, const gemv_pf *pf) {                                          \
        __m256 c[4];                                                                                   \
        for (int r = 0; r < R; r++) c[r] = _mm256_setzero_ps();                                        \
        int64_t i = 0;                                                                                 \
        for (; i + 8 <= n; i += 8) {                                                                   \
            const __m256 yv = _mm256_loadu_ps(y + i);                                                  \
            if (pf) gemv_prefetch_step(pf, R, (uintptr_t)w + i * sizeof(wtype), i * sizeof(wtype), 8 * sizeof(wtype)); \
            for (int r = 0; r < R; r++)                                                                \
                c[r] = _mm256_fmadd_ps(LOAD((const wtype *)(const void *)(w + r * rb) + i), yv, c[r]); \
        }                                                                                              \
        for (int r = 0; r < R; r++) {                                                                  \
            const wtype *x = (const wtype *)(const void *)(w + r * rb);                                \
            float s = hsum8(c[r]);                                                                     \
            for (int64_t j = i; j < n; j++) s += SCALAR(x[j]) * y[j];                                  \
            out[r] = s;                                                                                \
        }                                                                                              \
    }                                                                                                  \
    static void gemv_##name(int64_t n, const void *restrict w, size_t rb, int nrows,                  \
                            const void *restrict a, float *restrict out) {                             \
        const char *wr = w;                                                                            \
        const size_t len = (size_t)n * sizeof(wtype);                                                  \
        const gemv_pf pf4 = gemv_prefetch_plan(4, rb, len), pf1 = gemv_prefetch_plan(1, rb, len);      \
        int r = 0;                                                                                     \
        for (; r + 4 <= nrows; r += 4, wr += 4 * rb) frows_##name(4, n, wr, rb, a, out + r, &pf4);     \
        for (; r < nrows; r++, wr += rb) frows_##name(1, n, wr, rb, a, out + r, &pf1);                 \
    }                                                                                                  \
    static float vec_dot_##name(int64_t n, const void *restrict w, const void *restrict a) {          \
        float r;                                                                                       \
        frows_##name(1, n, w, 0, a, &r, NULL);                                                            \
        return r;                                                                                      \
    }                                                                                                  \
    /* ROWS4: a group's rows interleave in units of 32 elements (quants.h): the 4 rows side by side   \
     * in one stream, each its own chain; frows' float steps: the FMAs in order, hsum8, the tail      \
     * elements (in the last unit) */                                                                  \
    static void gemv4_##name(int64_t n, const void *restrict w, size_t rb, int nrows,                 \
                             const void *restrict a, float *restrict out) {                            \
        const float *y = a;                                                                            \
        const int64_t unit = rows4_unit(1), n8 = n / 8 * 8, last = (n - 1) / unit * unit; /* its start */ \
        const rows_at L = rows_group(unit * sizeof(wtype), rb);                                        \
        int r = 0;                                                                                     \
        for (; r + 4 <= nrows; r += 4) {                                                               \
            const char *g = (const char *)w + r * rb;                                                  \
            __m256 c[4];                                                                               \
            for (int q = 0; q < 4; q++) c[q] = _mm256_setzero_ps();                                    \
            for (int64_t u0 = 0; u0 < n; u0 += unit) {                                                 \
                const int64_t len = n - u0 < unit ? n - u0 : unit, len8 = n8 - u0 < len ? n8 - u0 : len; \
                const wtype *x[4];                                                                     \
                for (int q = 0; q < 4; q++)                                                            \
                    x[q] = (const wtype *)(const void *)row_at(g, &L, q, u0 * sizeof(wtype), u0 * sizeof(wtype)); \
                for (int64_t i = 0; i < len8; i += 8) {                                                \
                    const __m256 yv = _mm256_loadu_ps(y + u0 + i);                                     \
                    for (int q = 0; q < 4; q++) c[q] = _mm256_fmadd_ps(LOAD(x[q] + i), yv, c[q]);      \
                }                                                                                      \
            }                                                                                          \
            for (int q = 0; q < 4; q++) {                                                              \
                const wtype *x = (const wtype *)(const void *)row_at(g, &L, q, last * sizeof(wtype), last * sizeof(wtype)); \
                float s = hsum8(c[q]);                                                                 \
                for (int64_t j = n8; j < n; j++) s += SCALAR(x[j - last]) * y[j];                      \
                out[r + q] = s;                                                                        \
            }                                                                                          \
        }                                                                                              \
        gemv_##name(n, (const char *)w + r * rb, rb, nrows - r, a, out + r);                           \
    }

DEFINE_FGEMV(f32, float, load_f32x8, F32_ID)
DEFINE_FGEMV(f16, f16_t, load_f16x8, fp16_to_fp32)
DEFINE_FGEMV(bf16, uint16_t, load_bf16x8, bf16_to_fp32)

/* ------------------------------------------------------------------ */
/* dequantize (bit-exact with quants.c: mul, then add; no FMA)          */
/* ------------------------------------------------------------------ */

static void dequant_f16(const void *restrict w, float *restrict out, int64_t n) {
    const f16_t *x = w;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load_f16x8(x + i));
    for (; i < n; i++) out[i] = fp16_to_fp32(x[i]);
}

static void dequant_bf16(const void *restrict w, float *restrict out, int64_t n) {
    const uint16_t *x = w;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load_bf16x8(x + i));
    for (; i < n; i++) out[i] = bf16_to_fp32(x[i]);
}

/* store 32 bytes of small ints (as int8) times d, plus m when add_m */
INLINE void store_scaled(float *out, __m256i q, __m256 d, __m256 m, int add_m) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++) {
        __m256 v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[k])));
        if (add_m) v = _mm256_add_ps(v, m);
        _mm256_storeu_ps(out + 8 * k, v);
    }
}

static void dequant_q4_0(const void *restrict w, float *restrict out, int64_t n) {
    const block_q4_0 *x = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK) {
        const __m256i q = _mm256_sub_epi8(unpack_nibbles(x[i].qs), _mm256_set1_epi8(8));
        store_scaled(out, q, _mm256_set1_ps(_cvtsh_ss(x[i].d)), _mm256_setzero_ps(), 0);
    }
}

static void dequant_q4_1(const void *restrict w, float *restrict out, int64_t n) {
    const block_q4_1 *x = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK)
        store_scaled(out, unpack_nibbles(x[i].qs), _mm256_set1_ps(_cvtsh_ss(x[i].d)),
                     _mm256_set1_ps(_cvtsh_ss(x[i].m)), 1);
}

static void dequant_q5_0(const void *restrict w, float *restrict out, int64_t n) {
    const block_q5_0 *x = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK) {
        __m256i q = _mm256_or_si256(unpack_nibbles(x[i].qs), bits_to_0x10(ld32(x[i].qh)));
        q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
        store_scaled(out, q, _mm256_set1_ps(_cvtsh_ss(x[i].d)), _mm256_setzero_ps(), 0);
    }
}

static void dequant_q5_1(const void *restrict w, float *restrict out, int64_t n) {
    const block_q5_1 *x = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK) {
        const __m256i q = _mm256_or_si256(unpack_nibbles(x[i].qs), bits_to_0x10(ld32(x[i].qh)));
        store_scaled(out, q, _mm256_set1_ps(_cvtsh_ss(x[i].d)), _mm256_set1_ps(_cvtsh_ss(x[i].m)), 1);
    }
}

static void dequant_q8_0(const void *restrict w, float *restrict out, int64_t n) {
    const block_q8_0 *x = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK)
        store_scaled(out, _mm256_loadu_si256((const __m256i *)x[i].qs), _mm256_set1_ps(_cvtsh_ss(x[i].d)),
                     _mm256_setzero_ps(), 0);
}

static void dequant_iq4_nl(const void *restrict w, float *restrict out, int64_t n) {
    const block_iq4_nl *x = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK)
        store_scaled(out, book_values(x[i].qs, kvalues_iq4nl), _mm256_set1_ps(_cvtsh_ss(x[i].d)),
                     _mm256_setzero_ps(), 0);
}

static void dequant_iq4_xs(const void *restrict w, float *restrict out, int64_t n) {
    const block_iq4_xs *x = w;
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int ib = 0; ib < QK_K / QK; ib++, out += QK)
            store_scaled(out, book_values(x[i].qs + 16 * ib, kvalues_iq4nl),
                         _mm256_set1_ps(_cvtsh_ss(x[i].d) * (float)iq4_xs_scale(&x[i], ib)), _mm256_setzero_ps(), 0);
}

/* the grid i-quants: per 16 elements (dmul d) odd, times the value (as the scalar reference) */
#define DEFINE_GRID_DEQUANT(name)                                                                       \
    static void dequant_##name(const void *restrict w, float *restrict out, int64_t n) {                     \
        const block_##name *x = w;                                                                            \
        for (int64_t i = 0; i < n / QK_K; i++)                                                                \
            for (int ib = 0; ib < QK_K / QK; ib++, out += QK) {                                               \
                const float d = GRID_D(name, &x[i]);                                          \
                const __m128 lo = _mm_set1_ps(d * (float)name##_odd(&x[i], 2 * ib));                          \
                const __m128 hi = _mm_set1_ps(d * (float)name##_odd(&x[i], 2 * ib + 1));                      \
                __m256i sgn;                                                                                  \
                const __m256i mag = name##_mag32(&x[i], ib, &sgn);                                            \
                const __m256i v = _mm256_sign_epi8(mag, sgn);                                                 \
                const __m128i v0 = _mm256_castsi256_si128(v), v1 = _mm256_extracti128_si256(v, 1);            \
                const __m128i part[4] = {v0, _mm_srli_si128(v0, 8), v1, _mm_srli_si128(v1, 8)};               \
                for (int k = 0; k < 4; k++)                                                                   \
                    _mm256_storeu_ps(out + 8 * k, _mm256_mul_ps(_mm256_set_m128(k < 2 ? lo : hi, k < 2 ? lo : hi), \
                                                                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[k])))); \
            }                                                                                                 \
    }
DEFINE_GRID_DEQUANT(iq3_s)
DEFINE_GRID_DEQUANT(iq3_xxs)
DEFINE_GRID_DEQUANT(iq2_xxs)
DEFINE_GRID_DEQUANT(iq2_xs)
DEFINE_GRID_DEQUANT(iq2_s)
DEFINE_GRID_DEQUANT(iq1_s)
DEFINE_GRID_DEQUANT(iq1_m)

static void dequant_mxfp4(const void *restrict w, float *restrict out, int64_t n) {
    const block_mxfp4 *x = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK) {
        const uint32_t d = e8m0_half_table[x[i].e];
        store_scaled(out, book_values(x[i].qs, kvalues_mxfp4), _mm256_castsi256_ps(_mm256_set1_epi32((int)d)),
                     _mm256_setzero_ps(), 0);
    }
}

/* 16 elements: (d * sc) * q - (dmin * m), as the reference */
INLINE void store16_dm(float *out, __m128i q16, float dl, float ml) {
    const __m256 d = _mm256_set1_ps(dl), m = _mm256_set1_ps(ml);
    _mm256_storeu_ps(out, _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q16))), m));
    _mm256_storeu_ps(out + 8, _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q16, 8)))), m));
}

static void dequant_q4_K(const void *restrict w, float *restrict out, int64_t n) {
    const block_q4_K *x = w;
    for (int64_t i = 0; i < n / QK_K; i++, out += QK_K) {
        uint32_t sc[2], m[2];
        k4_scales(x[i].scales, sc, m);
        const uint8_t *scb = (const uint8_t *)sc, *mb = (const uint8_t *)m;
        const float d = _cvtsh_ss(x[i].d), dmin = _cvtsh_ss(x[i].dmin);
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            const __m256i v[2] = {_mm256_and_si256(q, _mm256_set1_epi8(0x0f)),
                                  _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi8(0x0f))};
            for (int s = 0; s < 2; s++) {
                const int j = 2 * c + s;
                const float dl = d * (float)scb[j], ml = dmin * (float)mb[j];
                store16_dm(out + 32 * j, _mm256_castsi256_si128(v[s]), dl, ml);
                store16_dm(out + 32 * j + 16, _mm256_extracti128_si256(v[s], 1), dl, ml);
            }
        }
    }
}

static void dequant_q5_K(const void *restrict w, float *restrict out, int64_t n) {
    const block_q5_K *x = w;
    for (int64_t i = 0; i < n / QK_K; i++, out += QK_K) {
        uint32_t sc[2], m[2];
        k4_scales(x[i].scales, sc, m);
        const uint8_t *scb = (const uint8_t *)sc, *mb = (const uint8_t *)m;
        const float d = _cvtsh_ss(x[i].d), dmin = _cvtsh_ss(x[i].dmin);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            const __m256i b4 = _mm256_set1_epi8(0x10);
            const __m256i h0 = _mm256_and_si256(move_bit(qh, 2 * c, 4), b4);
            const __m256i h1 = _mm256_and_si256(move_bit(qh, 2 * c + 1, 4), b4);
            const __m256i v[2] = {
                _mm256_or_si256(_mm256_and_si256(q, _mm256_set1_epi8(0x0f)), h0),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi8(0x0f)), h1)};
            for (int s = 0; s < 2; s++) {
                const int j = 2 * c + s;
                const float dl = d * (float)scb[j], ml = dmin * (float)mb[j];
                store16_dm(out + 32 * j, _mm256_castsi256_si128(v[s]), dl, ml);
                store16_dm(out + 32 * j + 16, _mm256_extracti128_si256(v[s], 1), dl, ml);
            }
        }
    }
}

static void dequant_q6_K(const void *restrict w, float *restrict out, int64_t n) {
    const block_q6_K *x = w;
    for (int64_t i = 0; i < n / QK_K; i++, out += QK_K) {
        const float d = _cvtsh_ss(x[i].d);
        const __m256i lo4 = _mm256_set1_epi8(0x0f), hi2 = _mm256_set1_epi8(0x30), o32 = _mm256_set1_epi8(32);
        for (int h = 0; h < 2; h++) {
            const __m256i q0 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
            const __m256i q1 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            __m256i v[4];
            v[0] = _mm256_or_si256(_mm256_and_si256(q0, lo4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2));
            v[1] = _mm256_or_si256(_mm256_and_si256(q1, lo4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2));
            v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q0, 4), lo4), _mm256_and_si256(qh, hi2));
            v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q1, 4), lo4),
                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2));
            for (int s = 0; s < 4; s++) {
                const __m256i q = _mm256_sub_epi8(v[s], o32);
                const int j = 8 * h + 2 * s;
                store16_dm(out + 16 * j, _mm256_castsi256_si128(q), d * (float)x[i].scales[j], 0.0f);
                store16_dm(out + 16 * j + 16, _mm256_extracti128_si256(q, 1), d * (float)x[i].scales[j + 1], 0.0f);
            }
        }
    }
}

/* 16 elements: dl * q (no min) -- Q3_K, Q6_K go through store16_dm with
 * m = 0: x - 0.0f == x for every x, so the result is the product itself */

static void dequant_q2_K(const void *restrict w, float *restrict out, int64_t n) {
    const block_q2_K *x = w;
    for (int64_t i = 0; i < n / QK_K; i++, out += QK_K) {
        const float d = _cvtsh_ss(x[i].d), dmin = _cvtsh_ss(x[i].dmin);
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                const __m256i v = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * s)), _mm256_set1_epi8(3));
                const int j = 8 * h + 2 * s;
                store16_dm(out + 16 * j, _mm256_castsi256_si128(v), d * (float)(x[i].scales[j] & 0xf),
                           dmin * (float)(x[i].scales[j] >> 4));
                store16_dm(out + 16 * j + 16, _mm256_extracti128_si256(v, 1), d * (float)(x[i].scales[j + 1] & 0xf),
                           dmin * (float)(x[i].scales[j + 1] >> 4));
            }
        }
    }
}

static void dequant_q3_K(const void *restrict w, float *restrict out, int64_t n) {
    const block_q3_K *x = w;
    for (int64_t i = 0; i < n / QK_K; i++, out += QK_K) {
        int8_t sc[16];
        _mm_storeu_si128((__m128i *)sc, q3_K_scales8(x[i].scales));
        const float d = _cvtsh_ss(x[i].d);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                const int b = 4 * h + s;
                const __m256i hb = move_bit(hm, b, 2);
                __m256i v = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * s)), _mm256_set1_epi8(3)),
                                            _mm256_and_si256(hb, _mm256_set1_epi8(4)));
                v = _mm256_sub_epi8(v, _mm256_set1_epi8(4));
                const int j = 8 * h + 2 * s;
                store16_dm(out + 16 * j, _mm256_castsi256_si128(v), d * (float)sc[j], 0.0f);
                store16_dm(out + 16 * j + 16, _mm256_extracti128_si256(v, 1), d * (float)sc[j + 1], 0.0f);
            }
        }
    }
}

/* ------------------------------------------------------------------ */
/* activation quantization (bit-exact with quants.c)                    */
/* ------------------------------------------------------------------ */

INLINE float amax_of(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 floats * id -> 32 int8 (round to nearest even); returns their sum and
 * the two 16-element sums */
INLINE int quant32(const float *x, __m256 id, int8_t *q, int *s16a, int *s16b) {
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
    const __m256i p01 = _mm256_packs_epi32(i0, i1), p23 = _mm256_packs_epi32(i2, i3);
    __m256i b = _mm256_packs_epi16(p01, p23); /* lanes interleaved: fix the dword order */
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, b);
    const int a = hsum_i32x8(_mm256_add_epi32(i0, i1)), c = hsum_i32x8(_mm256_add_epi32(i2, i3));
    if (s16a) *s16a = a, *s16b = c;
    return a + c;
}

static void quantize_q8_32(const float *restrict x, void *restrict out, int64_t n) {
    block_q8_32 *y = out;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        const float d = amax_of(x, QK) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const int sum = quant32(x, _mm256_set1_ps(id), y[i].qs, NULL, NULL);
        y[i].d = d;
        y[i].s = d * (float)sum;
    }
}

static void quantize_q8_K(const float *restrict x, void *restrict out, int64_t n) {
    block_q8_K *y = out;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const float d = amax_of(x, QK_K) / 127.0f;
        const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        for (int g = 0; g < QK_K / 32; g++) {
            int a, b;
            quant32(x + 32 * g, id, y[i].qs + 32 * g, &a, &b);
            y[i].bsums[2 * g] = (int16_t)a;
            y[i].bsums[2 * g + 1] = (int16_t)b;
        }
        y[i].d = d;
    }
}

static void quantize_f32(const float *restrict x, void *restrict out, int64_t n) {
    memcpy(out, x, (size_t)n * sizeof(float));
}

/* ------------------------------------------------------------------ */
/* float helpers                                                        */
/* ------------------------------------------------------------------ */

static void f32_to_f16_row(const float *restrict x, f16_t *restrict out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) out[i] = fp32_to_fp16(x[i]);
}

static void f16_to_f32_rows(const f16_t *restrict x, int64_t x_stride, int rows, float *restrict out, int64_t n) {
    for (int r = 0; r < rows; r++, x += x_stride, out += n) {
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load_f16x8(x + i));
        for (; i < n; i++) out[i] = fp16_to_fp32(x[i]);
    }
}

static float dot_f16_f32(int64_t n, const f16_t *restrict a, const float *restrict b) { return dot_f16_x(n, a, b); }

static float dot_f32(int64_t n, const float *restrict a, const float *restrict b) { return dot_f32_x(n, a, b); }

static void axpy_f16(int64_t n, float s, const f16_t *restrict a, float *restrict out) {
    const __m256 sv = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(sv, load_f16x8(a + i), _mm256_loadu_ps(out + i)));
    for (; i < n; i++) out[i] += s * fp16_to_fp32(a[i]);
}

/* ------------------------------------------------------------------ */
/* vector math: GLU activations, softmax exp, axpy                      */
/* ------------------------------------------------------------------ */
/* exp(x) = 2^k exp(r), k = round(x log2 e), r = x - k ln2 (ln2 in two
 * parts, the first exact times any k), |r| <= ln2/2; exp(r) by a degree-6
 * polynomial fitted for relative error (1.9e-9 on that range, below float
 * rounding), 2^k through the exponent bits. x is clamped to [-87.33, 88]
 * (2^k stays a normal float): exp(-87.33) = 1.2e-38 for anything smaller
 * (exp_sum maps those to 0), and inf above ln(FLT_MAX). Measured error:
 * within 2 ulp (1.2e-7 relative). Tails go through masked loads and
 * stores, so an element's result never depends on where it sits. */

#define EXP_LO (-87.33f)
#define EXP_HI 88.0f
#define EXP_OVER 88.7228394f /* ln(FLT_MAX) */

INLINE __m256 exp8(__m256 x0) {
    const __m256 x = _mm256_min_ps(_mm256_max_ps(x0, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.383684576e-03f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.374815807e-03f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166822508e-02f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666641980e-01f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.999999106e-01f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    /* past the float range: inf (silu(x) -> -0 for x -> -inf, not x / 1.65e38) */
    return _mm256_blendv_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), _mm256_set1_ps(__builtin_inff()),
                            _mm256_cmp_ps(x0, _mm256_set1_ps(EXP_OVER), _CMP_GT_OQ));
}

/* lanes [0, m) of a mask for vmaskmov */
INLINE __m256i tail_mask8(int64_t m) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* g / (1 + exp(-(g * (k0 + k1 g^2)))) * u: silu with k0 = 1, k1 = 0; gelu_tanh with
 * k0 = 2 sqrt(2/pi), k1 = k0 * 0.044715; sigmoid: u / (1 + exp(-g)) */
INLINE __m256 glu8(__m256 g, __m256 u, const int kind) {
    __m256 z = g;
    if (kind == GLU_K_SIGMOID) return _mm256_div_ps(u, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    if (kind == GLU_K_GELU_TANH) {
        const float k0 = 2.0f * 0.7978845608028654f;
        z = _mm256_mul_ps(g, _mm256_fmadd_ps(_mm256_mul_ps(g, g), _mm256_set1_ps(k0 * 0.044715f), _mm256_set1_ps(k0)));
    }
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), z));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

INLINE void glu_x8(int64_t n, const float *gate, const float *up, float *out, const int kind) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, glu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i), kind));
    if (i < n) {
        const __m256i k = tail_mask8(n - i);
        _mm256_maskstore_ps(out + i, k, glu8(_mm256_maskload_ps(gate + i, k), _mm256_maskload_ps(up + i, k), kind));
    }
}

static void glu_silu(int64_t n, const float *gate, const float *up, float *out) { glu_x8(n, gate, up, out, GLU_K_SILU); }
static void glu_gelu_tanh(int64_t n, const float *gate, const float *up, float *out) {
    glu_x8(n, gate, up, out, GLU_K_GELU_TANH);
}
static void glu_sigmoid(int64_t n, const float *gate, const float *up, float *out) {
    glu_x8(n, gate, up, out, GLU_K_SIGMOID);
}

INLINE __m256 exp_shifted8(__m256 v, __m256 m) {
    const __m256 x = _mm256_sub_ps(v, m);
    /* below the clamp (and -inf): 0 */
    return _mm256_and_ps(exp8(x), _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_GE_OQ));
}

static float exp_sum(int64_t n, float *s, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp_shifted8(_mm256_loadu_ps(s + i), mv);
        _mm256_storeu_ps(s + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (i < n) {
        const __m256i k = tail_mask8(n - i);
        const __m256 e = _mm256_and_ps(exp_shifted8(_mm256_maskload_ps(s + i, k), mv), _mm256_castsi256_ps(k));
        _mm256_maskstore_ps(s + i, k, e);
        acc = _mm256_add_ps(acc, e);
    }
    return hsum8(acc);
}

/* 32 columns at a time held in 4 registers over all rows; tail columns masked */
static void wsum_f32(int64_t n, int rows, const float *restrict w, const float *restrict x, int64_t ld,
                     float *restrict y) {
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256 a0 = _mm256_loadu_ps(y + j), a1 = _mm256_loadu_ps(y + j + 8);
        __m256 a2 = _mm256_loadu_ps(y + j + 16), a3 = _mm256_loadu_ps(y + j + 24);
        const float *p = x + j;
        for (int i = 0; i < rows; i++, p += ld) {
            const __m256 wv = _mm256_broadcast_ss(w + i);
            a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(p), a0);
            a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(p + 8), a1);
            a2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(p + 16), a2);
            a3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(p + 24), a3);
        }
        _mm256_storeu_ps(y + j, a0), _mm256_storeu_ps(y + j + 8, a1);
        _mm256_storeu_ps(y + j + 16, a2), _mm256_storeu_ps(y + j + 24, a3);
    }
    for (; j < n; j += 8) {
        const __m256i k = tail_mask8(n - j);
        __m256 a0 = _mm256_maskload_ps(y + j, k);
        const float *p = x + j;
        for (int i = 0; i < rows; i++, p += ld) a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + i), _mm256_maskload_ps(p, k), a0);
        _mm256_maskstore_ps(y + j, k, a0);
    }
}

/* wsum_f32 for Q outputs at once over columns [0, 8V) of x and y (k masks
 * the last 8): each x load shared by the Q outputs; an element's steps are
 * wsum_f32's (rows in order, one FMA each), whatever the chunking. x rows
 * are floats, or halves (half = 1: V straight from the f16 cache, each
 * converted exactly, so the same numbers; a partial last 8 goes through a
 * zero-padded copy, AVX2 having no 16-bit masked load). */
enum { X_F32 = 0, X_F16 = 1, X_Q8_0 = 2 };

INLINE __m256 xload8(const int fmt, const void *x, int64_t i, __m256i k, int m) {
    if (fmt == X_Q8_0) { /* a q8_0 cache's 8 values (n a multiple of 32): q * d, as dequant_q8_0 */
        const block_q8_0 *b = (const block_q8_0 *)x + i / QK;
        const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + i % QK))));
        return _mm256_mul_ps(q, _mm256_set1_ps(_cvtsh_ss(b->d)));
    }
    if (fmt == X_F32) return _mm256_maskload_ps((const float *)x + i, k);
    if (m == 8) return load_f16x8((const f16_t *)x + i);
    f16_t pad[8] = {0};
    memcpy(pad, (const f16_t *)x + i, (size_t)m * sizeof(f16_t));
    return load_f16x8(pad);
}

INLINE void wsum_chunk(const int fmt, const int Q, const int V, __m256i k, int m, int rows, const float *w,
                       int64_t ws, const void *x, int64_t j, size_t row_bytes, float *y, int64_t ys) {
    const __m256i all = _mm256_set1_epi32(-1);
    __m256 acc[2][4];
    for (int q = 0; q < Q; q++)
        for (int v = 0; v < V; v++) acc[q][v] = _mm256_maskload_ps(y + q * ys + 8 * v, v == V - 1 ? k : all);
    for (int i = 0; i < rows; i++, x = (const char *)x + row_bytes) {
        __m256 xv[4];
        for (int v = 0; v < V; v++) xv[v] = xload8(fmt, x, j + 8 * v, v == V - 1 ? k : all, v == V - 1 ? m : 8);
        for (int q = 0; q < Q; q++) {
            const __m256 wv = _mm256_broadcast_ss(w + q * ws + i);
            for (int v = 0; v < V; v++) acc[q][v] = _mm256_fmadd_ps(wv, xv[v], acc[q][v]);
        }
    }
    for (int q = 0; q < Q; q++)
        for (int v = 0; v < V; v++) _mm256_maskstore_ps(y + q * ys + 8 * v, v == V - 1 ? k : all, acc[q][v]);
}

INLINE void wsum_q(const int fmt, const int Q, int64_t n, int rows, const float *w, int64_t ws, const void *x,
                   size_t row_bytes, float *y, int64_t ys) {
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) wsum_chunk(fmt, Q, 4, _mm256_set1_epi32(-1), 8, rows, w, ws, x, j, row_bytes, y + j, ys);
    for (; j < n; j += 8) {
        const int m = n - j < 8 ? (int)(n - j) : 8;
        wsum_chunk(fmt, Q, 1, tail_mask8(n - j), m, rows, w, ws, x, j, row_bytes, y + j, ys);
    }
}

/* ld: elements between rows (X_F32, X_F16), bytes (X_Q8_0) */
INLINE void wsum_many(const int fmt, int64_t n, int rows, int nq, const float *w, int64_t ws, const void *x,
                      int64_t ld, float *y, int64_t ys) {
    const size_t rb = fmt == X_Q8_0 ? (size_t)ld : (size_t)ld * (fmt == X_F16 ? 2 : 4);
    int q = 0;
    for (; q + 2 <= nq; q += 2) wsum_q(fmt, 2, n, rows, w + q * ws, ws, x, rb, y + q * ys, ys);
    if (q < nq) wsum_q(fmt, 1, n, rows, w + q * ws, ws, x, rb, y + q * ys, ys);
}

static void wsum_many_f32(int64_t n, int rows, int nq, const float *restrict w, int64_t ws, const float *restrict x,
                          int64_t ld, float *restrict y, int64_t ys) {
    wsum_many(X_F32, n, rows, nq, w, ws, x, ld, y, ys);
}

static void wsum_many_f16(int64_t n, int rows, int nq, const float *restrict w, int64_t ws, const f16_t *restrict x,
                          int64_t ld, float *restrict y, int64_t ys) {
    wsum_many(X_F16, n, rows, nq, w, ws, x, ld, y, ys);
}

static void wsum_many_q8_0(int64_t n, int rows, int nq, const float *restrict w, int64_t ws, const void *restrict x,
                           int64_t ld, float *restrict y, int64_t ys) {
    wsum_many(X_Q8_0, n, rows, nq, w, ws, x, ld, y, ys);
}

/* Float-weight gemm (F32: attention's scores; F16: the same straight from
 * the f16 cache, and prefill on F16 and BF16 weights): R rows x C activation rows,
 * each pair with frows' accumulator and float steps (hsum8, then the tail
 * elements in order), the loads shared: 6 per 8 FMAs for 4 x 2, against 5
 * per 4 in gemv */
#define DEFINE_FTILE(name, wtype, LOAD, SCALAR)                                                              \
    INLINE void ftile_##name(const int R, const int C, int64_t n, const char *w, size_t rb, const char *a,   \
                             size_t as, float *out, size_t os) {                                             \
        __m256 c[4][2];                                                                                      \
        for (int r = 0; r < R; r++)                                                                          \
            for (int t = 0; t < C; t++) c[r][t] = _mm256_setzero_ps();                                       \
        int64_t i = 0;                                                                                       \
        for (; i + 8 <= n; i += 8) {                                                                         \
            __m256 wv[4];                                                                                    \
            for (int r = 0; r < R; r++) wv[r] = LOAD((const wtype *)(const void *)(w + r * rb) + i);         \
            for (int t = 0; t < C; t++) {                                                                    \
                const __m256 yv = _mm256_loadu_ps((const float *)(a + t * as) + i);                          \
                for (int r = 0; r < R; r++) c[r][t] = _mm256_fmadd_ps(wv[r], yv, c[r][t]);                   \
            }                                                                                                \
        }                                                                                                    \
        for (int t = 0; t < C; t++) {                                                                        \
            const float *y = (const float *)(a + t * as);                                                    \
            for (int r = 0; r < R; r++) {                                                                    \
                const wtype *x = (const wtype *)(const void *)(w + r * rb);                                  \
                float s = hsum8(c[r][t]);                                                                    \
                for (int64_t j = i; j < n; j++) s += SCALAR(x[j]) * y[j];                                    \
                out[t * os + r] = s;                                                                         \
            }                                                                                                \
        }                                                                                                    \
    }                                                                                                        \
    INLINE void fcols_##name(const int R, int64_t n, const char *w, size_t rb, const char *a, size_t as,     \
                             int ncols, float *out, size_t os) {                                             \
        int t = 0;                                                                                           \
        for (; t + 2 <= ncols; t += 2) ftile_##name(R, 2, n, w, rb, a + t * as, as, out + t * os, os);       \
        if (t < ncols) ftile_##name(R, 1, n, w, rb, a + t * as, as, out + t * os, os);                       \
    }                                                                                                        \
    static void gemm_##name(int64_t n, const void *restrict w, size_t rb, int nrows, const void *restrict a,  \
                            size_t as, int ncols, float *restrict out, size_t os) {                          \
        const char *wr = w;                                                                                  \
        int r = 0;                                                                                           \
        for (; r + 4 <= nrows; r += 4) fcols_##name(4, n, wr + r * rb, rb, a, as, ncols, out + r, os);       \
        for (; r < nrows; r++) fcols_##name(1, n, wr + r * rb, rb, a, as, ncols, out + r, os);               \
    }

DEFINE_FTILE(f32, float, load_f32x8, F32_ID)
DEFINE_FTILE(f16, f16_t, load_f16x8, fp16_to_fp32)
DEFINE_FTILE(bf16, uint16_t, load_bf16x8, bf16_to_fp32)

/* tanh(u), odd, from a = |u|: a + a^3 P(a^2) (Taylor to a^9) below 0.3,
 * else 1 - 2 / (exp(2a) + 1); a clamped at 9, where tanh rounds to 1 */
INLINE __m256 tanh8(__m256 u) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 a = _mm256_min_ps(_mm256_andnot_ps(sign, u), _mm256_set1_ps(9.0f));
    const __m256 a2 = _mm256_mul_ps(a, a);
    __m256 p = _mm256_set1_ps(62.0f / 2835.0f);
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-17.0f / 315.0f));
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(2.0f / 15.0f));
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-1.0f / 3.0f));
    const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(a, a2), p, a);
    const __m256 e = exp8(_mm256_add_ps(a, a));
    const __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                                     _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    const __m256 t = _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.3f), _CMP_LT_OQ));
    /* NaN in, NaN out (exp8's clamps would make it -1) */
    return _mm256_blendv_ps(_mm256_or_ps(t, _mm256_and_ps(sign, u)), u, _mm256_cmp_ps(u, u, _CMP_UNORD_Q));
}

INLINE __m256 softcap8(__m256 x, __m256 scale, __m256 cap) {
    return _mm256_mul_ps(cap, tanh8(_mm256_div_ps(_mm256_mul_ps(x, scale), cap)));
}

static void softcap(int64_t n, float *s, float scale, float cap) {
    const __m256 sv = _mm256_set1_ps(scale), cv = _mm256_set1_ps(cap);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, softcap8(_mm256_loadu_ps(s + i), sv, cv));
    if (i < n) {
        const __m256i k = tail_mask8(n - i);
        _mm256_maskstore_ps(s + i, k, softcap8(_mm256_maskload_ps(s + i, k), sv, cv));
    }
}

/* ssm_scan_row: 8 states per step, s = fma(B, xdt, s * decay), the dot with C in two
 * accumulators (the state stays in L1 across the tokens; its tail masked) */
static void ssm_scan_row(int64_t n, float *restrict s, int n_tok, const float *bc, int64_t bc_stride, int64_t c_off,
                         const float *x, int64_t x_stride, const float *dt, const float *decay, float *y,
                         int64_t y_stride) {
    for (int t = 0; t < n_tok; t++) {
        const float *B = bc + t * bc_stride, *C = B + c_off;
        const __m256 xdt = _mm256_set1_ps(x[t * x_stride] * dt[t]), d = _mm256_set1_ps(decay[t]);
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            const __m256 s0 = _mm256_fmadd_ps(_mm256_loadu_ps(B + i), xdt, _mm256_mul_ps(_mm256_loadu_ps(s + i), d));
            const __m256 s1 = _mm256_fmadd_ps(_mm256_loadu_ps(B + i + 8), xdt,
                                              _mm256_mul_ps(_mm256_loadu_ps(s + i + 8), d));
            _mm256_storeu_ps(s + i, s0);
            _mm256_storeu_ps(s + i + 8, s1);
            acc0 = _mm256_fmadd_ps(s0, _mm256_loadu_ps(C + i), acc0);
            acc1 = _mm256_fmadd_ps(s1, _mm256_loadu_ps(C + i + 8), acc1);
        }
        for (; i < n; i += 8) {
            const __m256i k = tail_mask8(n - i < 8 ? n - i : 8);
            const __m256 s0 = _mm256_fmadd_ps(_mm256_maskload_ps(B + i, k), xdt,
                                              _mm256_mul_ps(_mm256_maskload_ps(s + i, k), d));
            _mm256_maskstore_ps(s + i, k, s0);
            acc0 = _mm256_fmadd_ps(s0, _mm256_maskload_ps(C + i, k), acc0);
        }
        y[t * y_stride] = hsum8(_mm256_add_ps(acc0, acc1));
    }
}

static void axpy_f32(int64_t n, float a, const float *restrict x, float *restrict y) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
        _mm256_storeu_ps(y + i + 8, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8)));
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    if (i < n) {
        const __m256i k = tail_mask8(n - i);
        _mm256_maskstore_ps(y + i, k, _mm256_fmadd_ps(av, _mm256_maskload_ps(x + i, k), _mm256_maskload_ps(y + i, k)));
    }
}

/* ------------------------------------------------------------------ */

void KERNELS_FILL_AVX2(kernel_table *t) {
#define SETF(T, name)                   \
    t->dequant[T] = dequant_##name;     \
    t->vec_dot[T] = vec_dot_##name;     \
    t->gemv[T] = gemv_##name;
#define SET(T, name) SETF(T, name) t->gemv4[T] = gemv4_##name; /* every weight format reads ROWS4 too */
    SET(T_Q4_0, q4_0) SET(T_Q4_1, q4_1) SET(T_Q5_0, q5_0) SET(T_Q5_1, q5_1)
    SET(T_Q8_0, q8_0) SET(T_IQ4_NL, iq4_nl) SET(T_MXFP4, mxfp4)
    SET(T_Q2_K, q2_K) SET(T_Q3_K, q3_K) SET(T_Q4_K, q4_K) SET(T_Q5_K, q5_K) SET(T_Q6_K, q6_K)
    SET(T_IQ4_XS, iq4_xs) SET(T_IQ3_S, iq3_s) SET(T_IQ3_XXS, iq3_xxs)
    SET(T_IQ2_XXS, iq2_xxs) SET(T_IQ2_XS, iq2_xs) SET(T_IQ2_S, iq2_s) SET(T_IQ1_S, iq1_s) SET(T_IQ1_M, iq1_m)
    SET(T_F16, f16) SET(T_BF16, bf16)
#undef SET
#undef SETF
    t->gemm[T_Q4_0] = gemm_q4_0;
    t->gemm[T_Q4_1] = gemm_q4_1;
    t->gemm[T_Q5_0] = gemm_q5_0;
    t->gemm[T_Q5_1] = gemm_q5_1;
    t->gemm[T_Q8_0] = gemm_q8_0;
    t->gemm[T_IQ4_NL] = gemm_iq4_nl;
    t->gemm[T_MXFP4] = gemm_mxfp4;
    t->gemm[T_Q2_K] = gemm_q2_K;
    t->gemm[T_Q3_K] = gemm_q3_K;
    t->gemm[T_Q4_K] = gemm_q4_K;
    t->gemm[T_Q5_K] = gemm_q5_K;
    t->gemm[T_Q6_K] = gemm_q6_K;
    t->gemm[T_IQ4_XS] = gemm_iq4_xs;
    t->gemm[T_IQ3_S] = gemm_iq3_s;
    t->gemm[T_IQ3_XXS] = gemm_iq3_xxs;
    t->gemm[T_IQ2_XXS] = gemm_iq2_xxs;
    t->gemm[T_IQ2_XS] = gemm_iq2_xs;
    t->gemm[T_IQ2_S] = gemm_iq2_s;
    t->gemm[T_IQ1_S] = gemm_iq1_s;
    t->gemm[T_IQ1_M] = gemm_iq1_m;
    /* F32: dequant is a copy (the scalar memcpy) */
    t->vec_dot[T_F32] = vec_dot_f32;
    t->gemv4[T_F32] = gemv4_f32;
    t->gemv[T_F32] = gemv_f32;
    t->gemm[T_F32] = gemm_f32;
    t->gemm[T_F16] = gemm_f16;
    t->gemm[T_BF16] = gemm_bf16;
    t->quantize_act[ACT_F32] = quantize_f32;
    t->quantize_act[ACT_Q8_32] = quantize_q8_32;
    t->quantize_act[ACT_Q8_K] = quantize_q8_K;
    t->f32_to_f16 = f32_to_f16_row;
    t->f16_to_f32 = f16_to_f32_rows;
    t->dot_f16_f32 = dot_f16_f32;
    t->axpy_f16 = axpy_f16;
    t->dot_f32 = dot_f32;
    t->ssm_scan_row = ssm_scan_row;
    t->glu_silu = glu_silu;
    t->glu_gelu_tanh = glu_gelu_tanh;
    t->glu_sigmoid = glu_sigmoid;
    t->exp_sum = exp_sum;
    t->softcap = softcap;
    t->axpy_f32 = axpy_f32;
    t->wsum_f32 = wsum_f32;
    t->wsum_many_f32 = wsum_many_f32;
    t->wsum_many_f16 = wsum_many_f16;
    t->wsum_many_q8_0 = wsum_many_q8_0;
}
