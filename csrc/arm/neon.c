/* neon.c: AArch64 Advanced SIMD kernels (compiled only on aarch64).
 *
 * Provides every quantized format's vec_dot, gemv and gemm (Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4, Q2_K..Q6_K), dequant of Q4_0, Q4_1, Q8_0,
 * quantize_act for Q8_32 and Q8_K, the float helpers and the vector math of
 * GLU and attention; everything else comes from quants.c.
 *
 * The integer dot products use SDOT where the CPU has it: this file is
 * built twice, as itself with the baseline flags (widening multiplies,
 * smull + sadalp, which every AArch64 CPU has; kernels_fill_neon), and by
 * neon_dotprod.c with +dotprod (kernels_fill_neon_dotprod), which
 * dispatch.c picks where the CPU reports it (HWCAP_ASIMDDP: Cortex-A55/A76
 * and later, Apple M1 and later, Neoverse). Both forms give the same
 * integers, hence the same floats.
 *
 * dequant and quantize_act are bit-exact with quants.c: separate multiply
 * and add (no FMA; -std=c11 keeps GCC from contracting them), and
 * vcvtnq_s32_f32 rounds to nearest even like the reference.
 */
#include "quants.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

#ifndef KERNELS_FILL_NEON
#define KERNELS_FILL_NEON kernels_fill_neon
#endif

/* acc + the sum of products w x a (signed bytes) of elements 4 i .. 4 i + 3
 * in int32 lane i: SDOT, or widening multiplies added in pairs (each pair
 * of products fits int16: the activations are within -127..127), the same
 * integers lane for lane, so the float steps after it agree too */
INLINE int32x4_t dot16(int32x4_t acc, int8x16_t w, int8x16_t a) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, w, a);
#else
    const int16x8_t p0 = vmull_s8(vget_low_s8(w), vget_low_s8(a));
    const int16x8_t p1 = vmull_high_s8(w, a);
    return vpadalq_s16(acc, vpaddq_s16(p0, p1));
#endif
}

INLINE float16x4_t ld_f16x4(const f16_t *p) { return vreinterpret_f16_u16(vld1_u16(p)); }

/* one fp16 to float, exact, inline (the format's scales) */
INLINE float h2f(f16_t h) {
    __fp16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}

INLINE uint32_t ld32(const void *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* bytes j of 16 -> 0x10 where bit j of h is set, else 0 (the 5th bits) */
INLINE uint8x16_t bits_to_0x10(uint32_t h) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t b = vcombine_u8(vdup_n_u8((uint8_t)h), vdup_n_u8((uint8_t)(h >> 8)));
    return vandq_u8(vtstq_u8(b, vld1q_u8(bit)), vdupq_n_u8(0x10));
}

/* ------------------------------------------------------------------ */
/* 32-element formats x Q8_32                                          */
/* ------------------------------------------------------------------ */
/* A block decodes to its 32 values as signed bytes (the fixed offsets of
 * Q4_0 / Q5_0 subtracted: -8..7, -16..15), its d and, for Q4_1 / Q5_1,
 * its min m. Per (row, activation row, block):
 *     acc  = fma(float(sum of the 4 int32 lanes' dots), d * da, acc)    (4 lanes)
 *     accm = accm + m * s                                 (formats with a min)
 * and the row's result is vaddvq(acc) + accm. vec_dot, gemv and gemm all
 * run these steps (tile below), so they agree bit for bit (quants.h). */

typedef struct {
    int8x16_t lo, hi; /* elements 0..15, 16..31 */
    float d, m;
} wblock;

INLINE void dec_q4_0(const uint8_t *p, wblock *W) {
    const block_q4_0 *x = (const block_q4_0 *)(const void *)p;
    const uint8x16_t v = vld1q_u8(x->qs);
    W->lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
    W->hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
    W->d = h2f(x->d);
}

INLINE void dec_q4_1(const uint8_t *p, wblock *W) {
    const block_q4_1 *x = (const block_q4_1 *)(const void *)p;
    const uint8x16_t v = vld1q_u8(x->qs);
    W->lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
    W->hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
    W->d = h2f(x->d), W->m = h2f(x->m);
}

INLINE void dec_q5_0(const uint8_t *p, wblock *W) {
    const block_q5_0 *x = (const block_q5_0 *)(const void *)p;
    const uint8x16_t v = vld1q_u8(x->qs);
    const uint32_t h = ld32(x->qh);
    const uint8x16_t lo = vorrq_u8(vandq_u8(v, vdupq_n_u8(0x0f)), bits_to_0x10(h));
    const uint8x16_t hi = vorrq_u8(vshrq_n_u8(v, 4), bits_to_0x10(h >> 16));
    W->lo = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(16));
    W->hi = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(16));
    W->d = h2f(x->d);
}

INLINE void dec_q5_1(const uint8_t *p, wblock *W) {
    const block_q5_1 *x = (const block_q5_1 *)(const void *)p;
    const uint8x16_t v = vld1q_u8(x->qs);
    const uint32_t h = ld32(x->qh);
    W->lo = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, vdupq_n_u8(0x0f)), bits_to_0x10(h)));
    W->hi = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), bits_to_0x10(h >> 16)));
    W->d = h2f(x->d), W->m = h2f(x->m);
}

INLINE void dec_q8_0(const uint8_t *p, wblock *W) {
    const block_q8_0 *x = (const block_q8_0 *)(const void *)p;
    W->lo = vld1q_s8(x->qs);
    W->hi = vld1q_s8(x->qs + 16);
    W->d = h2f(x->d);
}

