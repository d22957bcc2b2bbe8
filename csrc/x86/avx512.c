/* avx512.c: AVX-512 (F, BW, VL, DQ) kernels, with a VNNI (vpdpbusd) variant.
 *
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni (and
 * the AVX2 flags); reached only when dispatch.c found AVX-512 F/BW/VL/DQ.
 * VNNI instructions run only in the functions built with vnni = 1, which
 * kernels_fill_avx512 picks only when dispatch.c set pyllm_avx512_vnni (CPU
 * has avx512vnni and PYLLM_AVX512_VNNI is not 0). Entries this file leaves
 * NULL (dequant, quantize_act, the f16 helpers) come from avx2.c.
 *
 * 32-element formats work on quads of 4 blocks. Per quad, the activation
 * side (shared by every row of a gemv) is rearranged once into
 *     lo = [a0[0:16] a1[0:16] a2[0:16] a3[0:16]],  hi = [a0[16:32] ... a3[16:32]]
 * and each row's 4 blocks are gathered by one two-source permute (vpermt2d /
 * vpermt2w: the block strides 18/20/22/24/34 bytes keep everything word- or
 * dword-aligned) into the same layout of unsigned bytes. Two vpdpbusd give
 * 16 int32 lanes, lanes 4k..4k+3 belonging to block k; one vcvtdq2ps and one
 * FMA with the blocks' d*da (permuted to that lane pattern) per quad. Whole
 * runs of 16 blocks ("hexes") reduce their 4 quads' dots to one lane per
 * block first, so that the float work is one convert and FMA per 16 blocks
 * (gemm, which stores its operands in that layout, needs no reduction).
 * Weights are made unsigned with a per-format offset c (Q4_0: q = u - 8,
 * Q5_0: u - 16, Q8_0, IQ4_NL and MXFP4: u - 128 via xor 0x80); the activation side
 * precomputes -c * sum(a) per lane, which seeds the vpdpbusd accumulator, so
 * the int32 dot is exact. Q4_1/Q5_1 mins: lanes 2k+1 += m_k * s_k, one
 * masked FMA per quad. Without VNNI: vpmaddubsw + vpmaddwd, and
 * the signed formats (Q8_0, IQ4_NL, MXFP4) use |w| and sign-adjusted activations.
 * MXFP4's 17-byte blocks put its quants at odd offsets, which the word and
 * dword permutes cannot gather: it loads each block's 16 quant bytes into
 * its 128-bit lane instead (mxfp4_qs).
 * A row's last partial quad uses masked loads (zeros past the row's end).
 * gemv prepares the activation quads once per call (ACT_CHUNK at a time)
 * and streams 4 rows at a time against them, prefetching the weights
 * ahead (GEMV_PREFETCH, quants.h; the K-quant and float gemv too). The
 * float steps of a row are fixed (RED_BLOCKS below), the same in vec_dot,
 * gemv and gemm: the determinism contract of quants.h.
 *
 * gemm (prefill) decodes a tile's weights once per call into buffers and
 * runs a register-tiled micro-kernel over them (see its section).
 *
 * K-quants (Q2_K .. Q6_K): VNNI (or vpmaddubsw) dots with one int32 lane
 * per 16-element sub-block, the sub-block scales applied in float (see
 * their section); VNNI and no-VNNI variants like the 32-element formats.
 *
 * Throughput notes for the machine these were tuned on (an Ice Lake Xeon
 * VM): vpdpbusd, vpmaddubsw, FMA and convert all issue 2 per cycle, but a
 * load into a zmm register (plain or broadcast) only ~1 per cycle, so the
 * micro-kernels are bound by operand loads as much as by arithmetic: the
 * 4x4 tiles keep both operands of each step in registers where they can.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "quants.h"

extern int pyllm_avx512_vnni; /* dispatch.c */

#define INLINE static inline __attribute__((always_inline))

/* The table's entries for one format, from its kernels' _impl(vnni, ...):
 * _vnni (AVX512-VNNI dot products) and _bw (AVX512BW only) of each. */
#define DEFINE_VARIANTS(name)                                                                             \
    static float vec_dot_##name##_vnni(int64_t n, const void *restrict w, const void *restrict a) {      \
        return vec_dot_##name##_impl(1, n, w, a);                                                         \
    }                                                                                                     \
    static float vec_dot_##name##_bw(int64_t n, const void *restrict w, const void *restrict a) {        \
        return vec_dot_##name##_impl(0, n, w, a);                                                         \
    }                                                                                                     \
    static void gemv_##name##_vnni(int64_t n, const void *restrict w, size_t rb, int nrows,              \
                                   const void *restrict a, float *restrict out) {                         \
        gemv_##name##_impl(1, n, w, rb, nrows, a, out);                                                   \
    }                                                                                                     \
    static void gemv_##name##_bw(int64_t n, const void *restrict w, size_t rb, int nrows,                \
                                 const void *restrict a, float *restrict out) {                           \
        gemv_##name##_impl(0, n, w, rb, nrows, a, out);                                                   \
    }                                                                                                     \
    static void gemm_##name##_vnni(int64_t n, const void *restrict w, size_t rb, int nrows,              \
                                   const void *restrict a, size_t as, int ncols, float *restrict out,     \
                                   size_t os) {                                                           \
        gemm_##name##_impl(1, n, w, rb, nrows, a, as, ncols, out, os);                                    \
    }                                                                                                     \
    static void gemm_##name##_bw(int64_t n, const void *restrict w, size_t rb, int nrows,                \
                                 const void *restrict a, size_t as, int ncols, float *restrict out,       \
                                 size_t os) {                                                             \
        gemm_##name##_impl(0, n, w, rb, nrows, a, as, ncols, out, os);                                    \
    }

/* the table's gemv4 (ROWS4 weights) of a format, _vnni and _bw, from impl(vnni, rows4, ...) */
#define DEFINE_GEMV4_VARIANTS(name, impl)                                                                 \
    static void gemv4_##name##_vnni(int64_t n, const void *restrict w, size_t rb, int nrows,             \
                                    const void *restrict a, float *restrict out) {                        \
        impl(1, 1, n, w, rb, nrows, a, out);                                                              \
    }                                                                                                     \
    static void gemv4_##name##_bw(int64_t n, const void *restrict w, size_t rb, int nrows,               \
                                  const void *restrict a, float *restrict out) {                          \
        impl(0, 1, n, w, rb, nrows, a, out);                                                              \
    }

/* a vector of 32 int16 (permute indexes); GCC 12 has no _mm512_setr_epi16 */
#define IDX16(...) _mm512_loadu_si512((const void *)(const int16_t[32]){__VA_ARGS__})

INLINE uint32_t ld32(const void *p) { uint32_t v; memcpy(&v, p, 4); return v; }
INLINE uint16_t ld16(const void *p) { uint16_t v; memcpy(&v, p, 2); return v; }

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* the 4 horizontal sums [sum(a0), sum(a1), sum(a2), sum(a3)] */
INLINE __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
#define HALF(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1))
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(HALF(a0), HALF(a1)), _mm256_hadd_ps(HALF(a2), HALF(a3)));
#undef HALF
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* the sum of one vector, added in exactly the order reduce4 adds each of
 * its four (every row's result must not depend on which rows share a call) */
INLINE float hsum16(__m512 a) { return _mm_cvtss_f32(reduce4(a, a, a, a)); }

/* unsigned x signed bytes, 4 products summed per int32 lane, added to acc.
 * Without VNNI the pairs go through int16: valid while u * 127 * 2 < 32768. */
INLINE __m512i dpbusd(const int vnni, __m512i acc, __m512i u, __m512i s) {
    if (vnni) return _mm512_dpbusd_epi32(acc, u, s);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}


/* signed x signed bytes (|w| <= 128, |a| <= 127), no VNNI */
INLINE __m512i dot_s8s8(__m512i acc, __m512i w, __m512i a) {
    const __m512i aa = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(w), _mm512_setzero_si512(), a);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(w), aa), _mm512_set1_epi16(1)));
}


/* ------------------------------------------------------------------ */
/* 32-element formats                                                   */
/* ------------------------------------------------------------------ */

/* the activation side of a quad */
typedef struct {
    __m512i lo, hi;  /* quants, in the quad layout */
    __m512i negc;    /* -c * (sum of the 4 activations of each lane) */
    __m256 ds;       /* [da0 s0 da1 s1 da2 s2 da3 s3] */
    __m128 da;       /* [da0 da1 da2 da3] */
} act4;

/* c: the format's offset (0, 8, 16, 128); signed_bw: the format uses the
 * signed no-VNNI path, which needs no offset */
INLINE void act4_load(const block_q8_32 *y, const int c, const int vnni, act4 *A) {
    const uint8_t *p = (const uint8_t *)y;
    const __m512i U = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 8))),
                                         _mm256_loadu_si256((const __m256i *)(p + 48)), 1);
    const __m512i V = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 88))),
                                         _mm256_loadu_si256((const __m256i *)(p + 128)), 1);
    A->lo = _mm512_permutex2var_epi64(U, _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), V);
    A->hi = _mm512_permutex2var_epi64(U, _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15), V);
    const __m128 d01 = _mm_castsi128_ps(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p),
                                                           _mm_loadl_epi64((const __m128i *)(p + 40))));
    const __m128 d23 = _mm_castsi128_ps(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(p + 80)),
                                                           _mm_loadl_epi64((const __m128i *)(p + 120))));
    A->ds = _mm256_insertf128_ps(_mm256_castps128_ps256(d01), d23, 1);
    A->da = _mm_shuffle_ps(d01, d23, _MM_SHUFFLE(2, 0, 2, 0));
    if (c) {
        const __m512i cv = _mm512_set1_epi8((char)c);
        const __m512i s = dpbusd(vnni, dpbusd(vnni, _mm512_setzero_si512(), cv, A->lo), cv, A->hi);
        A->negc = _mm512_sub_epi32(_mm512_setzero_si512(), s);
    } else {
        A->negc = _mm512_setzero_si512();
    }
}

/* [x0 x1 x2 x3] -> [x0 x4, x1 x4, x2 x4, x3 x4] */
INLINE __m512 spread4(__m128 v) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                 _mm512_castps128_ps512(v));
}

/* [x0 . x1 . x2 . x3 .] -> [x0 x4, x1 x4, x2 x4, x3 x4] */
INLINE __m512 spread4_even(__m256 v) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6),
                                 _mm512_castps256_ps512(v));
}

INLINE __m512i nib_lo(__m512i q) { return _mm512_and_si512(q, _mm512_set1_epi8(0x0f)); }
INLINE __m512i nib_hi(__m512i q) { return _mm512_and_si512(_mm512_srli_epi16(q, 4), _mm512_set1_epi8(0x0f)); }

/* the two 64-bit masks of the 5th bits of 4 Q5 blocks: lo = bits 0..15 of
 * each block's qh, hi = bits 16..31, in the quad layout */
INLINE void q5_masks(uint32_t h0, uint32_t h1, uint32_t h2, uint32_t h3, __mmask64 *klo, __mmask64 *khi) {
    const uint64_t a = (uint64_t)h0 | (uint64_t)h1 << 32, b = (uint64_t)h2 | (uint64_t)h3 << 32;
    const uint64_t ml = 0x0000ffff0000ffffull, mh = 0xffff0000ffff0000ull;
    *klo = _cvtu64_mask64(_pext_u64(a, ml) | _pext_u64(b, ml) << 32);
    *khi = _cvtu64_mask64(_pext_u64(a, mh) | _pext_u64(b, mh) << 32);
}

/* 64 bytes at x + off of a quad whose first nblk blocks (of bs bytes) exist:
 * a plain load for a full quad, else a masked load (no fault, zeros) */
INLINE __m512i ldw(const uint8_t *x, int off, const int full, int valid) {
    if (full) return _mm512_loadu_si512(x + off);
    const int nv = valid - off;
    if (nv <= 0) return _mm512_setzero_si512();
    return _mm512_maskz_loadu_epi8(_cvtu64_mask64(_bzhi_u64(~0ull, (unsigned)(nv > 64 ? 64 : nv))), x + off);
}
#define LDW(x, off, bs) ldw(x, off, full, nblk * (bs))
/* the qh word of block k (at byte off of a bs-byte block), 0 past the end */
#define QH(x, off, bs, k) ((full || (k) < nblk) ? ld32((x) + (bs) * (k) + (off)) : 0u)

/* the fp16 d of 4 blocks (stride bytes apart, d first), as 4 words: scalar
 * loads, which leave the vector ports (the bottleneck) to the dot products */
INLINE __m128i d4_scalar(const uint8_t *x, const int stride, const int full, const int nblk) {
    uint64_t v = ld16(x);
    for (int k = 1; k < 4; k++)
        if (full || k < nblk) v |= (uint64_t)ld16(x + k * stride) << (16 * k);
    return _mm_cvtsi64_si128((long long)v);
}

/* Q4_1/Q5_1 mins: lanes 1, 3, 5, 7 of acc += m_k * s_k, fused, from the
 * [d m] x 4 weight pairs and the [da s] x 4 activation pairs */
INLINE __m512 min_fma(__m256 dm, __m256 ds, __m512 acc) {
    return _mm512_mask3_fmadd_ps(_mm512_zextps256_ps512(dm), _mm512_zextps256_ps512(ds), acc, 0xaa);
}

/* ---- quad steps ----
 * qi_*: one quad's int32 dot (16 lanes, lanes 4k..4k+3 of block k, seeded
 * with the activation's -c * sum: exact) and its scales: dd = [d_k * da_k]
 * (formats without a min) or dm = [d_k m_k] x 4 (Q4_1, Q5_1, unmultiplied).
 * quad_*: acc (16 lanes) += d*da * dot, then (mins) lanes 2k+1 += m_k*s_k */

typedef struct {
    __m512i dot;
    __m128 dd;
    __m256 dm;
} qres;

/* the packed nibbles of 4 blocks of Q4_0's and IQ4_NL's layout (fp16 d, then 16 bytes), quad layout */
INLINE __m512i q4_quad(const int full, const int nblk, const uint8_t *x) {
    const __m512i L0 = LDW(x, 0, 18), L1 = LDW(x, 8, 18);
    return _mm512_permutex2var_epi16(
        L0,
        IDX16(1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17, 19, 20, 21, 22, 23, 24, 25, 26,
                          56, 57, 58, 59, 60, 61, 62, 63),
        L1);
}

/* IQ4_NL, MXFP4: the book (16 int8 values) as a shuffle table: + 128 as
 * unsigned bytes (VNNI), or the signed values */
INLINE __m512i book_table(const int vnni, const int8_t *book) {
    const __m128i k = _mm_loadu_si128((const __m128i *)book);
    const __m128i t = vnni ? _mm_xor_si128(k, _mm_set1_epi8((char)0x80)) : k;
    return _mm512_broadcast_i32x4(t);
}

/* the packed nibbles of 4 MXFP4 blocks (E8M0 e, then 16 bytes), quad layout: a 16-byte load per
 * block into its lane (the blocks' quants sit at odd offsets; inserts measured ~5% faster in a
 * gemv than merge-masked 64-byte loads), zeros past the first nblk */
INLINE __m512i mxfp4_qs(const int full, const int nblk, const uint8_t *x) {
    __m512i q = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)(x + 1)));
    if (full || nblk > 1) q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(x + 18)), 1);
    if (full || nblk > 2) q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(x + 35)), 2);
    if (full || nblk > 3) q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(x + 52)), 3);
    return q;
}

/* the scales of 4 MXFP4 blocks, 2^(e - 128) (0 past the first nblk): the 4 bytes gathered on
 * the scalar side, then scalef(1, e - 128), exact for every e (subnormal for e < 2). A gemv
 * measured 8% faster than with 4 e8m0_half_table lookups (twice the loads), 2% faster than
 * with the bytes picked out of a vector load (vpermw + vpshufb). */
INLINE __m128 e8m0_4(const uint8_t *x, const int full, const int nblk) {
    uint32_t e = x[0];
    if (full || nblk > 1) e |= (uint32_t)x[17] << 8;
    if (full || nblk > 2) e |= (uint32_t)x[34] << 16;
    if (full || nblk > 3) e |= (uint32_t)x[51] << 24;
    const __m128 p = _mm_sub_ps(_mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)e))), _mm_set1_ps(128.0f));
    const __m128 d = _mm_scalef_ps(_mm_set1_ps(1.0f), p);
    return full ? d : _mm_maskz_mov_ps((__mmask8)((1u << nblk) - 1), d);
}


/* qw_*: a quad's weight side: the bytes its dot takes (lo, hi, quad layout;
 * unsigned with the format's offset c, or on the no-VNNI path of the signed
 * formats the signed values) and the blocks' d, or [d m] pairs (Q4_1, Q5_1).
 * A gemm with few activation rows decodes a quad once and dots it with each. */
typedef struct {
    __m512i lo, hi;
    __m128 d;
    __m256 dm;
} qwd;

INLINE void qw_q4_0(const int vnni, const int full, const int nblk, const uint8_t *x, qwd *W) {
    (void)vnni;
    const __m512i q = q4_quad(full, nblk, x);
    W->lo = nib_lo(q), W->hi = nib_hi(q);
    W->d = _mm_cvtph_ps(d4_scalar(x, 18, full, nblk));
}

/* IQ4_NL, MXFP4: a quad of nibbles q looked up in the book */
INLINE void qw_book(const int vnni, __m512i q, const int8_t *book, qwd *W) {
    const __m512i tab = book_table(vnni, book);
    W->lo = _mm512_shuffle_epi8(tab, nib_lo(q)), W->hi = _mm512_shuffle_epi8(tab, nib_hi(q));
}

INLINE void qw_iq4_nl(const int vnni, const int full, const int nblk, const uint8_t *x, qwd *W) {
    qw_book(vnni, q4_quad(full, nblk, x), kvalues_iq4nl, W);
    W->d = _mm_cvtph_ps(d4_scalar(x, 18, full, nblk));
}

INLINE void qw_mxfp4(const int vnni, const int full, const int nblk, const uint8_t *x, qwd *W) {
    qw_book(vnni, mxfp4_qs(full, nblk, x), kvalues_mxfp4, W);
    W->d = e8m0_4(x, full, nblk);
}

INLINE void qw_q4_1(const int vnni, const int full, const int nblk, const uint8_t *x, qwd *W) {
    (void)vnni;
    const __m512i L0 = LDW(x, 0, 20), L1 = LDW(x, 16, 20);
    const __m512i q = _mm512_permutex2var_epi32(
        L0, _mm512_setr_epi32(1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14, 28, 29, 30, 31), L1);
    W->lo = nib_lo(q), W->hi = nib_hi(q);
    W->dm = _mm256_cvtph_ps(_mm512_castsi512_si128(
        _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 5, 10, 15, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), L0)));
}

INLINE void qw_q5_0(const int vnni, const int full, const int nblk, const uint8_t *x, qwd *W) {
    (void)vnni;
    const __m512i L0 = LDW(x, 0, 22), L1 = LDW(x, 24, 22);
    const __m512i q = _mm512_permutex2var_epi16(
        L0,
        IDX16(3, 4, 5, 6, 7, 8, 9, 10, 14, 15, 16, 17, 18, 19, 20, 21, 45, 46, 47, 48, 49, 50, 51, 52,
                          56, 57, 58, 59, 60, 61, 62, 63),
        L1);
    __mmask64 klo, khi;
    q5_masks(QH(x, 2, 22, 0), QH(x, 2, 22, 1), QH(x, 2, 22, 2), QH(x, 2, 22, 3), &klo, &khi);
    const __m512i b4 = _mm512_set1_epi8(0x10), lo = nib_lo(q), hi = nib_hi(q);
    W->lo = _mm512_mask_add_epi8(lo, klo, lo, b4), W->hi = _mm512_mask_add_epi8(hi, khi, hi, b4);
    /* (d through the vector side here: the 5th bits already keep the scalar ports busy) */
    W->d = _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(
        L0, IDX16(0, 11, 22, 53, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        L1)));
}

INLINE void qw_q5_1(const int vnni, const int full, const int nblk, const uint8_t *x, qwd *W) {
    (void)vnni;
    const __m512i L0 = LDW(x, 0, 24), L1 = LDW(x, 32, 24);
    const __m512i q = _mm512_permutex2var_epi32(
        L0, _mm512_setr_epi32(2, 3, 4, 5, 8, 9, 10, 11, 22, 23, 24, 25, 28, 29, 30, 31), L1);
    __mmask64 klo, khi;
    q5_masks(QH(x, 4, 24, 0), QH(x, 4, 24, 1), QH(x, 4, 24, 2), QH(x, 4, 24, 3), &klo, &khi);
    const __m512i b4 = _mm512_set1_epi8(0x10), lo = nib_lo(q), hi = nib_hi(q);
    W->lo = _mm512_mask_add_epi8(lo, klo, lo, b4), W->hi = _mm512_mask_add_epi8(hi, khi, hi, b4);
    W->dm = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi32(
        L0, _mm512_setr_epi32(0, 6, 12, 26, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), L1)));
}

INLINE void qw_q8_0(const int vnni, const int full, const int nblk, const uint8_t *x, qwd *W) {
    const __m512i S0 = LDW(x, 0, 34), S1 = LDW(x, 64, 34);
    const __m512i T0 = LDW(x, 16, 34), T1 = LDW(x, 72, 34);
    const __m512i f = vnni ? _mm512_set1_epi8((char)0x80) : _mm512_setzero_si512();  /* VNNI: unsigned, + 128 */
    W->lo = _mm512_xor_si512(_mm512_permutex2var_epi16(
        S0,
        IDX16(1, 2, 3, 4, 5, 6, 7, 8, 18, 19, 20, 21, 22, 23, 24, 25, 35, 36, 37, 38, 39, 40, 41, 42,
                          52, 53, 54, 55, 56, 57, 58, 59),
        S1), f);
    W->hi = _mm512_xor_si512(_mm512_permutex2var_epi16(
        T0,
        IDX16(1, 2, 3, 4, 5, 6, 7, 8, 18, 19, 20, 21, 22, 23, 24, 25, 39, 40, 41, 42, 43, 44, 45, 46,
                          56, 57, 58, 59, 60, 61, 62, 63),
        T1), f);
    W->d = _mm_cvtph_ps(d4_scalar(x, 34, full, nblk));
}

