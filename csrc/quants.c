/* quants.c: scalar reference kernels.
 *
 * Plain C11, no intrinsics: this file is compiled with the baseline flags of
 * the target and is the fallback of every kernel table entry. It is also the
 * specification the SIMD files are tested against:
 *   - dequant_* equal gguf.quants.dequantize (ggml's formats) bit for bit. The
 *     arithmetic order below is that of ggml/gguf (e.g. Q4_1: d*q + m, in that
 *     order, two roundings; Q4_K: (d*sc)*q - (dmin*m)), so keep it.
 *   - vec_dot_* compute sum_i w[i]*a[i] with the integer part of each block
 *     done exactly in int32 and the block scales applied in float.
 *   - quantize_q8_32 / quantize_q8_K: d = amax/127, q = round-to-nearest-even
 *     (x * (1/d)); SIMD variants reproduce these bit for bit.
 *
 * Element order inside the blocks (from ggml):
 *   Q4_0/Q4_1/IQ4_NL/MXFP4: element j (j < 16) is qs[j] & 15, element j+16 is qs[j] >> 4.
 *   Q5_0/Q5_1: as Q4, plus bit j of the little-endian uint32 qh is bit 4 of element j.
 *   Q2_K/Q3_K: 256 elements in 2 halves of 128; in half h, element 32*s + l
 *     (s < 4, l < 32) is (qs[32*h + l] >> 2*s) & 3. 16 sub-blocks of 16.
 *     Q3_K: bit 2 of element 32*i + l (i < 8) is (hmask[l] >> i) & 1, and the
 *     value is (low 2 bits) - 4 when that bit is 0; scales are 16 x 6 bits.
 *   Q4_K/Q5_K: 4 chunks of 64; in chunk c, element 32*s + l is
 *     (qs[32*c + l] >> 4*s) & 15; Q5_K bit 4 of element 32*i + l is
 *     (qh[l] >> i) & 1. 8 sub-blocks of 32, each with a 6-bit scale and min.
 *   IQ4_XS: 8 sub-blocks of 32, sub-block ib laid out as an IQ4_NL block at qs + 16*ib.
 *   IQ3_S: element e is byte e % 4 of the grid point iq3_s_index(e / 4), negated
 *     when bit e % 8 of signs[e / 8] is set (quants.h).
 *   IQ2_XXS/IQ2_XS/IQ2_S: element e is byte e % 8 of grid point index(e / 8), negated
 *     when bit e % 8 of signs(e / 8) is set (quants.h).
 *   IQ3_XXS: element e is byte e % 4 of grid point qs[e / 4], negated when bit e % 8
 *     of iq_signs[7 bits at 7 ((e % 32) / 8) of sub-block e / 32's word] is set.
 *   IQ1_S/IQ1_M: element e is 8 (byte e % 8 of grid point index(e / 8) - 1) -+ 1 by the
 *     sign of that point's delta (quants.h).
 *   Q6_K: 2 halves of 128; in half h, element 32*s + l (s < 4, l < 32) takes
 *     its low nibble from ql[64*h + l + 32*(s&1)] (>> 4 when s >= 2) and its
 *     2 high bits from (qh[32*h + l] >> 2*s) & 3; value - 32. 16 sub-blocks of 16.
 */
#include <math.h>
#include <string.h>

#include "quants.h"
#include "iq_grids.h"