/* IQ4_NL, MXFP4: the 16 bytes of nibbles at qs as book values */
INLINE void dec_book(const uint8_t *qs, const int8_t *book, wblock *W) {
    const int8x16_t tab = vld1q_s8(book);
    const uint8x16_t v = vld1q_u8(qs);
    W->lo = vqtbl1q_s8(tab, vandq_u8(v, vdupq_n_u8(0x0f)));
    W->hi = vqtbl1q_s8(tab, vshrq_n_u8(v, 4));
}

INLINE void dec_iq4_nl(const uint8_t *p, wblock *W) {
    const block_iq4_nl *x = (const block_iq4_nl *)(const void *)p;
    dec_book(x->qs, kvalues_iq4nl, W);
    W->d = h2f(x->d);
}

INLINE void dec_mxfp4(const uint8_t *p, wblock *W) {
    const block_mxfp4 *x = (const block_mxfp4 *)(const void *)p;
    dec_book(x->qs, kvalues_mxfp4, W);
    const uint32_t d = e8m0_half_table[x->e];
    memcpy(&W->d, &d, 4);
}

INLINE void step32(const wblock *W, const block_q8_32 *y, const int min, float32x4_t *acc, float *accm) {
    const int32x4_t s = dot16(dot16(vdupq_n_s32(0), W->lo, vld1q_s8(y->qs)), W->hi, vld1q_s8(y->qs + 16));
    *acc = vfmaq_n_f32(*acc, vcvtq_f32_s32(s), W->d * y->d);
    if (min) *accm += W->m * y->s;
}

/* R weight rows x T activation rows (y[t]) over nb blocks:
 * out[t * os + r] = the pair's result; each row's blocks decoded once */
#define DEFINE_Q32(name, block_t)                                                                     \
    INLINE void tile_##name(const int R, const int T, int64_t nb, const uint8_t *w, size_t rb,        \
                            const block_q8_32 *const *y, float *out, size_t os) {                     \
        float32x4_t acc[4][4];                                                                         \
        float accm[4][4];                                                                              \
        for (int r = 0; r < R; r++)                                                                    \
            for (int t = 0; t < T; t++) acc[r][t] = vdupq_n_f32(0.0f), accm[r][t] = 0.0f;             \
        for (int64_t i = 0; i < nb; i++)                                                               \
            for (int r = 0; r < R; r++) {                                                              \
                wblock W;                                                                              \
                dec_##name(w + r * rb + (size_t)i * sizeof(block_t), &W);                              \
                for (int t = 0; t < T; t++) step32(&W, &y[t][i], HAS_MIN_##name, &acc[r][t], &accm[r][t]); \
            }                                                                                          \
        for (int r = 0; r < R; r++)                                                                    \
            for (int t = 0; t < T; t++) out[t * os + r] = vaddvq_f32(acc[r][t]) + accm[r][t];         \
    }                                                                                                  \
    static float vec_dot_##name(int64_t n, const void *restrict w, const void *restrict a) {          \
        const block_q8_32 *y = a;                                                                      \
        float r;                                                                                       \
        tile_##name(1, 1, n / QK, w, 0, &y, &r, 0);                                                    \
        return r;                                                                                      \
    }                                                                                                  \
    static void gemv_##name(int64_t n, const void *restrict w, size_t rb, int nrows,                  \
                            const void *restrict a, float *restrict out) {                             \
        const block_q8_32 *y = a;                                                                      \
        const uint8_t *p = w;                                                                          \
        int r = 0;                                                                                     \
        for (; r + 4 <= nrows; r += 4, p += 4 * rb) tile_##name(4, 1, n / QK, p, rb, &y, out + r, 0);  \
        for (; r < nrows; r++, p += rb) tile_##name(1, 1, n / QK, p, rb, &y, out + r, 0);              \
    }                                                                                                  \
    static void gemm_##name(int64_t n, const void *restrict w, size_t rb, int nrows, const void *restrict a,  \
                            size_t as, int ncols, float *restrict out, size_t os) {                   \
        for (int t0 = 0; t0 < ncols; t0 += 4) {                                                        \
            const int T = ncols - t0 < 4 ? ncols - t0 : 4;                                             \
            const block_q8_32 *y[4];                                                                   \
            for (int t = 0; t < T; t++) y[t] = (const void *)((const char *)a + (size_t)(t0 + t) * as); \
            const uint8_t *p = w;                                                                      \
            float *o = out + (size_t)t0 * os;                                                          \
            for (int r = 0; r < nrows; r++, p += rb) {                                                 \
                if (T == 4) tile_##name(1, 4, n / QK, p, rb, y, o + r, os);                            \
                else                                                                                   \
                    for (int t = 0; t < T; t++) tile_##name(1, 1, n / QK, p, rb, y + t, o + t * os + r, 0); \
            }                                                                                          \
        }                                                                                              \
    }

DEFINE_Q32(q4_0, block_q4_0)
DEFINE_Q32(q4_1, block_q4_1)
DEFINE_Q32(q5_0, block_q5_0)
DEFINE_Q32(q5_1, block_q5_1)
DEFINE_Q32(q8_0, block_q8_0)
DEFINE_Q32(iq4_nl, block_iq4_nl)
DEFINE_Q32(mxfp4, block_mxfp4)

/* ------------------------------------------------------------------ */
/* K-quants x Q8_K                                                     */
/* ------------------------------------------------------------------ */
/* A super-block decodes to its 256 values as signed bytes, v[j] holding
 * elements 16 j .. 16 j + 15 (the offsets of Q6_K and Q3_K subtracted), an
 * integer scale per 16 elements (the 32-element sub-blocks of Q4_K and
 * Q5_K give two vectors one scale), an integer min per 16 (Q2_K, Q4_K,
 * Q5_K; else 0), d and dmin. Per (row, activation row, super-block), as
 * quants.c's reference:
 *     isum = sum_j sc[j] * dot(v[j], a[j]),  msum = sum_j mn[j] * bsums[j]   (exact)
 *     sum += da * (d * float(isum) - dmin * float(msum))
 * so vec_dot, gemv and gemm agree bit for bit. */