/* a decoded quad's int32 dot with the activation's (seeded with its -c * sum; the no-VNNI
 * path of the signed formats: signed bytes on both sides) */
INLINE __m512i qw_dot(const int vnni, const int sgn, const qwd *W, const act4 *A) {
    if (sgn && !vnni) return dot_s8s8(dot_s8s8(_mm512_setzero_si512(), W->lo, A->lo), W->hi, A->hi);
    return dpbusd(vnni, dpbusd(vnni, A->negc, W->lo, A->lo), W->hi, A->hi);
}

#define DEFINE_QI(name)                                                                                    \
    INLINE void qi_##name(const int vnni, const int full, const int nblk, const uint8_t *x, const act4 *A,  \
                          qres *Q) {                                                                        \
        qwd W;                                                                                              \
        qw_##name(vnni, full, nblk, x, &W);                                                                 \
        Q->dot = qw_dot(vnni, SIGNED_##name, &W, A);                                                        \
        if (HAS_MIN_##name)                                                                                 \
            Q->dm = W.dm;                                                                                   \
        else                                                                                                \
            Q->dd = _mm_mul_ps(W.d, A->da);                                                                 \
    }
DEFINE_QI(q4_0)
DEFINE_QI(q4_1)
DEFINE_QI(q5_0)
DEFINE_QI(q5_1)
DEFINE_QI(q8_0)
DEFINE_QI(iq4_nl)
DEFINE_QI(mxfp4)

/* the float steps of a quad */
INLINE void quad_fin(const int mins, const qres *Q, const act4 *A, __m512 *acc) {
    if (mins) {
        const __m256 p = _mm256_mul_ps(Q->dm, A->ds); /* [d*da, m*s] x 4: the d*da */
        *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Q->dot), spread4_even(p), *acc);
        *acc = min_fma(Q->dm, A->ds, *acc);
    } else {
        *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Q->dot), spread4(Q->dd), *acc);
    }
}

#define DEFINE_QUAD(name)                                                                                  \
    INLINE void quad_##name(const int vnni, const int full, const int nblk, const uint8_t *x, const act4 *A, \
                            __m512 *acc) {                                                                  \
        qres Q;                                                                                             \
        qi_##name(vnni, full, nblk, x, A, &Q);                                                              \
        quad_fin(HAS_MIN_##name, &Q, A, acc);                                                                   \
    }
DEFINE_QUAD(q4_0)
DEFINE_QUAD(q4_1)
DEFINE_QUAD(q5_0)
DEFINE_QUAD(q5_1)
DEFINE_QUAD(q8_0)
DEFINE_QUAD(iq4_nl)
DEFINE_QUAD(mxfp4)

/* ---- hexes: 16 blocks (4 quads) with one int32 lane per block ----
 * Lane 4k + q of a hex vector belongs to block 4q + k of the hex ("M
 * order": what reducing the 4 quads' dots with two rounds of unpacks gives).
 * Per hex: acc = fma(float(dot16), d*da, acc), then (mins) acc = fma(m, s,
 * acc): one convert and FMA per 16 blocks where quads take four. */

/* the int32 sums of each block's 4 lanes of 4 quad dots, in M order (exact) */
INLINE __m512i red4i(__m512i d0, __m512i d1, __m512i d2, __m512i d3) {
    const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(d0, d1), _mm512_unpackhi_epi32(d0, d1));
    const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(d2, d3), _mm512_unpackhi_epi32(d2, d3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
}

/* [x_q[0..3]] of 4 quads -> M order: lane 4k + q = x_q[k] */
INLINE __m512 m_order4(__m128 a0, __m128 a1, __m128 a2, __m128 a3) {
    const __m512 z = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_insertf128_ps(_mm256_castps128_ps256(a0), a1, 1)),
                                        _mm256_insertf128_ps(_mm256_castps128_ps256(a2), a3, 1), 1);
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
}

/* lanes 2k + o of 4 quads' [x0 y0 x1 y1 x2 y2 x3 y3] pairs, in M order */
INLINE __m512 m_order_pairs(__m256 p0, __m256 p1, __m256 p2, __m256 p3, const int o) {
    const __m512 z01 = _mm512_insertf32x8(_mm512_castps256_ps512(p0), p1, 1);
    const __m512 z23 = _mm512_insertf32x8(_mm512_castps256_ps512(p2), p3, 1);
    const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 8, 16, 24, 2, 10, 18, 26, 4, 12, 20, 28, 6, 14, 22, 30),
                                         _mm512_set1_epi32(o));
    return _mm512_permutex2var_ps(z01, idx, z23);
}

/* 4 vectors of the quad pattern [x_k x4] -> M order (lane 4k + q from vector q) */
INLINE __m512 m_blend4(__m512 p0, __m512 p1, __m512 p2, __m512 p3) {
    __m512 r = _mm512_mask_blend_ps(0x2222, p0, p1);
    r = _mm512_mask_blend_ps(0x4444, r, p2);
    return _mm512_mask_blend_ps(0x8888, r, p3);
}

/* 4 quads' bytes in the quad layout (128-bit lane k: block k, dword i:
 * bytes 4i..4i+3) -> o[i]: dword i of each block, in M order */
INLINE void m_transpose(__m512i a0, __m512i a1, __m512i a2, __m512i a3, __m512i *o) {
    const __m512i t0 = _mm512_unpacklo_epi32(a0, a1), t1 = _mm512_unpackhi_epi32(a0, a1);
    const __m512i t2 = _mm512_unpacklo_epi32(a2, a3), t3 = _mm512_unpackhi_epi32(a2, a3);
    o[0] = _mm512_unpacklo_epi64(t0, t2), o[1] = _mm512_unpackhi_epi64(t0, t2);
    o[2] = _mm512_unpacklo_epi64(t1, t3), o[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* the activation side of a hex beside its 4 quads: da and (mins) s, M order */
typedef struct {
    __m512 da, s;
} acth;

INLINE void acth_of(const act4 *A, acth *H) {
    H->da = m_order4(A[0].da, A[1].da, A[2].da, A[3].da);
    H->s = m_order_pairs(A[0].ds, A[1].ds, A[2].ds, A[3].ds, 1);
}

/* a hex of one row (gemv, vec_dot): the 4 quads' dots reduced to one lane per block */
#define DEFINE_HEX(name, block_t)                                                                          \
    INLINE void hex_##name(const int vnni, const uint8_t *x, const act4 *A, const acth *H, __m512 *acc) {  \
        qres Q[4];                                                                                          \
        for (int q = 0; q < 4; q++) qi_##name(vnni, 1, 4, x + 4 * q * sizeof(block_t), &A[q], &Q[q]);      \
        const __m512 dot = _mm512_cvtepi32_ps(red4i(Q[0].dot, Q[1].dot, Q[2].dot, Q[3].dot));               \
        if (HAS_MIN_##name) {                                                                                   \
            __m256 p[4];                                                                                    \
            for (int q = 0; q < 4; q++) p[q] = _mm256_mul_ps(Q[q].dm, A[q].ds); /* the d*da */              \
            *acc = _mm512_fmadd_ps(dot, m_order_pairs(p[0], p[1], p[2], p[3], 0), *acc);                    \
            *acc = _mm512_fmadd_ps(m_order_pairs(Q[0].dm, Q[1].dm, Q[2].dm, Q[3].dm, 1), H->s, *acc);       \
        } else {                                                                                            \
            *acc = _mm512_fmadd_ps(dot, m_order4(Q[0].dd, Q[1].dd, Q[2].dd, Q[3].dd), *acc);                \
        }                                                                                                   \
    }
DEFINE_HEX(q4_0, block_q4_0)
/* Q4_1: two quads' (d, m) pairs through one permute and vcvtph2ps, as in oct_q4_1 below */
INLINE void hex_q4_1(const int vnni, const uint8_t *x, const act4 *A, const acth *H, __m512 *acc) {
    const __m512i idx = _mm512_setr_epi32(1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14, 28, 29, 30, 31);
    const __m512i didx = _mm512_setr_epi32(0, 5, 10, 15, 16, 21, 26, 31, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512i d[4];
    __m512 dm[2], p[2];
    for (int h = 0; h < 2; h++) {
        const uint8_t *xh = x + 160 * h;
        const __m512i L0 = _mm512_loadu_si512(xh), L1 = _mm512_loadu_si512(xh + 16);
        const __m512i L2 = _mm512_loadu_si512(xh + 80), L3 = _mm512_loadu_si512(xh + 96);
        const __m512i q0 = _mm512_permutex2var_epi32(L0, idx, L1), q1 = _mm512_permutex2var_epi32(L2, idx, L3);
        d[2 * h] = dpbusd(vnni, dpbusd(vnni, _mm512_setzero_si512(), nib_lo(q0), A[2 * h].lo), nib_hi(q0), A[2 * h].hi);
        d[2 * h + 1] = dpbusd(vnni, dpbusd(vnni, _mm512_setzero_si512(), nib_lo(q1), A[2 * h + 1].lo), nib_hi(q1), A[2 * h + 1].hi);
        dm[h] = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi32(L0, didx, L2)));
        p[h] = _mm512_mul_ps(dm[h], _mm512_insertf32x8(_mm512_castps256_ps512(A[2 * h].ds), A[2 * h + 1].ds, 1));
    }
    const __m512i ev = _mm512_setr_epi32(0, 8, 16, 24, 2, 10, 18, 26, 4, 12, 20, 28, 6, 14, 22, 30);
    const __m512 dot = _mm512_cvtepi32_ps(red4i(d[0], d[1], d[2], d[3]));
    *acc = _mm512_fmadd_ps(dot, _mm512_permutex2var_ps(p[0], ev, p[1]), *acc); /* the d*da, M order */
    *acc = _mm512_fmadd_ps(_mm512_permutex2var_ps(dm[0], _mm512_add_epi32(ev, _mm512_set1_epi32(1)), dm[1]), H->s, *acc);
}
DEFINE_HEX(q5_0, block_q5_0)
DEFINE_HEX(q5_1, block_q5_1)
DEFINE_HEX(q8_0, block_q8_0)
DEFINE_HEX(iq4_nl, block_iq4_nl)
DEFINE_HEX(mxfp4, block_mxfp4)

/* Q4_1, two quads at once: the (d, m) pairs of 8 blocks go through one
 * vcvtph2ps, multiply and add (ds16: the two quads' activation (d, s) pairs) */
INLINE void oct_q4_1(const int vnni, const uint8_t *x, const act4 *A0, const act4 *A1, __m512 ds16, __m512 *acc) {
    const __m512i idx = _mm512_setr_epi32(1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14, 28, 29, 30, 31);
    const __m512i L0 = _mm512_loadu_si512(x), L1 = _mm512_loadu_si512(x + 16);
    const __m512i L2 = _mm512_loadu_si512(x + 80), L3 = _mm512_loadu_si512(x + 96);
    const __m512i q0 = _mm512_permutex2var_epi32(L0, idx, L1), q1 = _mm512_permutex2var_epi32(L2, idx, L3);
    __m512i d0 = dpbusd(vnni, _mm512_setzero_si512(), nib_lo(q0), A0->lo);
    d0 = dpbusd(vnni, d0, nib_hi(q0), A0->hi);
    __m512i d1 = dpbusd(vnni, _mm512_setzero_si512(), nib_lo(q1), A1->lo);
    d1 = dpbusd(vnni, d1, nib_hi(q1), A1->hi);
    const __m256i dm = _mm512_castsi512_si256(
        _mm512_permutex2var_epi32(L0, _mm512_setr_epi32(0, 5, 10, 15, 16, 21, 26, 31, 0, 0, 0, 0, 0, 0, 0, 0), L2));
    const __m512 dmf = _mm512_cvtph_ps(dm);
    const __m512 p = _mm512_mul_ps(dmf, ds16); /* [d*da, m*s] x 8: the d*da */
    /* exactly the float steps of two quad_q4_1 */
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0),
                           _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6), p), *acc);
    *acc = min_fma(_mm512_castps512_ps256(dmf), A0->ds, *acc);
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1),
                           _mm512_permutexvar_ps(_mm512_setr_epi32(8, 8, 8, 8, 10, 10, 10, 10, 12, 12, 12, 12, 14, 14, 14, 14), p),
                           *acc);
    *acc = min_fma(_mm512_extractf32x8_ps(dmf, 1), A1->ds, *acc);
}

/* Q4_1, the last rem (1 or 2) blocks of two rows in one quad: slots 0, 1
 * are row 0's blocks, slots 2, 3 row 1's (Ap: the activation quad
 * [a_i, a_i+1, a_i, a_i+1], zeros past the row). Short rows (n = 576: 18
 * blocks) would otherwise spend a whole masked quad per row on 2 blocks.
 * Row 1's lanes are moved down to 0..7 before they are added, so that both
 * rows see exactly the float steps of a partial quad_q4_1 (lanes 8..15 of
 * the accumulators, which the partial quad leaves at +0 + 0*0, untouched). */
INLINE void pair_q4_1(const int vnni, int rem, const uint8_t *x0, const uint8_t *x1, const act4 *Ap, __m512 *acc0,
                      __m512 *acc1) {
    const __mmask64 k = _cvtu64_mask64(_bzhi_u64(~0ull, 20u * (unsigned)rem));
    const __m512i W0 = _mm512_maskz_loadu_epi8(k, x0), W1 = _mm512_maskz_loadu_epi8(k, x1);
    const __m512i q = _mm512_permutex2var_epi32(
        W0, _mm512_setr_epi32(1, 2, 3, 4, 6, 7, 8, 9, 17, 18, 19, 20, 22, 23, 24, 25), W1);
    __m512i dot = dpbusd(vnni, _mm512_setzero_si512(), nib_lo(q), Ap->lo);
    dot = dpbusd(vnni, dot, nib_hi(q), Ap->hi);
    const __m128i dm = _mm512_castsi512_si128(
        _mm512_permutex2var_epi32(W0, _mm512_setr_epi32(0, 5, 16, 21, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), W1));
    const __m256 dmf = _mm256_cvtph_ps(dm); /* [d m d' m'] of row 0, then of row 1 */
    const __m256 p = _mm256_mul_ps(dmf, Ap->ds);
    const __m512 dotf = _mm512_cvtepi32_ps(dot), pat = spread4_even(p);
    *acc0 = _mm512_mask3_fmadd_ps(dotf, pat, *acc0, 0x00ff);
    *acc0 = _mm512_mask3_fmadd_ps(_mm512_zextps256_ps512(dmf), _mm512_zextps256_ps512(Ap->ds), *acc0, 0x0a);
    const __m512 dotf1 = _mm512_shuffle_f32x4(dotf, dotf, 0x4e), pat1 = _mm512_shuffle_f32x4(pat, pat, 0x4e);
    *acc1 = _mm512_mask3_fmadd_ps(dotf1, pat1, *acc1, 0x00ff);
    const __m256 dmf1 = _mm256_zextps128_ps256(_mm256_extractf128_ps(dmf, 1));
    *acc1 = _mm512_mask3_fmadd_ps(_mm512_zextps256_ps512(dmf1),
                                  _mm512_zextps256_ps512(Ap->ds), *acc1, 0x0a);
}

/* offsets c of the act side: 128 only on the VNNI path of the signed formats */
/* formats with a two-quad step */
#define OCT_q4_0 0
#define OCT_q4_1 1
#define OCT_q5_0 0
#define OCT_q5_1 0
#define OCT_q8_0 0
#define OCT_iq4_nl 0
#define OCT_mxfp4 0
/* formats with a two-row step for the last 1-2 blocks */
#define PAIR_q4_0 0
#define PAIR_q4_1 1
#define PAIR_q5_0 0
#define PAIR_q5_1 0
#define PAIR_q8_0 0
#define PAIR_iq4_nl 0
#define PAIR_mxfp4 0
#define pair_q4_0(...) ((void)0)
#define pair_q5_0(...) ((void)0)
#define pair_q5_1(...) ((void)0)
#define pair_q8_0(...) ((void)0)
#define pair_iq4_nl(...) ((void)0)
#define pair_mxfp4(...) ((void)0)
#define oct_q4_0(...) ((void)0)
#define oct_q5_0(...) ((void)0)
#define oct_q5_1(...) ((void)0)
#define oct_q8_0(...) ((void)0)
#define oct_iq4_nl(...) ((void)0)
#define oct_mxfp4(...) ((void)0)

#define C_q4_0(v) 8
#define C_q4_1(v) 0
#define C_q5_0(v) 16
#define C_q5_1(v) 0
#define C_q8_0(v) ((v) ? 128 : 0)
#define C_iq4_nl(v) ((v) ? 128 : 0)
#define C_mxfp4(v) ((v) ? 128 : 0)

/* the activation quads of blocks [i, i + nblk), nblk <= 4 (missing blocks: zeros) */
INLINE void act4_prep(const block_q8_32 *y, int nblk, const int c, const int vnni, act4 *A) {
    if (nblk >= 4) {
        act4_load(y, c, vnni, A);
    } else {
        block_q8_32 tmp[4];
        memset(tmp, 0, sizeof tmp);
        memcpy(tmp, y, (size_t)nblk * sizeof *y);
        act4_load(tmp, c, vnni, A);
    }
}

/* gemv prepares the activation quads once, for at most ACT_CHUNK quads at a
 * time (16 KB of stack), and shares them across all its rows */
#define ACT_CHUNK 64

/* The float result of a row is fixed by this order (the contract of
 * quants.h): the row's blocks are summed in groups of RED_BLOCKS from its
 * start; in a group, first hex after hex (16 blocks: acc = fma(float(dot16),
 * d*da, acc) with one lane per block in M order, then for Q4_1/Q5_1 acc =
 * fma(m, s, acc)), then on the group's last < 16 blocks quad after quad (a
 * last partial quad padded with zero blocks), acc = fma(float(dot), d*da,
 * acc), then for Q4_1/Q5_1 lanes 2k+1 += m_k * s_k (fused); each group's
 * 16 lanes are summed by hsum16 (reduce4 order) and added to the row's sum
 * in group order. vec_dot, gemv (any rows) and gemm all follow it: the
 * octs, the two-row pairs and the gemm tiles are the same float steps, only
 * the decode is shared. (RED_BLOCKS is a multiple of 16: hexes never cross
 * groups.) */
#define RED_BLOCKS 64
_Static_assert(4 * ACT_CHUNK % RED_BLOCKS == 0 && RED_BLOCKS % 16 == 0, "activation chunks hold whole groups, groups whole hexes");

/* R rows (compile-time) against nb blocks of one activation row; Ab: the
 * prepared quads, or NULL to prepare them on the fly (vec_dot). out[r] =
 * the rows' sums, added to out[r] when cont (a later chunk of the row).
 * L: where the rows are (quants.h rows_at; every hex step starts a unit); pf: gemv's prefetch plan (quants.h), NULL for none. */