/* ------------------------------------------------------------------ */
/* fp16 / bf16                                                         */
/* ------------------------------------------------------------------ */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float fp16_to_fp32(f16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in float */
        float v = (float)man * 0x1p-24f;
        return bits_f32(f32_bits(v) | sign);
    }
    if (exp == 31) /* inf / nan (payload kept) */
        return bits_f32(sign | 0x7f800000u | (man << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

f16_t fp32_to_fp16(float f) {
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) { /* inf, nan (made quiet, top payload bits kept) */
        if (x == 0x7f800000u) return (f16_t)(sign | 0x7c00);
        return (f16_t)(sign | 0x7e00 | ((x >> 13) & 0x3ff));
    }
    if (x >= 0x477ff000u) /* >= 65520: rounds to inf */
        return (f16_t)(sign | 0x7c00);
    if (x >= 0x38800000u) { /* normal half: rebias, round 13 dropped bits to nearest even */
        uint32_t h = (x >> 13) - (112u << 10);
        uint32_t rem = x & 0x1fff;
        if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into the exponent */
        return (f16_t)(sign | h);
    }
    if (x < 0x33000000u) /* < 2^-25 (or exactly: ties to even 0) */
        return (f16_t)sign;
    /* subnormal half: value / 2^-24 = man * 2^(e - 126), rounded to nearest even */
    uint32_t e = x >> 23;
    uint32_t man = (x & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e; /* 14 .. 24 */
    uint32_t h = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++; /* 0x400 is the smallest normal: fine */
    return (f16_t)(sign | h);
}

float bf16_to_fp32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

#define F16(x) fp16_to_fp32(x)

/* ------------------------------------------------------------------ */
/* round to nearest even, for |x| < 2^22 (what the SIMD cvtps2dq does) */
/* ------------------------------------------------------------------ */

static inline int nearest_int(float x) {
    float v = x + 12582912.f; /* 1.5 * 2^23: the integer lands in the low mantissa bits */
    return (int)(f32_bits(v) & 0x007fffff) - 0x00400000;
}

/* ------------------------------------------------------------------ */
/* dequantize                                                          */
/* ------------------------------------------------------------------ */

static void dequant_f32(const void *restrict w, float *restrict out, int64_t n) {
    memcpy(out, w, (size_t)n * sizeof(float));
}

static void dequant_f16(const void *restrict w, float *restrict out, int64_t n) {
    const f16_t *x = w;
    for (int64_t i = 0; i < n; i++) out[i] = F16(x[i]);
}

static void dequant_bf16(const void *restrict w, float *restrict out, int64_t n) {
    const uint16_t *x = w;
    for (int64_t i = 0; i < n; i++) out[i] = bf16_to_fp32(x[i]);
}

static void dequant_q4_0(const void *restrict w, float *restrict out, int64_t n) {
    const block_q4_0 *b = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK) {
        const float d = F16(b[i].d);
        for (int j = 0; j < QK / 2; j++) {
            out[j] = d * (float)((b[i].qs[j] & 0x0f) - 8);
            out[j + QK / 2] = d * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}

static void dequant_q4_1(const void *restrict w, float *restrict out, int64_t n) {
    const block_q4_1 *b = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK) {
        const float d = F16(b[i].d), m = F16(b[i].m);
        for (int j = 0; j < QK / 2; j++) {
            out[j] = d * (float)(b[i].qs[j] & 0x0f) + m;
            out[j + QK / 2] = d * (float)(b[i].qs[j] >> 4) + m;
        }
    }
}

static inline uint32_t load_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* the 32 5-bit values of a Q5 block, 0..31 */
static inline void unpack_q5(const uint8_t *qs, const uint8_t *qh4, int q[QK]) {
    const uint32_t qh = load_u32(qh4);
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
        q[j + QK / 2] = (qs[j] >> 4) | (int)(((qh >> (j + QK / 2)) & 1) << 4);
    }
}

static void dequant_q5_0(const void *restrict w, float *restrict out, int64_t n) {
    const block_q5_0 *b = w;
    int q[QK];
    for (int64_t i = 0; i < n / QK; i++, out += QK) {
        const float d = F16(b[i].d);
        unpack_q5(b[i].qs, b[i].qh, q);
        for (int j = 0; j < QK; j++) out[j] = d * (float)(q[j] - 16);
    }
}

static void dequant_q5_1(const void *restrict w, float *restrict out, int64_t n) {
    const block_q5_1 *b = w;
    int q[QK];
    for (int64_t i = 0; i < n / QK; i++, out += QK) {
        const float d = F16(b[i].d), m = F16(b[i].m);
        unpack_q5(b[i].qs, b[i].qh, q);
        for (int j = 0; j < QK; j++) out[j] = d * (float)q[j] + m;
    }
}

static void dequant_q8_0(const void *restrict w, float *restrict out, int64_t n) {
    const block_q8_0 *b = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK) {
        const float d = F16(b[i].d);
        for (int j = 0; j < QK; j++) out[j] = (float)b[i].qs[j] * d;
    }
}

const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};

const int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

const uint32_t iq3s_grid[IQ3S_GRID_SIZE] = {IQ3S_GRID};
const uint32_t iq3xxs_grid[IQ3XXS_GRID_SIZE] = {IQ3XXS_GRID};
const uint64_t iq2xxs_grid[IQ2XXS_GRID_SIZE] = {IQ2XXS_GRID};
const uint64_t iq2xs_grid[IQ2XS_GRID_SIZE] = {IQ2XS_GRID};
const uint64_t iq2s_grid[IQ2S_GRID_SIZE] = {IQ2S_GRID};
const uint64_t iq1s_grid[IQ1S_GRID_SIZE] = {IQ1S_GRID};

#define PARITY7(i) (((i) ^ (i) >> 1 ^ (i) >> 2 ^ (i) >> 3 ^ (i) >> 4 ^ (i) >> 5 ^ (i) >> 6) & 1)
#define SIGNS_1(i) (uint8_t)((i) | PARITY7(i) << 7)
#define SIGNS_4(i) SIGNS_1(i), SIGNS_1(i + 1), SIGNS_1(i + 2), SIGNS_1(i + 3)
#define SIGNS_16(i) SIGNS_4(i), SIGNS_4(i + 4), SIGNS_4(i + 8), SIGNS_4(i + 12)
const uint8_t iq_signs[128] = {SIGNS_16(0), SIGNS_16(16), SIGNS_16(32), SIGNS_16(48),
                               SIGNS_16(64), SIGNS_16(80), SIGNS_16(96), SIGNS_16(112)};
#undef PARITY7
#undef SIGNS_1
#undef SIGNS_4
#undef SIGNS_16

#define E8M0_4(e) E8M0_HALF_BITS(e), E8M0_HALF_BITS(e + 1), E8M0_HALF_BITS(e + 2), E8M0_HALF_BITS(e + 3)
#define E8M0_16(e) E8M0_4(e), E8M0_4(e + 4), E8M0_4(e + 8), E8M0_4(e + 12)
#define E8M0_64(e) E8M0_16(e), E8M0_16(e + 16), E8M0_16(e + 32), E8M0_16(e + 48)
const uint32_t e8m0_half_table[256] = {E8M0_64(0), E8M0_64(64), E8M0_64(128), E8M0_64(192)};
#undef E8M0_4
#undef E8M0_16
#undef E8M0_64

/* (the reference decodes with the formula; AVX2's dequant reads the table,
 * so test_kernels' test of every exponent checks each entry) */
static inline float e8m0_half(uint8_t e) { return bits_f32(e8m0_half_bits(e)); }

/* IQ4_NL, MXFP4: one block of nibbles into book values times d */
static inline void dequant_book(const uint8_t *qs, const int8_t *book, float d, float *out) {
    for (int j = 0; j < QK / 2; j++) {
        out[j] = d * (float)book[qs[j] & 0x0f];
        out[j + QK / 2] = d * (float)book[qs[j] >> 4];
    }
}

static void dequant_iq4_nl(const void *restrict w, float *restrict out, int64_t n) {
    const block_iq4_nl *b = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK) dequant_book(b[i].qs, kvalues_iq4nl, F16(b[i].d), out);
}