typedef struct {
    int8x16_t v[16];
    int16_t sc[16], mn[16];
    float d, dmin;
} kblock;

/* Q4_K/Q5_K: the 6-bit scales and mins of the 8 sub-blocks of 32, each
 * stored for both of its 16-element halves */
INLINE void k4_scales(const uint8_t *q, kblock *B) {
    for (int j = 0; j < 8; j++) {
        const int sc = j < 4 ? q[j] & 63 : (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        const int m = j < 4 ? q[j + 4] & 63 : (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        B->sc[2 * j] = B->sc[2 * j + 1] = (int16_t)sc;
        B->mn[2 * j] = B->mn[2 * j + 1] = (int16_t)m;
    }
}

/* Q4_K/Q5_K nibbles: element 64 c + l is the low nibble of qs[32 c + l],
 * element 64 c + 32 + l its high nibble (l < 32) */
INLINE void k4_nibbles(const uint8_t *qs, uint8x16_t u[16]) {
    for (int c = 0; c < 4; c++) {
        const uint8x16_t q0 = vld1q_u8(qs + 32 * c), q1 = vld1q_u8(qs + 32 * c + 16);
        u[4 * c] = vandq_u8(q0, vdupq_n_u8(0x0f));
        u[4 * c + 1] = vandq_u8(q1, vdupq_n_u8(0x0f));
        u[4 * c + 2] = vshrq_n_u8(q0, 4);
        u[4 * c + 3] = vshrq_n_u8(q1, 4);
    }
}

/* Q5_K's 5th bits and Q3_K's hmask: bit s of byte l of a 32-byte plane
 * belongs to element 32 s + l; for v[j] (elements 16 j ..) that is bit
 * j >> 1 of bytes 16 (j & 1) ..: all ones where it is set */
INLINE uint8x16_t plane_bit(const uint8x16_t plane[2], int j) {
    return vtstq_u8(plane[j & 1], vdupq_n_u8((uint8_t)(1u << (j >> 1))));
}

INLINE void kdec_q4_K(const uint8_t *p, kblock *B) {
    const block_q4_K *x = (const block_q4_K *)(const void *)p;
    uint8x16_t u[16];
    k4_nibbles(x->qs, u);
    for (int j = 0; j < 16; j++) B->v[j] = vreinterpretq_s8_u8(u[j]);
    k4_scales(x->scales, B);
    B->d = h2f(x->d), B->dmin = h2f(x->dmin);
}

INLINE void kdec_q5_K(const uint8_t *p, kblock *B) {
    const block_q5_K *x = (const block_q5_K *)(const void *)p;
    uint8x16_t u[16];
    k4_nibbles(x->qs, u);
    const uint8x16_t qh[2] = {vld1q_u8(x->qh), vld1q_u8(x->qh + 16)};
    for (int j = 0; j < 16; j++)
        B->v[j] = vreinterpretq_s8_u8(vorrq_u8(u[j], vandq_u8(plane_bit(qh, j), vdupq_n_u8(0x10))));
    k4_scales(x->scales, B);
    B->d = h2f(x->d), B->dmin = h2f(x->dmin);
}

INLINE void kdec_q6_K(const uint8_t *p, kblock *B) {
    const block_q6_K *x = (const block_q6_K *)(const void *)p;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m2 = vdupq_n_u8(0x30);
    const int8x16_t off = vdupq_n_s8(32);
    /* element 128 h + 32 s + l: nibble (s >> 1) of ql[64 h + 32 (s & 1) + l],
     * bits 2 s, 2 s + 1 of qh[32 h + l] on top, minus 32 */
    for (int h = 0; h < 2; h++) {
        for (int half = 0; half < 2; half++) {
            const uint8x16_t a = vld1q_u8(x->ql + 64 * h + 16 * half);
            const uint8x16_t b = vld1q_u8(x->ql + 64 * h + 32 + 16 * half);
            const uint8x16_t q = vld1q_u8(x->qh + 32 * h + 16 * half);
            const uint8x16_t s0 = vorrq_u8(vandq_u8(a, m4), vandq_u8(vshlq_n_u8(q, 4), m2));
            const uint8x16_t s1 = vorrq_u8(vandq_u8(b, m4), vandq_u8(vshlq_n_u8(q, 2), m2));
            const uint8x16_t s2 = vorrq_u8(vshrq_n_u8(a, 4), vandq_u8(q, m2));
            const uint8x16_t s3 = vorrq_u8(vshrq_n_u8(b, 4), vandq_u8(vshrq_n_u8(q, 2), m2));
            B->v[8 * h + half] = vsubq_s8(vreinterpretq_s8_u8(s0), off);
            B->v[8 * h + 2 + half] = vsubq_s8(vreinterpretq_s8_u8(s1), off);
            B->v[8 * h + 4 + half] = vsubq_s8(vreinterpretq_s8_u8(s2), off);
            B->v[8 * h + 6 + half] = vsubq_s8(vreinterpretq_s8_u8(s3), off);
        }
    }
    for (int j = 0; j < 16; j++) B->sc[j] = x->scales[j], B->mn[j] = 0;
    B->d = h2f(x->d), B->dmin = 0.0f;
}

/* Q2_K/Q3_K: element 128 h + 32 s + l is bits 2 s, 2 s + 1 of qs[32 h + l] */
INLINE void k2_bits(const uint8_t *qs, uint8x16_t u[16]) {
    const uint8x16_t m3 = vdupq_n_u8(3);
    for (int h = 0; h < 2; h++)
        for (int half = 0; half < 2; half++) {
            const uint8x16_t q = vld1q_u8(qs + 32 * h + 16 * half);
            u[8 * h + half] = vandq_u8(q, m3);
            u[8 * h + 2 + half] = vandq_u8(vshrq_n_u8(q, 2), m3);
            u[8 * h + 4 + half] = vandq_u8(vshrq_n_u8(q, 4), m3);
            u[8 * h + 6 + half] = vshrq_n_u8(q, 6);
        }
}

INLINE void kdec_q2_K(const uint8_t *p, kblock *B) {
    const block_q2_K *x = (const block_q2_K *)(const void *)p;
    uint8x16_t u[16];
    k2_bits(x->qs, u);
    for (int j = 0; j < 16; j++) {
        B->v[j] = vreinterpretq_s8_u8(u[j]);
        B->sc[j] = x->scales[j] & 0x0f, B->mn[j] = x->scales[j] >> 4;
    }
    B->d = h2f(x->d), B->dmin = h2f(x->dmin);
}

INLINE void kdec_q3_K(const uint8_t *p, kblock *B) {
    const block_q3_K *x = (const block_q3_K *)(const void *)p;
    uint8x16_t u[16];
    k2_bits(x->qs, u);
    /* minus 4 where the element's hmask bit is clear */
    const uint8x16_t hm[2] = {vld1q_u8(x->hmask), vld1q_u8(x->hmask + 16)};
    for (int j = 0; j < 16; j++)
        B->v[j] = vsubq_s8(vreinterpretq_s8_u8(u[j]), vreinterpretq_s8_u8(vbicq_u8(vdupq_n_u8(4), plane_bit(hm, j))));
    const uint8_t *s = x->scales;
    for (int j = 0; j < 16; j++) {
        const int lo = (j < 8 ? s[j] : s[j - 8] >> 4) & 0x0f;
        const int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        B->sc[j] = (int16_t)((lo | hi << 4) - 32), B->mn[j] = 0;
    }
    B->d = h2f(x->d), B->dmin = 0.0f;
}

INLINE float kstep(const kblock *B, const block_q8_K *y, const int min, float sum) {
    int32x4_t isum = vdupq_n_s32(0);
    for (int j = 0; j < 16; j++) isum = vmlaq_n_s32(isum, dot16(vdupq_n_s32(0), B->v[j], vld1q_s8(y->qs + 16 * j)), B->sc[j]);
    int32_t msum = 0;
    if (min) {
        const int16x8_t m0 = vld1q_s16(B->mn), m1 = vld1q_s16(B->mn + 8);
        const int16x8_t b0 = vld1q_s16(y->bsums), b1 = vld1q_s16(y->bsums + 8);
        int32x4_t ms = vmull_s16(vget_low_s16(m0), vget_low_s16(b0));
        ms = vmlal_high_s16(ms, m0, b0);
        ms = vmlal_s16(ms, vget_low_s16(m1), vget_low_s16(b1));
        ms = vmlal_high_s16(ms, m1, b1);
        msum = vaddvq_s32(ms);
    }
    return sum + y->d * (B->d * (float)vaddvq_s32(isum) - B->dmin * (float)msum);
}

#define KMIN_q2_K 1
#define KMIN_q3_K 0
#define KMIN_q4_K 1
#define KMIN_q5_K 1
#define KMIN_q6_K 0

/* one weight row x T activation rows: each super-block decoded once */
#define DEFINE_QK(name, block_t)                                                                      \
    INLINE void ktile_##name(const int T, int64_t nsb, const uint8_t *w, const block_q8_K *const *y,  \
                             float *out, size_t os) {                                                  \
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};                                                       \
        for (int64_t i = 0; i < nsb; i++) {                                                            \
            kblock B;                                                                                  \
            kdec_##name(w + (size_t)i * sizeof(block_t), &B);                                          \
            for (int t = 0; t < T; t++) sum[t] = kstep(&B, &y[t][i], KMIN_##name, sum[t]);             \
        }                                                                                              \
        for (int t = 0; t < T; t++) out[t * os] = sum[t];                                              \
    }                                                                                                  \
    static float vec_dot_##name(int64_t n, const void *restrict w, const void *restrict a) {          \
        const block_q8_K *y = a;                                                                       \
        float r;                                                                                       \
        ktile_##name(1, n / QK_K, w, &y, &r, 0);                                                       \
        return r;                                                                                      \
    }                                                                                                  \
    static void gemv_##name(int64_t n, const void *restrict w, size_t rb, int nrows,                  \
                            const void *restrict a, float *restrict out) {                             \
        const block_q8_K *y = a;                                                                       \
        for (int r = 0; r < nrows; r++) ktile_##name(1, n / QK_K, (const uint8_t *)w + r * rb, &y, out + r, 0); \
    }                                                                                                  \
    static void gemm_##name(int64_t n, const void *restrict w, size_t rb, int nrows, const void *restrict a,  \
                            size_t as, int ncols, float *restrict out, size_t os) {                   \
        for (int t0 = 0; t0 < ncols; t0 += 4) {                                                        \
            const int T = ncols - t0 < 4 ? ncols - t0 : 4;                                             \
            const block_q8_K *y[4];                                                                    \
            for (int t = 0; t < T; t++) y[t] = (const void *)((const char *)a + (size_t)(t0 + t) * as); \
            for (int r = 0; r < nrows; r++) {                                                          \
                const uint8_t *p = (const uint8_t *)w + r * rb;                                        \
                float *o = out + (size_t)t0 * os + r;                                                  \
                if (T == 4) ktile_##name(4, n / QK_K, p, y, o, os);                                    \
                else                                                                                   \
                    for (int t = 0; t < T; t++) ktile_##name(1, n / QK_K, p, y + t, o + t * os, 0);    \
            }                                                                                          \
        }                                                                                              \
    }