#define DEFINE_ROWS(name, block_t)                                                                        \
    INLINE void rows_##name(const int R, const int vnni, int64_t nb, const char *w, const rows_at *L,       \
                            const block_q8_32 *y, const act4 *Ab, const acth *Hb, const act4 *Apair,       \
                            float *out, const int cont, const gemv_pf *pf) {                               \
        float sum[4];                                                                                      \
        for (int r = 0; r < R; r++) sum[r] = cont ? out[r] : 0.0f;                                         \
        const int rem = (int)(nb & 3);                                                                     \
        const int paired = PAIR_##name && R == 4 && Apair && (rem == 1 || rem == 2);                       \
        for (int64_t g0 = 0; g0 < nb; g0 += RED_BLOCKS) {                                                  \
            const int64_t g1 = nb - g0 < RED_BLOCKS ? nb : g0 + RED_BLOCKS;                                \
            __m512 acc[4];                                                                                 \
            for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();                                      \
            int64_t i = g0;                                                                                \
            for (; i + 16 <= g1; i += 16) {                                                                \
                act4 Al[4];                                                                                \
                acth Hl;                                                                                   \
                const act4 *A = Ab ? &Ab[i / 4] : Al;                                                      \
                const acth *H = Hb ? &Hb[i / 16] : &Hl;                                                    \
                if (!Ab) {                                                                                 \
                    for (int q = 0; q < 4; q++) act4_load(y + i + 4 * q, C_##name(vnni), vnni, &Al[q]);    \
                    acth_of(Al, &Hl);                                                                      \
                }                                                                                          \
                const size_t off = (size_t)i * sizeof(block_t);                                            \
                /* the hex's prefetch in 4 steps of 4 blocks, one before each row (R = 4): a burst \
                 * of 24 lines at once streamed ~10% slower from DRAM */                                 \
                for (int r = 0; r < R; r++) {                                                              \
                    if (pf)                                                                                \
                        for (int k = R == 4 ? r : 0; k < (R == 4 ? r + 1 : 4); k++)                        \
                            gemv_prefetch_step(pf, R, (uintptr_t)w + off + 4 * k * sizeof(block_t),        \
                                               off + 4 * k * sizeof(block_t), 4 * sizeof(block_t));        \
                    hex_##name(vnni, row_at(w, L, r, off, off), A, H, &acc[r]);                                   \
                }                                                                                          \
            }                                                                                              \
            if (OCT_##name)                                                                                \
                for (; i + 8 <= g1; i += 8) {                                                              \
                    act4 A0l, A1l;                                                                         \
                    const act4 *A0 = Ab ? &Ab[i / 4] : &A0l, *A1 = Ab ? &Ab[i / 4 + 1] : &A1l;             \
                    if (!Ab)                                                                               \
                        act4_load(y + i, C_##name(vnni), vnni, &A0l),                                      \
                            act4_load(y + i + 4, C_##name(vnni), vnni, &A1l);                              \
                    const __m512 ds16 = _mm512_insertf32x8(_mm512_castps256_ps512(A0->ds), A1->ds, 1);     \
                    const size_t off = (size_t)i * sizeof(block_t);                                        \
                    (void)ds16, (void)off;                                                                 \
                    if (pf) gemv_prefetch_step(pf, R, (uintptr_t)w + off, off, 8 * sizeof(block_t));                               \
                    for (int r = 0; r < R; r++)                                                            \
                        oct_##name(vnni, row_at(w, L, r, off, off), A0, A1, ds16, &acc[r]);                        \
                }                                                                                          \
            const int last = paired && g1 == nb;                                                           \
            const int64_t nq = last ? nb - rem : g1;                                                       \
            for (; i < nq; i += 4) {                                                                       \
                const int nblk = nq - i < 4 ? (int)(nq - i) : 4;                                           \
                act4 Aloc;                                                                                 \
                const act4 *A = Ab ? &Ab[i / 4] : &Aloc;                                                   \
                if (!Ab) act4_prep(y + i, nblk, C_##name(vnni), vnni, &Aloc);                              \
                const size_t off = (size_t)i * sizeof(block_t);                                            \
                if (pf) gemv_prefetch_step(pf, R, (uintptr_t)w + off, off, 4 * sizeof(block_t));                                   \
                if (nblk == 4)                                                                             \
                    for (int r = 0; r < R; r++)                                                            \
                        quad_##name(vnni, 1, 4, row_at(w, L, r, off, off), A, &acc[r]);                            \
                else                                                                                       \
                    for (int r = 0; r < R; r++)                                                            \
                        quad_##name(vnni, 0, nblk, row_at(w, L, r, off, off), A, &acc[r]);                         \
            }                                                                                              \
            if (last)                                                                                      \
                for (int r = 0; r < R; r += 2)                                                             \
                    pair_##name(vnni, rem, row_at(w, L, r, nq * sizeof(block_t), nq * sizeof(block_t)),                             \
                                row_at(w, L, r + 1, nq * sizeof(block_t), nq * sizeof(block_t)), Apair, &acc[r], &acc[r + 1]);      \
            if (R == 4) {                                                                                  \
                float part[4];                                                                             \
                _mm_storeu_ps(part, reduce4(acc[0], acc[1], acc[2], acc[3]));                              \
                for (int r = 0; r < 4; r++) sum[r] += part[r];                                             \
            } else {                                                                                       \
                for (int r = 0; r < R; r++) sum[r] += hsum16(acc[r]);                                      \
            }                                                                                              \
        }                                                                                                  \
        for (int r = 0; r < R; r++) out[r] = sum[r];                                                       \
    }                                                                                                      \
    /* rows4: w in the ROWS4 layout (read front to back, no software prefetch, as kgemv) */            \
    INLINE void qgemv_##name(const int vnni, const int rows4, int64_t n, const void *w, size_t rb,       \
                             int nrows, const void *a, float *out) {                                       \
        const block_q8_32 *y = a;                                                                          \
        const int64_t nb = n / QK;                                                                         \
        act4 Ab[ACT_CHUNK];                                                                                \
        acth Hb[ACT_CHUNK / 4];                                                                            \
        if (nb <= 0)                                                                                       \
            for (int r = 0; r < nrows; r++) out[r] = 0.0f;                                                 \
        for (int64_t c0 = 0; c0 < nb; c0 += 4 * ACT_CHUNK) {                                               \
            const int64_t cb = nb - c0 < 4 * ACT_CHUNK ? nb - c0 : 4 * ACT_CHUNK;                          \
            for (int64_t i = 0; i < cb; i += 4)                                                            \
                act4_prep(y + c0 + i, cb - i < 4 ? (int)(cb - i) : 4, C_##name(vnni), vnni, &Ab[i / 4]);  \
            for (int64_t h = 0; h < cb / 16; h++) acth_of(&Ab[4 * h], &Hb[h]);                            \
            act4 Apair;                                                                                    \
            const act4 *pp = NULL;                                                                         \
            const int rem = (int)(cb & 3);                                                                 \
            if (PAIR_##name && (rem == 1 || rem == 2)) {                                                   \
                block_q8_32 t[4];                                                                          \
                memset(t, 0, sizeof t);                                                                    \
                memcpy(&t[0], y + c0 + cb - rem, (size_t)rem * sizeof *y);                                 \
                memcpy(&t[2], y + c0 + cb - rem, (size_t)rem * sizeof *y);                                 \
                act4_load(t, C_##name(vnni), vnni, &Apair);                                                \
                pp = &Apair;                                                                               \
            }                                                                                              \
            const char *p = (const char *)w + (size_t)c0 * sizeof(block_t);                                \
            const size_t len = (size_t)cb * sizeof(block_t);                                               \
            const gemv_pf pf4 = gemv_prefetch_plan(4, rb, len), pf1 = gemv_prefetch_plan(1, rb, len);      \
            const rows_at plain = rows_plain(rb), group = rows_group(16 * sizeof(block_t), len);           \
            int r = 0;                                                                                     \
            for (; r + 4 <= nrows; r += 4, p += 4 * rb)                                                    \
                if (rows4) /* the chunk's units start 4 c0 blocks into the group */                        \
                    rows_##name(4, vnni, cb, p + 3 * (size_t)c0 * sizeof(block_t), &group, NULL, Ab, Hb, pp, \
                                out + r, c0 > 0, NULL);                                                    \
                else                                                                                       \
                    rows_##name(4, vnni, cb, p, &plain, NULL, Ab, Hb, pp, out + r, c0 > 0, &pf4);           \
            for (; r < nrows; r++, p += rb) rows_##name(1, vnni, cb, p, &plain, NULL, Ab, Hb, NULL, out + r, c0 > 0, &pf1); \
        }                                                                                                  \
    }                                                                                                      \
    INLINE void gemv_##name##_impl(const int vnni, int64_t n, const void *w, size_t rb, int nrows,      \
                                   const void *a, float *out) {                                            \
        qgemv_##name(vnni, 0, n, w, rb, nrows, a, out);                                                    \
    }                                                                                                      \
    DEFINE_GEMV4_VARIANTS(name, qgemv_##name)                                                             \
    INLINE float vec_dot_##name##_impl(const int vnni, int64_t n, const void *w, const void *a) {      \
        float r;                                                                                        \
        const rows_at one = rows_plain(0);                                                              \
        rows_##name(1, vnni, n / QK, w, &one, a, NULL, NULL, NULL, &r, 0, NULL);                        \
        return r;                                                                                       \
    }

DEFINE_ROWS(q4_0, block_q4_0)
DEFINE_ROWS(q4_1, block_q4_1)
DEFINE_ROWS(q5_0, block_q5_0)
DEFINE_ROWS(q5_1, block_q5_1)
DEFINE_ROWS(q8_0, block_q8_0)
DEFINE_ROWS(iq4_nl, block_iq4_nl)
DEFINE_ROWS(mxfp4, block_mxfp4)

/* ------------------------------------------------------------------ */
/* the gemm kernels' buffers                                              */
/* ------------------------------------------------------------------ */
/* The gemm kernels decode a tile's weights and prepare the activation rows
 * into buffers of up to GEMM_SCRATCH bytes, too large for every thread's
 * stack (musl gives threads 128 KB): one heap buffer per thread, allocated
 * at its first gemm and freed when the thread exits. */
#define GEMM_SCRATCH (192 * 1024)
/* With this few activation rows the weights' stream is the cost, not their decode: the
 * K-quant gemm then decodes each super-block once in place and dots it with every
 * activation row (kfew_*), instead of decoding tiles into buffers */
#define GEMM_FEW_COLS 8
/* f(C, ...) with C the constant equal to ncols (1..GEMM_FEW_COLS): each case compiled with its
 * own constant, so the per-row accumulators of the few-rows kernels stay in registers */
#define FEW_CASES(ncols, f, ...)                                                                           \
    switch (ncols) {                                                                                       \
    case 1: f(1, __VA_ARGS__); break;                                                                      \
    case 2: f(2, __VA_ARGS__); break;                                                                      \
    case 3: f(3, __VA_ARGS__); break;                                                                      \
    case 4: f(4, __VA_ARGS__); break;                                                                      \
    case 5: f(5, __VA_ARGS__); break;                                                                      \
    case 6: f(6, __VA_ARGS__); break;                                                                      \
    case 7: f(7, __VA_ARGS__); break;                                                                      \
    default: f(8, __VA_ARGS__); break;                                                                     \
    }
_Static_assert(GEMM_FEW_COLS == 8, "FEW_CASES covers 1..GEMM_FEW_COLS");

static pthread_key_t gemm_scratch_key;
static pthread_once_t gemm_scratch_once = PTHREAD_ONCE_INIT;
static void gemm_scratch_free(void *p) { free(p); }
static void gemm_scratch_init(void) {
    if (pthread_key_create(&gemm_scratch_key, gemm_scratch_free) != 0) abort();
}

static unsigned char *gemm_scratch(void) {
    pthread_once(&gemm_scratch_once, gemm_scratch_init);
    unsigned char *p = pthread_getspecific(gemm_scratch_key);
    if (!p) {
        p = aligned_alloc(64, GEMM_SCRATCH);
        if (!p || pthread_setspecific(gemm_scratch_key, p) != 0) abort(); /* out of memory */
    }
    return p;
}

/* ------------------------------------------------------------------ */
/* gemm: a tile of rows against all the activation rows of a prompt      */
/* ------------------------------------------------------------------ */
/* Each weight block of the tile is decoded once per call (gather, nibble
 * split / 5th bits, scales to float: dec_* below) into a buffer of
 * ready-to-use vectors, and each activation row's blocks are prepared once
 * per pass over the rows, GEMM_TP activation rows at a time. A micro-kernel
 * then runs GEMM_R rows x GEMM_T activation rows from those buffers, with
 * no decoding: per (row, activation row)
 *   hex (16 blocks): 8 vpdpbusd into one int32 lane per block (the weights
 *     and activations stored transposed: vector j holds dword j of every
 *     block, in M order), seeded with the activation's -c * sums; then one
 *     convert, multiply and FMA (and the mins' FMA);
 *   quad (the last < 16 blocks of a group): 2 vpdpbusd, convert, multiply,
 *     FMA (and the mins' masked FMA).
 * The float steps are gemv's (RED_BLOCKS groups; hexes, then quads; reduce4). */

#ifndef GEMM_R
#define GEMM_R 4 /* micro-kernel: rows x activation rows */
#endif
#ifndef GEMM_T
#define GEMM_T 4
#endif
#define GEMM_CHUNK 16 /* quads per pass: one reduction group */
_Static_assert(4 * GEMM_CHUNK == RED_BLOCKS, "a gemm chunk is one reduction group");
#ifndef GEMM_WBUF
#define GEMM_WBUF (64 * 1024) /* bytes of decoded weights per pass (L2) */
#endif
#ifndef GEMM_TP
#define GEMM_TP 8 /* activation rows prepared per panel */
#endif
_Static_assert(GEMM_WBUF + GEMM_TP * 4096 <= GEMM_SCRATCH, "32-element gemm buffers fit the scratch");

/* a row's quad, decoded: lo/hi quants in the quad layout (unsigned with
 * offset c, or signed for the no-VNNI path of Q8_0/IQ4_NL/MXFP4), dpat the
 * blocks' d as [d0 x4, ...], mz (Q4_1/Q5_1) m_k in lanes 2k+1 */
typedef struct {
    __m512i lo, hi;
    __m512 dpat, mz;
} wquad;

/* as stored in the gemm's buffers. Quads: lo, hi, dpat; beside them the
 * mins (__m256 [d m] x 4) and, on the no-VNNI path of the signed formats,
 * the sign masks of lo/hi (lo/hi then hold |w|). Hexes: v[j] = dword j of
 * each block (j < 4 from lo, j >= 4 from hi), d, in M order; beside them
 * the mins (__m512 m, M order) and the 8 sign masks. */
typedef struct {
    __m512i lo, hi;
    __m512 dpat;
} wq;
typedef struct {
    __m512i v[8];
    __m512 d;
} whex;

/* an activation row's quad / hex, prepared: quants, -c * sums, da (quad
 * pattern / M order); beside them the [da s] pairs / s (mins) */
typedef struct {
    __m512i lo, hi, negc;
    __m512 dapat;
} aq;
typedef struct {
    __m512i v[8], negc;
    __m512 da;
} ahex;

INLINE __m512 dpat_of(__m128i dh) { return spread4(_mm_cvtph_ps(dh)); }

INLINE void dec_q4_0(const int vnni, const int full, const int nblk, const uint8_t *x, wquad *W) {
    (void)vnni;
    const __m512i q = q4_quad(full, nblk, x);
    W->lo = nib_lo(q), W->hi = nib_hi(q);
    W->dpat = dpat_of(d4_scalar(x, 18, full, nblk));
}

INLINE void dec_book(__m512i q, __m512i tab, __m128 d, wquad *W) {
    W->lo = _mm512_shuffle_epi8(tab, nib_lo(q)), W->hi = _mm512_shuffle_epi8(tab, nib_hi(q));
    W->dpat = spread4(d);
}

INLINE void dec_iq4_nl(const int vnni, const int full, const int nblk, const uint8_t *x, wquad *W) {
    dec_book(q4_quad(full, nblk, x), book_table(vnni, kvalues_iq4nl), _mm_cvtph_ps(d4_scalar(x, 18, full, nblk)), W);
}

INLINE void dec_mxfp4(const int vnni, const int full, const int nblk, const uint8_t *x, wquad *W) {
    dec_book(mxfp4_qs(full, nblk, x), book_table(vnni, kvalues_mxfp4), e8m0_4(x, full, nblk), W);
}

INLINE void dec_q4_1(const int vnni, const int full, const int nblk, const uint8_t *x, wquad *W) {
    (void)vnni;
    const __m512i L0 = LDW(x, 0, 20), L1 = LDW(x, 16, 20);
    const __m512i q = _mm512_permutex2var_epi32(
        L0, _mm512_setr_epi32(1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14, 28, 29, 30, 31), L1);
    W->lo = nib_lo(q), W->hi = nib_hi(q);
    const __m256 dmf = _mm256_cvtph_ps(_mm512_castsi512_si128(
        _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 5, 10, 15, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), L0)));
    W->dpat = spread4_even(dmf), W->mz = _mm512_zextps256_ps512(dmf);
}

INLINE void dec_q5_0(const int vnni, const int full, const int nblk, const uint8_t *x, wquad *W) {
    (void)vnni;
    const __m512i L0 = LDW(x, 0, 22), L1 = LDW(x, 24, 22);
    const __m512i q = _mm512_permutex2var_epi16(
        L0, IDX16(3, 4, 5, 6, 7, 8, 9, 10, 14, 15, 16, 17, 18, 19, 20, 21, 45, 46, 47, 48, 49, 50, 51, 52, 56, 57, 58, 59, 60, 61, 62, 63),
        L1);
    __mmask64 klo, khi;
    q5_masks(QH(x, 2, 22, 0), QH(x, 2, 22, 1), QH(x, 2, 22, 2), QH(x, 2, 22, 3), &klo, &khi);
    const __m512i b4 = _mm512_set1_epi8(0x10), lo = nib_lo(q), hi = nib_hi(q);
    W->lo = _mm512_mask_add_epi8(lo, klo, lo, b4), W->hi = _mm512_mask_add_epi8(hi, khi, hi, b4);
    W->dpat = dpat_of(d4_scalar(x, 22, full, nblk));
}

INLINE void dec_q5_1(const int vnni, const int full, const int nblk, const uint8_t *x, wquad *W) {
    (void)vnni;
    const __m512i L0 = LDW(x, 0, 24), L1 = LDW(x, 32, 24);
    const __m512i q = _mm512_permutex2var_epi32(
        L0, _mm512_setr_epi32(2, 3, 4, 5, 8, 9, 10, 11, 22, 23, 24, 25, 28, 29, 30, 31), L1);
    __mmask64 klo, khi;
    q5_masks(QH(x, 4, 24, 0), QH(x, 4, 24, 1), QH(x, 4, 24, 2), QH(x, 4, 24, 3), &klo, &khi);
    const __m512i b4 = _mm512_set1_epi8(0x10), lo = nib_lo(q), hi = nib_hi(q);
    W->lo = _mm512_mask_add_epi8(lo, klo, lo, b4), W->hi = _mm512_mask_add_epi8(hi, khi, hi, b4);
    const __m256 dmf = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi32(
        L0, _mm512_setr_epi32(0, 6, 12, 26, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), L1)));
    W->dpat = spread4_even(dmf), W->mz = _mm512_zextps256_ps512(dmf);
}

INLINE void dec_q8_0(const int vnni, const int full, const int nblk, const uint8_t *x, wquad *W) {
    const __m512i S0 = LDW(x, 0, 34), S1 = LDW(x, 64, 34);
    const __m512i T0 = LDW(x, 16, 34), T1 = LDW(x, 72, 34);
    W->lo = _mm512_permutex2var_epi16(
        S0, IDX16(1, 2, 3, 4, 5, 6, 7, 8, 18, 19, 20, 21, 22, 23, 24, 25, 35, 36, 37, 38, 39, 40, 41, 42, 52, 53, 54, 55, 56, 57, 58, 59),
        S1);
    W->hi = _mm512_permutex2var_epi16(
        T0, IDX16(1, 2, 3, 4, 5, 6, 7, 8, 18, 19, 20, 21, 22, 23, 24, 25, 39, 40, 41, 42, 43, 44, 45, 46, 56, 57, 58, 59, 60, 61, 62, 63),
        T1);
    if (vnni) {
        const __m512i f = _mm512_set1_epi8((char)0x80);
        W->lo = _mm512_xor_si512(W->lo, f), W->hi = _mm512_xor_si512(W->hi, f);
    }
    W->dpat = dpat_of(d4_scalar(x, 34, full, nblk));
}

/* [x0 . x1 . x2 . x3 . ...] -> [x0 x4 ... ] from the odd lanes: [y_k x4] of [x_k y_k] pairs */
INLINE __m512 spread4_odd(__m512 v) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7), v);
}

/* the int32 dot of a decoded weight quad and a prepared activation quad,
 * seeded with the activation's -c * sum. Without VNNI: unsigned weights
 * (u <= 31, |a| <= 128: each vpmaddubsw word <= 7936) add their lo and hi
 * words before one vpmaddwd; signed ones (|w| kept, the sign moved to the
 * activation by the masks ks) take one vpmaddwd each. Exact either way. */
INLINE __m512i gdot(const int vnni, const int sgn, const wq *w, const uint64_t *ks, const aq *a) {
    if (vnni) return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a->negc, w->lo, a->lo), w->hi, a->hi);
    const __m512i ones = _mm512_set1_epi16(1);
    if (sgn) {
        const __m512i z = _mm512_setzero_si512();
        const __m512i al = _mm512_mask_sub_epi8(a->lo, _cvtu64_mask64(ks[0]), z, a->lo);
        const __m512i ah = _mm512_mask_sub_epi8(a->hi, _cvtu64_mask64(ks[1]), z, a->hi);
        return _mm512_add_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(w->lo, al), ones),
                                _mm512_madd_epi16(_mm512_maddubs_epi16(w->hi, ah), ones));
    }
    const __m512i p = _mm512_add_epi16(_mm512_maddubs_epi16(w->lo, a->lo), _mm512_maddubs_epi16(w->hi, a->hi));
    return _mm512_add_epi32(a->negc, _mm512_madd_epi16(p, ones));
}

/* vpmaddubsw of |w| and the activation with w's signs (no VNNI, signed formats) */
INLINE __m512i sdot16(__m512i w, uint64_t k, __m512i a) {
    return _mm512_maddubs_epi16(w, _mm512_mask_sub_epi8(a, _cvtu64_mask64(k), _mm512_setzero_si512(), a));
}

/* a hex's int32 dot, for R rows x T activation rows at once: s[r][t] =
 * the activation's -c * sums + sum_j dot(w_r.v[j], a_t.v[j]). Without VNNI
 * the unsigned formats add 4 vpmaddubsw words (4 * 7936 < 32768) before
 * each vpmaddwd; the signed formats take one vpmaddwd per vector. */
INLINE void hexdot(const int R, const int T, const int vnni, const int sgn, const whex *const *w,
                   const uint64_t *const *wk, const ahex *const *a, __m512i s[4][4]) {
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) s[r][t] = a[t]->negc;
    if (vnni) {
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                const __m512i av = a[t]->v[j];
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                    s[r][t] = _mm512_dpbusd_epi32(s[r][t], w[r]->v[j], av);
            }
        return;
    }
    const __m512i ones = _mm512_set1_epi16(1);
    if (sgn) {
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                    s[r][t] = _mm512_add_epi32(s[r][t], _mm512_madd_epi16(sdot16(w[r]->v[j], wk[r][j], a[t]->v[j]), ones));
        return;
    }
    _Pragma("GCC unroll 2") for (int j = 0; j < 8; j += 4)
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                __m512i p = _mm512_maddubs_epi16(w[r]->v[j], a[t]->v[j]);
                p = _mm512_add_epi16(p, _mm512_maddubs_epi16(w[r]->v[j + 1], a[t]->v[j + 1]));
                p = _mm512_add_epi16(p, _mm512_maddubs_epi16(w[r]->v[j + 2], a[t]->v[j + 2]));
                p = _mm512_add_epi16(p, _mm512_maddubs_epi16(w[r]->v[j + 3], a[t]->v[j + 3]));
                s[r][t] = _mm512_add_epi32(s[r][t], _mm512_madd_epi16(p, ones));
            }
}

