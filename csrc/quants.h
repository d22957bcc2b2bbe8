/* quants.h: block formats and the per-ISA kernel table.
 *
 * Weight formats are GGUF's (type ids are ggml's). Activations are quantized
 * once per matmul into one of two formats of our own:
 *   - block_q8_32 for the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 *     IQ4_NL, MXFP4). It keeps d as float and also s = d * sum(qs), which the formats
 *     with an offset (Q4_1, Q5_1) and with a fixed bias (Q4_0: q - 8) need.
 *   - block_q8_K for the 256-element K-quants (llama.cpp's Q8_K layout).
 * Float weights (F32, F16, BF16) take float32 activations as they are.
 *
 * Every kernel has a scalar reference in quants.c. x86/avx2.c and
 * x86/avx512.c provide faster variants of some of them; dispatch.c builds
 * one table per ISA level, falling back to the level below for any entry a
 * level leaves NULL.
 */
#ifndef PYLLM_QUANTS_H
#define PYLLM_QUANTS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ggml type ids, as stored in GGUF files */
enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7,
    T_Q8_0 = 8, T_Q8_1 = 9, T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12,
    T_Q5_K = 13, T_Q6_K = 14, T_Q8_K = 15, T_IQ2_XXS = 16, T_IQ2_XS = 17, T_IQ3_XXS = 18, T_IQ1_S = 19, T_IQ4_NL = 20,
    T_IQ3_S = 21, T_IQ2_S = 22, T_IQ4_XS = 23, T_IQ1_M = 29, T_BF16 = 30,
    T_MXFP4 = 39, T_COUNT = 40
};

/* activation formats (the `act` of a weight type) */
enum { ACT_F32 = 0, ACT_Q8_32 = 1, ACT_Q8_K = 2 };

#define QK 32    /* elements per block of the 32-element formats */
#define QK_K 256 /* elements per super-block of the K-quants */
#define K_SCALE_SIZE 12

typedef uint16_t f16_t; /* IEEE half, stored as bits */

/* ---- weight blocks (byte layouts exactly as in GGUF) ---- */
typedef struct { f16_t d; uint8_t qs[QK / 2]; } block_q4_0;               /* 18 B */
typedef struct { f16_t d, m; uint8_t qs[QK / 2]; } block_q4_1;            /* 20 B */
typedef struct { f16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_0; /* 22 B */
typedef struct { f16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_1; /* 24 B */
typedef struct { f16_t d; int8_t qs[QK]; } block_q8_0;                     /* 34 B */
typedef struct { f16_t d; uint8_t qs[QK / 2]; } block_iq4_nl;             /* 18 B */
typedef struct { uint8_t e; uint8_t qs[QK / 2]; } block_mxfp4;            /* 17 B: e an E8M0 exponent */
typedef struct {
    uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; f16_t d, dmin;
} block_q2_K;                                                              /* 84 B */
typedef struct {
    uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; f16_t d;
} block_q3_K;                                                              /* 110 B */
typedef struct {
    f16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2];
} block_q4_K;                                                              /* 144 B */
typedef struct {
    f16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2];
} block_q5_K;                                                              /* 176 B */
typedef struct {
    uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; f16_t d;
} block_q6_K;                                                              /* 210 B */

/* IQ4_XS: IQ4_NL's values in super-blocks of 256: 8 sub-blocks of 32, each
 * with a 6-bit scale ls (low 4 bits in scales_l, high 2 in scales_h);
 * w = d (ls - 32) kvalues[nibble], the nibbles of each sub-block laid out
 * as an IQ4_NL block's (qs[16 ib + j]: elements j and j + 16) */
typedef struct {
    f16_t d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2];
} block_iq4_xs;                                                            /* 136 B */

/* the signed 6-bit scale (ls - 32, -32..31) of IQ4_XS sub-block ib (0..7) */
static inline int iq4_xs_scale(const block_iq4_xs *b, int ib) {
    return (((b->scales_l[ib / 2] >> 4 * (ib % 2)) & 0x0f) | (((b->scales_h >> 2 * ib) & 3) << 4)) - 32;
}

/* IQ3_S: 8 sub-blocks of 32, each 8 points of 4 values on a grid (iq3s_grid: 512
 * points, values odd 1..15): point k of the super-block has the 9-bit index
 * qs[k] | bit (k % 8) of qh[k / 8] << 8, and covers elements 4k..4k+3; element e
 * is negated when bit e % 8 of signs[e / 8] is set; sub-block ib's scale is the
 * nibble (scales[ib / 2] >> 4 (ib % 2)) & 15 =: s, w = d (1 + 2 s) grid value */
typedef struct {
    f16_t d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t signs[QK_K / 8]; uint8_t scales[QK_K / 64];
} block_iq3_s;                                                             /* 110 B */