DEFINE_QK(q2_K, block_q2_K)
DEFINE_QK(q3_K, block_q3_K)
DEFINE_QK(q4_K, block_q4_K)
DEFINE_QK(q5_K, block_q5_K)
DEFINE_QK(q6_K, block_q6_K)

/* ------------------------------------------------------------------ */
/* dequantize (bit-exact with quants.c)                                 */
/* ------------------------------------------------------------------ */

/* 16 small ints (int8) -> 16 floats d*q (+ m) */
INLINE void store16(float *out, int8x16_t q, float d, float m, const int add_m) {
    const int16x8_t w0 = vmovl_s8(vget_low_s8(q)), w1 = vmovl_high_s8(q);
    const int32x4_t i[4] = {vmovl_s16(vget_low_s16(w0)), vmovl_high_s16(w0), vmovl_s16(vget_low_s16(w1)),
                            vmovl_high_s16(w1)};
    for (int k = 0; k < 4; k++) {
        float32x4_t v = vmulq_n_f32(vcvtq_f32_s32(i[k]), d);
        if (add_m) v = vaddq_f32(v, vdupq_n_f32(m));
        vst1q_f32(out + 4 * k, v);
    }
}

static void dequant_q4_0(const void *restrict w, float *restrict out, int64_t n) {
    const block_q4_0 *x = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK) {
        const uint8x16_t v = vld1q_u8(x[i].qs);
        const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
        const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
        const float d = fp16_to_fp32(x[i].d);
        store16(out, lo, d, 0.0f, 0);
        store16(out + 16, hi, d, 0.0f, 0);
    }
}