/* The gemm's buffers for one pass: per row, nh hexes then nq quads (and
 * beside them the mins and sign masks); per activation row, the same. */
typedef struct {
    whex *h; __m512 *hm; uint64_t *hk; /* hexes: nh per row */
    wq *q; __m256 *qm; uint64_t *qk;   /* quads: nq per row */
} wbufs;
typedef struct {
    ahex *h; __m512 *hs;
    aq *q; __m256 *qd;
} abufs;

/* activation quads per pass of few_* (whole RED_BLOCKS groups) */
#define FEW_QUADS 32
_Static_assert(4 * FEW_QUADS % RED_BLOCKS == 0, "a pass of few_* holds whole groups");

#define DEFINE_FEW(name, block_t)                                                                          \
    /* gemm with few activation rows (VNNI): the weights stream once, as in gemv, each quad decoded once  \
     * (qw_*) and dotted with every activation row. Per (row, activation row) exactly rows_*'s float      \
     * steps: hexes (the products d * da taken in M order, as m_order4 of them would be), then quads. */  \
    INLINE void few_##name##_t(const int ncols, int64_t n, const void *w, size_t rb, int nrows, const void *a, \
                               size_t as, float *out, size_t os) {                                           \
        const int64_t nb = n / QK;                                                                           \
        const int mins = HAS_MIN_##name;                                                                     \
        act4(*const Ab)[FEW_QUADS] = (act4(*)[FEW_QUADS])(void *)gemm_scratch();                             \
        acth(*const Hb)[FEW_QUADS / 4] = (acth(*)[FEW_QUADS / 4])(void *)(Ab + GEMM_FEW_COLS);               \
        for (int t = 0; t < ncols; t++)                                                                      \
            for (int r = 0; r < nrows; r++) out[t * os + r] = 0.0f;                                          \
        for (int64_t c0 = 0; c0 < nb; c0 += 4 * FEW_QUADS) {                                                 \
            const int64_t cb = nb - c0 < 4 * FEW_QUADS ? nb - c0 : 4 * FEW_QUADS;                            \
            for (int t = 0; t < ncols; t++) {                                                                \
                const block_q8_32 *y = (const block_q8_32 *)(const void *)((const char *)a + (size_t)t * as) + c0; \
                for (int64_t i = 0; i < cb; i += 4)                                                          \
                    act4_prep(y + i, cb - i < 4 ? (int)(cb - i) : 4, C_##name(1), 1, &Ab[t][i / 4]);        \
                for (int64_t h = 0; h < cb / 16; h++) acth_of(&Ab[t][4 * h], &Hb[t][h]);                     \
            }                                                                                                \
            const char *p = (const char *)w + (size_t)c0 * sizeof(block_t);                                  \
            const gemv_pf pf = gemv_prefetch_plan(1, rb, (size_t)cb * sizeof(block_t));                      \
            for (int r = 0; r < nrows; r++, p += rb)                                                         \
                for (int64_t g0 = 0; g0 < cb; g0 += RED_BLOCKS) {                                            \
                    const int64_t g1 = cb - g0 < RED_BLOCKS ? cb : g0 + RED_BLOCKS;                          \
                    __m512 acc[GEMM_FEW_COLS];                                                               \
                    for (int t = 0; t < ncols; t++) acc[t] = _mm512_setzero_ps();                            \
                    int64_t i = g0;                                                                          \
                    for (; i + 16 <= g1; i += 16) {                                                          \
                        const size_t off = (size_t)i * sizeof(block_t);                                     \
                        gemv_prefetch_step(&pf, 1, (uintptr_t)p + off, off, 16 * sizeof(block_t));           \
                        qwd Wq[4];                                                                         \
                        for (int q = 0; q < 4; q++) qw_##name(1, 1, 4, (const uint8_t *)p + off + 4 * q * sizeof(block_t), &Wq[q]); \
                        const __m512 dM = mins ? m_order_pairs(Wq[0].dm, Wq[1].dm, Wq[2].dm, Wq[3].dm, 0)       \
                                               : m_order4(Wq[0].d, Wq[1].d, Wq[2].d, Wq[3].d);             \
                        const __m512 mM = mins ? m_order_pairs(Wq[0].dm, Wq[1].dm, Wq[2].dm, Wq[3].dm, 1)       \
                                               : _mm512_setzero_ps();                                        \
                        for (int t = 0; t < ncols; t++) {                                                    \
                            const act4 *A = &Ab[t][i / 4];                                                   \
                            const acth *H = &Hb[t][i / 16];                                                  \
                            const __m512 dot = _mm512_cvtepi32_ps(red4i(qw_dot(1, 0, &Wq[0], &A[0]), qw_dot(1, 0, &Wq[1], &A[1]), \
                                                                        qw_dot(1, 0, &Wq[2], &A[2]), qw_dot(1, 0, &Wq[3], &A[3]))); \
                            acc[t] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dM, H->da), acc[t]);                 \
                            if (mins) acc[t] = _mm512_fmadd_ps(mM, H->s, acc[t]);                            \
                        }                                                                                    \
                    }                                                                                        \
                    for (; i < g1; i += 4) {                                                                 \
                        const int nblk = g1 - i < 4 ? (int)(g1 - i) : 4;                                     \
                        const size_t off = (size_t)i * sizeof(block_t);                                     \
                        gemv_prefetch_step(&pf, 1, (uintptr_t)p + off, off, 4 * sizeof(block_t));            \
                        qwd Wq;                                                                            \
                        if (nblk == 4)                                                                       \
                            qw_##name(1, 1, 4, (const uint8_t *)p + off, &Wq);                                  \
                        else                                                                                 \
                            qw_##name(1, 0, nblk, (const uint8_t *)p + off, &Wq);                               \
                        for (int t = 0; t < ncols; t++) {                                                    \
                            const act4 *A = &Ab[t][i / 4];                                                   \
                            qres Q;                                                                          \
                            Q.dot = qw_dot(1, 0, &Wq, A);                                                          \
                            Q.dd = mins ? _mm_setzero_ps() : _mm_mul_ps(Wq.d, A->da);                        \
                            Q.dm = Wq.dm;                                                                    \
                            quad_fin(mins, &Q, A, &acc[t]);                                                  \
                        }                                                                                    \
                    }                                                                                        \
                    for (int t = 0; t < ncols; t++) out[t * os + r] += hsum16(acc[t]);                       \
                }                                                                                            \
        }                                                                                                    \
    }                                                                                                    \
    static void few_##name(int64_t n, const void *w, size_t rb, int nrows, const void *a, size_t as, int ncols, \
                           float *out, size_t os) {                                                          \
        FEW_CASES(ncols, few_##name##_t, n, w, rb, nrows, a, as, out, os)                                    \
    }

#define DEFINE_GEMM(name, block_t)                                                                         \
    /* R rows x T activation rows over one group (nh hexes, nq quads), from the buffers (W: the first    \
     * row's hexes/quads at index wi (row r: + r * nh / r * nq), A: the first activation row's at ai);    \
     * out[t * os + r] += the group's sums */                                                             \
    INLINE void gk_##name(const int R, const int T, const int vnni, int nh, int nq, const wbufs *W, size_t wh, \
                          size_t wqi, const abufs *A, size_t ah, size_t aqi, float *out, size_t os) {       \
        const int mins = HAS_MIN_##name, sgn = !vnni && SIGNED_##name;                                          \
        /* acc: the quads' accumulators, in registers; acch: the hexes', kept in memory (the compiler \
         * barrier below), so that the 16 int32 sums and the 8 operands of a hex step keep the         \
         * registers: a zmm load issues ~1 per cycle, so reloading operands costs more than this */    \
        __m512 acc[4][4], acch[4][4];                                                                       \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                                 \
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[r][t] = acch[r][t] = _mm512_setzero_ps(); \
        for (int h = 0; h < nh; h++) {                                                                      \
            const whex *w[4];                                                                               \
            const uint64_t *wk[4];                                                                          \
            const ahex *a[4];                                                                               \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                           \
                w[r] = W->h + wh + (size_t)r * nh + h;                                                      \
                wk[r] = sgn ? W->hk + 8 * (wh + (size_t)r * nh + h) : NULL;                                 \
            }                                                                                               \
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) a[t] = A->h + ah + (size_t)t * nh + h;      \
            __m512i s[4][4];                                                                                \
            hexdot(R, T, vnni, sgn, w, wk, a, s);                                                           \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                             \
                _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {                                       \
                    __m512 c = h ? acch[r][t] : _mm512_setzero_ps();                                        \
                    c = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][t]), _mm512_mul_ps(w[r]->d, a[t]->da), c);  \
                    if (mins)                                                                               \
                        c = _mm512_fmadd_ps(W->hm[wh + (size_t)r * nh + h], A->hs[ah + (size_t)t * nh + h], c); \
                    acch[r][t] = c;                                                                         \
                }                                                                                           \
            __asm__ volatile("" ::: "memory");                                                              \
        }                                                                                                   \
        if (nh)                                                                                             \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                             \
                _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[r][t] = acch[r][t];                 \
        for (int q = 0; q < nq; q++) {                                                                      \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                           \
                const size_t wi = wqi + (size_t)r * nq + q;                                                 \
                const wq *w = W->q + wi;                                                                    \
                _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {                                       \
                    const size_t ai = aqi + (size_t)t * nq + q;                                             \
                    const aq *a = A->q + ai;                                                                \
                    const __m512i dot = gdot(vnni, sgn, w, sgn ? W->qk + 2 * wi : NULL, a);                 \
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(w->dpat, a->dapat), acc[r][t]); \
                    if (mins) /* lanes 1, 3, 5, 7: m_k * s_k */                                             \
                        acc[r][t] = _mm512_mask3_fmadd_ps(_mm512_zextps256_ps512(W->qm[wi]),                \
                                                          _mm512_zextps256_ps512(A->qd[ai]), acc[r][t], 0xaa); \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {                                               \
            if (R == 4) {                                                                                   \
                _mm_storeu_ps(out + t * os, _mm_add_ps(_mm_loadu_ps(out + t * os),                          \
                                                       reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]))); \
            } else {                                                                                        \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) out[t * os + r] += hsum16(acc[r][t]);   \
            }                                                                                               \
        }                                                                                                   \
    }                                                                                                       \
    /* decodes nh hexes and nq quads (the last with nlast blocks) of a row at x */                         \
    INLINE void gdec_##name(const int vnni, const uint8_t *x, int nh, int nq, int nlast, const wbufs *W,   \
                            size_t wh, size_t wqi) {                                                        \
        const int mins = HAS_MIN_##name, sgn = !vnni && SIGNED_##name;                                          \
        for (int h = 0; h < nh; h++, x += 16 * sizeof(block_t)) {                                           \
            wquad D[4];                                                                                     \
            for (int q = 0; q < 4; q++) dec_##name(vnni, 1, 4, x + 4 * q * sizeof(block_t), &D[q]);         \
            whex *o = W->h + wh + h;                                                                        \
            m_transpose(D[0].lo, D[1].lo, D[2].lo, D[3].lo, o->v);                                          \
            m_transpose(D[0].hi, D[1].hi, D[2].hi, D[3].hi, o->v + 4);                                      \
            o->d = m_blend4(D[0].dpat, D[1].dpat, D[2].dpat, D[3].dpat);                                    \
            if (mins)                                                                                       \
                W->hm[wh + h] = m_blend4(spread4_odd(D[0].mz), spread4_odd(D[1].mz), spread4_odd(D[2].mz),  \
                                         spread4_odd(D[3].mz));                                             \
            if (sgn)                                                                                        \
                for (int j = 0; j < 8; j++) {                                                               \
                    W->hk[8 * (wh + h) + j] = _cvtmask64_u64(_mm512_movepi8_mask(o->v[j]));                \
                    o->v[j] = _mm512_abs_epi8(o->v[j]);                                                     \
                }                                                                                           \
        }                                                                                                   \
        for (int q = 0; q < nq; q++) {                                                                      \
            const int nblk = q == nq - 1 ? nlast : 4;                                                       \
            wquad D;                                                                                        \
            if (nblk == 4)                                                                                  \
                dec_##name(vnni, 1, 4, x + 4 * q * sizeof(block_t), &D);                                    \
            else                                                                                            \
                dec_##name(vnni, 0, nblk, x + 4 * q * sizeof(block_t), &D);                                 \
            wq *o = W->q + wqi + q;                                                                         \
            o->dpat = D.dpat;                                                                               \
            if (mins) W->qm[wqi + q] = _mm512_castps512_ps256(D.mz);                                        \
            if (sgn) {                                                                                      \
                W->qk[2 * (wqi + q)] = _cvtmask64_u64(_mm512_movepi8_mask(D.lo));                           \
                W->qk[2 * (wqi + q) + 1] = _cvtmask64_u64(_mm512_movepi8_mask(D.hi));                       \
                D.lo = _mm512_abs_epi8(D.lo), D.hi = _mm512_abs_epi8(D.hi);                                 \
            }                                                                                               \
            o->lo = D.lo, o->hi = D.hi;                                                                     \
        }                                                                                                   \
    }                                                                                                       \
    /* prepares nh hexes and nq quads (the last with nlast blocks) of an activation row at y */            \
    INLINE void gprep_##name(const int vnni, const block_q8_32 *y, int nh, int nq, int nlast, const abufs *A, \
                             size_t ah, size_t aqi) {                                                       \
        const int c = C_##name(vnni);                                                                       \
        for (int h = 0; h < nh; h++, y += 16) {                                                             \
            act4 g[4];                                                                                      \
            for (int q = 0; q < 4; q++) act4_load(y + 4 * q, c, vnni, &g[q]);                               \
            ahex *o = A->h + ah + h;                                                                        \
            m_transpose(g[0].lo, g[1].lo, g[2].lo, g[3].lo, o->v);                                          \
            m_transpose(g[0].hi, g[1].hi, g[2].hi, g[3].hi, o->v + 4);                                      \
            o->negc = red4i(g[0].negc, g[1].negc, g[2].negc, g[3].negc);                                    \
            o->da = m_order4(g[0].da, g[1].da, g[2].da, g[3].da);                                           \
            if (HAS_MIN_##name) A->hs[ah + h] = m_order_pairs(g[0].ds, g[1].ds, g[2].ds, g[3].ds, 1);          \
        }                                                                                                   \
        for (int q = 0; q < nq; q++) {                                                                      \
            act4 g;                                                                                         \
            act4_prep(y + 4 * q, q == nq - 1 ? nlast : 4, c, vnni, &g);                                     \
            aq *o = A->q + aqi + q;                                                                         \
            o->lo = g.lo, o->hi = g.hi, o->negc = g.negc, o->dapat = spread4(g.da);                         \
            if (HAS_MIN_##name) A->qd[aqi + q] = g.ds;                                                          \
        }                                                                                                   \
    }                                                                                                       \
    INLINE void gemm_##name##_impl(const int vnni, int64_t n, const void *w, size_t rb, int nrows,         \
                                   const void *a, size_t as, int ncols, float *out, size_t os) {            \
        if (vnni && ncols <= GEMM_FEW_COLS) {                                                               \
            few_##name(n, w, rb, nrows, a, as, ncols, out, os);                                             \
            return;                                                                                         \
        }                                                                                                   \
        const int64_t nb = n / QK;                                                                          \
        const int mins = HAS_MIN_##name, sgn = !vnni && SIGNED_##name;                                          \
        unsigned char *const wmem = gemm_scratch(), *const amem = wmem + GEMM_WBUF;                         \
        for (int t = 0; t < ncols; t++)                                                                     \
            for (int r = 0; r < nrows; r++) out[t * os + r] = 0.0f;                                         \
        for (int64_t c0 = 0; c0 < nb; c0 += 4 * GEMM_CHUNK) {                                               \
            const int cb = nb - c0 < 4 * GEMM_CHUNK ? (int)(nb - c0) : 4 * GEMM_CHUNK;                      \
            const int nh = cb / 16, tail = cb - 16 * nh, nq = (tail + 3) / 4, nlast = tail - 4 * (nq - 1);  \
            /* bytes per row / activation row, each part a multiple of 64 */                               \
            const size_t hb = sizeof(whex) + (mins ? 64 : 0) + (sgn ? 64 : 0);                               \
            const size_t qb = sizeof(wq) + (mins ? 32 : 0) + (sgn ? 16 : 0);                                 \
            const int rpass = (int)(GEMM_WBUF / (nh * hb + nq * qb + 64)) / GEMM_R * GEMM_R;                \
            const int rp = rpass < nrows ? rpass : nrows;                                                   \
            wbufs W;                                                                                        \
            unsigned char *m = wmem;                                                                        \
            W.h = (whex *)(void *)m, m += (size_t)rp * nh * sizeof(whex);                                   \
            W.q = (wq *)(void *)m, m += (size_t)rp * nq * sizeof(wq);                                       \
            W.hm = (__m512 *)(void *)m, m += mins ? (size_t)rp * nh * 64 : 0;                               \
            W.qm = (__m256 *)(void *)m, m += mins ? (size_t)rp * nq * 32 : 0;                               \
            m = (unsigned char *)(((uintptr_t)m + 63) & ~(uintptr_t)63);                                    \
            W.hk = (uint64_t *)(void *)m, m += sgn ? (size_t)rp * nh * 64 : 0;                              \
            W.qk = (uint64_t *)(void *)m;                                                                   \
            abufs A;                                                                                        \
            m = amem;                                                                                       \
            A.h = (ahex *)(void *)m, m += (size_t)GEMM_TP * nh * sizeof(ahex);                              \
            A.q = (aq *)(void *)m, m += (size_t)GEMM_TP * nq * sizeof(aq);                                  \
            A.hs = (__m512 *)(void *)m, m += mins ? (size_t)GEMM_TP * nh * 64 : 0;                          \
            A.qd = (__m256 *)(void *)m;                                                                     \
            for (int r0 = 0; r0 < nrows; r0 += rp) {                                                        \
                const int Rn = nrows - r0 < rp ? nrows - r0 : rp;                                           \
                for (int r = 0; r < Rn; r++)                                                                \
                    gdec_##name(vnni, (const uint8_t *)w + (size_t)(r0 + r) * rb + (size_t)c0 * sizeof(block_t), \
                                nh, nq, nlast, &W, (size_t)r * nh, (size_t)r * nq);                         \
                for (int t0 = 0; t0 < ncols; t0 += GEMM_TP) {                                               \
                    const int Tn = ncols - t0 < GEMM_TP ? ncols - t0 : GEMM_TP;                             \
                    for (int t = 0; t < Tn; t++)                                                            \
                        gprep_##name(vnni, (const block_q8_32 *)(const void *)((const char *)a + (size_t)(t0 + t) * as) + c0, \
                                     nh, nq, nlast, &A, (size_t)t * nh, (size_t)t * nq);                    \
                    float *ob = out + (size_t)t0 * os + r0;                                                 \
                    int r = 0;                                                                              \
                    for (; r + GEMM_R <= Rn; r += GEMM_R) {                                                 \
                        int t = 0;                                                                          \
                        for (; t + GEMM_T <= Tn; t += GEMM_T)                                               \
                            gk_##name(GEMM_R, GEMM_T, vnni, nh, nq, &W, (size_t)r * nh, (size_t)r * nq, &A,  \
                                      (size_t)t * nh, (size_t)t * nq, ob + t * os + r, os);                 \
                        for (; t < Tn; t++)                                                                 \
                            gk_##name(GEMM_R, 1, vnni, nh, nq, &W, (size_t)r * nh, (size_t)r * nq, &A,       \
                                      (size_t)t * nh, (size_t)t * nq, ob + t * os + r, os);                 \
                    }                                                                                       \
                    for (; r < Rn; r++) {                                                                   \
                        int t = 0;                                                                          \
                        for (; t + GEMM_T <= Tn; t += GEMM_T)                                               \
                            gk_##name(1, GEMM_T, vnni, nh, nq, &W, (size_t)r * nh, (size_t)r * nq, &A,       \
                                      (size_t)t * nh, (size_t)t * nq, ob + t * os + r, os);                 \
                        for (; t < Tn; t++)                                                                 \
                            gk_##name(1, 1, vnni, nh, nq, &W, (size_t)r * nh, (size_t)r * nq, &A,            \
                                      (size_t)t * nh, (size_t)t * nq, ob + t * os + r, os);                 \
                    }                                                                                       \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
    }                                                                                                       \
    DEFINE_VARIANTS(name)

DEFINE_FEW(q4_0, block_q4_0)
DEFINE_GEMM(q4_0, block_q4_0)
DEFINE_FEW(q4_1, block_q4_1)
DEFINE_GEMM(q4_1, block_q4_1)
DEFINE_FEW(q5_0, block_q5_0)
DEFINE_GEMM(q5_0, block_q5_0)
DEFINE_FEW(q5_1, block_q5_1)
DEFINE_GEMM(q5_1, block_q5_1)
DEFINE_FEW(q8_0, block_q8_0)
DEFINE_GEMM(q8_0, block_q8_0)
DEFINE_FEW(iq4_nl, block_iq4_nl)
DEFINE_GEMM(iq4_nl, block_iq4_nl)
DEFINE_FEW(mxfp4, block_mxfp4)
DEFINE_GEMM(mxfp4, block_mxfp4)