static void dequant_iq4_xs(const void *restrict w, float *restrict out, int64_t n) {
    const block_iq4_xs *b = w;
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int ib = 0; ib < QK_K / QK; ib++, out += QK)
            dequant_book(b[i].qs + 16 * ib, kvalues_iq4nl, F16(b[i].d) * (float)iq4_xs_scale(&b[i], ib), out);
}

/* the grid i-quants: the signed value of element e (0..255) of a super-block */
static inline int iq3_s_value(const block_iq3_s *b, int e) {
    const int v = (uint8_t)(iq3s_grid[iq3_s_index(b, e / 4)] >> 8 * (e % 4));
    return (b->signs[e / 8] >> (e % 8)) & 1 ? -v : v;
}

static inline int iq3_xxs_value(const block_iq3_xxs *b, int e) {
    const int v = (uint8_t)(iq3xxs_grid[b->qs[e / 4]] >> 8 * (e % 4));
    return (iq3_xxs_sign_bits(b, e / QK) >> (e % QK)) & 1 ? -v : v;
}

#define IQ2_VALUE(name, grid)                                                                   \
    static inline int name##_value(const block_##name *b, int e) {                              \
        const int v = (uint8_t)(grid[name##_index(b, e / 8)] >> 8 * (e % 8));                 \
        return (name##_signs(b, e / 8) >> (e % 8)) & 1 ? -v : v;                                \
    }
IQ2_VALUE(iq2_xxs, iq2xxs_grid)
IQ2_VALUE(iq2_xs, iq2xs_grid)
IQ2_VALUE(iq2_s, iq2s_grid)
#undef IQ2_VALUE

/* IQ1: 8 g + 1 or 8 g - 1 (g = the stored byte - 1), 8 (g + delta) */
#define IQ1_VALUE(name)                                                                             \
    static inline int name##_value(const block_##name *b, int e) {                                  \
        const int g = (int)(uint8_t)(iq1s_grid[name##_index(b, e / 8)] >> 8 * (e % 8)) - 1;           \
        return 8 * g + (name##_delta_neg(b, e / 8) ? -1 : 1);                                        \
    }
IQ1_VALUE(iq1_s)
IQ1_VALUE(iq1_m)
#undef IQ1_VALUE

/* the grid i-quants (GRID_DMUL and odd: quants.h): dequant ((dmul d) odd) * value,
 * equal to gguf.quants' d (s + 1/2) / 4 (...) * value since everything before the last
 * product is exact in float; vec_dot per super-block sum_j odd_j * sum(value * a) over the
 * 16-groups j in int, times dmul d */
#define DEFINE_GRID_KERNELS(name)                                                               \
    static void dequant_##name(const void *restrict w, float *restrict out, int64_t n) {             \
        const block_##name *b = w;                                                                    \
        for (int64_t i = 0; i < n / QK_K; i++, out += QK_K)                                           \
            for (int e = 0; e < QK_K; e++)                                                            \
                out[e] = GRID_DMUL_##name * F16(name##_d(&b[i])) * (float)name##_odd(&b[i], e / 16) * (float)name##_value(&b[i], e); \
    }                                                                                                 \
    static float vec_dot_##name(int64_t n, const void *restrict w, const void *restrict a) {          \
        const block_##name *x = w;                                                                    \
        const block_q8_K *y = a;                                                                      \
        float sum = 0.0f;                                                                             \
        for (int64_t i = 0; i < n / QK_K; i++) {                                                      \
            int isum = 0;                                                                             \
            for (int j = 0; j < QK_K / 16; j++) {                                                     \
                int sub = 0;                                                                          \
                for (int e = 16 * j; e < 16 * (j + 1); e++) sub += name##_value(&x[i], e) * y[i].qs[e]; \
                isum += name##_odd(&x[i], j) * sub;                                                   \
            }                                                                                         \
            sum += y[i].d * (GRID_DMUL_##name * F16(name##_d(&x[i]))) * (float)isum;                            \
        }                                                                                             \
        return sum;                                                                                   \
    }
DEFINE_GRID_KERNELS(iq3_s)
DEFINE_GRID_KERNELS(iq3_xxs)
DEFINE_GRID_KERNELS(iq2_xxs)
DEFINE_GRID_KERNELS(iq2_xs)
DEFINE_GRID_KERNELS(iq2_s)
DEFINE_GRID_KERNELS(iq1_s)
DEFINE_GRID_KERNELS(iq1_m)
#undef DEFINE_GRID_KERNELS

static void dequant_mxfp4(const void *restrict w, float *restrict out, int64_t n) {
    const block_mxfp4 *b = w;
    for (int64_t i = 0; i < n / QK; i++, out += QK) dequant_book(b[i].qs, kvalues_mxfp4, e8m0_half(b[i].e), out);
}

/* Q2_K/Q3_K: the 2-bit field of element k (0..255) */
static inline int q2_bits(const uint8_t *qs, int k) {
    const int h = k >> 7, s = (k >> 5) & 3, l = k & 31;
    return (qs[32 * h + l] >> (2 * s)) & 3;
}

static void dequant_q2_K(const void *restrict w, float *restrict out, int64_t n) {
    const block_q2_K *b = w;
    for (int64_t i = 0; i < n / QK_K; i++, out += QK_K) {
        const float d = F16(b[i].d), dmin = F16(b[i].dmin);
        for (int sb = 0; sb < 16; sb++) {
            const float dl = d * (float)(b[i].scales[sb] & 0x0f);
            const float ml = dmin * (float)(b[i].scales[sb] >> 4);
            for (int l = 0; l < 16; l++) {
                const int k = 16 * sb + l;
                out[k] = dl * (float)q2_bits(b[i].qs, k) - ml;
            }
        }
    }
}

/* Q3_K: the 16 signed 6-bit scales (-32..31) */
static inline void q3_K_scales(const uint8_t s[12], int sc[16]) {
    for (int j = 0; j < 16; j++) {
        const int lo = (j < 8 ? s[j] : s[j - 8] >> 4) & 0x0f;
        const int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        sc[j] = (lo | hi << 4) - 32;
    }
}

/* Q3_K: the value (-4..3) of element k */
static inline int q3_value(const block_q3_K *b, int k) {
    const int hbit = (b->hmask[k & 31] >> (k >> 5)) & 1;
    return q2_bits(b->qs, k) - (hbit ? 0 : 4);
}

static void dequant_q3_K(const void *restrict w, float *restrict out, int64_t n) {
    const block_q3_K *b = w;
    int sc[16];
    for (int64_t i = 0; i < n / QK_K; i++, out += QK_K) {
        const float d = F16(b[i].d);
        q3_K_scales(b[i].scales, sc);
        for (int sb = 0; sb < 16; sb++) {
            const float dl = d * (float)sc[sb];
            for (int l = 0; l < 16; l++) out[16 * sb + l] = dl * (float)q3_value(&b[i], 16 * sb + l);
        }
    }
}

/* Q4_K/Q5_K: 6-bit scale and min of sub-block j (0..7) */
static inline void get_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K/Q5_K: the low nibble of element k */
static inline int q4k_nibble(const uint8_t *qs, int k) {
    const int c = k >> 6, s = (k >> 5) & 1, l = k & 31;
    return (qs[32 * c + l] >> (4 * s)) & 0x0f;
}

static void dequant_q4_K(const void *restrict w, float *restrict out, int64_t n) {
    const block_q4_K *b = w;
    for (int64_t i = 0; i < n / QK_K; i++, out += QK_K) {
        const float d = F16(b[i].d), dmin = F16(b[i].dmin);
        for (int sb = 0; sb < 8; sb++) {
            int sc, m;
            get_scale_min_k4(sb, b[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                const int k = 32 * sb + l;
                out[k] = d1 * (float)q4k_nibble(b[i].qs, k) - m1;
            }
        }
    }
}

static inline int q5k_value(const block_q5_K *b, int k) {
    return q4k_nibble(b->qs, k) | (((b->qh[k & 31] >> (k >> 5)) & 1) << 4);
}

static void dequant_q5_K(const void *restrict w, float *restrict out, int64_t n) {
    const block_q5_K *b = w;
    for (int64_t i = 0; i < n / QK_K; i++, out += QK_K) {
        const float d = F16(b[i].d), dmin = F16(b[i].dmin);
        for (int sb = 0; sb < 8; sb++) {
            int sc, m;
            get_scale_min_k4(sb, b[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                const int k = 32 * sb + l;
                out[k] = d1 * (float)q5k_value(&b[i], k) - m1;
            }
        }
    }
}

/* Q6_K: the value (-32..31) of element k */
static inline int q6k_value(const block_q6_K *b, int k) {
    const int h = k >> 7, s = (k >> 5) & 3, l = k & 31;
    const int lo = (b->ql[64 * h + l + 32 * (s & 1)] >> (4 * (s >> 1))) & 0x0f;
    const int hi = (b->qh[32 * h + l] >> (2 * s)) & 3;
    return (lo | hi << 4) - 32;
}

static void dequant_q6_K(const void *restrict w, float *restrict out, int64_t n) {
    const block_q6_K *b = w;
    for (int64_t i = 0; i < n / QK_K; i++, out += QK_K) {
        const float d = F16(b[i].d);
        for (int sb = 0; sb < 16; sb++) {
            const float dl = d * (float)b[i].scales[sb];
            for (int l = 0; l < 16; l++) out[16 * sb + l] = dl * (float)q6k_value(&b[i], 16 * sb + l);
        }
    }
}

/* ------------------------------------------------------------------ */
/* activation quantization                                             */
/* ------------------------------------------------------------------ */

static void quantize_f32(const float *restrict x, void *restrict out, int64_t n) {
    memcpy(out, x, (size_t)n * sizeof(float));
}

/* d = amax/127, q = nearest_even(x / d); returns d and fills q */
static inline float quantize_group(const float *x, int8_t *q, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) {
        const float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < n; j++) q[j] = (int8_t)nearest_int(x[j] * id);
    return d;
}

static void quantize_q8_32(const float *restrict x, void *restrict out, int64_t n) {
    block_q8_32 *y = out;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        y[i].d = quantize_group(x, y[i].qs, QK);
        int sum = 0;
        for (int j = 0; j < QK; j++) sum += y[i].qs[j];
        y[i].s = y[i].d * (float)sum;
    }
}

/* the Q8_0 weight format (a KV cache's rows): q from the float scale, the scale stored as f16 */
void quantize_row_q8_0(const float *restrict x, void *restrict out, int64_t n) {
    block_q8_0 *y = out;
    for (int64_t i = 0; i < n / QK; i++, x += QK) y[i].d = fp32_to_fp16(quantize_group(x, y[i].qs, QK));
}

/* the Q4_0 weight format (a KV cache's rows), as llama.cpp's reference quantizer: d = m / -8 for the
 * value m of largest magnitude (the first), q = min(15, trunc(x / d + 8.5)), the scale stored as f16 */
void quantize_row_q4_0(const float *restrict x, void *restrict out, int64_t n) {
    block_q4_0 *y = out;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++)
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK / 2; j++) {
            const int q0 = (int)(int8_t)(x[j] * id + 8.5f), q1 = (int)(int8_t)(x[QK / 2 + j] * id + 8.5f);
            y[i].qs[j] = (uint8_t)((q0 < 15 ? q0 : 15) | (q1 < 15 ? q1 : 15) << 4);
        }
    }
}