static void dequant_q4_1(const void *restrict w, float *restrict out, int64_t n) {
    const block_q4_1 *x = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK) {
        const uint8x16_t v = vld1q_u8(x[i].qs);
        const float d = fp16_to_fp32(x[i].d), m = fp16_to_fp32(x[i].m);
        store16(out, vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), d, m, 1);
        store16(out + 16, vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), d, m, 1);
    }
}

static void dequant_q8_0(const void *restrict w, float *restrict out, int64_t n) {
    const block_q8_0 *x = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK) {
        const float d = fp16_to_fp32(x[i].d);
        store16(out, vld1q_s8(x[i].qs), d, 0.0f, 0);
        store16(out + 16, vld1q_s8(x[i].qs + 16), d, 0.0f, 0);
    }
}

/* ------------------------------------------------------------------ */
/* activation quantization (bit-exact with quants.c)                    */
/* ------------------------------------------------------------------ */

INLINE float amax_of(const float *x, int n) {
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int j = 0; j < n; j += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + j)));
    return vmaxvq_f32(m);
}

/* 16 floats * id -> 16 int8 (nearest even); returns their sum */
INLINE int quant16(const float *x, float id, int8_t *q) {
    int32x4_t i[4];
    for (int k = 0; k < 4; k++) i[k] = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 4 * k), id));
    const int16x8_t h0 = vcombine_s16(vqmovn_s32(i[0]), vqmovn_s32(i[1]));
    const int16x8_t h1 = vcombine_s16(vqmovn_s32(i[2]), vqmovn_s32(i[3]));
    vst1q_s8(q, vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1)));
    return vaddvq_s32(vaddq_s32(vaddq_s32(i[0], i[1]), vaddq_s32(i[2], i[3])));
}

static void quantize_q8_32(const float *restrict x, void *restrict out, int64_t n) {
    block_q8_32 *y = out;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        const float d = amax_of(x, QK) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const int sum = quant16(x, id, y[i].qs) + quant16(x + 16, id, y[i].qs + 16);
        y[i].d = d;
        y[i].s = d * (float)sum;
    }
}

static void quantize_q8_K(const float *restrict x, void *restrict out, int64_t n) {
    block_q8_K *y = out;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const float d = amax_of(x, QK_K) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int g = 0; g < QK_K / 16; g++) y[i].bsums[g] = (int16_t)quant16(x + 16 * g, id, y[i].qs + 16 * g);
        y[i].d = d;
    }
}

/* ------------------------------------------------------------------ */
/* float helpers                                                        */
/* ------------------------------------------------------------------ */

static void f32_to_f16_row(const float *restrict x, f16_t *restrict out, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(out + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) out[i] = fp32_to_fp16(x[i]);
}

static void f16_to_f32_rows(const f16_t *restrict x, int64_t x_stride, int rows, float *restrict out, int64_t n) {
    for (int r = 0; r < rows; r++, x += x_stride, out += n) {
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) vst1q_f32(out + i, vcvt_f32_f16(ld_f16x4(x + i)));
        for (; i < n; i++) out[i] = fp16_to_fp32(x[i]);
    }
}

/* float rows: 4 lanes, the F16 and BF16 ones converted exactly */
INLINE float32x4_t ld4_f32(const float *p) { return vld1q_f32(p); }
INLINE float32x4_t ld4_f16(const f16_t *p) { return vcvt_f32_f16(ld_f16x4(p)); }
INLINE float32x4_t ld4_bf16(const uint16_t *p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
INLINE float f32_id(float v) { return v; }

static void axpy_f16(int64_t n, float s, const f16_t *restrict a, float *restrict out) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(out + i, vfmaq_n_f32(vld1q_f32(out + i), vcvt_f32_f16(ld_f16x4(a + i)), s));
    for (; i < n; i++) out[i] += s * fp16_to_fp32(a[i]);
}

/* Float weights (F32: attention's scores; F16: the same straight from the
 * f16 cache, and prefill on F16 weights; BF16 weights). A (row, activation
 * row) pair takes two 4-lane accumulators over 8 elements a step, their
 * sum reduced, then the tail in order. The gemm tiles are R rows x C
 * activation rows, the R rows' loads shared by the C activation rows and
 * theirs by the R rows; vec_dot (and the generic gemv, and the float dots
 * attention uses) is the 1 x 1 tile, so all agree bit for bit. */