/* ------------------------------------------------------------------ */
/* K-quants                                                              */
/* ------------------------------------------------------------------ */
/* A super-block's 256 quants are decoded (dec_*) into 4 vectors of
 * unsigned bytes in which every 128-bit lane holds one 16-element
 * sub-block, in an order that depends on the format, and the activation
 * row's quants are arranged (act_*) to match. Per (row, activation row,
 * super-block) the int32 dot of each sub-block is exact: 4 vpdpbusd (no
 * VNNI: vpmaddubsw + vpmaddwd), then the 4 lanes of each sub-block summed,
 * giving one lane per sub-block ("M order": lane 4k + q holds the
 * sub-block in 128-bit lane k of vector q, K_ORD_* below), plus the
 * activation's seed (-off * bsums for formats with an offset: Q6_K -32,
 * Q3_K -4). The sub-block scales are applied in float, one lane each:
 *     acc = fma(float(isum), (d * sc) * da, acc)
 *     acc = fma(-dmin * m, da * bsums, acc)        Q4_K, Q5_K, Q2_K: the mins
 * (d * sc and dmin * m are exact in float). The row's result (the contract
 * of quants.h): super-blocks in groups of RED_SB from the row's start, each
 * group's lanes summed by hsum16 (reduce4 order) and added to the row's sum
 * in order. vec_dot and gemv reduce the 4 vectors' dots to M order with two
 * rounds of unpacks; gemm stores the decoded weights and the arranged
 * activations transposed (vector i = dword i of every sub-block, in M
 * order), so its vpdpbusd land in M order directly: the same integers, the
 * same float steps. */
#define RED_SB 8

/* Q4_K/Q5_K's 6-bit scales and mins (12 bytes after d, dmin; v = the block's
 * first 16 bytes) -> [sc 0..7, m 0..7] as bytes: sc = a & 0x3f.., (c & 0x0f..)
 * | (a >> 2 & 0x30..), m the same of b and c >> 4 (a, b, c: the 3 dwords) */
INLINE __m128i k4_scales(__m128i v) {
    const __m128i u = _mm_shuffle_epi32(v, _MM_SHUFFLE(3, 2, 3, 1)); /* [a, c, b, c] */
    const __m128i w = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 1, 1)); /* [a, a, b, b] */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(u, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(w, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* M order of each format: K_ORD[4k + q] = the sub-block (0..15) in 128-bit
 * lane k of decoded vector q */
#define K_ORD_q4_K 0, 2, 8, 10, 1, 3, 9, 11, 4, 6, 12, 14, 5, 7, 13, 15
#define K_ORD_q5_K K_ORD_q4_K
#define K_ORD_q6_K 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15
#define K_ORD_q2_K 0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15
#define K_ORD_q3_K K_ORD_q2_K
/* -offset of the quants (seed = -off * bsums), and whether the format has mins */
#define K_OFF_q4_K 0
#define K_OFF_q5_K 0
#define K_OFF_q6_K 32
#define K_OFF_q2_K 0
#define K_OFF_q3_K 4
#define K_OFF_iq4_xs 128
#define K_MIN_q4_K 1
#define K_MIN_q5_K 1
#define K_MIN_q6_K 0
#define K_MIN_q2_K 1
#define K_MIN_q3_K 0
#define K_MIN_iq4_xs 0
/* quants past 127 (IQ4_XS: its book + 128, up to 241): vpmaddubsw could saturate, so the
 * path without VNNI dots them as signed w - 128 and adds 128 sum(a) back (k_dot) */
#define K_SGN_q4_K 0
#define K_SGN_q5_K 0
#define K_SGN_q6_K 0
#define K_SGN_q2_K 0
#define K_SGN_q3_K 0
#define K_SGN_iq4_xs 1
/* the largest quant: bounds the vpmaddubsw words added in int16 (no VNNI) */
#define K_GRP_q4_K 4 /* 15 * 128 * 2 * 4 < 32768 */
#define K_GRP_q5_K 4 /* 31 * 128 * 2 * 4 */
#define K_GRP_q6_K 2 /* 63 * 128 * 2 * 2 */
#define K_GRP_q2_K 4
#define K_GRP_q3_K 4
#define K_GRP_iq4_xs 1 /* unused: k_dot's signed path */
#define K_ORD_iq4_xs 0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15
/* IQ3_S: Q6_K's order, signed values + 16 (1..31: 31 * 128 * 2 * 4 fits int16) */
#define K_ORD_iq3_s K_ORD_q6_K
#define K_OFF_iq3_s 16
#define K_MIN_iq3_s 0
#define K_SGN_iq3_s 0
#define K_GRP_iq3_s 4
/* IQ3_XXS: the same with values + 64 (2..126: one vpmaddubsw word per vpmaddwd) */
#define K_ORD_iq3_xxs K_ORD_q6_K
#define K_OFF_iq3_xxs 64
#define K_MIN_iq3_xxs 0
#define K_SGN_iq3_xxs 0
#define K_GRP_iq3_xxs 1
/* IQ2_*: values 8..43 + 64 (21..107), as IQ3_XXS */
#define K_ORD_iq2_xxs K_ORD_q6_K
#define K_ORD_iq2_xs K_ORD_q6_K
#define K_ORD_iq2_s K_ORD_q6_K
#define K_OFF_iq2_xxs 64
#define K_OFF_iq2_xs 64
#define K_OFF_iq2_s 64
#define K_MIN_iq2_xxs 0
#define K_MIN_iq2_xs 0
#define K_MIN_iq2_s 0
#define K_SGN_iq2_xxs 0
#define K_SGN_iq2_xs 0
#define K_SGN_iq2_s 0
#define K_GRP_iq2_xxs 1
#define K_GRP_iq2_xs 1
#define K_GRP_iq2_s 1
/* IQ1_*: values 8 g -+ 1 + 16 (7..25), as IQ3_S */
#define K_ORD_iq1_s K_ORD_q6_K
#define K_ORD_iq1_m K_ORD_q6_K
#define K_OFF_iq1_s 16
#define K_OFF_iq1_m 16
#define K_MIN_iq1_s 0
#define K_MIN_iq1_m 0
#define K_SGN_iq1_s 0
#define K_SGN_iq1_m 0
#define K_GRP_iq1_s 4
#define K_GRP_iq1_m 4

/* K_CHAIN: the format's ROWS4 blocks are chained (rows4_code_* below) */
#define K_CHAIN_q4_K 1
#define K_CHAIN_q5_K 1
#define K_CHAIN_q6_K 1
#define K_CHAIN_q2_K 1
#define K_CHAIN_q3_K 1
#define K_CHAIN_iq4_xs 1
#define K_CHAIN_iq3_s 0
#define K_CHAIN_iq3_xxs 0
#define K_CHAIN_iq2_xxs 0
#define K_CHAIN_iq2_xs 0
#define K_CHAIN_iq2_s 0
#define K_CHAIN_iq1_s 0
#define K_CHAIN_iq1_m 0

#define IDX8(...) _mm_loadu_si128((const void *)(const int8_t[16]){__VA_ARGS__})
#define IDX32(...) _mm512_setr_epi32(__VA_ARGS__)
#define HALF_(a) ((a) >> 1)
#define K_HALF(o) HALF_(o)

/* a decoded super-block of one row: the quants (format layout), the scales
 * d * sc and (mins) -dmin * m per sub-block, M order */
typedef struct {
    __m512i v[4];
    __m512 dsc, nmin;
} wKs;

/* float(bytes b[idx[l]]) for the 16 lanes, unsigned / signed bytes */
INLINE __m512 k_bytes_u(__m128i b, __m128i idx) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_shuffle_epi8(b, idx))); }
INLINE __m512 k_bytes_s(__m128i b, __m128i idx) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_shuffle_epi8(b, idx))); }

/* Q4_K/Q5_K scales in M order: sub-block j (16 elements) has the scale and
 * min of 32-element sub-block j / 2, K4_ORD; all 16 as floats at once,
 * [d sc 0..7, -dmin m 0..7] (exact), then permuted */
#define K4_ORD 0, 1, 4, 5, 0, 1, 4, 5, 2, 3, 6, 7, 2, 3, 6, 7
INLINE void k4_dsc(const void *block, wKs *W) {
    const __m128i v = _mm_loadu_si128(block);
    const __m512i sm = _mm512_cvtepu8_epi32(k4_scales(v));
    const __m512i sm_neg = _mm512_mask_sub_epi32(sm, 0xff00, _mm512_setzero_si512(), sm); /* -m */
    const __m512 dd = _mm512_permutexvar_ps(IDX32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                            _mm512_castps128_ps512(_mm_cvtph_ps(v)));
    const __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(sm_neg), dd);
    W->dsc = _mm512_permutexvar_ps(IDX32(K4_ORD), s);
    W->nmin = _mm512_permutexvar_ps(_mm512_add_epi32(IDX32(K4_ORD), _mm512_set1_epi32(8)), s);
}

INLINE void dec_q4_K(const void *xb, wKs *W) {
    const block_q4_K *x = xb;
    const __m512i z0 = _mm512_loadu_si512(x->qs), z1 = _mm512_loadu_si512(x->qs + 64);
    W->v[0] = nib_lo(z0), W->v[1] = nib_hi(z0); /* elements 0-31 | 64-95, 32-63 | 96-127 (chained: below) */
    W->v[2] = nib_lo(z1), W->v[3] = nib_hi(z1); /* + 128 */
    k4_dsc(x, W);
}

/* Q5_K: Q4_K's layout plus the 5th bits (bit i of qh[l] is bit 4 of element 32 i + l) */
INLINE void dec_q5_K(const void *xb, wKs *W) {
    const block_q5_K *x = xb;
    const __m512i z0 = _mm512_loadu_si512(x->qs), z1 = _mm512_loadu_si512(x->qs + 64);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)x->qh);
    const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(qh), qh, 1);
    const __m512i b4 = _mm512_set1_epi8(0x10);
    /* v[k]: elements 32 i + l of the low 256 bits, 32 (i + 2) + l of the high */
#define BITS(i) _mm512_set_epi64(0x0101010101010101ll << ((i) + 2), 0x0101010101010101ll << ((i) + 2),           \
                                 0x0101010101010101ll << ((i) + 2), 0x0101010101010101ll << ((i) + 2),           \
                                 0x0101010101010101ll << (i), 0x0101010101010101ll << (i),                       \
                                 0x0101010101010101ll << (i), 0x0101010101010101ll << (i))
    const __m512i q[4] = {nib_lo(z0), nib_hi(z0), nib_lo(z1), nib_hi(z1)};
    const int first[4] = {0, 1, 4, 5};
    for (int k = 0; k < 4; k++)
        W->v[k] = _mm512_or_si512(q[k], _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(h, BITS(first[k])), b4));
#undef BITS
    k4_dsc(x, W);
}

/* Q6_K: v[q] = elements 64 q .. 64 q + 63 (128-bit lane k: sub-block 4 q + k), 6-bit unsigned */
INLINE void dec_q6_K(const void *xb, wKs *W) {
    const block_q6_K *x = xb;
    const __m512i lo4 = _mm512_set1_epi8(0x0f), hi2 = _mm512_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        const __m512i l = _mm512_loadu_si512(x->ql + 64 * h);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
        W->v[2 * h] = _mm512_or_si512(_mm512_and_si512(l, lo4), _mm512_and_si512(_mm512_slli_epi16(z, 4), hi2));
        W->v[2 * h + 1] = _mm512_or_si512(nib_hi(l), _mm512_and_si512(z, hi2));
    }
    const __m128i s8 = _mm_loadu_si128((const __m128i *)x->scales);
    W->dsc = _mm512_mul_ps(k_bytes_s(s8, IDX8(K_ORD_q6_K)), _mm512_set1_ps(_cvtsh_ss(x->d)));
    W->nmin = _mm512_setzero_ps();
}

/* Q2_K: v[s] = bit pair s of qs[0:32 | 32:64]; 128-bit lane L of v[s] is
 * sub-block 2s + (L & 1) + 8 (L >> 1) */
INLINE void dec_q2_K(const void *xb, wKs *W) {
    const block_q2_K *x = xb;
    const __m512i z = _mm512_loadu_si512(x->qs), m3 = _mm512_set1_epi8(3);
    W->v[0] = _mm512_and_si512(z, m3);
    W->v[1] = _mm512_and_si512(_mm512_srli_epi16(z, 2), m3);
    W->v[2] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m3);
    W->v[3] = _mm512_and_si512(_mm512_srli_epi16(z, 6), m3);
    const __m128i sb = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)x->scales), IDX8(K_ORD_q2_K));
    const __m128i lo = _mm_set1_epi8(0x0f);
    W->dsc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(sb, lo))), _mm512_set1_ps(_cvtsh_ss(x->d)));
    W->nmin = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(sb, 4), lo))),
                            _mm512_set1_ps(-_cvtsh_ss(x->dmin)));
}

/* Q3_K: Q2_K's layout, 3-bit quants + 4 (unsigned 0..7; the -4 is the seed) */
INLINE void dec_q3_K(const void *xb, wKs *W) {
    const block_q3_K *x = xb;
    /* the 16 signed 6-bit scales */
    const uint32_t a = ld32(x->scales), b = ld32(x->scales + 4), c = ld32(x->scales + 8);
    const uint32_t w0 = (a & 0x0f0f0f0fu) | ((c << 4) & 0x30303030u);
    const uint32_t w1 = (b & 0x0f0f0f0fu) | ((c << 2) & 0x30303030u);
    const uint32_t w2 = ((a >> 4) & 0x0f0f0f0fu) | (c & 0x30303030u);
    const uint32_t w3 = ((b >> 4) & 0x0f0f0f0fu) | ((c >> 2) & 0x30303030u);
    const __m128i s8 = _mm_sub_epi8(_mm_setr_epi32((int)w0, (int)w1, (int)w2, (int)w3), _mm_set1_epi8(32));
    const __m512i z = _mm512_loadu_si512(x->qs), m3 = _mm512_set1_epi8(3);
    const __m256i hm = _mm256_loadu_si256((const __m256i *)x->hmask);
    const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(hm), hm, 1);
    const __m512i b2 = _mm512_set1_epi8(4);
    for (int s = 0; s < 4; s++) {
        /* bit s of hmask[l] for the low half, bit 4 + s for the high half: + 4 when set */
        const __m512i bits = _mm512_set_epi64(0x0101010101010101ll << (s + 4), 0x0101010101010101ll << (s + 4),
                                              0x0101010101010101ll << (s + 4), 0x0101010101010101ll << (s + 4),
                                              0x0101010101010101ll << s, 0x0101010101010101ll << s,
                                              0x0101010101010101ll << s, 0x0101010101010101ll << s);
        const __m512i q2 = _mm512_and_si512(_mm512_srli_epi16(z, 2 * s), m3);
        W->v[s] = _mm512_or_si512(q2, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(h, bits), b2));
    }
    W->dsc = _mm512_mul_ps(k_bytes_s(s8, IDX8(K_ORD_q3_K)), _mm512_set1_ps(_cvtsh_ss(x->d)));
    W->nmin = _mm512_setzero_ps();
}

/* ---- chained blocks: AVX-512's ROWS4 encoding of Q2_K - Q6_K and IQ4_XS (K_CHAIN) ----
 * The 4 vectors of quants that dec_* makes are stored transposed (as
 * transpose4_dwords does), re-encoded in the format's own bit layout: dword p
 * of vector q then holds quants 4q .. 4q + 3 of sub-block K_ORD[p]. A chain
 * of 4 vpdpbusd sums each sub-block in its own lane, M order, without red4i's
 * unpacks (shuffles are what bounds the K-quant gemv on Zen 4): the same
 * integers, so the same results. The scales and d stay. The transpose is its
 * own inverse, as quants.h's rows4_codec_fn asks. */

/* 4x4 transposes of dwords, one in each 128-bit lane: lane L of out[q] holds
 * dword q of lane L of in[0..3] */
INLINE void transpose4_dwords(const __m512i in[4], __m512i out[4]) {
    const __m512i t0 = _mm512_unpacklo_epi32(in[0], in[1]), t1 = _mm512_unpackhi_epi32(in[0], in[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(in[2], in[3]), t3 = _mm512_unpackhi_epi32(in[2], in[3]);
    out[0] = _mm512_unpacklo_epi64(t0, t2), out[1] = _mm512_unpackhi_epi64(t0, t2);
    out[2] = _mm512_unpacklo_epi64(t1, t3), out[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* the inverses of dec_*'s quants: the bytes that decode to v[0..3] */
INLINE __m512i nib_pack(__m512i lo, __m512i hi) { return _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4)); }
/* 32 bytes with bit lo set where byte l of v has any bit of `test`, bit hi where byte 32 + l has */
INLINE __m256i bit_plane(__m512i v, int test, int lo, int hi) {
    const uint64_t m = _mm512_test_epi8_mask(v, _mm512_set1_epi8((char)test));
    return _mm256_or_si256(_mm256_maskz_mov_epi8((__mmask32)m, _mm256_set1_epi8((char)(1 << lo))),
                           _mm256_maskz_mov_epi8((__mmask32)(m >> 32), _mm256_set1_epi8((char)(1 << hi))));
}
INLINE void enc_q5_K(const __m512i v[4], void *yb) {
    block_q5_K *y = yb;
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    _mm512_storeu_si512(y->qs, nib_pack(_mm512_and_si512(v[0], lo4), _mm512_and_si512(v[1], lo4)));
    _mm512_storeu_si512(y->qs + 64, nib_pack(_mm512_and_si512(v[2], lo4), _mm512_and_si512(v[3], lo4)));
    const int first[4] = {0, 1, 4, 5}; /* dec_q5_K's BITS */
    __m256i qh = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) qh = _mm256_or_si256(qh, bit_plane(v[k], 0x10, first[k], first[k] + 2));
    _mm256_storeu_si256((__m256i *)y->qh, qh);
}
INLINE void enc_q6_K(const __m512i v[4], void *yb) {
    block_q6_K *y = yb;
    const __m512i lo4 = _mm512_set1_epi8(0x0f), lo2 = _mm512_set1_epi8(0x03);
    for (int h = 0; h < 2; h++) {
        _mm512_storeu_si512(y->ql + 64 * h, nib_pack(_mm512_and_si512(v[2 * h], lo4), _mm512_and_si512(v[2 * h + 1], lo4)));
        /* qh[32 h + l]: the top 2 bits of byte l of v[2h] (bits 0-1), of its byte 32 + l (2-3),
         * and the same of v[2h + 1] (4-5, 6-7) */
        const __m512i a = _mm512_and_si512(_mm512_srli_epi16(v[2 * h], 4), lo2);
        const __m512i b = _mm512_and_si512(_mm512_srli_epi16(v[2 * h + 1], 4), lo2);
        const __m512i ab = _mm512_or_si512(a, _mm512_slli_epi16(b, 4));
        const __m256i qh = _mm256_or_si256(_mm512_castsi512_si256(ab), _mm256_slli_epi16(_mm512_extracti64x4_epi64(ab, 1), 2));
        _mm256_storeu_si256((__m256i *)(y->qh + 32 * h), qh);
    }
}

INLINE void enc_q2_K(const __m512i v[4], void *yb) {
    block_q2_K *y = yb;
    __m512i qs = v[0];
    for (int s = 1; s < 4; s++) qs = _mm512_or_si512(qs, _mm512_slli_epi16(v[s], 2 * s));
    _mm512_storeu_si512(y->qs, qs);
}
INLINE void enc_q3_K(const __m512i v[4], void *yb) {
    block_q3_K *y = yb;
    const __m512i lo2 = _mm512_set1_epi8(0x03);
    __m512i qs = _mm512_setzero_si512();
    __m256i hm = _mm256_setzero_si256();
    for (int s = 0; s < 4; s++) {
        qs = _mm512_or_si512(qs, _mm512_slli_epi16(_mm512_and_si512(v[s], lo2), 2 * s));
        hm = _mm256_or_si256(hm, bit_plane(v[s], 0x04, s, s + 4));
    }
    _mm512_storeu_si512(y->qs, qs);
    _mm256_storeu_si256((__m256i *)y->hmask, hm);
}

/* Q4_K and IQ4_XS: 128 bytes of nibbles, whose 4 vectors (low and high of bytes 0-63, then
 * of 64-127) dec_* maps byte for byte: the nibbles themselves are transposed */
#define DEFINE_CHAIN_NIBBLES(name, block_t)                                                               \
    static void rows4_code_##name(const void *restrict src, void *restrict dst) {                       \
        const block_t *x = src;                                                                           \
        block_t *y = dst;                                                                                 \
        memcpy(y, x, sizeof(block_t));                                                                    \
        const __m512i z0 = _mm512_loadu_si512(x->qs), z1 = _mm512_loadu_si512(x->qs + 64);                \
        const __m512i q[4] = {nib_lo(z0), nib_hi(z0), nib_lo(z1), nib_hi(z1)};                            \
        __m512i t[4];                                                                                     \
        transpose4_dwords(q, t);                                                                          \
        _mm512_storeu_si512(y->qs, nib_pack(t[0], t[1]));                                                 \
        _mm512_storeu_si512(y->qs + 64, nib_pack(t[2], t[3]));                                            \
    }
DEFINE_CHAIN_NIBBLES(q4_K, block_q4_K)

/* the others: their quants decoded, transposed and encoded again */
#define DEFINE_CHAIN(name, block_t)                                                                       \
    static void rows4_code_##name(const void *restrict src, void *restrict dst) {                       \
        memcpy(dst, src, sizeof(block_t));                                                                \
        wKs W;                                                                                            \
        dec_##name(src, &W);                                                                              \
        __m512i t[4];                                                                                     \
        transpose4_dwords(W.v, t);                                                                        \
        enc_##name(t, dst);                                                                               \
    }
DEFINE_CHAIN(q5_K, block_q5_K)
DEFINE_CHAIN(q6_K, block_q6_K)
DEFINE_CHAIN(q2_K, block_q2_K)
DEFINE_CHAIN(q3_K, block_q3_K)

/* IQ4_XS: v[0], v[1] = the low, high nibbles of qs[0:64] as book values + 128,
 * v[2], v[3] those of qs[64:128]: 128-bit lane k of v[0] holds elements 0-15
 * of sub-block k of 32 (v[1] its 16-31, v[2], v[3] sub-block 4 + k's);
 * each 16-element half scaled by d (ls - 32) of its sub-block */