static void quantize_q8_K(const float *restrict x, void *restrict out, int64_t n) {
    block_q8_K *y = out;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        y[i].d = quantize_group(x, y[i].qs, QK_K);
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += y[i].qs[16 * g + j];
            y[i].bsums[g] = (int16_t)sum;
        }
    }
}

/* ------------------------------------------------------------------ */
/* dot products against the activation format                          */
/* ------------------------------------------------------------------ */

static float vec_dot_f32(int64_t n, const void *restrict w, const void *restrict a) {
    const float *x = w, *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += x[i] * y[i];
    return sum;
}

static float vec_dot_f16(int64_t n, const void *restrict w, const void *restrict a) {
    const f16_t *x = w;
    const float *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += F16(x[i]) * y[i];
    return sum;
}

static float vec_dot_bf16(int64_t n, const void *restrict w, const void *restrict a) {
    const uint16_t *x = w;
    const float *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += bf16_to_fp32(x[i]) * y[i];
    return sum;
}

/* sum((q - 8) * a) * dw * da = dw * (da * sum(q * a) - 8 * s) */
static float vec_dot_q4_0(int64_t n, const void *restrict w, const void *restrict a) {
    const block_q4_0 *x = w;
    const block_q8_32 *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++) {
        int isum = 0;
        for (int j = 0; j < QK / 2; j++)
            isum += (x[i].qs[j] & 0x0f) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + QK / 2];
        sum += F16(x[i].d) * (y[i].d * (float)isum - 8.0f * y[i].s);
    }
    return sum;
}