#define DEFINE_FTILE(name, wtype, LOAD4, SCALAR)                                                            \
    INLINE void ftile_##name(const int R, const int C, int64_t n, const char *w, size_t rb, const char *a,  \
                             size_t as, float *out, size_t os) {                                            \
        float32x4_t c0[4][2], c1[4][2];                                                                     \
        for (int r = 0; r < R; r++)                                                                         \
            for (int t = 0; t < C; t++) c0[r][t] = c1[r][t] = vdupq_n_f32(0.0f);                            \
        int64_t i = 0;                                                                                      \
        for (; i + 8 <= n; i += 8) {                                                                        \
            float32x4_t w0[4], w1[4];                                                                       \
            for (int r = 0; r < R; r++) {                                                                   \
                const wtype *x = (const wtype *)(const void *)(w + r * rb);                                 \
                w0[r] = LOAD4(x + i), w1[r] = LOAD4(x + i + 4);                                             \
            }                                                                                               \
            for (int t = 0; t < C; t++) {                                                                   \
                const float *y = (const float *)(const void *)(a + t * as);                                 \
                const float32x4_t y0 = vld1q_f32(y + i), y1 = vld1q_f32(y + i + 4);                         \
                for (int r = 0; r < R; r++) {                                                               \
                    c0[r][t] = vfmaq_f32(c0[r][t], w0[r], y0);                                              \
                    c1[r][t] = vfmaq_f32(c1[r][t], w1[r], y1);                                              \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
        for (int t = 0; t < C; t++) {                                                                       \
            const float *y = (const float *)(const void *)(a + t * as);                                     \
            for (int r = 0; r < R; r++) {                                                                   \
                const wtype *x = (const wtype *)(const void *)(w + r * rb);                                 \
                float sum = vaddvq_f32(vaddq_f32(c0[r][t], c1[r][t]));                                      \
                for (int64_t j = i; j < n; j++) sum += SCALAR(x[j]) * y[j];                                 \
                out[t * os + r] = sum;                                                                      \
            }                                                                                               \
        }                                                                                                   \
    }                                                                                                       \
    static void gemm_##name(int64_t n, const void *restrict w, size_t rb, int nrows, const void *restrict a, \
                            size_t as, int ncols, float *restrict out, size_t os) {                         \
        const char *wr = w, *ar = a;                                                                        \
        for (int t = 0; t < ncols; t += 2) {                                                                \
            const int C = ncols - t < 2 ? 1 : 2;                                                            \
            int r = 0;                                                                                      \
            for (; r + 4 <= nrows; r += 4) ftile_##name(4, C, n, wr + r * rb, rb, ar + t * as, as, out + t * os + r, os); \
            for (; r < nrows; r++) ftile_##name(1, C, n, wr + r * rb, rb, ar + t * as, as, out + t * os + r, os); \
        }                                                                                                   \
    }

DEFINE_FTILE(f32, float, ld4_f32, f32_id)
DEFINE_FTILE(f16, f16_t, ld4_f16, fp16_to_fp32)
DEFINE_FTILE(bf16, uint16_t, ld4_bf16, bf16_to_fp32)

#define DEFINE_FDOT(name)                                                                       \
    static float vec_dot_##name(int64_t n, const void *restrict w, const void *restrict a) {    \
        float r;                                                                                \
        ftile_##name(1, 1, n, w, 0, a, 0, &r, 0);                                               \
        return r;                                                                               \
    }
DEFINE_FDOT(f32)
DEFINE_FDOT(f16)
DEFINE_FDOT(bf16)
#undef DEFINE_FDOT

static float dot_f16_f32(int64_t n, const f16_t *restrict a, const float *restrict b) { return vec_dot_f16(n, a, b); }
static float dot_f32(int64_t n, const float *restrict a, const float *restrict b) { return vec_dot_f32(n, a, b); }

/* ------------------------------------------------------------------ */
/* vector math: GLU activations, softmax exp, axpy                      */
/* ------------------------------------------------------------------ */
/* The algorithm of x86/avx2.c's exp8 (same reduction, polynomial, clamps
 * and overflow to inf), 4 lanes. A row's last partial vector goes through
 * a zero-padded copy, so every element runs the same vector code wherever
 * it sits. */

INLINE float32x4_t exp4(float32x4_t x0) {
    const float32x4_t x = vminq_f32(vmaxq_f32(x0, vdupq_n_f32(-87.33f)), vdupq_n_f32(88.0f));
    const float32x4_t k = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504f)));
    float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, k, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.383684576e-03f);
    p = vfmaq_f32(vdupq_n_f32(8.374815807e-03f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.166822508e-02f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.666641980e-01f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.999999106e-01f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23);
    const float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vbslq_f32(vcgtq_f32(x0, vdupq_n_f32(88.7228394f)), vdupq_n_f32(__builtin_inff()), y);
}

INLINE float32x4_t glu4(float32x4_t g, float32x4_t u, const int gelu) {
    float32x4_t z = g;
    if (gelu) {
        const float k0 = 2.0f * 0.7978845608028654f;
        z = vmulq_f32(g, vfmaq_f32(vdupq_n_f32(k0), vmulq_f32(g, g), vdupq_n_f32(k0 * 0.044715f)));
    }
    const float32x4_t e = exp4(vnegq_f32(z));
    return vmulq_f32(vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), e)), u);
}