INLINE void dec_iq4_xs(const void *xb, wKs *W) {
    const block_iq4_xs *x = xb;
    const __m512i book = _mm512_broadcast_i32x4(   /* the values + 128, unsigned */
        _mm_xor_si128(_mm_loadu_si128((const __m128i *)kvalues_iq4nl), _mm_set1_epi8((char)0x80)));
    const __m512i z0 = _mm512_loadu_si512(x->qs), z1 = _mm512_loadu_si512(x->qs + 64);
    W->v[0] = _mm512_shuffle_epi8(book, nib_lo(z0)), W->v[1] = _mm512_shuffle_epi8(book, nib_hi(z0));
    W->v[2] = _mm512_shuffle_epi8(book, nib_lo(z1)), W->v[3] = _mm512_shuffle_epi8(book, nib_hi(z1));
    /* the 8 scales ls - 32 as bytes: the nibbles of scales_l and the bit pairs of scales_h in order */
    const uint64_t ls = _pdep_u64(ld32(x->scales_l), 0x0f0f0f0f0f0f0f0full) |
                        _pdep_u64(x->scales_h, 0x0303030303030303ull) << 4;
    const __m128i s8 = _mm_sub_epi8(_mm_cvtsi64_si128((long long)ls), _mm_set1_epi8(32));
    W->dsc = _mm512_mul_ps(k_bytes_s(s8, IDX8(0, 0, 4, 4, 1, 1, 5, 5, 2, 2, 6, 6, 3, 3, 7, 7)),   /* K_ORD / 2 */
                           _mm512_set1_ps(_cvtsh_ss(x->d)));
    W->nmin = _mm512_setzero_ps();
}

DEFINE_CHAIN_NIBBLES(iq4_xs, block_iq4_xs)

/* the grid i-quants (IQ3_S, IQ3_XXS, IQ2_*): v[q] = elements 64 q .. 64 q + 63 (128-bit
 * lane k: sub-block 4 q + k of 16, as Q6_K) as signed value + K_OFF (the seed takes it
 * back): the points of the 64 gathered from the grid, negated where their 64 sign bits
 * say; each 16-element sub-block scaled by d times its odd scale */
INLINE __m512i k_signed_off(__m512i g, uint64_t neg, int off) {
    const __m512i o = _mm512_set1_epi8((char)off);
    return _mm512_mask_sub_epi8(_mm512_add_epi8(o, g), (__mmask64)neg, o, g);
}

/* d times the odd scales of the 16 sub-blocks of 16 (byte j of sc16), in M order */
INLINE __m512 k_grid_dsc16(__m128i sc16, float d) {
    return _mm512_mul_ps(k_bytes_u(sc16, IDX8(K_ORD_q6_K)), _mm512_set1_ps(d));
}

/* the same from the 8 scales of sub-blocks of 32 (byte ib of sc8), each for its two halves */
INLINE __m512 k_grid_dsc(uint64_t sc8, float d) {
    const __m128i s = _mm_cvtsi64_si128((long long)sc8);
    return k_grid_dsc16(_mm_unpacklo_epi8(s, s), d);
}

/* IQ3_S: 9-bit indices (qs, the bits of qh as bit 8), the sign bits in order, scales 2 s + 1 */
INLINE void dec_iq3_s(const void *xb, wKs *W) {
    const block_iq3_s *x = xb;
    for (int q = 0; q < 4; q++) {
        const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(x->qs + 16 * q)));
        const __mmask16 hi = (__mmask16)(x->qh[2 * q] | x->qh[2 * q + 1] << 8);
        uint64_t neg;
        memcpy(&neg, x->signs + 8 * q, 8);
        const __m512i idx = _mm512_mask_or_epi32(lo, hi, lo, _mm512_set1_epi32(0x100));
        W->v[q] = k_signed_off(_mm512_i32gather_epi32(idx, iq3s_grid, 4), neg, K_OFF_iq3_s);
    }
    const uint64_t s = _pdep_u64(ld32(x->scales), 0x0f0f0f0f0f0f0f0full);   /* byte ib: s */
    W->dsc = k_grid_dsc(s << 1 | 0x0101010101010101ull, _cvtsh_ss(x->d));
    W->nmin = _mm512_setzero_ps();
}

/* 8 sign bytes from eight 7-bit fields (in the low bits of 32-bit lanes): bit 7 makes each
 * byte's count of set bits even (iq_signs) */
INLINE uint64_t k_signs8(__m256i s7) {
    s7 = _mm256_and_si256(s7, _mm256_set1_epi32(127));
    __m256i p = _mm256_xor_si256(s7, _mm256_srli_epi32(s7, 4));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 1));
    const __m256i b = _mm256_or_si256(s7, _mm256_slli_epi32(_mm256_and_si256(p, _mm256_set1_epi32(1)), 7));
    return (uint64_t)_mm_cvtsi128_si64(_mm256_cvtepi32_epi8(b));
}

/* the sign bytes of two words of four 7-bit fields (IQ3_XXS, IQ2_XXS: sub-blocks w0, w1) */
INLINE uint64_t k_word_signs(uint32_t w0, uint32_t w1) {
    const __m256i w = _mm256_set_m128i(_mm_set1_epi32((int)w1), _mm_set1_epi32((int)w0));
    return k_signs8(_mm256_srlv_epi32(w, _mm256_setr_epi32(0, 7, 14, 21, 0, 7, 14, 21)));
}

/* IQ3_XXS: 8-bit indices, the sign fields of the sub-blocks' words, scales 2 s + 1 times d / 4 */
INLINE void dec_iq3_xxs(const void *xb, wKs *W) {
    const block_iq3_xxs *x = xb;
    uint64_t sc = 0;
    for (int q = 0; q < 4; q++) {
        const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(x->qs + 16 * q)));
        const uint64_t neg = k_word_signs(iq3_xxs_word(x, 2 * q), iq3_xxs_word(x, 2 * q + 1));
        W->v[q] = k_signed_off(_mm512_i32gather_epi32(idx, iq3xxs_grid, 4), neg, K_OFF_iq3_xxs);
        sc |= (uint64_t)iq3_xxs_scale(x, 2 * q) << 16 * q | (uint64_t)iq3_xxs_scale(x, 2 * q + 1) << (16 * q + 8);
    }
    W->dsc = k_grid_dsc(sc, GRID_DMUL_iq3_xxs * _cvtsh_ss(x->d));
    W->nmin = _mm512_setzero_ps();
}

/* IQ2_*: v[q] = points 8 q .. 8 q + 7, 8 values each, their 64-bit grid entries loaded one by one
 * (k_grid64_loads: a gather of 8 measured slower on Zen 4) */
INLINE __m512i k_grid64_loads(const uint64_t *grid, uint64_t a, uint64_t b) {   /* 4 16-bit indices each */
    return _mm512_set_epi64((long long)grid[b >> 48], (long long)grid[(b >> 32) & 0xffff],
                            (long long)grid[(b >> 16) & 0xffff], (long long)grid[b & 0xffff],
                            (long long)grid[a >> 48], (long long)grid[(a >> 32) & 0xffff],
                            (long long)grid[(a >> 16) & 0xffff], (long long)grid[a & 0xffff]);
}

/* the 16 nibbles of 8 bytes as the odd scales 2 s + 1 of the 16 sub-blocks of 16 */
INLINE __m128i k_odd_nibbles16(const uint8_t *p) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)p), m = _mm_set1_epi8(0x0f);
    const __m128i s = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    return _mm_add_epi8(_mm_add_epi8(s, s), _mm_set1_epi8(1));
}

/* IQ2_XXS: sub-blocks 2 q, 2 q + 1: their 8 index bytes, and the 7-bit sign fields and s of their words */
INLINE void dec_iq2_xxs(const void *xb, wKs *W) {
    const block_iq2_xxs *x = xb;
    uint64_t sc = 0;
    for (int q = 0; q < 4; q++) {
        const uint64_t neg = k_word_signs(iq2_xxs_word(x, 2 * q), iq2_xxs_word(x, 2 * q + 1));
        const __m512i g = k_grid64_loads(iq2xxs_grid, _pdep_u64(ld32(x->qs + 16 * q), 0x00ff00ff00ff00ffull),
                                         _pdep_u64(ld32(x->qs + 16 * q + 8), 0x00ff00ff00ff00ffull));
        W->v[q] = k_signed_off(g, neg, K_OFF_iq2_xxs);
        sc |= (uint64_t)(2 * iq2_xxs_s(x, 4 * q) + 1) << 16 * q | (uint64_t)(2 * iq2_xxs_s(x, 4 * q + 2) + 1) << (16 * q + 8);
    }
    W->dsc = k_grid_dsc(sc, GRID_DMUL_iq2_xxs * _cvtsh_ss(x->d));
    W->nmin = _mm512_setzero_ps();
}

/* IQ2_XS: 16-bit entries, index in the low 9 bits, the sign field above */
INLINE void dec_iq2_xs(const void *xb, wKs *W) {
    const block_iq2_xs *x = xb;
    for (int q = 0; q < 4; q++) {
        const __m256i e = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x->qs + 8 * q)));
        uint64_t a, b;
        memcpy(&a, x->qs + 8 * q, 8);
        memcpy(&b, x->qs + 8 * q + 4, 8);
        const __m512i g = k_grid64_loads(iq2xs_grid, a & 0x01ff01ff01ff01ffull, b & 0x01ff01ff01ff01ffull);
        W->v[q] = k_signed_off(g, k_signs8(_mm256_srli_epi32(e, 9)), K_OFF_iq2_xs);
    }
    W->dsc = k_grid_dsc16(k_odd_nibbles16(x->scales), GRID_DMUL_iq2_xs * _cvtsh_ss(x->d));
    W->nmin = _mm512_setzero_ps();
}

/* IQ2_S: 8 index bytes and their 2-bit tops (qh[2 q], qh[2 q + 1]), the sign bytes as they are */
INLINE void dec_iq2_s(const void *xb, wKs *W) {
    const block_iq2_s *x = xb;
    for (int q = 0; q < 4; q++) {
        const uint64_t a = _pdep_u64(ld32(x->qs + 8 * q), 0x00ff00ff00ff00ffull) | _pdep_u64(x->qh[2 * q], 0x0300030003000300ull);
        const uint64_t b = _pdep_u64(ld32(x->qs + 8 * q + 4), 0x00ff00ff00ff00ffull) | _pdep_u64(x->qh[2 * q + 1], 0x0300030003000300ull);
        uint64_t neg;
        memcpy(&neg, x->signs + 8 * q, 8);
        W->v[q] = k_signed_off(k_grid64_loads(iq2s_grid, a, b), neg, K_OFF_iq2_s);
    }
    W->dsc = k_grid_dsc16(k_odd_nibbles16(x->scales), GRID_DMUL_iq2_s * _cvtsh_ss(x->d));
    W->nmin = _mm512_setzero_ps();
}

/* IQ1_*: v[q] = points 8 q .. 8 q + 7, their grid entries (g + 1 in each byte) loaded one by
 * one (a gather of 8 measured ~20% slower on Zen 4), as
 * 8 (g + 1) + 9, less 2 where the point's delta is negative (bit k of neg8): 8 g -+ 1 + K_OFF */
#define IQ1_GRID8(name, x, q) k_grid64_loads(iq1s_grid, name##_index4(x, 2 * (q)), name##_index4(x, 2 * (q) + 1))
INLINE __m512i k_iq1_values(__m512i g, uint32_t neg8) {
    const __mmask64 neg = (__mmask64)(_pdep_u64(neg8, 0x0101010101010101ull) * 0xff);
    const __m512i v = _mm512_add_epi8(_mm512_slli_epi16(g, 3), _mm512_set1_epi8(9));
    return _mm512_mask_sub_epi8(v, neg, v, _mm512_set1_epi8(2));
}

/* IQ1_S: sub-blocks 2 q, 2 q + 1 share the delta sign and s of their qh words */
INLINE void dec_iq1_s(const void *xb, wKs *W) {
    const block_iq1_s *x = xb;
    for (int q = 0; q < 4; q++)
        W->v[q] = k_iq1_values(IQ1_GRID8(iq1_s, x, q), (x->qh[2 * q] >> 15) * 0x0fu | (x->qh[2 * q + 1] >> 15) * 0xf0u);
    const __m128i s = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)x->qh), 12), _mm_set1_epi16(7));
    const __m128i odd = _mm_add_epi16(_mm_add_epi16(s, s), _mm_set1_epi16(1));
    W->dsc = k_grid_dsc((uint64_t)_mm_cvtsi128_si64(_mm_packus_epi16(odd, odd)), GRID_DMUL_iq1_s * _cvtsh_ss(x->d));
    W->nmin = _mm512_setzero_ps();
}

/* IQ1_M: the delta signs of points 8 q .. 8 q + 7 are bit 3 of each nibble of qh[4 q .. 4 q + 3] */
INLINE void dec_iq1_m(const void *xb, wKs *W) {
    const block_iq1_m *x = xb;
    for (int q = 0; q < 4; q++) W->v[q] = k_iq1_values(IQ1_GRID8(iq1_m, x, q), _pext_u32(ld32(x->qh + 4 * q), 0x88888888u));
    uint64_t s16[2];
    iq1_m_s16(x, s16);
    const __m128i s = _mm_set_epi64x((long long)s16[1], (long long)s16[0]);
    W->dsc = k_grid_dsc16(_mm_add_epi8(_mm_add_epi8(s, s), _mm_set1_epi8(1)), GRID_DMUL_iq1_m * _cvtsh_ss(iq1_m_d(x)));
    W->nmin = _mm512_setzero_ps();
}

/* an activation super-block, arranged for a format: a[q] pairs with the
 * decoded v[q]; seed = -off * bsums, bs = da * bsums (mins), M order */
typedef struct {
    __m512i a[4], seed;
    __m512 bs, da;
} aKs;

/* [32 x0 : 32 x0 + 32 | 32 x1 : 32 x1 + 32] of the quants */
INLINE __m512i k_pair32(const int8_t *q, int x0, int x1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(q + 32 * x0))),
                              _mm256_loadu_si256((const __m256i *)(q + 32 * x1)), 1);
}

#define DEFINE_KACT(name, x00, x01, x10, x11, x20, x21, x30, x31)                                          \
    INLINE void act_##name(const block_q8_K *y, aKs *A) {                                                   \
        A->a[0] = k_pair32(y->qs, x00, x01), A->a[1] = k_pair32(y->qs, x10, x11);                           \
        A->a[2] = k_pair32(y->qs, x20, x21), A->a[3] = k_pair32(y->qs, x30, x31);                           \
        const __m512i b = _mm512_permutexvar_epi32(                                                         \
            IDX32(K_ORD_##name), _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)y->bsums)));    \
        A->seed = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_mullo_epi32(b, _mm512_set1_epi32(K_OFF_##name))); \
        A->da = _mm512_set1_ps(y->d);                                                                       \
        A->bs = _mm512_mul_ps(_mm512_cvtepi32_ps(b), A->da);                                                \
    }
DEFINE_KACT(q4_K, 0, 2, 1, 3, 4, 6, 5, 7)
DEFINE_KACT(q5_K, 0, 2, 1, 3, 4, 6, 5, 7)
DEFINE_KACT(q6_K, 0, 1, 2, 3, 4, 5, 6, 7)
DEFINE_KACT(iq3_s, 0, 1, 2, 3, 4, 5, 6, 7)
DEFINE_KACT(iq3_xxs, 0, 1, 2, 3, 4, 5, 6, 7)
DEFINE_KACT(iq2_xxs, 0, 1, 2, 3, 4, 5, 6, 7)
DEFINE_KACT(iq2_xs, 0, 1, 2, 3, 4, 5, 6, 7)
DEFINE_KACT(iq2_s, 0, 1, 2, 3, 4, 5, 6, 7)
DEFINE_KACT(iq1_s, 0, 1, 2, 3, 4, 5, 6, 7)
DEFINE_KACT(iq1_m, 0, 1, 2, 3, 4, 5, 6, 7)
DEFINE_KACT(q2_K, 0, 4, 1, 5, 2, 6, 3, 7)
DEFINE_KACT(q3_K, 0, 4, 1, 5, 2, 6, 3, 7)
/* IQ4_XS's activations: a[0] = elements 0-15 of each 32-element quarter of the first half
 * (a[1] their 16-31), a[2], a[3] the same of the second half, as dec_iq4_xs's lanes */
INLINE void act_iq4_xs(const block_q8_K *y, aKs *A) {
    for (int h = 0; h < 2; h++) {
        const __m512i lo = _mm512_loadu_si512(y->qs + 128 * h), hi = _mm512_loadu_si512(y->qs + 128 * h + 64);
        A->a[2 * h] = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
        A->a[2 * h + 1] = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
    }
    const __m512i b = _mm512_permutexvar_epi32(IDX32(K_ORD_iq4_xs),
                                               _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)y->bsums)));
    A->seed = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_mullo_epi32(b, _mm512_set1_epi32(K_OFF_iq4_xs)));
    A->da = _mm512_set1_ps(y->d);
    A->bs = _mm512_mul_ps(_mm512_cvtepi32_ps(b), A->da);
}

/* a chained format's activations: act_*'s, transposed as its weights are */
INLINE void act_chain(aKs *A) {
    const __m512i a[4] = {A->a[0], A->a[1], A->a[2], A->a[3]};
    transpose4_dwords(a, A->a);
}

/* acc + the 4-product sums of unsigned w and signed a (vpdpbusd); a K_SGN format without
 * VNNI as (w - 128) x a (dot_s8s8) + 128 x a: no pair of products leaves int16, the same integers */
INLINE __m512i k_dot(const int vnni, const int sgn, __m512i acc, __m512i w, __m512i a) {
    if (vnni || !sgn) return dpbusd(vnni, acc, w, a);
    acc = dot_s8s8(acc, _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80)), a);
    return dpbusd(0, acc, _mm512_set1_epi8((char)0x80), a);
}

/* the int32 sums of 4 vpdpbusd-style products per lane (unsigned w, signed a),
 * without VNNI: grp vpmaddubsw words added in int16, then one vpmaddwd (K_SGN: k_dot) */
INLINE __m512i k_dot4(const int vnni, const int sgn, const int grp, const __m512i *w, const __m512i *a, __m512i acc) {
    if (vnni || sgn) {
        for (int i = 0; i < 4; i++) acc = k_dot(vnni, sgn, acc, w[i], a[i]);
        return acc;
    }
    const __m512i ones = _mm512_set1_epi16(1);
    for (int i = 0; i < 4; i += grp) {
        __m512i p = _mm512_maddubs_epi16(w[i], a[i]);
        for (int j = 1; j < grp; j++) p = _mm512_add_epi16(p, _mm512_maddubs_epi16(w[i + j], a[i + j]));
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, ones));
    }
    return acc;
}

/* the float steps of a super-block */
INLINE __m512 k_fin(const int mins, __m512i isum, __m512 dsc, __m512 nmin, const aKs *A, __m512 acc) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dsc, A->da), acc);
    if (mins) acc = _mm512_fmadd_ps(nmin, A->bs, acc);
    return acc;
}

/* gemv prepares the activation super-blocks once per call, KACT_CHUNK at a time */
#define KACT_CHUNK 32

#ifndef GEMMK_R
#define GEMMK_R 4
#endif
#ifndef GEMMK_T
#define GEMMK_T 4
#endif
#ifndef GEMMK_WBUF
#define GEMMK_WBUF (128 * 1024) /* bytes of decoded weights per pass (L2) */
#endif
#ifndef GEMMK_TP
#define GEMMK_TP 8 /* activation rows prepared per panel */
#endif

/* gemm's stored forms: the transposed quants (vector i = dword i of every
 * sub-block, M order) and the scales; the mins / activation sums beside */
typedef struct {
    __m512i v[4];
    __m512 dsc;
} wKg;
typedef struct {
    __m512i v[4], seed;
    __m512 da;
} aKg;

_Static_assert(GEMMK_WBUF + GEMMK_TP * RED_SB * (sizeof(aKg) + 64) <= GEMM_SCRATCH, "K-quant gemm buffers fit the scratch");
_Static_assert(GEMM_FEW_COLS * FEW_QUADS * (sizeof(act4) + sizeof(acth) / 4) <= GEMM_SCRATCH,
               "few_*'s activation quads fit the scratch");
_Static_assert(GEMM_FEW_COLS * KACT_CHUNK * sizeof(aKs) <= GEMM_SCRATCH, "kfew's activation super-blocks fit the scratch");