/* sum((d q + m) * a) = d * da * sum(q * a) + m * s */
static float vec_dot_q4_1(int64_t n, const void *restrict w, const void *restrict a) {
    const block_q4_1 *x = w;
    const block_q8_32 *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++) {
        int isum = 0;
        for (int j = 0; j < QK / 2; j++)
            isum += (x[i].qs[j] & 0x0f) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + QK / 2];
        sum += F16(x[i].d) * y[i].d * (float)isum + F16(x[i].m) * y[i].s;
    }
    return sum;
}

static float vec_dot_q5_0(int64_t n, const void *restrict w, const void *restrict a) {
    const block_q5_0 *x = w;
    const block_q8_32 *y = a;
    int q[QK];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++) {
        unpack_q5(x[i].qs, x[i].qh, q);
        int isum = 0;
        for (int j = 0; j < QK; j++) isum += q[j] * y[i].qs[j];
        sum += F16(x[i].d) * (y[i].d * (float)isum - 16.0f * y[i].s);
    }
    return sum;
}

static float vec_dot_q5_1(int64_t n, const void *restrict w, const void *restrict a) {
    const block_q5_1 *x = w;
    const block_q8_32 *y = a;
    int q[QK];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++) {
        unpack_q5(x[i].qs, x[i].qh, q);
        int isum = 0;
        for (int j = 0; j < QK; j++) isum += q[j] * y[i].qs[j];
        sum += F16(x[i].d) * y[i].d * (float)isum + F16(x[i].m) * y[i].s;
    }
    return sum;
}

static float vec_dot_q8_0(int64_t n, const void *restrict w, const void *restrict a) {
    const block_q8_0 *x = w;
    const block_q8_32 *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++) {
        int isum = 0;
        for (int j = 0; j < QK; j++) isum += x[i].qs[j] * y[i].qs[j];
        sum += F16(x[i].d) * y[i].d * (float)isum;
    }
    return sum;
}

/* IQ4_NL, MXFP4: the int dot of one block's book values with 32 activations */
static inline int dot_book(const uint8_t *qs, const int8_t *book, const int8_t *a) {
    int isum = 0;
    for (int j = 0; j < QK / 2; j++) isum += book[qs[j] & 0x0f] * a[j] + book[qs[j] >> 4] * a[j + QK / 2];
    return isum;
}

static float vec_dot_iq4_nl(int64_t n, const void *restrict w, const void *restrict a) {
    const block_iq4_nl *x = w;
    const block_q8_32 *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++)
        sum += F16(x[i].d) * y[i].d * (float)dot_book(x[i].qs, kvalues_iq4nl, y[i].qs);
    return sum;
}

static float vec_dot_mxfp4(int64_t n, const void *restrict w, const void *restrict a) {
    const block_mxfp4 *x = w;
    const block_q8_32 *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++)
        sum += e8m0_half(x[i].e) * y[i].d * (float)dot_book(x[i].qs, kvalues_mxfp4, y[i].qs);
    return sum;
}

/* IQ4_XS: per super-block, sum_ib (ls_ib - 32) * dot_book(sub-block ib) in int */
static float vec_dot_iq4_xs(int64_t n, const void *restrict w, const void *restrict a) {
    const block_iq4_xs *x = w;
    const block_q8_K *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int isum = 0;
        for (int ib = 0; ib < QK_K / QK; ib++)
            isum += iq4_xs_scale(&x[i], ib) * dot_book(x[i].qs + 16 * ib, kvalues_iq4nl, y[i].qs + QK * ib);
        sum += y[i].d * F16(x[i].d) * (float)isum;
    }
    return sum;
}

/* K-quants: per super-block, sum_sb scale_sb * sum(q * a) in int, the min
 * term from the activation's 16-element sums (bsums). */
static float vec_dot_q2_K(int64_t n, const void *restrict w, const void *restrict a) {
    const block_q2_K *x = w;
    const block_q8_K *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int isum = 0, msum = 0;
        for (int sb = 0; sb < 16; sb++) {
            int s = 0;
            for (int l = 0; l < 16; l++) {
                const int k = 16 * sb + l;
                s += q2_bits(x[i].qs, k) * y[i].qs[k];
            }
            isum += (x[i].scales[sb] & 0x0f) * s;
            msum += (x[i].scales[sb] >> 4) * y[i].bsums[sb];
        }
        sum += y[i].d * (F16(x[i].d) * (float)isum - F16(x[i].dmin) * (float)msum);
    }
    return sum;
}