INLINE void glu_x4(int64_t n, const float *gate, const float *up, float *out, const int gelu) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(out + i, glu4(vld1q_f32(gate + i), vld1q_f32(up + i), gelu));
    if (i < n) {
        float g[4] = {0}, u[4] = {0}, o[4];
        memcpy(g, gate + i, (size_t)(n - i) * 4);
        memcpy(u, up + i, (size_t)(n - i) * 4);
        vst1q_f32(o, glu4(vld1q_f32(g), vld1q_f32(u), gelu));
        memcpy(out + i, o, (size_t)(n - i) * 4);
    }
}

static void glu_silu(int64_t n, const float *gate, const float *up, float *out) { glu_x4(n, gate, up, out, 0); }
static void glu_gelu_tanh(int64_t n, const float *gate, const float *up, float *out) { glu_x4(n, gate, up, out, 1); }

INLINE float32x4_t exp_shifted4(float32x4_t v, float32x4_t m) {
    const float32x4_t x = vsubq_f32(v, m);
    /* below the clamp (and -inf): 0 */
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(exp4(x)), vcgeq_f32(x, vdupq_n_f32(-87.33f))));
}

static float exp_sum(int64_t n, float *s, float m) {
    const float32x4_t mv = vdupq_n_f32(m);
    float32x4_t acc = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t e = exp_shifted4(vld1q_f32(s + i), mv);
        vst1q_f32(s + i, e);
        acc = vaddq_f32(acc, e);
    }
    if (i < n) {
        float t[4] = {0};
        memcpy(t, s + i, (size_t)(n - i) * 4);
        float32x4_t e = exp_shifted4(vld1q_f32(t), mv);
        vst1q_f32(t, e);
        memcpy(s + i, t, (size_t)(n - i) * 4);
        for (int64_t j = n - i; j < 4; j++) t[j] = 0.0f; /* lanes past n add 0 */
        acc = vaddq_f32(acc, vld1q_f32(t));
    }
    return vaddvq_f32(acc);
}

/* x86/avx2.c's tanh8 (same branches, polynomial and clamp), 4 lanes */
INLINE float32x4_t tanh4(float32x4_t u) {
    const float32x4_t a = vminq_f32(vabsq_f32(u), vdupq_n_f32(9.0f));
    const float32x4_t a2 = vmulq_f32(a, a);
    float32x4_t p = vdupq_n_f32(62.0f / 2835.0f);
    p = vfmaq_f32(vdupq_n_f32(-17.0f / 315.0f), p, a2);
    p = vfmaq_f32(vdupq_n_f32(2.0f / 15.0f), p, a2);
    p = vfmaq_f32(vdupq_n_f32(-1.0f / 3.0f), p, a2);
    const float32x4_t small = vfmaq_f32(a, vmulq_f32(a, a2), p);
    const float32x4_t e = exp4(vaddq_f32(a, a));
    const float32x4_t big = vsubq_f32(vdupq_n_f32(1.0f), vdivq_f32(vdupq_n_f32(2.0f), vaddq_f32(e, vdupq_n_f32(1.0f))));
    float32x4_t t = vbslq_f32(vcltq_f32(a, vdupq_n_f32(0.3f)), small, big);
    t = vbslq_f32(vceqq_f32(u, u), t, u); /* NaN in, NaN out */
    return vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(t),
                                           vandq_u32(vreinterpretq_u32_f32(u), vdupq_n_u32(0x80000000u))));
}

static void softcap(int64_t n, float *s, float scale, float cap) {
    const float32x4_t sv = vdupq_n_f32(scale), cv = vdupq_n_f32(cap);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(s + i, vmulq_f32(cv, tanh4(vdivq_f32(vmulq_f32(vld1q_f32(s + i), sv), cv))));
    if (i < n) {
        float t[4] = {0};
        memcpy(t, s + i, (size_t)(n - i) * 4);
        vst1q_f32(t, vmulq_f32(cv, tanh4(vdivq_f32(vmulq_f32(vld1q_f32(t), sv), cv))));
        memcpy(s + i, t, (size_t)(n - i) * 4);
    }
}

static void axpy_f32(int64_t n, float a, const float *restrict x, float *restrict y) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
    for (; i < n; i++) y[i] = __builtin_fmaf(a, x[i], y[i]); /* the same fused step as the vector lanes */
}

static void wsum_f32(int64_t n, int rows, const float *restrict w, const float *restrict x, int64_t ld,
                     float *restrict y) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        float32x4_t a0 = vld1q_f32(y + j), a1 = vld1q_f32(y + j + 4), a2 = vld1q_f32(y + j + 8), a3 = vld1q_f32(y + j + 12);
        const float *p = x + j;
        for (int i = 0; i < rows; i++, p += ld) {
            a0 = vfmaq_n_f32(a0, vld1q_f32(p), w[i]);
            a1 = vfmaq_n_f32(a1, vld1q_f32(p + 4), w[i]);
            a2 = vfmaq_n_f32(a2, vld1q_f32(p + 8), w[i]);
            a3 = vfmaq_n_f32(a3, vld1q_f32(p + 12), w[i]);
        }
        vst1q_f32(y + j, a0), vst1q_f32(y + j + 4, a1), vst1q_f32(y + j + 8, a2), vst1q_f32(y + j + 12, a3);
    }
    for (; j + 4 <= n; j += 4) {
        float32x4_t a0 = vld1q_f32(y + j);
        const float *p = x + j;
        for (int i = 0; i < rows; i++, p += ld) a0 = vfmaq_n_f32(a0, vld1q_f32(p), w[i]);
        vst1q_f32(y + j, a0);
    }
    for (; j < n; j++) {
        float a = y[j];
        for (int i = 0; i < rows; i++) a = __builtin_fmaf(w[i], x[(int64_t)i * ld + j], a);
        y[j] = a;
    }
}

/* wsum_f32 for nq outputs at once (attention's weighted sums of V for the
 * queries of a KV head): each row's loads shared by up to 4 outputs, each
 * output's steps those of wsum_f32 (rows in order, one fma per element and
 * row, the same column chunks). half = 1: rows of halves, converted exactly
 * (V straight from the f16 cache), so the same numbers as on floats. */