#define DEFINE_K512(name, block_t)                                                                          \
    /* R rows against one activation row (vec_dot, gemv); Ab: the prepared super-blocks or NULL;       \
     * row r's super-block i at w + r rs + i bs (plain: rs = the row's bytes; ROWS4: rs = one block) */  \
    INLINE void krows_##name(const int R, const int vnni, const int chained, int64_t nsb, const char *w,     \
                             size_t rs, size_t bs, const block_q8_K *y, const aKs *Ab, float *out, const int cont, \
                             const gemv_pf *pf) {                                                           \
        float sum[4];                                                                                       \
        for (int r = 0; r < R; r++) sum[r] = cont ? out[r] : 0.0f;                                          \
        for (int64_t g0 = 0; g0 < nsb; g0 += RED_SB) {                                                      \
            const int64_t g1 = nsb - g0 < RED_SB ? nsb : g0 + RED_SB;                                       \
            __m512 acc[4];                                                                                  \
            for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();                                       \
            for (int64_t i = g0; i < g1; i++) {                                                             \
                aKs Al;                                                                                     \
                const aKs *A = Ab ? &Ab[i] : &Al;                                                           \
                if (!Ab) act_##name(&y[i], &Al);                                                            \
                if (pf) gemv_prefetch_step(pf, R, (uintptr_t)(w + i * bs), i * bs, sizeof(block_t));             \
                for (int r = 0; r < R; r++) {                                                               \
                    wKs W;                                                                                  \
                    dec_##name(w + r * rs + i * bs, &W);                                                    \
                    __m512i isum = A->seed;                                                                 \
                    if (chained) {                                                                          \
                        for (int q = 0; q < 4; q++) isum = k_dot(vnni, K_SGN_##name, isum, W.v[q], A->a[q]); \
                    } else {                                                                                \
                        __m512i d[4];                                                                       \
                        for (int q = 0; q < 4; q++)                                                         \
                            d[q] = k_dot(vnni, K_SGN_##name, _mm512_setzero_si512(), W.v[q], A->a[q]);      \
                        isum = _mm512_add_epi32(red4i(d[0], d[1], d[2], d[3]), isum);                       \
                    }                                                                                       \
                    acc[r] = k_fin(K_MIN_##name, isum, W.dsc, W.nmin, A, acc[r]);                           \
                }                                                                                           \
            }                                                                                               \
            if (R == 4) {                                                                                   \
                float part[4];                                                                              \
                _mm_storeu_ps(part, reduce4(acc[0], acc[1], acc[2], acc[3]));                               \
                for (int r = 0; r < 4; r++) sum[r] += part[r];                                              \
            } else {                                                                                        \
                for (int r = 0; r < R; r++) sum[r] += hsum16(acc[r]);                                       \
            }                                                                                               \
        }                                                                                                   \
        for (int r = 0; r < R; r++) out[r] = sum[r];                                                        \
    }                                                                                                       \
    INLINE float vec_dot_##name##_impl(const int vnni, int64_t n, const void *w, const void *a) {      \
        float r;                                                                                            \
        krows_##name(1, vnni, 0, n / QK_K, w, 0, sizeof(block_t), a, NULL, &r, 0, NULL);                    \
        return r;                                                                                           \
    }                                                                                                       \
    /* rows4: w in the ROWS4 layout, each group read front to back (no software prefetch: one stream    \
     * the hardware prefetcher follows, which measured a little faster without); its blocks chained     \
     * for K_CHAIN formats (the last rows, fewer than 4, are plain and prepare their own activations)  */ \
    INLINE void kgemv_##name(const int vnni, const int rows4, int64_t n, const void *w, size_t rb, int nrows, \
                             const void *a, float *out) {                                                   \
        const int chained = rows4 && K_CHAIN_##name;                                                        \
        const block_q8_K *y = a;                                                                            \
        const size_t bsz = sizeof(block_t);                                                                 \
        const int64_t nsb = n / QK_K;                                                                       \
        aKs Ab[KACT_CHUNK];                                                                                 \
        if (nsb <= 0)                                                                                       \
            for (int r = 0; r < nrows; r++) out[r] = 0.0f;                                                  \
        for (int64_t c0 = 0; c0 < nsb; c0 += KACT_CHUNK) {                                                  \
            const int64_t cb = nsb - c0 < KACT_CHUNK ? nsb - c0 : KACT_CHUNK;                               \
            for (int64_t i = 0; i < cb; i++) {                                                              \
                act_##name(&y[c0 + i], &Ab[i]);                                                             \
                if (chained) act_chain(&Ab[i]);                                                             \
            }                                                                                               \
            const char *p = (const char *)w + (size_t)c0 * bsz;                                             \
            const size_t len = (size_t)cb * bsz;                                                            \
            const gemv_pf pf4 = gemv_prefetch_plan(4, rb, len), pf1 = gemv_prefetch_plan(1, rb, len);       \
            int r = 0;                                                                                      \
            for (; r + 4 <= nrows; r += 4, p += 4 * rb)                                                     \
                if (rows4)                                                                                  \
                    krows_##name(4, vnni, chained, cb, p + 3 * c0 * bsz, bsz, 4 * bsz, NULL, Ab, out + r, c0 > 0, NULL); \
                else                                                                                        \
                    krows_##name(4, vnni, 0, cb, p, rb, bsz, NULL, Ab, out + r, c0 > 0, &pf4);              \
            for (; r < nrows; r++, p += rb)                                                                 \
                krows_##name(1, vnni, 0, cb, p, rb, bsz, y + c0, chained ? NULL : Ab, out + r, c0 > 0, &pf1); \
        }                                                                                                   \
    }                                                                                                       \
    INLINE void gemv_##name##_impl(const int vnni, int64_t n, const void *w, size_t rb, int nrows,         \
                                   const void *a, float *out) {                                             \
        kgemv_##name(vnni, 0, n, w, rb, nrows, a, out);                                                     \
    }                                                                                                       \
    DEFINE_GEMV4_VARIANTS(name, kgemv_##name)                                                              \
    /* gemm: R rows x T activation rows over one group of nsb super-blocks from the buffers               \
     * (row r's super-blocks at W + r * nsb, activation row t's at A + t * nsb) */                          \
    INLINE void ktile_##name(const int R, const int T, const int vnni, int nsb, const wKg *W, const __m512 *WM, \
                             const aKg *A, const __m512 *AB, float *out, size_t os) {                       \
        __m512 acc[4][4];                                                                                   \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                                 \
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();           \
        for (int j = 0; j < nsb; j++) {                                                                     \
            __m512i s[4][4];                                                                                \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                             \
                _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) s[r][t] = A[t * nsb + j].seed;          \
            if (vnni) {                                                                                     \
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)                                         \
                    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {                                   \
                        const __m512i av = A[t * nsb + j].v[i];                                             \
                        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                 \
                            s[r][t] = _mm512_dpbusd_epi32(s[r][t], W[r * nsb + j].v[i], av);                \
                    }                                                                                       \
            } else {                                                                                        \
                _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)                                         \
                    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                     \
                        s[r][t] = k_dot4(0, K_SGN_##name, K_GRP_##name, W[r * nsb + j].v, A[t * nsb + j].v, s[r][t]); \
            }                                                                                               \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                             \
                _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {                                       \
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][t]),                                \
                                                _mm512_mul_ps(W[r * nsb + j].dsc, A[t * nsb + j].da), acc[r][t]); \
                    if (K_MIN_##name) acc[r][t] = _mm512_fmadd_ps(WM[r * nsb + j], AB[t * nsb + j], acc[r][t]); \
                }                                                                                           \
        }                                                                                                   \
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {                                               \
            if (R == 4) {                                                                                   \
                _mm_storeu_ps(out + t * os, _mm_add_ps(_mm_loadu_ps(out + t * os),                          \
                                                       reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]))); \
            } else {                                                                                        \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) out[t * os + r] += hsum16(acc[r][t]);   \
            }                                                                                               \
        }                                                                                                   \
    }                                                                                                       \
    /* gemm with few activation rows (a decode step of several sequences, or of guessed tokens):        \
     * the weights stream once, as in gemv, each super-block decoded once and dotted with every            \
     * activation row; per (row, activation row) exactly krows' float steps */                            \
    INLINE void kfew_##name##_t(const int ncols, const int vnni, int64_t n, const void *w, size_t rb,       \
                                int nrows, const void *a, size_t as, float *out, size_t os) {               \
        const int64_t nsb = n / QK_K;                                                                       \
        aKs(*const Ab)[KACT_CHUNK] = (aKs(*)[KACT_CHUNK])(void *)gemm_scratch(); /* [ncols][KACT_CHUNK] */  \
        for (int t = 0; t < ncols; t++)                                                                     \
            for (int r = 0; r < nrows; r++) out[t * os + r] = 0.0f;                                         \
        for (int64_t c0 = 0; c0 < nsb; c0 += KACT_CHUNK) {                                                  \
            const int64_t cb = nsb - c0 < KACT_CHUNK ? nsb - c0 : KACT_CHUNK;                               \
            for (int t = 0; t < ncols; t++)                                                                 \
                for (int64_t i = 0; i < cb; i++)                                                            \
                    act_##name((const block_q8_K *)(const void *)((const char *)a + (size_t)t * as) + c0 + i, &Ab[t][i]); \
            const char *p = (const char *)w + (size_t)c0 * sizeof(block_t);                                 \
            const gemv_pf pf = gemv_prefetch_plan(1, rb, (size_t)cb * sizeof(block_t));                     \
            for (int r = 0; r < nrows; r++, p += rb)                                                        \
                for (int64_t g0 = 0; g0 < cb; g0 += RED_SB) {                                               \
                    const int64_t g1 = cb - g0 < RED_SB ? cb : g0 + RED_SB;                                 \
                    __m512 acc[GEMM_FEW_COLS];                                                              \
                    for (int t = 0; t < ncols; t++) acc[t] = _mm512_setzero_ps();                           \
                    for (int64_t i = g0; i < g1; i++) {                                                     \
                        gemv_prefetch_step(&pf, 1, (uintptr_t)(p + i * sizeof(block_t)), i * sizeof(block_t), sizeof(block_t)); \
                        wKs W;                                                                              \
                        dec_##name((const block_t *)(const void *)p + i, &W);                               \
                        for (int t = 0; t < ncols; t++) {                                                   \
                            const aKs *A = &Ab[t][i];                                                       \
                            __m512i d[4];                                                                   \
                            for (int q = 0; q < 4; q++) d[q] = k_dot(vnni, K_SGN_##name, _mm512_setzero_si512(), W.v[q], A->a[q]); \
                            const __m512i isum = _mm512_add_epi32(red4i(d[0], d[1], d[2], d[3]), A->seed);  \
                            acc[t] = k_fin(K_MIN_##name, isum, W.dsc, W.nmin, A, acc[t]);                   \
                        }                                                                                   \
                    }                                                                                       \
                    for (int t = 0; t < ncols; t++) out[t * os + r] += hsum16(acc[t]);                      \
                }                                                                                           \
        }                                                                                                   \
    }                                                                                                       \
    INLINE void gemm_##name##_impl(const int vnni, int64_t n, const void *w, size_t rb, int nrows,         \
                                   const void *a, size_t as, int ncols, float *out, size_t os) {            \
        if (ncols <= GEMM_FEW_COLS) { /* few activation rows: kfew */                                       \
            FEW_CASES(ncols, kfew_##name##_t, vnni, n, w, rb, nrows, a, as, out, os)                        \
            return;                                                                                         \
        }                                                                                                   \
        const int64_t nsb = n / QK_K;                                                                       \
        const int mins = K_MIN_##name;                                                                      \
        unsigned char *const wmem = gemm_scratch();                                                         \
        aKg *const A = (aKg *)(void *)(wmem + GEMMK_WBUF);                                                  \
        __m512 *const AB = (__m512 *)(void *)(wmem + GEMMK_WBUF + GEMMK_TP * RED_SB * sizeof(aKg));         \
        for (int t = 0; t < ncols; t++)                                                                     \
            for (int r = 0; r < nrows; r++) out[t * os + r] = 0.0f;                                         \
        for (int64_t c0 = 0; c0 < nsb; c0 += RED_SB) {                                                      \
            const int cb = nsb - c0 < RED_SB ? (int)(nsb - c0) : RED_SB;                                    \
            const size_t per_row = (size_t)cb * (sizeof(wKg) + (mins ? 64 : 0));                            \
            int rp = (int)(GEMMK_WBUF / per_row) / GEMMK_R * GEMMK_R;                                       \
            if (rp > nrows) rp = nrows;                                                                     \
            wKg *W = (wKg *)(void *)wmem;                                                                   \
            __m512 *WM = (__m512 *)(void *)(wmem + (size_t)rp * cb * sizeof(wKg));                          \
            for (int r0 = 0; r0 < nrows; r0 += rp) {                                                        \
                const int Rn = nrows - r0 < rp ? nrows - r0 : rp;                                           \
                for (int r = 0; r < Rn; r++)                                                                \
                    for (int j = 0; j < cb; j++) {                                                          \
                        wKs D;                                                                              \
                        dec_##name((const block_t *)(const void *)((const char *)w + (size_t)(r0 + r) * rb) + c0 + j, &D); \
                        wKg *o = &W[r * cb + j];                                                            \
                        m_transpose(D.v[0], D.v[1], D.v[2], D.v[3], o->v);                                  \
                        o->dsc = D.dsc;                                                                     \
                        if (mins) WM[r * cb + j] = D.nmin;                                                  \
                    }                                                                                       \
                for (int t0 = 0; t0 < ncols; t0 += GEMMK_TP) {                                              \
                    const int Tn = ncols - t0 < GEMMK_TP ? ncols - t0 : GEMMK_TP;                           \
                    for (int t = 0; t < Tn; t++)                                                            \
                        for (int j = 0; j < cb; j++) {                                                      \
                            aKs g;                                                                          \
                            act_##name((const block_q8_K *)(const void *)((const char *)a + (size_t)(t0 + t) * as) + c0 + j, &g); \
                            aKg *o = &A[t * cb + j];                                                        \
                            m_transpose(g.a[0], g.a[1], g.a[2], g.a[3], o->v);                              \
                            o->seed = g.seed, o->da = g.da;                                                 \
                            if (mins) AB[t * cb + j] = g.bs;                                                \
                        }                                                                                   \
                    float *ob = out + (size_t)t0 * os + r0;                                                 \
                    int r = 0;                                                                              \
                    for (; r + GEMMK_R <= Rn; r += GEMMK_R) {                                               \
                        int t = 0;                                                                          \
                        for (; t + GEMMK_T <= Tn; t += GEMMK_T)                                             \
                            ktile_##name(GEMMK_R, GEMMK_T, vnni, cb, W + r * cb, WM + (mins ? r * cb : 0),   \
                                         A + t * cb, AB + (mins ? t * cb : 0), ob + t * os + r, os);        \
                        for (; t < Tn; t++)                                                                 \
                            ktile_##name(GEMMK_R, 1, vnni, cb, W + r * cb, WM + (mins ? r * cb : 0),         \
                                         A + t * cb, AB + (mins ? t * cb : 0), ob + t * os + r, os);        \
                    }                                                                                       \
                    for (; r < Rn; r++) {                                                                   \
                        int t = 0;                                                                          \
                        for (; t + GEMMK_T <= Tn; t += GEMMK_T)                                             \
                            ktile_##name(1, GEMMK_T, vnni, cb, W + r * cb, WM + (mins ? r * cb : 0),         \
                                         A + t * cb, AB + (mins ? t * cb : 0), ob + t * os + r, os);        \
                        for (; t < Tn; t++)                                                                 \
                            ktile_##name(1, 1, vnni, cb, W + r * cb, WM + (mins ? r * cb : 0),               \
                                         A + t * cb, AB + (mins ? t * cb : 0), ob + t * os + r, os);        \
                    }                                                                                       \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
    }                                                                                                       \
    DEFINE_VARIANTS(name)

DEFINE_K512(q4_K, block_q4_K)
DEFINE_K512(q5_K, block_q5_K)
DEFINE_K512(q6_K, block_q6_K)
DEFINE_K512(q2_K, block_q2_K)
DEFINE_K512(q3_K, block_q3_K)
DEFINE_K512(iq4_xs, block_iq4_xs)
DEFINE_K512(iq3_s, block_iq3_s)
DEFINE_K512(iq3_xxs, block_iq3_xxs)
DEFINE_K512(iq2_xxs, block_iq2_xxs)
DEFINE_K512(iq2_xs, block_iq2_xs)
DEFINE_K512(iq2_s, block_iq2_s)
DEFINE_K512(iq1_s, block_iq1_s)
DEFINE_K512(iq1_m, block_iq1_m)

INLINE __mmask16 tail_mask16(int64_t m) { return (__mmask16)_bzhi_u32(0xffffu, (unsigned)(m > 16 ? 16 : m)); }

/* ------------------------------------------------------------------ */
/* float weights (F32, F16, BF16) x float activations                  */
/* ------------------------------------------------------------------ */
/* One 16-lane accumulator per row, one FMA per 16 elements in order (a
 * last partial group masked: its missing lanes add 0), then the 16 lanes
 * summed in reduce4's order. gemv does 4 rows at a time (reduce4 gives all
 * four sums), vec_dot is the one-row case (hsum16): the same float steps,
 * so the contract of quants.h holds. Attention's scores go through here. */

INLINE __m512 fload_f32(const void *p, int64_t i, __mmask16 k) { return _mm512_maskz_loadu_ps(k, (const float *)p + i); }
INLINE __m512 fload_f16(const void *p, int64_t i, __mmask16 k) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, (const uint16_t *)p + i));
}
INLINE __m512 fload_bf16(const void *p, int64_t i, __mmask16 k) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, (const uint16_t *)p + i)), 16));
}

#define ESIZE_f32 4 /* bytes per weight */
#define ESIZE_f16 2
#define ESIZE_bf16 2