static float vec_dot_q3_K(int64_t n, const void *restrict w, const void *restrict a) {
    const block_q3_K *x = w;
    const block_q8_K *y = a;
    int sc[16];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        q3_K_scales(x[i].scales, sc);
        int isum = 0;
        for (int sb = 0; sb < 16; sb++) {
            int s = 0;
            for (int l = 0; l < 16; l++) {
                const int k = 16 * sb + l;
                s += q3_value(&x[i], k) * y[i].qs[k];
            }
            isum += sc[sb] * s;
        }
        sum += y[i].d * F16(x[i].d) * (float)isum;
    }
    return sum;
}

static float vec_dot_q4_K(int64_t n, const void *restrict w, const void *restrict a) {
    const block_q4_K *x = w;
    const block_q8_K *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int isum = 0, msum = 0;
        for (int sb = 0; sb < 8; sb++) {
            int sc, m, s = 0;
            get_scale_min_k4(sb, x[i].scales, &sc, &m);
            for (int l = 0; l < 32; l++) {
                const int k = 32 * sb + l;
                s += q4k_nibble(x[i].qs, k) * y[i].qs[k];
            }
            isum += sc * s;
            msum += m * (y[i].bsums[2 * sb] + y[i].bsums[2 * sb + 1]);
        }
        sum += y[i].d * (F16(x[i].d) * (float)isum - F16(x[i].dmin) * (float)msum);
    }
    return sum;
}

static float vec_dot_q5_K(int64_t n, const void *restrict w, const void *restrict a) {
    const block_q5_K *x = w;
    const block_q8_K *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int isum = 0, msum = 0;
        for (int sb = 0; sb < 8; sb++) {
            int sc, m, s = 0;
            get_scale_min_k4(sb, x[i].scales, &sc, &m);
            for (int l = 0; l < 32; l++) {
                const int k = 32 * sb + l;
                s += q5k_value(&x[i], k) * y[i].qs[k];
            }
            isum += sc * s;
            msum += m * (y[i].bsums[2 * sb] + y[i].bsums[2 * sb + 1]);
        }
        sum += y[i].d * (F16(x[i].d) * (float)isum - F16(x[i].dmin) * (float)msum);
    }
    return sum;
}

static float vec_dot_q6_K(int64_t n, const void *restrict w, const void *restrict a) {
    const block_q6_K *x = w;
    const block_q8_K *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int isum = 0;
        for (int sb = 0; sb < 16; sb++) {
            int s = 0;
            for (int l = 0; l < 16; l++) {
                const int k = 16 * sb + l;
                s += q6k_value(&x[i], k) * y[i].qs[k];
            }
            isum += x[i].scales[sb] * s;
        }
        sum += y[i].d * F16(x[i].d) * (float)isum;
    }
    return sum;
}

/* ------------------------------------------------------------------ */
/* float helpers (attention, KV cache)                                  */
/* ------------------------------------------------------------------ */

static void f32_to_f16_row(const float *restrict x, f16_t *restrict out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = fp32_to_fp16(x[i]);
}

static void f16_to_f32_rows(const f16_t *restrict x, int64_t x_stride, int rows, float *restrict out, int64_t n) {
    for (int r = 0; r < rows; r++, x += x_stride, out += n)
        for (int64_t i = 0; i < n; i++) out[i] = F16(x[i]);
}

static float dot_f16_f32(int64_t n, const f16_t *restrict a, const float *restrict b) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += F16(a[i]) * b[i];
    return sum;
}

static void axpy_f16(int64_t n, float s, const f16_t *restrict a, float *restrict out) {
    for (int64_t i = 0; i < n; i++) out[i] += s * F16(a[i]);
}

static float dot_f32(int64_t n, const float *restrict a, const float *restrict b) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* ------------------------------------------------------------------ */
/* vector math of the non-matmul ops (GLU, attention)                   */
/* ------------------------------------------------------------------ */
/* The specification, in libm float arithmetic:
 *     silu(x)      = x / (1 + exp(-x))
 *     gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *                  = x / (1 + exp(-2 sqrt(2/pi) (x + 0.044715 x^3)))
 * (the second form: 0.5 (1 + tanh z) = 1 / (1 + exp(-2z)); it has no
 * cancellation for negative x, where 1 + tanh z is tiny). The SIMD levels
 * use a polynomial exp (x86/avx2.c: exp8) and a correctly rounded division,
 * and are tested against these and against float64 numpy:
 *     glu_silu:      |err| <= 1e-6 |silu(g) u|      (+ 1e-30 absolute, for
 *                    g < -87 where the result underflows)
 *     glu_gelu_tanh: |err| <= 1e-6 max(1, |g|) |u|  (absolute 1e-6 for |g| <= 1;
 *                    relative 1e-6 for larger |g|, where gelu(g) ~ g or ~0)
 *     glu_sigmoid:   |err| <= 1e-6 |sigmoid(g) u| (+ 1e-30 absolute), u / (1 + exp(-g))
 *     exp_sum:       each exp within 4e-7 relative (results below 1.2e-38
 *                    may flush to 0), the sum within 1e-6 relative for
 *                    n <= 1000 (float summation: the error grows with n)
 *     softcap:       |err| <= 1e-6 |result| + 1e-12 cap (tanh from the same
 *                    exp: a^3 polynomial below |u| = 0.3, 1 - 2 / (e^2a + 1)
 *                    above, |u| clamped at 9 where tanh rounds to 1)
 *     axpy_f32:      one fma or mul+add per element (within 1 ulp of each
 *                    other); wsum_f32 the same per row, rows in order.
 * Measured on AVX2 and AVX-512 (millions of random inputs): silu 1.7e-7
 * relative, gelu_tanh 9e-8 absolute for |g| <= 1 and 1.2e-7 |g| beyond,
 * exp 8.8e-8 relative (libm here: 1.7e-7, 9e-8, 6e-8). */