INLINE float32x4_t xrow4(const int half, const char *p, int64_t j) {
    return half ? ld4_f16((const f16_t *)(const void *)p + j) : vld1q_f32((const float *)(const void *)p + j);
}
INLINE float xrow1(const int half, const char *p, int64_t j) {
    return half ? fp16_to_fp32(((const f16_t *)(const void *)p)[j]) : ((const float *)(const void *)p)[j];
}

INLINE void wsum_cols(const int half, const int Q, const int V, int64_t j, int rows, const float *w, int64_t ws,
                      const char *x, size_t row_bytes, float *y, int64_t ys) {
    float32x4_t a[4][4];
    for (int q = 0; q < Q; q++)
        for (int v = 0; v < V; v++) a[q][v] = vld1q_f32(y + q * ys + j + 4 * v);
    for (int i = 0; i < rows; i++, x += row_bytes) {
        float32x4_t xv[4];
        for (int v = 0; v < V; v++) xv[v] = xrow4(half, x, j + 4 * v);
        for (int q = 0; q < Q; q++)
            for (int v = 0; v < V; v++) a[q][v] = vfmaq_n_f32(a[q][v], xv[v], w[q * ws + i]);
    }
    for (int q = 0; q < Q; q++)
        for (int v = 0; v < V; v++) vst1q_f32(y + q * ys + j + 4 * v, a[q][v]);
}

INLINE void wsum_many(const int half, int64_t n, int rows, int nq, const float *w, int64_t ws, const void *x,
                      int64_t ld, float *y, int64_t ys) {
    const size_t row_bytes = (size_t)ld * (half ? 2 : 4);
    for (int q0 = 0; q0 < nq; q0 += 4) {
        const int Q = nq - q0 < 4 ? nq - q0 : 4;
        const float *wq = w + (int64_t)q0 * ws;
        float *yq = y + (int64_t)q0 * ys;
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) {
            switch (Q) {
            case 4: wsum_cols(half, 4, 4, j, rows, wq, ws, x, row_bytes, yq, ys); break;
            case 3: wsum_cols(half, 3, 4, j, rows, wq, ws, x, row_bytes, yq, ys); break;
            case 2: wsum_cols(half, 2, 4, j, rows, wq, ws, x, row_bytes, yq, ys); break;
            default: wsum_cols(half, 1, 4, j, rows, wq, ws, x, row_bytes, yq, ys); break;
            }
        }
        for (; j + 4 <= n; j += 4) wsum_cols(half, Q, 1, j, rows, wq, ws, x, row_bytes, yq, ys);
        for (; j < n; j++)
            for (int q = 0; q < Q; q++) {
                float acc = yq[q * ys + j];
                const char *p = x;
                for (int i = 0; i < rows; i++, p += row_bytes) acc = __builtin_fmaf(wq[q * ws + i], xrow1(half, p, j), acc);
                yq[q * ys + j] = acc;
            }
    }
}

static void wsum_many_f32(int64_t n, int rows, int nq, const float *restrict w, int64_t ws, const float *restrict x,
                          int64_t ld, float *restrict y, int64_t ys) {
    wsum_many(0, n, rows, nq, w, ws, x, ld, y, ys);
}

static void wsum_many_f16(int64_t n, int rows, int nq, const float *restrict w, int64_t ws, const f16_t *restrict x,
                          int64_t ld, float *restrict y, int64_t ys) {
    wsum_many(1, n, rows, nq, w, ws, x, ld, y, ys);
}

/* ------------------------------------------------------------------ */

void KERNELS_FILL_NEON(kernel_table *t) {
    t->dequant[T_Q4_0] = dequant_q4_0;
    t->dequant[T_Q4_1] = dequant_q4_1;
    t->dequant[T_Q8_0] = dequant_q8_0;
#define SET(T, name) t->vec_dot[T] = vec_dot_##name, t->gemv[T] = gemv_##name, t->gemm[T] = gemm_##name;
    SET(T_Q4_0, q4_0) SET(T_Q4_1, q4_1) SET(T_Q5_0, q5_0) SET(T_Q5_1, q5_1) SET(T_Q8_0, q8_0)
    SET(T_IQ4_NL, iq4_nl) SET(T_MXFP4, mxfp4) SET(T_Q2_K, q2_K) SET(T_Q3_K, q3_K) SET(T_Q4_K, q4_K) SET(T_Q5_K, q5_K)
    SET(T_Q6_K, q6_K)
#undef SET
    t->vec_dot[T_F16] = vec_dot_f16;
    t->vec_dot[T_BF16] = vec_dot_bf16;
    t->vec_dot[T_F32] = vec_dot_f32;
    t->gemm[T_F32] = gemm_f32;
    t->gemm[T_F16] = gemm_f16;
    t->gemm[T_BF16] = gemm_bf16;
    t->quantize_act[ACT_Q8_32] = quantize_q8_32;
    t->quantize_act[ACT_Q8_K] = quantize_q8_K;
    t->f32_to_f16 = f32_to_f16_row;
    t->f16_to_f32 = f16_to_f32_rows;
    t->dot_f16_f32 = dot_f16_f32;
    t->axpy_f16 = axpy_f16;
    t->dot_f32 = dot_f32;
    t->glu_silu = glu_silu;
    t->glu_gelu_tanh = glu_gelu_tanh;
    t->exp_sum = exp_sum;
    t->softcap = softcap;
    t->axpy_f32 = axpy_f32;
    t->wsum_f32 = wsum_f32;
    t->wsum_many_f32 = wsum_many_f32;
    t->wsum_many_f16 = wsum_many_f16;
}

#endif /* __aarch64__ */