#define DEFINE_F512(name)                                                                                   \
    INLINE void frows_##name(const int R, int64_t n, const char *w, size_t rb, const float *y, float *out,  \
                             const gemv_pf *pf) {                                                           \
        __m512 c[4];                                                                                        \
        for (int r = 0; r < R; r++) c[r] = _mm512_setzero_ps();                                             \
        int64_t i = 0;                                                                                      \
        for (; i + 16 <= n; i += 16) {                                                                      \
            const __m512 yv = _mm512_loadu_ps(y + i);                                                       \
            if (pf) gemv_prefetch_step(pf, R, (uintptr_t)w + i * ESIZE_##name, i * ESIZE_##name, 16 * ESIZE_##name);                         \
            for (int r = 0; r < R; r++) c[r] = _mm512_fmadd_ps(fload_##name(w + r * rb, i, 0xffff), yv, c[r]); \
        }                                                                                                   \
        if (i < n) {                                                                                        \
            const __mmask16 k = tail_mask16(n - i);                                                         \
            const __m512 yv = _mm512_maskz_loadu_ps(k, y + i);                                              \
            for (int r = 0; r < R; r++) c[r] = _mm512_fmadd_ps(fload_##name(w + r * rb, i, k), yv, c[r]);   \
        }                                                                                                   \
        if (R == 4)                                                                                         \
            _mm_storeu_ps(out, reduce4(c[0], c[1], c[2], c[3]));                                            \
        else                                                                                                \
            for (int r = 0; r < R; r++) out[r] = hsum16(c[r]);                                              \
    }                                                                                                       \
    static void gemv_##name(int64_t n, const void *restrict w, size_t rb, int nrows, const void *restrict a,  \
                            float *restrict out) {                                                          \
        const char *wr = w;                                                                                 \
        const gemv_pf pf4 = gemv_prefetch_plan(4, rb, n * ESIZE_##name), pf1 = gemv_prefetch_plan(1, rb, n * ESIZE_##name); \
        int r = 0;                                                                                          \
        for (; r + 4 <= nrows; r += 4, wr += 4 * rb) frows_##name(4, n, wr, rb, a, out + r, &pf4);          \
        for (; r < nrows; r++, wr += rb) frows_##name(1, n, wr, rb, a, out + r, &pf1);                      \
    }                                                                                                       \
    static float vec_dot_##name(int64_t n, const void *restrict w, const void *restrict a) {               \
        float r;                                                                                            \
        frows_##name(1, n, w, 0, a, &r, NULL);                                                                    \
        return r;                                                                                           \
    }                                                                                                       \
    /* ROWS4: a group's rows interleave in units of 32 elements (quants.h), so the 4 rows are read    \
     * side by side in one stream, each with its own chain of FMAs in frows' order (one row's whole    \
     * unit first would make one long chain, bound by the FMA latency); a row's last unit may be       \
     * shorter */                                                                                       \
    static void gemv4_##name(int64_t n, const void *restrict w, size_t rb, int nrows, const void *restrict a,  \
                             float *restrict out) {                                                         \
        const float *y = a;                                                                                 \
        const int64_t unit = rows4_unit(1);                                                                 \
        const rows_at L = rows_group(unit * ESIZE_##name, rb);                                              \
        int r = 0;                                                                                          \
        for (; r + 4 <= nrows; r += 4) {                                                                    \
            const char *g = (const char *)w + r * rb;                                                       \
            __m512 c[4];                                                                                    \
            for (int q = 0; q < 4; q++) c[q] = _mm512_setzero_ps();                                         \
            for (int64_t u0 = 0; u0 < n; u0 += unit) {                                                      \
                const int64_t len = n - u0 < unit ? n - u0 : unit;                                          \
                const uint8_t *p[4];                                                                        \
                for (int q = 0; q < 4; q++) p[q] = row_at(g, &L, q, u0 * ESIZE_##name, u0 * ESIZE_##name);  \
                int64_t i = 0;                                                                              \
                for (; i + 16 <= len; i += 16) {                                                            \
                    const __m512 yv = _mm512_loadu_ps(y + u0 + i);                                          \
                    for (int q = 0; q < 4; q++) c[q] = _mm512_fmadd_ps(fload_##name(p[q], i, 0xffff), yv, c[q]); \
                }                                                                                           \
                if (i < len) {                                                                              \
                    const __mmask16 k = tail_mask16(len - i);                                               \
                    const __m512 yv = _mm512_maskz_loadu_ps(k, y + u0 + i);                                 \
                    for (int q = 0; q < 4; q++) c[q] = _mm512_fmadd_ps(fload_##name(p[q], i, k), yv, c[q]); \
                }                                                                                           \
            }                                                                                               \
            _mm_storeu_ps(out + r, reduce4(c[0], c[1], c[2], c[3]));                                        \
        }                                                                                                   \
        gemv_##name(n, (const char *)w + r * rb, rb, nrows - r, a, out + r);                                \
    }

DEFINE_F512(f32)
DEFINE_F512(f16)
DEFINE_F512(bf16)

/* Float-weight gemm (F32: attention's scores, key rows against the query
 * rows of a tile; F16: the same straight from the f16 cache, and prefill on
 * F16 and BF16 weights): R rows x C activation rows, each pair with frows' one
 * accumulator and float steps, the R row loads shared by the C activation
 * rows and the C activation loads by the R rows (10 loads per 24 FMAs for
 * 6 x 4, 24 of the 32 registers accumulating). The activation rows are taken
 * in blocks of FTILE_ACT_BYTES that every row of the call meets while they
 * sit in L2 (else a prompt's rows stream from L3 once per 6 weight rows).
 * F16 prefill ~113 GFLOP/s on one Zen 4 core here, near its FMA peak
 * (~117), for rows of 2048. */
#define FTILE_ACT_BYTES (192 << 10)
/* activation rows (as bytes apart) per block: a multiple of 4, at least 4 */
INLINE int ftile_cols_block(size_t as) {
    const size_t c = FTILE_ACT_BYTES / as / 4 * 4;
    return c < 4 ? 4 : (int)c;
}
#define DEFINE_FTILE512(name)                                                                               \
    /* one step of 16 elements (k: those present; whole steps pass a constant mask, which the         \
     * compiler turns into plain loads: masked loads in every step cost a fifth of the speed on Zen 4) */ \
    INLINE void ftile_step_##name(const int R, const int C, int64_t i, const __mmask16 k, const char *w,   \
                                  size_t rb, const char *a, size_t as, __m512 c[6][4]) {                 \
        __m512 wv[6];                                                                                   \
        for (int r = 0; r < R; r++) wv[r] = fload_##name(w + r * rb, i, k);                             \
        for (int t = 0; t < C; t++) {                                                                   \
            const __m512 yv = _mm512_maskz_loadu_ps(k, (const float *)(a + t * as) + i);                \
            for (int r = 0; r < R; r++) c[r][t] = _mm512_fmadd_ps(wv[r], yv, c[r][t]);                  \
        }                                                                                               \
    }                                                                                                   \
    INLINE void ftile_##name(const int R, const int C, int64_t n, const char *w, size_t rb, const char *a,  \
                             size_t as, float *out, size_t os) {                                            \
        __m512 c[6][4];                                                                                     \
        for (int r = 0; r < R; r++)                                                                         \
            for (int t = 0; t < C; t++) c[r][t] = _mm512_setzero_ps();                                      \
        int64_t i = 0;                                                                                      \
        for (; i + 16 <= n; i += 16) ftile_step_##name(R, C, i, 0xffff, w, rb, a, as, c);                  \
        if (i < n) ftile_step_##name(R, C, i, tail_mask16(n - i), w, rb, a, as, c);                         \
        for (int t = 0; t < C; t++) {                                                                       \
            if (R >= 4) _mm_storeu_ps(out + t * os, reduce4(c[0][t], c[1][t], c[2][t], c[3][t]));          \
            for (int r = R >= 4 ? 4 : 0; r < R; r++) out[t * os + r] = hsum16(c[r][t]);                   \
        }                                                                                                   \
    }                                                                                                       \
    INLINE void fcols_##name(const int R, int64_t n, const char *w, size_t rb, const char *a, size_t as,    \
                             int ncols, float *out, size_t os) {                                            \
        int t = 0;                                                                                          \
        for (; t + 4 <= ncols; t += 4) ftile_##name(R, 4, n, w, rb, a + t * as, as, out + t * os, os);      \
        switch (ncols - t) {                                                                                \
        case 3: ftile_##name(R, 3, n, w, rb, a + t * as, as, out + t * os, os); break;                      \
        case 2: ftile_##name(R, 2, n, w, rb, a + t * as, as, out + t * os, os); break;                      \
        case 1: ftile_##name(R, 1, n, w, rb, a + t * as, as, out + t * os, os); break;                      \
        }                                                                                                   \
    }                                                                                                       \
    static void gemm_##name(int64_t n, const void *restrict w, size_t rb, int nrows, const void *restrict a, \
                            size_t as, int ncols, float *restrict out, size_t os) {                         \
        const char *wr = w;                                                                                 \
        const int block = ftile_cols_block(as);                                                             \
        for (int t0 = 0; t0 < ncols; t0 += block) {                                                        \
            const int nc = ncols - t0 < block ? ncols - t0 : block;                                         \
            const char *at = (const char *)a + (size_t)t0 * as;                                             \
            float *ot = out + (size_t)t0 * os;                                                              \
            int r = 0;                                                                                      \
            for (; r + 6 <= nrows; r += 6) fcols_##name(6, n, wr + r * rb, rb, at, as, nc, ot + r, os);     \
            for (; r + 4 <= nrows; r += 4) fcols_##name(4, n, wr + r * rb, rb, at, as, nc, ot + r, os);     \
            for (; r < nrows; r++) fcols_##name(1, n, wr + r * rb, rb, at, as, nc, ot + r, os);             \
        }                                                                                                   \
    }

DEFINE_FTILE512(f32)
DEFINE_FTILE512(f16)
DEFINE_FTILE512(bf16)

/* ------------------------------------------------------------------ */
/* vector math: GLU activations, softmax exp, axpy                      */
/* ------------------------------------------------------------------ */
/* The algorithm of avx2.c's exp8 (same reduction and polynomial), 16
 * lanes; 2^k by vscalefps, which also overflows to inf past ln(FLT_MAX)
 * (x clamped to [-87.33, 89]). Tails through masked loads and stores. */

#define EXP_LO (-87.33f)
#define EXP_HI 89.0f

INLINE __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.383684576e-03f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.374815807e-03f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166822508e-02f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666641980e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.999999106e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k); /* p * 2^k, exact */
}

INLINE __m512 glu16(__m512 g, __m512 u, const int kind) {   /* kind: GLU_K_* (avx2.c's glu8) */
    __m512 z = g;
    if (kind == GLU_K_SIGMOID) return _mm512_div_ps(u, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    if (kind == GLU_K_GELU_TANH) {
        const float k0 = 2.0f * 0.7978845608028654f;
        z = _mm512_mul_ps(g, _mm512_fmadd_ps(_mm512_mul_ps(g, g), _mm512_set1_ps(k0 * 0.044715f), _mm512_set1_ps(k0)));
    }
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), z));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

INLINE void glu_x16(int64_t n, const float *gate, const float *up, float *out, const int kind) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, glu16(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i), kind));
    if (i < n) {
        const __mmask16 k = tail_mask16(n - i);
        _mm512_mask_storeu_ps(out + i, k, glu16(_mm512_maskz_loadu_ps(k, gate + i), _mm512_maskz_loadu_ps(k, up + i), kind));
    }
}

static void glu_silu(int64_t n, const float *gate, const float *up, float *out) { glu_x16(n, gate, up, out, GLU_K_SILU); }
static void glu_gelu_tanh(int64_t n, const float *gate, const float *up, float *out) {
    glu_x16(n, gate, up, out, GLU_K_GELU_TANH);
}
static void glu_sigmoid(int64_t n, const float *gate, const float *up, float *out) {
    glu_x16(n, gate, up, out, GLU_K_SIGMOID);
}

static float exp_sum(int64_t n, float *s, float m) {
    const __m512 mv = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = tail_mask16(n - i);
        const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), mv);
        /* below the clamp (and -inf): 0; lanes past n: 0 */
        const __m512 e = _mm512_maskz_mov_ps(k & _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_LO), _CMP_GE_OQ), exp16(x));
        _mm512_mask_storeu_ps(s + i, k, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

/* 64 columns at a time held in 4 registers over all rows; tail columns masked */
static void wsum_f32(int64_t n, int rows, const float *restrict w, const float *restrict x, int64_t ld,
                     float *restrict y) {
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        __m512 a0 = _mm512_loadu_ps(y + j), a1 = _mm512_loadu_ps(y + j + 16);
        __m512 a2 = _mm512_loadu_ps(y + j + 32), a3 = _mm512_loadu_ps(y + j + 48);
        const float *p = x + j;
        for (int i = 0; i < rows; i++, p += ld) {
            const __m512 wv = _mm512_set1_ps(w[i]);
            a0 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(p), a0);
            a1 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(p + 16), a1);
            a2 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(p + 32), a2);
            a3 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(p + 48), a3);
        }
        _mm512_storeu_ps(y + j, a0), _mm512_storeu_ps(y + j + 16, a1);
        _mm512_storeu_ps(y + j + 32, a2), _mm512_storeu_ps(y + j + 48, a3);
    }
    for (; j < n; j += 16) {
        const __mmask16 k = tail_mask16(n - j);
        __m512 a0 = _mm512_maskz_loadu_ps(k, y + j);
        const float *p = x + j;
        for (int i = 0; i < rows; i++, p += ld) a0 = _mm512_fmadd_ps(_mm512_set1_ps(w[i]), _mm512_maskz_loadu_ps(k, p), a0);
        _mm512_mask_storeu_ps(y + j, k, a0);
    }
}

/* wsum_f32 for Q outputs at once, columns [j, j + 16V): each x load
 * shared by the Q outputs; an element's steps are wsum_f32's (rows in
 * order, one FMA each), whatever the chunking. k masks the last 16. x rows
 * (row_bytes apart) are floats (fmt 0), halves (fmt 1: V straight from the
 * f16 cache) or Q8_0 blocks (fmt 2: a q8_0 cache, n a multiple of 32; each
 * value q * d as dequant_q8_0 gives it), each converted exactly, so the
 * same numbers as the float form on converted rows. */
enum { X_F32 = 0, X_F16 = 1, X_Q8_0 = 2 };

INLINE __m512 xload(const int fmt, const void *row, int64_t i, __mmask16 k) {
    if (fmt == X_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)row + i / QK;
        const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + i % QK))));
        return _mm512_mul_ps(q, _mm512_set1_ps(_cvtsh_ss(b->d)));
    }
    return fmt == X_F16 ? fload_f16(row, i, k) : fload_f32(row, i, k);
}

INLINE void wsum_chunk(const int fmt, const int Q, const int V, __mmask16 k, int rows, const float *w, int64_t ws,
                       const void *x, int64_t j, size_t row_bytes, float *y, int64_t ys) {
    __m512 acc[4][4];
    for (int q = 0; q < Q; q++)
        for (int v = 0; v < V; v++) acc[q][v] = _mm512_maskz_loadu_ps(v == V - 1 ? k : 0xffff, y + q * ys + 16 * v);
    for (int i = 0; i < rows; i++, x = (const char *)x + row_bytes) {
        __m512 xv[4];
        for (int v = 0; v < V; v++) xv[v] = xload(fmt, x, j + 16 * v, v == V - 1 ? k : 0xffff);
        for (int q = 0; q < Q; q++) {
            const __m512 wv = _mm512_set1_ps(w[q * ws + i]);
            for (int v = 0; v < V; v++) acc[q][v] = _mm512_fmadd_ps(wv, xv[v], acc[q][v]);
        }
    }
    for (int q = 0; q < Q; q++)
        for (int v = 0; v < V; v++) _mm512_mask_storeu_ps(y + q * ys + 16 * v, v == V - 1 ? k : 0xffff, acc[q][v]);
}

INLINE void wsum_q(const int fmt, const int Q, int64_t n, int rows, const float *w, int64_t ws, const void *x,
                   size_t row_bytes, float *y, int64_t ys) {
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) wsum_chunk(fmt, Q, 4, 0xffff, rows, w, ws, x, j, row_bytes, y + j, ys);
    for (; j < n; j += 16) wsum_chunk(fmt, Q, 1, tail_mask16(n - j), rows, w, ws, x, j, row_bytes, y + j, ys);
}

/* ld: elements between rows (fmt 0, 1), bytes (fmt 2) */
INLINE void wsum_many(const int fmt, int64_t n, int rows, int nq, const float *w, int64_t ws, const void *x,
                      int64_t ld, float *y, int64_t ys) {
    const size_t rb = fmt == X_Q8_0 ? (size_t)ld : (size_t)ld * (fmt == X_F16 ? 2 : 4);
    int q = 0;
    for (; q + 4 <= nq; q += 4) wsum_q(fmt, 4, n, rows, w + q * ws, ws, x, rb, y + q * ys, ys);
    switch (nq - q) {
    case 3: wsum_q(fmt, 3, n, rows, w + q * ws, ws, x, rb, y + q * ys, ys); break;
    case 2: wsum_q(fmt, 2, n, rows, w + q * ws, ws, x, rb, y + q * ys, ys); break;
    case 1: wsum_q(fmt, 1, n, rows, w + q * ws, ws, x, rb, y + q * ys, ys); break;
    }
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

/* avx2.c's tanh8 (same branches, polynomial and clamp), 16 lanes */
INLINE __m512 tanh16(__m512 u) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    const __m512 a = _mm512_min_ps(_mm512_andnot_ps(sign, u), _mm512_set1_ps(9.0f));
    const __m512 a2 = _mm512_mul_ps(a, a);
    __m512 p = _mm512_set1_ps(62.0f / 2835.0f);
    p = _mm512_fmadd_ps(p, a2, _mm512_set1_ps(-17.0f / 315.0f));
    p = _mm512_fmadd_ps(p, a2, _mm512_set1_ps(2.0f / 15.0f));
    p = _mm512_fmadd_ps(p, a2, _mm512_set1_ps(-1.0f / 3.0f));
    const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(a, a2), p, a);
    const __m512 e = exp16(_mm512_add_ps(a, a));
    const __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.0f),
                                     _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
    const __m512 t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.3f), _CMP_LT_OQ), big, small);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(u, u, _CMP_UNORD_Q), _mm512_or_ps(t, _mm512_and_ps(sign, u)), u);
}

INLINE __m512 softcap16(__m512 x, __m512 scale, __m512 cap) {
    return _mm512_mul_ps(cap, tanh16(_mm512_div_ps(_mm512_mul_ps(x, scale), cap)));
}

static void softcap(int64_t n, float *s, float scale, float cap) {
    const __m512 sv = _mm512_set1_ps(scale), cv = _mm512_set1_ps(cap);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = tail_mask16(n - i);
        _mm512_mask_storeu_ps(s + i, k, softcap16(_mm512_maskz_loadu_ps(k, s + i), sv, cv));
    }
}

static void axpy_f32(int64_t n, float a, const float *restrict x, float *restrict y) {
    const __m512 av = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 k = tail_mask16(n - i);
        _mm512_mask_storeu_ps(y + i, k, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(k, x + i), _mm512_maskz_loadu_ps(k, y + i)));
    }
}

/* ssm_scan_row: 16 states per step, s = fma(B, xdt, s * decay), the dot with C in one
 * accumulator per 16 (the state stays in L1 across the tokens; its tail masked) */
static void ssm_scan_row(int64_t n, float *restrict s, int n_tok, const float *bc, int64_t bc_stride, int64_t c_off,
                         const float *x, int64_t x_stride, const float *dt, const float *decay, float *y,
                         int64_t y_stride) {
    for (int t = 0; t < n_tok; t++) {
        const float *B = bc + t * bc_stride, *C = B + c_off;
        const __m512 xdt = _mm512_set1_ps(x[t * x_stride] * dt[t]), d = _mm512_set1_ps(decay[t]);
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 32 <= n; i += 32) {
            const __m512 s0 = _mm512_fmadd_ps(_mm512_loadu_ps(B + i), xdt, _mm512_mul_ps(_mm512_loadu_ps(s + i), d));
            const __m512 s1 = _mm512_fmadd_ps(_mm512_loadu_ps(B + i + 16), xdt,
                                              _mm512_mul_ps(_mm512_loadu_ps(s + i + 16), d));
            _mm512_storeu_ps(s + i, s0);
            _mm512_storeu_ps(s + i + 16, s1);
            acc0 = _mm512_fmadd_ps(s0, _mm512_loadu_ps(C + i), acc0);
            acc1 = _mm512_fmadd_ps(s1, _mm512_loadu_ps(C + i + 16), acc1);
        }
        for (; i < n; i += 16) {
            const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail_mask16(n - i);
            const __m512 s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, B + i), xdt,
                                              _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + i), d));
            _mm512_mask_storeu_ps(s + i, k, s0);
            acc0 = _mm512_fmadd_ps(s0, _mm512_maskz_loadu_ps(k, C + i), acc0);
        }
        y[t * y_stride] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    }
}

/* K/V cache rows to float: 16 halves per convert, the row's tail masked */
static void f16_to_f32_rows(const f16_t *restrict x, int64_t x_stride, int rows, float *restrict out, int64_t n) {
    for (int r = 0; r < rows; r++, x += x_stride, out += n) {
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, fload_f16(x, i, 0xffff));
        if (i < n) _mm512_mask_storeu_ps(out + i, tail_mask16(n - i), fload_f16(x, i, tail_mask16(n - i)));
    }
}

/* ------------------------------------------------------------------ */

void kernels_fill_avx512(kernel_table *t) {
    if (pyllm_avx512_vnni) {
#define SET(T, name)                          \
    t->vec_dot[T] = vec_dot_##name##_vnni;    \
    t->gemv[T] = gemv_##name##_vnni;          \
    t->gemm[T] = gemm_##name##_vnni;          \
    t->gemv4[T] = gemv4_##name##_vnni;
        SET(T_Q4_0, q4_0) SET(T_Q4_1, q4_1) SET(T_Q5_0, q5_0) SET(T_Q5_1, q5_1)
        SET(T_Q8_0, q8_0) SET(T_IQ4_NL, iq4_nl) SET(T_MXFP4, mxfp4)
        SET(T_Q4_K, q4_K) SET(T_Q5_K, q5_K) SET(T_Q6_K, q6_K) SET(T_Q2_K, q2_K) SET(T_Q3_K, q3_K)
        SET(T_IQ4_XS, iq4_xs) SET(T_IQ3_S, iq3_s) SET(T_IQ3_XXS, iq3_xxs)
        SET(T_IQ2_XXS, iq2_xxs) SET(T_IQ2_XS, iq2_xs) SET(T_IQ2_S, iq2_s) SET(T_IQ1_S, iq1_s) SET(T_IQ1_M, iq1_m)
#undef SET
        for (int T = 0; T < T_COUNT; T++) t->gemm_streams[T] = t->gemm[T] && T != T_F32 && T != T_F16 && T != T_BF16 ? GEMM_FEW_COLS : 0;
    } else {
#define SET(T, name)                        \
    t->vec_dot[T] = vec_dot_##name##_bw;    \
    t->gemv[T] = gemv_##name##_bw;          \
    t->gemm[T] = gemm_##name##_bw;          \
    t->gemv4[T] = gemv4_##name##_bw;
        SET(T_Q4_0, q4_0) SET(T_Q4_1, q4_1) SET(T_Q5_0, q5_0) SET(T_Q5_1, q5_1)
        SET(T_Q8_0, q8_0) SET(T_IQ4_NL, iq4_nl) SET(T_MXFP4, mxfp4)
        SET(T_Q4_K, q4_K) SET(T_Q5_K, q5_K) SET(T_Q6_K, q6_K) SET(T_Q2_K, q2_K) SET(T_Q3_K, q3_K)
        SET(T_IQ4_XS, iq4_xs) SET(T_IQ3_S, iq3_s) SET(T_IQ3_XXS, iq3_xxs)
        SET(T_IQ2_XXS, iq2_xxs) SET(T_IQ2_XS, iq2_xs) SET(T_IQ2_S, iq2_s) SET(T_IQ1_S, iq1_s) SET(T_IQ1_M, iq1_m)
#undef SET
        /* without VNNI only the K-quants' gemm has the streaming path (few_* is VNNI's) */
        t->gemm_streams[T_Q4_K] = t->gemm_streams[T_Q5_K] = t->gemm_streams[T_Q6_K] = GEMM_FEW_COLS;
        t->gemm_streams[T_Q2_K] = t->gemm_streams[T_Q3_K] = t->gemm_streams[T_IQ4_XS] = GEMM_FEW_COLS;
        t->gemm_streams[T_IQ3_S] = t->gemm_streams[T_IQ3_XXS] = GEMM_FEW_COLS;
        t->gemm_streams[T_IQ2_XXS] = t->gemm_streams[T_IQ2_XS] = t->gemm_streams[T_IQ2_S] = GEMM_FEW_COLS;
        t->gemm_streams[T_IQ1_S] = t->gemm_streams[T_IQ1_M] = GEMM_FEW_COLS;
    }
    t->rows4_codec[T_Q4_K] = rows4_code_q4_K;   /* K_CHAIN */
    t->rows4_codec[T_Q5_K] = rows4_code_q5_K;
    t->rows4_codec[T_Q6_K] = rows4_code_q6_K;
    t->rows4_codec[T_Q2_K] = rows4_code_q2_K;
    t->rows4_codec[T_Q3_K] = rows4_code_q3_K;
    t->rows4_codec[T_IQ4_XS] = rows4_code_iq4_xs;
    t->vec_dot[T_F32] = vec_dot_f32;
    t->gemv[T_F32] = gemv_f32;
    t->gemm[T_F32] = gemm_f32;
    t->gemm[T_F16] = gemm_f16;
    t->gemm[T_BF16] = gemm_bf16;
    t->vec_dot[T_F16] = vec_dot_f16;
    t->gemv[T_F16] = gemv_f16;
    t->vec_dot[T_BF16] = vec_dot_bf16;
    t->gemv[T_BF16] = gemv_bf16;
    t->gemv4[T_F32] = gemv4_f32;
    t->gemv4[T_F16] = gemv4_f16;
    t->gemv4[T_BF16] = gemv4_bf16;
    t->glu_silu = glu_silu;
    t->glu_gelu_tanh = glu_gelu_tanh;
    t->glu_sigmoid = glu_sigmoid;
    t->exp_sum = exp_sum;
    t->softcap = softcap;
    t->axpy_f32 = axpy_f32;
    t->wsum_f32 = wsum_f32;
    t->ssm_scan_row = ssm_scan_row;
    t->wsum_many_f32 = wsum_many_f32;
    t->wsum_many_f16 = wsum_many_f16;
    t->wsum_many_q8_0 = wsum_many_q8_0;
    t->f16_to_f32 = f16_to_f32_rows;
}