static void glu_silu(int64_t n, const float *gate, const float *up, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

static void glu_sigmoid(int64_t n, const float *gate, const float *up, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = up[i] / (1.0f + expf(-gate[i]));
}

static void glu_gelu_tanh(int64_t n, const float *gate, const float *up, float *out) {
    const float c2 = 2.0f * 0.7978845608028654f; /* 2 sqrt(2/pi) */
    for (int64_t i = 0; i < n; i++) {
        const float x = gate[i];
        out[i] = x / (1.0f + expf(-c2 * (x + 0.044715f * x * x * x))) * up[i];
    }
}

static float exp_sum(int64_t n, float *s, float m) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        s[i] = expf(s[i] - m);
        sum += s[i];
    }
    return sum;
}

static void softcap(int64_t n, float *s, float scale, float cap) {
    for (int64_t i = 0; i < n; i++) {
        const float x = s[i] * scale;
        s[i] = cap * tanhf(x / cap);
    }
}

static void axpy_f32(int64_t n, float a, const float *restrict x, float *restrict y) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void wsum_f32(int64_t n, int rows, const float *restrict w, const float *restrict x, int64_t ld,
                     float *restrict y) {
    for (int i = 0; i < rows; i++) axpy_f32(n, w[i], x + (int64_t)i * ld, y);
}

/* ssm_scan_row: each state value one multiply and one multiply-add per token (the SIMD
 * levels fuse the add: within 1 ulp of each other per step), the dot product in float */
static void ssm_scan_row(int64_t n, float *restrict s, int n_tok, const float *bc, int64_t bc_stride, int64_t c_off,
                         const float *x, int64_t x_stride, const float *dt, const float *decay, float *y,
                         int64_t y_stride) {
    for (int t = 0; t < n_tok; t++) {
        const float *B = bc + t * bc_stride, *C = B + c_off;
        const float xdt = x[t * x_stride] * dt[t], d = decay[t];
        float sum = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            s[i] = s[i] * d + B[i] * xdt;
            sum += s[i] * C[i];
        }
        y[t * y_stride] = sum;
    }
}

/* ------------------------------------------------------------------ */
/* type traits                                                          */
/* ------------------------------------------------------------------ */

static const type_traits TRAITS[T_COUNT] = {
    [T_F32] = {"F32", 1, 4, ACT_F32},
    [T_F16] = {"F16", 1, 2, ACT_F32},
    [T_BF16] = {"BF16", 1, 2, ACT_F32},
    [T_Q4_0] = {"Q4_0", QK, sizeof(block_q4_0), ACT_Q8_32},
    [T_Q4_1] = {"Q4_1", QK, sizeof(block_q4_1), ACT_Q8_32},
    [T_Q5_0] = {"Q5_0", QK, sizeof(block_q5_0), ACT_Q8_32},
    [T_Q5_1] = {"Q5_1", QK, sizeof(block_q5_1), ACT_Q8_32},
    [T_Q8_0] = {"Q8_0", QK, sizeof(block_q8_0), ACT_Q8_32},
    [T_IQ4_NL] = {"IQ4_NL", QK, sizeof(block_iq4_nl), ACT_Q8_32},
    [T_MXFP4] = {"MXFP4", QK, sizeof(block_mxfp4), ACT_Q8_32},
    [T_IQ4_XS] = {"IQ4_XS", QK_K, sizeof(block_iq4_xs), ACT_Q8_K},
    [T_IQ3_S] = {"IQ3_S", QK_K, sizeof(block_iq3_s), ACT_Q8_K},
    [T_IQ3_XXS] = {"IQ3_XXS", QK_K, sizeof(block_iq3_xxs), ACT_Q8_K},
    [T_IQ2_XXS] = {"IQ2_XXS", QK_K, sizeof(block_iq2_xxs), ACT_Q8_K},
    [T_IQ2_XS] = {"IQ2_XS", QK_K, sizeof(block_iq2_xs), ACT_Q8_K},
    [T_IQ2_S] = {"IQ2_S", QK_K, sizeof(block_iq2_s), ACT_Q8_K},
    [T_IQ1_S] = {"IQ1_S", QK_K, sizeof(block_iq1_s), ACT_Q8_K},
    [T_IQ1_M] = {"IQ1_M", QK_K, sizeof(block_iq1_m), ACT_Q8_K},
    [T_Q2_K] = {"Q2_K", QK_K, sizeof(block_q2_K), ACT_Q8_K},
    [T_Q3_K] = {"Q3_K", QK_K, sizeof(block_q3_K), ACT_Q8_K},
    [T_Q4_K] = {"Q4_K", QK_K, sizeof(block_q4_K), ACT_Q8_K},
    [T_Q5_K] = {"Q5_K", QK_K, sizeof(block_q5_K), ACT_Q8_K},
    [T_Q6_K] = {"Q6_K", QK_K, sizeof(block_q6_K), ACT_Q8_K},
};