/* the odd scale 1 + 2 s (1..31) of IQ3_S sub-block ib (0..7) */
static inline int iq3_s_scale(const block_iq3_s *b, int ib) { return 1 + 2 * ((b->scales[ib / 2] >> 4 * (ib % 2)) & 0x0f); }
/* the grid index (0..511) of IQ3_S point k (0..63) */
static inline int iq3_s_index(const block_iq3_s *b, int k) { return b->qs[k] | ((b->qh[k / 8] >> (k % 8)) & 1) << 8; }

/* IQ3_XXS: 8 sub-blocks of 32, each 8 points of 4 values on a grid (iq3xxs_grid:
 * 256 points, values 4..62): point k (elements 4k..4k+3) has the index qs[k].
 * Sub-block ib's 32-bit word sas[4 ib..4 ib + 3] (little-endian) holds in bits
 * 7 l..7 l + 6 the signs of its elements 8 l..8 l + 7 (iq_signs) and in its top
 * 4 bits the scale s: w = d (2 s + 1) / 4 value */
typedef struct { f16_t d; uint8_t qs[QK_K / 4]; uint8_t sas[QK_K / 8]; } block_iq3_xxs;   /* 98 B */

static inline uint32_t iq3_xxs_word(const block_iq3_xxs *b, int ib) {
    const uint8_t *p = b->sas + 4 * ib;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
/* the odd scale 2 s + 1 (1..31) of IQ3_XXS sub-block ib: w = (d / 4) (2 s + 1) value */
static inline int iq3_xxs_scale(const block_iq3_xxs *b, int ib) { return 1 + 2 * (int)(iq3_xxs_word(b, ib) >> 28); }

/* The 2-bit grid i-quants: 32 points of 8 values (8, 25 or 43) on a grid, point k
 * covering elements 8k..8k+7, its 8 sign bits (bit j: element 8k + j negated) and
 * grid index as below; a 4-bit s per 16 elements (IQ2_XXS: per 32), w = d (2 s + 1)
 * / 8 value (gguf: d (s + 1/2) / 4).
 * IQ2_XXS: sub-block ib of 32 is 8 bytes: the 4 points' 8-bit indices, then a
 *   32-bit word with their 7-bit signs (iq_signs) at 7 l and s in the top 4 bits. */
typedef struct { f16_t d; uint8_t qs[QK_K / 4]; } block_iq2_xxs;                          /* 66 B */
/* IQ2_XS: qs[k] = 9-bit index | 7-bit signs << 9; s of 16-group j: nibble j of scales */
typedef struct { f16_t d; uint16_t qs[QK_K / 8]; uint8_t scales[QK_K / 32]; } block_iq2_xs;   /* 74 B */
/* IQ2_S: index qs[k] | bits 2 (k % 4).. of qh[k / 4] << 8 (10 bits), signs[k] as they
 * are; s of 16-group j: nibble j of scales */
typedef struct {
    f16_t d; uint8_t qs[QK_K / 8]; uint8_t signs[QK_K / 8]; uint8_t qh[QK_K / 32]; uint8_t scales[QK_K / 32];
} block_iq2_s;                                                             /* 82 B */

/* The 1-bit grid i-quants: 32 points of 8 values -1, 0, 1 on a grid of 2048 (iq1s_grid,
 * stored + 1), point k covering elements 8k..8k+7: an 11-bit grid index, and a delta of
 * 1/8 (or -1/8) added to each value; w = d (2 s + 1) (g + delta) = d / 8 (2 s + 1) value,
 * value = 8 g +- 1 (-9..9), as ggml's dl (g + delta).
 * IQ1_S: index qs[k] | bits 3 (k % 4).. of qh[k / 4] << 8; qh[ib] also holds, for its
 *   sub-block of 32, s in bits 12-14 and the delta's sign in bit 15 (set: -1/8). */
typedef struct { f16_t d; uint8_t qs[QK_K / 8]; uint16_t qh[QK_K / 32]; } block_iq1_s;    /* 50 B */
/* IQ1_M: index qs[k] | bits 4 (k % 2).. of qh[k / 2] << 8, the bit above them the delta's
 * sign; s of 16-group j: the 3 bits at 3 (j % 4) of the little-endian uint16 scale word
 * j / 4, whose top nibbles (word 0 lowest) are the fp16 d: the block has no d field. */
typedef struct { uint8_t qs[QK_K / 8]; uint8_t qh[QK_K / 16]; uint8_t scales[QK_K / 32]; } block_iq1_m;   /* 56 B */

/* facts of the 32-element formats the SIMD kernels build on, by name:
 * HAS_MIN_x: a block has a min m (w = d q + m); SIGNED_x: the quants are
 * signed bytes (the others are unsigned nibbles, with the fixed offset of
 * Q4_0/Q5_0 folded in by each kernel) */
#define HAS_MIN_q4_0 0
#define HAS_MIN_q4_1 1
#define HAS_MIN_q5_0 0
#define HAS_MIN_q5_1 1
#define HAS_MIN_q8_0 0
#define HAS_MIN_iq4_nl 0
#define HAS_MIN_mxfp4 0
#define SIGNED_q4_0 0
#define SIGNED_q4_1 0
#define SIGNED_q5_0 0
#define SIGNED_q5_1 0
#define SIGNED_q8_0 1
#define SIGNED_iq4_nl 1
#define SIGNED_mxfp4 1

/* ---- activation blocks (ours; never stored in files) ---- */
typedef struct { float d; float s; int8_t qs[QK]; } block_q8_32;          /* s = d*sum(qs) */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;

/* the 16 IQ4_NL code values (a non-linear 4-bit grid) */
extern const int8_t kvalues_iq4nl[16];
/* the 16 MXFP4 code values: the E2M1 values (0, 0.5, 1, 1.5, 2, 3, 4, 6 and
 * their negatives) doubled, so that they are integers; the block scale is
 * halved to match (e8m0_half_bits). IQ4_NL and MXFP4 are both "a nibble
 * indexes 16 int8 values, times a block scale", and the SIMD kernels share
 * that code, each format bringing its table and its scale decode. */
extern const int8_t kvalues_mxfp4[16];
/* IQ3_S's grid: point i's 4 values in the bytes of iq3s_grid[i] (csrc/iq_grids.h) */
extern const uint32_t iq3s_grid[512];
/* IQ3_XXS's grid, as iq3s_grid */
extern const uint32_t iq3xxs_grid[256];
/* the 2-bit grids: point i's 8 values in the bytes of entry i; the 1-bit grid, values + 1 */
extern const uint64_t iq2xxs_grid[256], iq2xs_grid[512], iq2s_grid[1024], iq1s_grid[2048];
/* the 8 sign bits of 8 values stored as 7 (IQ3_XXS, IQ2_XXS, IQ2_XS): bit 7 makes their
 * count even (ggml's ksigns_iq2xs) */
extern const uint8_t iq_signs[128];

/* IQ2_XXS, IQ2_XS, IQ2_S: point k's grid index, its 8 sign bits, and s of 16-group j */
static inline uint32_t iq2_xxs_word(const block_iq2_xxs *b, int ib) {
    const uint8_t *p = b->qs + 8 * ib + 4;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline int iq2_xxs_index(const block_iq2_xxs *b, int k) { return b->qs[8 * (k / 4) + k % 4]; }
static inline int iq2_xxs_signs(const block_iq2_xxs *b, int k) { return iq_signs[(iq2_xxs_word(b, k / 4) >> 7 * (k % 4)) & 127]; }
static inline int iq2_xxs_s(const block_iq2_xxs *b, int j) { return (int)(iq2_xxs_word(b, j / 2) >> 28); }
static inline int iq2_xs_index(const block_iq2_xs *b, int k) { return b->qs[k] & 511; }
static inline int iq2_xs_signs(const block_iq2_xs *b, int k) { return iq_signs[b->qs[k] >> 9]; }
static inline int iq2_xs_s(const block_iq2_xs *b, int j) { return (b->scales[j / 2] >> 4 * (j % 2)) & 15; }
static inline int iq2_s_index(const block_iq2_s *b, int k) { return b->qs[k] | ((b->qh[k / 4] >> 2 * (k % 4)) & 3) << 8; }
static inline int iq2_s_signs(const block_iq2_s *b, int k) { return b->signs[k]; }
static inline int iq2_s_s(const block_iq2_s *b, int j) { return (b->scales[j / 2] >> 4 * (j % 2)) & 15; }

/* IQ1_S, IQ1_M: point k's grid index, whether its delta is -1/8, and s of 16-group j */
static inline int iq1_s_index(const block_iq1_s *b, int k) { return b->qs[k] | ((b->qh[k / 4] >> 3 * (k % 4)) & 7) << 8; }
static inline int iq1_s_delta_neg(const block_iq1_s *b, int k) { return b->qh[k / 4] >> 15; }
static inline int iq1_s_s(const block_iq1_s *b, int j) { return (b->qh[j / 2] >> 12) & 7; }
static inline int iq1_m_index(const block_iq1_m *b, int k) { return b->qs[k] | ((b->qh[k / 2] >> 4 * (k % 2)) & 7) << 8; }
static inline int iq1_m_delta_neg(const block_iq1_m *b, int k) { return (b->qh[k / 2] >> (3 + 4 * (k % 2))) & 1; }
static inline unsigned iq1_m_word(const block_iq1_m *b, int i) { return b->scales[2 * i] | (unsigned)b->scales[2 * i + 1] << 8; }
static inline int iq1_m_s(const block_iq1_m *b, int j) { return (iq1_m_word(b, j / 4) >> 3 * (j % 4)) & 7; }
#ifdef __BMI2__
#include <immintrin.h>
/* the SIMD kernels': the indices of points 4 ib .. 4 ib + 3 side by side in 16-bit lanes (the
 * low bytes spread by pdep, each top to bits 8-10 of its lane), and IQ1_M's 4 delta signs */
static inline uint64_t iq1_qs4(const uint8_t *qs, int ib) {
    uint32_t v;
    memcpy(&v, qs + 4 * ib, 4);
    return _pdep_u64(v, 0x00ff00ff00ff00ffull);
}
static inline uint64_t iq1_s_index4(const block_iq1_s *b, int ib) {
    return iq1_qs4(b->qs, ib) | _pdep_u64(b->qh[ib], 0x0700070007000700ull);
}
static inline unsigned iq1_m_qh16(const block_iq1_m *b, int ib) { return b->qh[2 * ib] | (unsigned)b->qh[2 * ib + 1] << 8; }
static inline uint64_t iq1_m_index4(const block_iq1_m *b, int ib) {
    return iq1_qs4(b->qs, ib) | (_pdep_u64(iq1_m_qh16(b, ib), 0x0f000f000f000f00ull) & 0x0700070007000700ull);
}
static inline unsigned iq1_m_neg4(const block_iq1_m *b, int ib) { return _pext_u32(iq1_m_qh16(b, ib), 0x8888u); }
/* IQ1_M's 16 s (3 bits each in the low 12 bits of the 4 scale words), one per byte: s[0] holds
 * 16-groups 0-7, s[1] 8-15 */
static inline void iq1_m_s16(const block_iq1_m *b, uint64_t s[2]) {
    uint64_t words;
    memcpy(&words, b->scales, 8);
    const uint64_t f = _pext_u64(words, 0x0fff0fff0fff0fffull);
    s[0] = _pdep_u64(f, 0x0707070707070707ull), s[1] = _pdep_u64(f >> 24, 0x0707070707070707ull);
}
#endif

/* the grid i-quants' fp16 d (IQ1_M: from the top nibbles of its scale words) */
#define GRID_D_FIELD(name) static inline f16_t name##_d(const block_##name *b) { return b->d; }
GRID_D_FIELD(iq3_s)
GRID_D_FIELD(iq3_xxs)
GRID_D_FIELD(iq2_xxs)
GRID_D_FIELD(iq2_xs)
GRID_D_FIELD(iq2_s)
GRID_D_FIELD(iq1_s)
#undef GRID_D_FIELD
static inline f16_t iq1_m_d(const block_iq1_m *b) {
    return (f16_t)(iq1_m_word(b, 0) >> 12 | (iq1_m_word(b, 1) >> 8 & 0x00f0) | (iq1_m_word(b, 2) >> 4 & 0x0f00) |
                   (iq1_m_word(b, 3) & 0xf000));
}

/* the grid i-quants' odd scale of 16-group j (0..15): w = GRID_DMUL d odd value */
#define GRID_DMUL_iq3_s 1.0f
#define GRID_DMUL_iq3_xxs 0.25f
#define GRID_DMUL_iq2_xxs 0.125f
#define GRID_DMUL_iq2_xs 0.125f
#define GRID_DMUL_iq2_s 0.125f
#define GRID_DMUL_iq1_s 0.125f
#define GRID_DMUL_iq1_m 0.125f
static inline int iq3_s_odd(const block_iq3_s *b, int j) { return iq3_s_scale(b, j / 2); }
static inline int iq3_xxs_odd(const block_iq3_xxs *b, int j) { return iq3_xxs_scale(b, j / 2); }
static inline int iq2_xxs_odd(const block_iq2_xxs *b, int j) { return 2 * iq2_xxs_s(b, j) + 1; }
static inline int iq2_xs_odd(const block_iq2_xs *b, int j) { return 2 * iq2_xs_s(b, j) + 1; }
static inline int iq2_s_odd(const block_iq2_s *b, int j) { return 2 * iq2_s_s(b, j) + 1; }
static inline int iq1_s_odd(const block_iq1_s *b, int j) { return 2 * iq1_s_s(b, j) + 1; }
static inline int iq1_m_odd(const block_iq1_m *b, int j) { return 2 * iq1_m_s(b, j) + 1; }

/* IQ3_XXS: the 32 sign bits of sub-block ib (bit j: element 32 ib + j negated) */
static inline uint32_t iq3_xxs_sign_bits(const block_iq3_xxs *b, int ib) {
    const uint32_t w = iq3_xxs_word(b, ib);
    return (uint32_t)iq_signs[w & 127] | (uint32_t)iq_signs[(w >> 7) & 127] << 8 |
           (uint32_t)iq_signs[(w >> 14) & 127] << 16 | (uint32_t)iq_signs[(w >> 21) & 127] << 24;
}

/* an MXFP4 block's scale, 2^(e - 128) (half the E8M0 value 2^(e - 127)), as
 * float bits: the normal 2^(e - 128) for e >= 2, the subnormals 2^-128 and
 * 2^-127 for e = 0, 1 (ggml's e8m0_to_fp32_half). Exact for every byte. */
#define E8M0_HALF_BITS(e) ((e) < 2 ? 0x00200000u << ((e) & 1) : (uint32_t)((e) - 1) << 23)
static inline uint32_t e8m0_half_bits(uint8_t e) { return E8M0_HALF_BITS(e); }
/* the same for every byte: the AVX2 and NEON kernels look their scales up
 * here (one load where the formula takes ~6 scalar ops per block: an AVX2
 * gemv measured ~25% faster with the table) */
extern const uint32_t e8m0_half_table[256];

/* ---- kernel signatures ----
 * n is the row length in elements; callers guarantee n % block_size == 0.
 * vec_dot returns sum_i w[i] * a[i] for one weight row w (in its GGUF format)
 * and one activation row a (in the weight type's activation format). */
typedef void (*dequant_fn)(const void *restrict w, float *restrict out, int64_t n);
typedef void (*quantize_fn)(const float *restrict x, void *restrict out, int64_t n);
typedef float (*vec_dot_fn)(int64_t n, const void *restrict w, const void *restrict a);

/* gemv_fn: out[r] = vec_dot(n, w + r*row_bytes, a) for r in [0, nrows).
 * A level may provide it to share activation loads across rows; NULL means
 * the matmul loops over vec_dot. */
typedef void (*gemv_fn)(int64_t n, const void *restrict w, size_t row_bytes, int nrows,
                        const void *restrict a, float *restrict out);

/* gemm_fn: out[t*out_stride + r] = vec_dot(n, w + r*row_bytes, a + t*a_stride)
 * for r in [0, nrows), t in [0, ncols): a tile of weight rows against several
 * activation rows (prefill), each weight block decoded once for several of
 * them. NULL means the matmul loops over gemv. */
typedef void (*gemm_fn)(int64_t n, const void *restrict w, size_t row_bytes, int nrows,
                        const void *restrict a, size_t a_stride, int ncols,
                        float *restrict out, size_t out_stride);

/* Software prefetch in the gemv kernels (decode). A decode step streams
 * every weight once, from memory (more than any cache holds), and a gemv
 * reads R rows side by side (R = 4, 2 or 1 by kernel), each from its start
 * to its end, then the next R rows. One core keeps only so many misses in
 * flight, and the hardware prefetcher stops at every 4 KB page and needs a
 * few misses to start again, so on its own a gemv streams at ~70% of what
 * the core can read (an Ice Lake Xeon: 6.5-7 GB/s against 9.7). So the x86
 * gemv kernels also ask for the lines ahead of what they read (prefetcht0,
 * a few lines per step of the inner loop): each of the R rows read side by
 * side is a stream that goes on in the row R further, and each stream asks
 * GEMV_PREFETCH / R bytes ahead of itself, so that the R streams together
 * keep GEMV_PREFETCH bytes asked for. It runs on past the end of the call
 * into the rows after it, which the matmul hands the same thread next
 * (matmul.c: decode chunks are contiguous per thread); a prefetch never
 * faults, so asking for lines past the end of a matrix is harmless.
 * 4 KB: about what one core has in flight (bandwidth x latency); 2 KB loses
 * a little, 4 to 8 KB measure alike, 16 KB and prefetcht1 (L2 only) a
 * little less, prefetchnta much less. Prefetching changes no arithmetic:
 * the contract below is untouched. */
#define GEMV_PREFETCH 4096

/* prefetcht0 the 64-byte lines of [p, p + len), one hint per 64 bytes
 * (with len a compile-time constant: a fixed, unrolled sequence, no
 * branches; consecutive spans cover every line). p may point past the end
 * of its object: the address is only a hint. */
static inline void prefetch_lines(uintptr_t p, size_t len) {
    for (size_t j = 0; j < len; j += 64) __builtin_prefetch((const void *)(p + j), 0, 3);
}

/* Where the R streams of a gemv pass ask, for rows of stride rb of which
 * the pass reads len bytes (the whole row, or a column chunk of long rows):
 * a stream reading at offset off of its row asks d = GEMV_PREFETCH / R
 * bytes further along it, which is k = (off + d) / len rows of its stream
 * (R * k rows) further, at offset (off + d) % len. Over a row, k takes two
 * values, k0 below offset `turn` and k0 + 1 from there on. */
typedef struct { size_t near, far, turn, rb; } gemv_pf;

static inline gemv_pf gemv_prefetch_plan(int R, size_t rb, size_t len) {
    const size_t d = GEMV_PREFETCH / R, k0 = d / len, skip = R * rb - len;
    gemv_pf p = {d + k0 * skip, d + (k0 + 1) * skip, (k0 + 1) * len - d, rb};
    return p;
}

/* the prefetch for a step that reads step bytes of each of the R rows,
 * the first at address at, offset off of its row */
static inline void gemv_prefetch_step(const gemv_pf *pf, int R, uintptr_t at, size_t off, size_t step) {
    const uintptr_t a = at + (off < pf->turn ? pf->near : pf->far);
    for (int r = 0; r < R; r++) prefetch_lines(a + r * pf->rb, step);
}

/* The ROWS4 layout: an optional repacking of a weight matrix for decode
 * (pyllm_repack_rows4, made at load where it pays; DESIGN.md's "repacking
 * for speed"). The rows are taken in groups of 4 and each row is cut into
 * units of rows4_unit(type) elements (whole blocks; a row's last unit may be
 * shorter). A group holds its 4 rows' bytes with the units interleaved:
 * unit 0 of rows 0, 1, 2, 3, then unit 1 of each, and so on; the rows after
 * the last whole group stay as they are. A group takes the 4 rows' place, so
 * a chunk of rows that starts at a multiple of 4 starts a group.
 * Why: a gemv reads 4 rows side by side, and in the plain layout those are 4
 * streams a row apart; a core's hardware prefetcher follows one stream far
 * better than 4 (on Zen 4, 4 side-by-side rows streamed at 10-17 GB/s
 * against 24 for one: benchmarks/bench_kernels.py, gemv_cold). In ROWS4 the
 * same reads are one stream, front to back. The bytes are only moved, so a
 * row's results are the plain layout's, bit for bit; a level may also
 * reorder the quants inside each block of a format for its gemv4's sake
 * (kernel_table.rows4_codec: AVX-512 "chains" its K-quants and IQ4_XS),
 * which changes no integer a kernel sums and so no result either. */
/* a super-block for the K-quants (AVX-512's gemv4 reads one per row in turn); 512 elements for
 * the 32-element formats (the 16 blocks of their hex step); 32 for float weights (a line of
 * F16: the gemv4 runs the 4 rows' FMA chains side by side, which whole 512-element units would
 * make one chain at a time, bound by the FMA latency at ~28 GB/s of F16) */
static inline int64_t rows4_unit(int block_size) {
    return block_size >= QK_K ? block_size : block_size == 1 ? 32 : 512 - 512 % block_size;
}

/* Where a gemv's rows are, plain or a ROWS4 group: row r's bytes at offset off (of the
 * call's part of the row), in the unit that starts at u0, are at
 *     w + k u0 + r rs + (off - u0)                    u0 < tail
 *     w + 4 tail + r tail_rs + (off - tail)           u0 >= tail (the row's last, shorter unit)
 * Plain rows rb apart: rows_plain(rb) (u0 plays no part). A ROWS4 group whose part of the
 * rows holds len bytes of each (units of ub; w at the part's start, 4 times its offset into
 * the group): rows_group(ub, len). */
typedef struct { size_t rs, k, tail, tail_rs; } rows_at;
static inline rows_at rows_plain(size_t rb) { return (rows_at){rb, 1, SIZE_MAX, 0}; }
static inline rows_at rows_group(size_t ub, size_t len) {
    const size_t tail = len / ub * ub;
    return (rows_at){ub, 4, tail < len ? tail : SIZE_MAX, len - tail};
}
static inline const uint8_t *row_at(const void *w, const rows_at *L, int r, size_t u0, size_t off) {
    return u0 < L->tail ? (const uint8_t *)w + L->k * u0 + r * L->rs + (off - u0)
                        : (const uint8_t *)w + 4 * L->tail + r * L->tail_rs + (off - L->tail);
}

/* a level's re-encoding of one block of a format inside ROWS4: its own inverse, so the same
 * call goes from the file's encoding and back (src and dst do not overlap); super-block
 * formats only, whose ROWS4 unit is one block */
typedef void (*rows4_codec_fn)(const void *restrict src, void *restrict dst);

/* copies nrows rows of n elements of `type` between the plain layout and ROWS4 (quants.c):
 * to_rows4 = 1 reads plain and writes ROWS4, 0 the reverse; src and dst start at a group;
 * codec: the level's rows4_codec[type] (NULL: the blocks' bytes as they are) */
void rows4_move(int type, int64_t n, const uint8_t *src, uint8_t *dst, int64_t nrows, int to_rows4,
                rows4_codec_fn codec);

/* DETERMINISM CONTRACT (every level, every type; tests/test_kernels.py checks
 * it with exact equality). Within one level's table, the float result for a
 * (weight row, activation row) pair depends only on the row bytes, the
 * activation bytes and n, never on which kernel computes it or on what else
 * shares the call:
 *     gemm(...)[t*out_stride + r] == gemv(activation row t)[r]
 *                                 == gemv(nrows = 1, that row)[0]
 *                                 == vec_dot(that row, activation row t)
 * bit for bit, for any nrows, ncols, strides and any position of the row in
 * the call. The matmul cuts rows into chunks by thread and token count, and
 * runs one token through gemv but a prompt through gemm; this contract is
 * what makes a token's logits independent of both (a chat that recomputes
 * only its last token gets the logits of the whole prompt computed at once).
 * How it is kept: each level fixes, per format, one sequence of float
 * operations per row (which blocks share an accumulator lane, where the
 * lanes are reduced and in what order) and every kernel of that format runs
 * exactly that sequence; multi-row and multi-token kernels only share the
 * decoding of weights and activations, which is exact (integer) work. The
 * levels still differ from each other and from the scalar reference (by
 * summation order and FMA rounding, within the tolerances of the tests). */

typedef struct {
    dequant_fn dequant[T_COUNT];
    vec_dot_fn vec_dot[T_COUNT];
    gemv_fn gemv[T_COUNT];
    gemm_fn gemm[T_COUNT];
    int gemm_streams[T_COUNT];     /* up to this many activation rows, gemm streams the weights once as gemv
                                      does (cheaper than a gemv per row): matmul.c then takes it for 2 rows too */
    gemv_fn gemv4[T_COUNT];        /* gemv over weights in the ROWS4 layout (below), exactly gemv's results;
                                      NULL: matmul.c copies each group out of it and runs gemv */
    rows4_codec_fn rows4_codec[T_COUNT]; /* how this level's gemv4 wants the blocks inside ROWS4; NULL: as is */
    quantize_fn quantize_act[3];   /* by ACT_*; ACT_F32 entry is a plain copy */
    /* float helpers used by attention and the KV cache */
    void (*f32_to_f16)(const float *restrict x, f16_t *restrict out, int64_t n);
    /* rows rows of n halves, x_stride halves apart -> out, rows x n floats back to back
     * (exact: the K/V rows of a cache block, converted in one call) */
    void (*f16_to_f32)(const f16_t *restrict x, int64_t x_stride, int rows, float *restrict out, int64_t n);
    float (*dot_f16_f32)(int64_t n, const f16_t *restrict a, const float *restrict b);
    /* out[i] += s * f16_to_f32(a[i]) */
    void (*axpy_f16)(int64_t n, float s, const f16_t *restrict a, float *restrict out);
    float (*dot_f32)(int64_t n, const float *restrict a, const float *restrict b);
    /* one row of Mamba 2's selective scan over n_tok tokens, its state s[n] carried on:
     *   s = s * decay[t] + (x[t x_stride] dt[t]) B_t ;  y[t y_stride] = s . C_t
     * with B_t = bc + t bc_stride and C_t = B_t + c_off (the scan's state update; see ssm.c) */
    void (*ssm_scan_row)(int64_t n, float *restrict s, int n_tok, const float *bc, int64_t bc_stride, int64_t c_off,
                         const float *x, int64_t x_stride, const float *dt, const float *decay, float *y,
                         int64_t y_stride);
    /* vector math of the non-matmul ops (GLU, attention); the error bounds of
     * each level are stated with the scalar references in quants.c. Each
     * element's result depends only on its inputs, never on n or on where the
     * element sits in the array (the ops split rows at any point), and
     * exp_sum's sum only on the values and n. */
    /* out[i] = silu(gate[i]) * up[i]; out may be gate or up */
    void (*glu_silu)(int64_t n, const float *gate, const float *up, float *out);
    /* out[i] = gelu_tanh(gate[i]) * up[i]; out may be gate or up */
    void (*glu_gelu_tanh)(int64_t n, const float *gate, const float *up, float *out);
    /* out[i] = sigmoid(gate[i]) * up[i]; out may be gate or up (RWKV's gates) */
    void (*glu_sigmoid)(int64_t n, const float *gate, const float *up, float *out);
    /* s[i] = exp(s[i] - m) in place (s[i] - m <= 0 expected, -inf gives 0);
     * returns the sum of the new s[i] */
    float (*exp_sum)(int64_t n, float *s, float m);
    /* s[i] = cap * tanh(s[i] * scale / cap) in place, cap > 0: Gemma 2's
     * soft-capped attention scores and logits */
    void (*softcap)(int64_t n, float *s, float scale, float cap);
    /* y[i] += a * x[i] */
    void (*axpy_f32)(int64_t n, float a, const float *restrict x, float *restrict y);
    /* y[j] += sum_{i < rows} w[i] * x[i*ld + j] for j < n: the rows added in
     * order, one multiply-add per element and row (axpy_f32 over the rows,
     * with y held in registers: attention's weighted sum of V rows) */
    void (*wsum_f32)(int64_t n, int rows, const float *restrict w, const float *restrict x, int64_t ld,
                     float *restrict y);
    /* wsum_f32 for nq outputs at once: y[q*ys + j] += sum_i w[q*ws + i] * x[i*ld + j],
     * each output exactly what wsum_f32 gives it (sharing the loads of x's
     * rows among the outputs: attention's weighted sum for several queries).
     * NULL: callers loop over wsum_f32. */
    void (*wsum_many_f32)(int64_t n, int rows, int nq, const float *restrict w, int64_t ws,
                          const float *restrict x, int64_t ld, float *restrict y, int64_t ys);
    /* wsum_many_f32 over rows of halves (attention's V rows read straight from
     * the f16 cache): exactly wsum_many_f32 on the rows converted to float.
     * NULL: callers convert the rows (f16_to_f32) and call the f32 form. */
    void (*wsum_many_f16)(int64_t n, int rows, int nq, const float *restrict w, int64_t ws,
                          const f16_t *restrict x, int64_t ld, float *restrict y, int64_t ys);
    /* wsum_many_f32 over rows of Q8_0 blocks ld bytes apart, n a multiple of 32 (a q8_0
     * cache's V rows): exactly wsum_many_f32 on the rows dequantized (dequant[T_Q8_0]).
     * NULL: callers dequantize the rows and call the f32 form. */
    void (*wsum_many_q8_0)(int64_t n, int rows, int nq, const float *restrict w, int64_t ws,
                           const void *restrict x, int64_t ld, float *restrict y, int64_t ys);
} kernel_table;

/* the activations the SIMD GLU helpers (glu8, glu16) are compiled for */
enum { GLU_K_SILU = 0, GLU_K_GELU_TANH = 1, GLU_K_SIGMOID = 2 };

/* ISA levels, in increasing order */
enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_NEON = 3, ISA_COUNT = 4 };

/* per-level tables: entries a level does not provide are NULL */
void kernels_fill_scalar(kernel_table *t);
void kernels_fill_avx2(kernel_table *t);   /* defined only on x86-64 */
/* avx2.c built with AVX-VNNI (x86/avx2_vnni.c); weak: absent where the
 * compiler has no -mavxvnni (setup.py then builds without it) */
void kernels_fill_avx2_vnni(kernel_table *t) __attribute__((weak));
void kernels_fill_avx512(kernel_table *t); /* defined only on x86-64 */
void kernels_fill_neon(kernel_table *t);   /* defined only on aarch64 */
/* neon.c built with +dotprod (arm/neon_dotprod.c); weak, like the AVX-VNNI table */
void kernels_fill_neon_dotprod(kernel_table *t) __attribute__((weak));

/* type traits (format facts, independent of ISA) */
typedef struct {
    const char *name;
    int block_size;  /* elements per block */
    int type_size;   /* bytes per block */
    int act;         /* ACT_* the vec_dot expects */
} type_traits;

const type_traits *type_info(int type); /* NULL for an unsupported type */
size_t act_row_bytes(int act, int64_t n);   /* bytes of one quantized activation row */
size_t weight_row_bytes(int type, int64_t n);

/* the table for the best level this CPU supports (set up by dispatch_init) */
extern kernel_table K;
int dispatch_init(int max_isa);          /* returns the chosen level */
int dispatch_level(void);
const kernel_table *dispatch_table(int isa); /* NULL if the CPU lacks that level */
/* dispatch_table after the one-time set-up: for entry points called before any context exists */
const kernel_table *dispatch_table_ready(int isa);

/* n floats (n % 32 == 0) as Q8_0 blocks: d = amax / 127 (stored as f16), q = nearest(x / d) */
void quantize_row_q8_0(const float *restrict x, void *restrict out, int64_t n);
/* n floats (n % 32 == 0) as Q4_0 blocks (llama.cpp's reference quantizer, see quants.c) */
void quantize_row_q4_0(const float *restrict x, void *restrict out, int64_t n);

/* scalar fp16 / bf16 conversion, exact (round to nearest even) */
float fp16_to_fp32(f16_t h);
f16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);

#endif