_Static_assert(sizeof(block_q4_0) == 18, "q4_0");
_Static_assert(sizeof(block_q4_1) == 20, "q4_1");
_Static_assert(sizeof(block_q5_0) == 22, "q5_0");
_Static_assert(sizeof(block_q5_1) == 24, "q5_1");
_Static_assert(sizeof(block_q8_0) == 34, "q8_0");
_Static_assert(sizeof(block_iq4_nl) == 18, "iq4_nl");
_Static_assert(sizeof(block_mxfp4) == 17, "mxfp4");
_Static_assert(sizeof(block_iq4_xs) == 136, "iq4_xs");
_Static_assert(sizeof(block_iq3_s) == 110, "iq3_s");
_Static_assert(sizeof(block_iq3_xxs) == 98, "iq3_xxs");
_Static_assert(sizeof(block_iq2_xxs) == 66, "iq2_xxs");
_Static_assert(sizeof(block_iq2_xs) == 74, "iq2_xs");
_Static_assert(sizeof(block_iq2_s) == 82, "iq2_s");
_Static_assert(sizeof(block_iq1_s) == 50, "iq1_s");
_Static_assert(sizeof(block_iq1_m) == 56, "iq1_m");
_Static_assert(sizeof(block_q2_K) == 84, "q2_K");
_Static_assert(sizeof(block_q3_K) == 110, "q3_K");
_Static_assert(sizeof(block_q4_K) == 144, "q4_K");
_Static_assert(sizeof(block_q5_K) == 176, "q5_K");
_Static_assert(sizeof(block_q6_K) == 210, "q6_K");
_Static_assert(sizeof(block_q8_32) == 40, "q8_32");
_Static_assert(sizeof(block_q8_K) == 292, "q8_K");

const type_traits *type_info(int type) {
    if (type < 0 || type >= T_COUNT || TRAITS[type].name == NULL) return NULL;
    return &TRAITS[type];
}

size_t act_row_bytes(int act, int64_t n) {
    if (n < 0) return 0;
    switch (act) {
    case ACT_F32: return (size_t)n * sizeof(float);
    case ACT_Q8_32: return (size_t)(n / QK) * sizeof(block_q8_32);
    case ACT_Q8_K: return (size_t)(n / QK_K) * sizeof(block_q8_K);
    default: return 0;
    }
}

size_t weight_row_bytes(int type, int64_t n) {
    const type_traits *t = type_info(type);
    if (!t || n < 0) return 0;
    return (size_t)(n / t->block_size) * (size_t)t->type_size;
}

/* len bytes of whole blocks of `type_size` bytes, through the codec when there is one */
static void move_blocks(const uint8_t *src, uint8_t *dst, size_t len, size_t type_size, rows4_codec_fn codec) {
    if (!codec) {
        memcpy(dst, src, len);
        return;
    }
    for (size_t b = 0; b < len; b += type_size) codec(src + b, dst + b);
}

/* the ROWS4 layout's copy, either way (quants.h) */
void rows4_move(int type, int64_t n, const uint8_t *src, uint8_t *dst, int64_t nrows, int to_rows4,
                rows4_codec_fn codec) {
    const type_traits *t = type_info(type);
    const size_t rb = weight_row_bytes(type, n), ub = weight_row_bytes(type, rows4_unit(t->block_size));
    const rows_at group = rows_group(ub, rb);
    int64_t r = 0;
    for (; r + 4 <= nrows; r += 4, src += 4 * rb, dst += 4 * rb)
        for (size_t off = 0; off < rb; off += ub)
            for (int q = 0; q < 4; q++) {
                const size_t len = rb - off < ub ? rb - off : ub;
                if (to_rows4)
                    move_blocks(src + q * rb + off, (uint8_t *)row_at(dst, &group, q, off, off), len, t->type_size, codec);
                else
                    move_blocks(row_at(src, &group, q, off, off), dst + q * rb + off, len, t->type_size, codec);
            }
    memcpy(dst, src, (size_t)(nrows - r) * rb); /* the last rows, fewer than 4, as they are */
}

/* ------------------------------------------------------------------ */
/* the scalar table                                                     */
/* ------------------------------------------------------------------ */

void kernels_fill_scalar(kernel_table *t) {
    memset(t, 0, sizeof *t);
#define SET(T, name)                      \
    t->dequant[T] = dequant_##name;       \
    t->vec_dot[T] = vec_dot_##name;
    SET(T_F32, f32) SET(T_F16, f16) SET(T_BF16, bf16)
    SET(T_Q4_0, q4_0) SET(T_Q4_1, q4_1) SET(T_Q5_0, q5_0) SET(T_Q5_1, q5_1)
    SET(T_Q8_0, q8_0) SET(T_IQ4_NL, iq4_nl) SET(T_MXFP4, mxfp4)
    SET(T_Q2_K, q2_K) SET(T_Q3_K, q3_K) SET(T_Q4_K, q4_K) SET(T_Q5_K, q5_K) SET(T_Q6_K, q6_K)
    SET(T_IQ4_XS, iq4_xs) SET(T_IQ3_S, iq3_s) SET(T_IQ3_XXS, iq3_xxs)
    SET(T_IQ2_XXS, iq2_xxs) SET(T_IQ2_XS, iq2_xs) SET(T_IQ2_S, iq2_s) SET(T_IQ1_S, iq1_s) SET(T_IQ1_M, iq1_m)
#undef SET
    /* no scalar gemv: the matmul loops over vec_dot */
    t->quantize_act[ACT_F32] = quantize_f32;
    t->quantize_act[ACT_Q8_32] = quantize_q8_32;
    t->quantize_act[ACT_Q8_K] = quantize_q8_K;
    t->f32_to_f16 = f32_to_f16_row;
    t->f16_to_f32 = f16_to_f32_rows;
    t->dot_f16_f32 = dot_f16_f32;
    t->axpy_f16 = axpy_f16;
    t->dot_f32 = dot_f32;
    t->glu_silu = glu_silu;
    t->glu_gelu_tanh = glu_gelu_tanh;
    t->glu_sigmoid = glu_sigmoid;
    t->exp_sum = exp_sum;
    t->softcap = softcap;
    t->axpy_f32 = axpy_f32;
    t->wsum_f32 = wsum_f32;
    t->ssm_scan_row = ssm_scan_row;
}
