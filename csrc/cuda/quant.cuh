/* quant.cuh: GGUF weight blocks on the device.
 *
 * Two views of a weight row, both byte-exact readings of csrc/quants.c:
 *
 * - unpack16<T>(row, g, q, a, b): the g-th group of 16 consecutive elements
 *   as 16 small integers (packed four to an int, element 4i+j in byte j of
 *   q[i], signed) and two floats with  w = a * q + b  for every element of the
 *   group. Every format fits this: the scale (and offset) of a group is the
 *   block's or the sub-block's (16 or 32 elements). The matmul kernels take
 *   integer dot products of q with the 8-bit activations (__dp4a) and apply a
 *   and b per group, as the formats were designed for.
 *
 * - dequant(type, row, k): element k as a float, with the arithmetic of the
 *   C reference (same operations in the same order, no fused multiply-add),
 *   so the embedding lookup gives the CPU's floats bit for bit.
 *
 * Blocks sit at byte offsets that are only 2-byte aligned (18, 20, 22, 34
 * bytes per block) or not aligned at all (MXFP4: 17), so everything is read
 * with byte loads.
 *
 * Everything here is __host__ __device__ (PQ_HD): hosttest.cu compiles the
 * same code for the CPU, so tests check these readings against the C core
 * and gguf's dequantize on machines without a GPU.
 */
#ifndef PYLLM_CUDA_QUANT_CUH
#define PYLLM_CUDA_QUANT_CUH

#include <cstring>

#include "common.cuh"
#include "iq_grids.h"

#define PQ_HD __host__ __device__ __forceinline__

namespace pq {

/* device intrinsics, and what they compute on the host */
PQ_HD uint32_t vsub4(uint32_t a, uint32_t b) {   /* bytewise a - b, wrapping */
#ifdef __CUDA_ARCH__
    return __vsub4(a, b);
#else
    uint32_t r = 0;
    for (int j = 0; j < 4; j++) r |= ((((a >> (8 * j)) & 0xffu) - ((b >> (8 * j)) & 0xffu)) & 0xffu) << (8 * j);
    return r;
#endif
}

PQ_HD float mul_rn(float a, float b) {   /* a * b, never fused with an add */
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    volatile float r = a * b;
    return r;
#endif
}

PQ_HD float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    volatile float r = a + b;
    return r;
#endif
}

PQ_HD float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    volatile float r = a - b;
    return r;
#endif
}

PQ_HD float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

PQ_HD float ld_f16(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

PQ_HD uint32_t ld_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* The same loads from a block field known to be A-byte aligned (allocations are 256-byte aligned
 * and every block size keeps its fields 2- or 4-byte aligned but MXFP4's 17): on the GPU one or
 * two loads instead of one per byte, which is what bounds a decode matmul's rate. The emulator
 * checks the alignment; the host (tests) reads bytes. */
#if defined(__CUDA_ARCH__) && defined(PYLLM_CUDA_EMU)
#define PQ_ALIGNED(p, a) ::pqemu::check_aligned(p, a, __FILE__, __LINE__)
#else
#define PQ_ALIGNED(p, a) ((void)0)
#endif

template <int A> PQ_HD uint32_t ld32(const uint8_t *p);
template <> PQ_HD uint32_t ld32<1>(const uint8_t *p) { return ld_u32(p); }
template <> PQ_HD uint32_t ld32<2>(const uint8_t *p) {
#ifdef __CUDA_ARCH__
    PQ_ALIGNED(p, 2);
    const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
#else
    return ld_u32(p);
#endif
}
template <> PQ_HD uint32_t ld32<4>(const uint8_t *p) {
#ifdef __CUDA_ARCH__
    PQ_ALIGNED(p, 4);
    return *reinterpret_cast<const uint32_t *>(p);
#else
    return ld_u32(p);
#endif
}

PQ_HD float ld_f16a(const uint8_t *p) {   /* p 2-byte aligned */
#ifdef __CUDA_ARCH__
    PQ_ALIGNED(p, 2);
    return __half2float(*reinterpret_cast<const __half *>(p));
#else
    return ld_f16(p);
#endif
}

PQ_HD uint32_t pack4(int a, int b, int c, int d) {
    return (uint32_t)(a & 0xff) | ((uint32_t)(b & 0xff) << 8) | ((uint32_t)(c & 0xff) << 16) |
           ((uint32_t)(d & 0xff) << 24);
}

/* the 16 values a nibble stands for in IQ4_NL (its non-linear grid) and in
 * MXFP4 (the E2M1 values doubled), as csrc/quants.c */
__constant__ const int8_t kvalues_iq4nl_dev[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                   1,    13,   25,  38,  53,  69,  89,  113};
static const int8_t kvalues_iq4nl_host[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                              1,    13,   25,  38,  53,  69,  89,  113};
__constant__ const int8_t kvalues_mxfp4_dev[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
static const int8_t kvalues_mxfp4_host[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

template <int T> PQ_HD int kvalue(int i) {
    static_assert(T == T_IQ4_NL || T == T_MXFP4, "a format with a table of values");
#ifdef __CUDA_ARCH__
    return T == T_MXFP4 ? kvalues_mxfp4_dev[i] : kvalues_iq4nl_dev[i];
#else
    return T == T_MXFP4 ? kvalues_mxfp4_host[i] : kvalues_iq4nl_host[i];
#endif
}

/* MXFP4's block scale: 2^(e - 128) for the E8M0 byte e, subnormal for e < 2 (e8m0_half_bits, quants.h) */
PQ_HD float e8m0_half(uint8_t e) { return bits_float(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23); }

/* Q4_K/Q5_K: 6-bit scale and min of sub-block j (0..7) */
PQ_HD void scale_min_k4(int j, const uint8_t *q, int &sc, int &m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q3_K: signed 6-bit scale of sub-block j (0..15) */
PQ_HD int scale_q3k(int j, const uint8_t *s) {
    const int lo = (j < 8 ? s[j] : s[j - 8] >> 4) & 0x0f;
    const int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    return (lo | hi << 4) - 32;
}

/* ---- unpack16 ---- */

template <int T> struct fmt;   /* facts per format, known at compile time */
template <> struct fmt<T_Q4_0> { static constexpr int block = 32, bytes = 18, act = ACT_Q8_32; };
template <> struct fmt<T_Q4_1> { static constexpr int block = 32, bytes = 20, act = ACT_Q8_32; };
template <> struct fmt<T_Q5_0> { static constexpr int block = 32, bytes = 22, act = ACT_Q8_32; };
template <> struct fmt<T_Q5_1> { static constexpr int block = 32, bytes = 24, act = ACT_Q8_32; };
template <> struct fmt<T_Q8_0> { static constexpr int block = 32, bytes = 34, act = ACT_Q8_32; };
template <> struct fmt<T_IQ4_NL> { static constexpr int block = 32, bytes = 18, act = ACT_Q8_32; };
template <> struct fmt<T_MXFP4> { static constexpr int block = 32, bytes = 17, act = ACT_Q8_32; };
template <> struct fmt<T_Q2_K> { static constexpr int block = 256, bytes = 84, act = ACT_Q8_K; };
template <> struct fmt<T_Q3_K> { static constexpr int block = 256, bytes = 110, act = ACT_Q8_K; };
template <> struct fmt<T_Q4_K> { static constexpr int block = 256, bytes = 144, act = ACT_Q8_K; };
template <> struct fmt<T_Q5_K> { static constexpr int block = 256, bytes = 176, act = ACT_Q8_K; };
template <> struct fmt<T_Q6_K> { static constexpr int block = 256, bytes = 210, act = ACT_Q8_K; };
template <> struct fmt<T_IQ4_XS> { static constexpr int block = 256, bytes = 136, act = ACT_Q8_K; };
template <> struct fmt<T_IQ3_S> { static constexpr int block = 256, bytes = 110, act = ACT_Q8_K; };
template <> struct fmt<T_IQ3_XXS> { static constexpr int block = 256, bytes = 98, act = ACT_Q8_K; };
template <> struct fmt<T_IQ2_XXS> { static constexpr int block = 256, bytes = 66, act = ACT_Q8_K; };
template <> struct fmt<T_IQ2_XS> { static constexpr int block = 256, bytes = 74, act = ACT_Q8_K; };
template <> struct fmt<T_IQ2_S> { static constexpr int block = 256, bytes = 82, act = ACT_Q8_K; };
template <> struct fmt<T_IQ1_S> { static constexpr int block = 256, bytes = 50, act = ACT_Q8_K; };
template <> struct fmt<T_IQ1_M> { static constexpr int block = 256, bytes = 56, act = ACT_Q8_K; };
template <> struct fmt<T_F32> { static constexpr int block = 1, bytes = 4, act = ACT_F32; };
template <> struct fmt<T_F16> { static constexpr int block = 1, bytes = 2, act = ACT_F32; };
template <> struct fmt<T_BF16> { static constexpr int block = 1, bytes = 2, act = ACT_F32; };

template <int T> PQ_HD void unpack16(const uint8_t *row, int g, int q[4], float &a, float &b);

/* Q4_0: elements 0..15 are the low nibbles of qs, 16..31 the high ones; w = d (q - 8) */
template <> PQ_HD void unpack16<T_Q4_0>(const uint8_t *row, int g, int q[4], float &a, float &b) {
    const uint8_t *blk = row + (size_t)(g >> 1) * 18;
    const int sh = (g & 1) * 4;
#pragma unroll
    for (int i = 0; i < 4; i++) q[i] = (int)((ld32<2>(blk + 2 + 4 * i) >> sh) & 0x0F0F0F0Fu);
    const float d = ld_f16a(blk);
    a = d;
    b = -8.0f * d;
}

/* Q4_1: w = d q + m */
template <> PQ_HD void unpack16<T_Q4_1>(const uint8_t *row, int g, int q[4], float &a, float &b) {
    const uint8_t *blk = row + (size_t)(g >> 1) * 20;
    const int sh = (g & 1) * 4;
#pragma unroll
    for (int i = 0; i < 4; i++) q[i] = (int)((ld32<4>(blk + 4 + 4 * i) >> sh) & 0x0F0F0F0Fu);
    a = ld_f16a(blk);
    b = ld_f16a(blk + 2);
}

/* Q5: bit j of the little-endian qh is bit 4 of element j */
template <int A> PQ_HD void q5_group(const uint8_t *qs, uint32_t qh, int half, int q[4]) {
    const int sh = half * 4;
    const uint32_t h = qh >> (16 * half);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t lo = (ld32<A>(qs + 4 * i) >> sh) & 0x0F0F0F0Fu;
        uint32_t hb = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) hb |= ((h >> (4 * i + j)) & 1u) << (8 * j + 4);
        q[i] = (int)(lo | hb);
    }
}

/* Q5_0: w = d (q - 16) */
template <> PQ_HD void unpack16<T_Q5_0>(const uint8_t *row, int g, int q[4], float &a, float &b) {
    const uint8_t *blk = row + (size_t)(g >> 1) * 22;
    q5_group<2>(blk + 6, ld32<2>(blk + 2), g & 1, q);
    const float d = ld_f16a(blk);
    a = d;
    b = -16.0f * d;
}

/* Q5_1: w = d q + m */
template <> PQ_HD void unpack16<T_Q5_1>(const uint8_t *row, int g, int q[4], float &a, float &b) {
    const uint8_t *blk = row + (size_t)(g >> 1) * 24;
    q5_group<4>(blk + 8, ld32<4>(blk + 4), g & 1, q);
    a = ld_f16a(blk);
    b = ld_f16a(blk + 2);
}

/* Q8_0: w = d q */
template <> PQ_HD void unpack16<T_Q8_0>(const uint8_t *row, int g, int q[4], float &a, float &b) {
    const uint8_t *blk = row + (size_t)(g >> 1) * 34;
    const uint8_t *qs = blk + 2 + 16 * (g & 1);
#pragma unroll
    for (int i = 0; i < 4; i++) q[i] = (int)ld32<2>(qs + 4 * i);
    a = ld_f16a(blk);
    b = 0.0f;
}

/* IQ4_NL, MXFP4: the values of the 16 nibbles of half sh / 4 (0: low, 1: high) of the qs at p */
template <int T, int A> PQ_HD void kvalues16(const uint8_t *p, int sh, int q[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++, p += 4) {
        const uint32_t v = ld32<A>(p) >> sh;
        q[i] = (int)pack4(kvalue<T>(v & 15), kvalue<T>((v >> 8) & 15), kvalue<T>((v >> 16) & 15),
                          kvalue<T>((v >> 24) & 15));
    }
}

/* IQ4_NL: w = d kvalues[nibble] */
template <> PQ_HD void unpack16<T_IQ4_NL>(const uint8_t *row, int g, int q[4], float &a, float &b) {
    const uint8_t *blk = row + (size_t)(g >> 1) * 18;
    kvalues16<T_IQ4_NL, 2>(blk + 2, (g & 1) * 4, q);
    a = ld_f16a(blk);
    b = 0.0f;
}

/* IQ4_XS: the signed 6-bit scale ls - 32 of sub-block ib (0..7) of the block at b (d, scales_h, scales_l) */
PQ_HD int scale_iq4xs(const uint8_t *b, int ib) {
    const int lo = (b[4 + ib / 2] >> (4 * (ib & 1))) & 0x0f, hi = ((b[2] | b[3] << 8) >> (2 * ib)) & 3;
    return (lo | hi << 4) - 32;
}

/* IQ4_XS: 8 sub-blocks of 32, sub-block ib laid out as an IQ4_NL block's nibbles at qs + 16 ib;
 * w = d (ls - 32) kvalues[nibble] */
template <> PQ_HD void unpack16<T_IQ4_XS>(const uint8_t *row, int g, int q[4], float &a, float &b) {
    const uint8_t *blk = row + (size_t)(g >> 4) * 136;
    const int ib = (g & 15) >> 1;
    kvalues16<T_IQ4_NL, 4>(blk + 8 + 16 * ib, (g & 1) * 4, q);
    a = ld_f16a(blk) * (float)scale_iq4xs(blk, ib);
    b = 0.0f;
}

/* the grid i-quants (quants.h): IQ3_S, IQ3_XXS (points of 4 values), IQ2_XXS, IQ2_XS, IQ2_S
 * (points of 8). Point k of a super-block covers elements W k .. W k + W - 1; w = dmul d odd
 * value, odd the scale 2 s + 1 of the element's 16-group */
template <int T> struct grid_fmt;
template <> struct grid_fmt<T_IQ3_S> { static constexpr int width = 4; static constexpr float dmul = 1.0f; };
template <> struct grid_fmt<T_IQ3_XXS> { static constexpr int width = 4; static constexpr float dmul = 0.25f; };
template <> struct grid_fmt<T_IQ2_XXS> { static constexpr int width = 8; static constexpr float dmul = 0.125f; };
template <> struct grid_fmt<T_IQ2_XS> { static constexpr int width = 8; static constexpr float dmul = 0.125f; };
template <> struct grid_fmt<T_IQ2_S> { static constexpr int width = 8; static constexpr float dmul = 0.125f; };
template <> struct grid_fmt<T_IQ1_S> { static constexpr int width = 8; static constexpr float dmul = 0.125f; };
template <> struct grid_fmt<T_IQ1_M> { static constexpr int width = 8; static constexpr float dmul = 0.125f; };

/* the grids (csrc/iq_grids.h): point i's values in the bytes of entry i. In global memory,
 * not __constant__: the threads of a warp read different points */
#define PQ_GRID_TABLES(type, name, GRID)                                   \
    __device__ const type name##_dev[GRID##_SIZE] = {GRID};                   \
    static const type name##_host[GRID##_SIZE] = {GRID};
PQ_GRID_TABLES(uint32_t, iq3s_grid, IQ3S_GRID)
PQ_GRID_TABLES(uint32_t, iq3xxs_grid, IQ3XXS_GRID)
PQ_GRID_TABLES(uint64_t, iq2xxs_grid, IQ2XXS_GRID)
PQ_GRID_TABLES(uint64_t, iq2xs_grid, IQ2XS_GRID)
PQ_GRID_TABLES(uint64_t, iq2s_grid, IQ2S_GRID)
PQ_GRID_TABLES(uint64_t, iq1s_grid, IQ1S_GRID)
#undef PQ_GRID_TABLES

template <int T> PQ_HD uint64_t grid_entry(int i) {
#ifdef __CUDA_ARCH__
    return T == T_IQ3_S ? iq3s_grid_dev[i] : T == T_IQ3_XXS ? iq3xxs_grid_dev[i] : T == T_IQ2_XXS ? iq2xxs_grid_dev[i]
         : T == T_IQ2_XS ? iq2xs_grid_dev[i] : T == T_IQ2_S ? iq2s_grid_dev[i] : iq1s_grid_dev[i];
#else
    return T == T_IQ3_S ? iq3s_grid_host[i] : T == T_IQ3_XXS ? iq3xxs_grid_host[i] : T == T_IQ2_XXS ? iq2xxs_grid_host[i]
         : T == T_IQ2_XS ? iq2xs_grid_host[i] : T == T_IQ2_S ? iq2s_grid_host[i] : iq1s_grid_host[i];
#endif
}

/* the 4 values of point v with the signs of 4 bits: bit j negates byte j (0xff mask, then -) */
PQ_HD uint32_t signed4(uint32_t v, uint32_t bits) {
    const uint32_t neg = ((bits * 0x00204081u) & 0x01010101u) * 0xffu;   /* bit j -> bit 8 j -> byte j */
    return vsub4(v ^ neg, neg);
}

/* 8 sign bits from the 7 stored (IQ3_XXS, IQ2_XXS, IQ2_XS): the 8th makes their count even */
PQ_HD uint32_t signs8(uint32_t s7) {
    s7 &= 127u;
    return s7 | ((s7 ^ s7 >> 1 ^ s7 >> 2 ^ s7 >> 3 ^ s7 >> 4 ^ s7 >> 5 ^ s7 >> 6) & 1u) << 7;
}

/* IQ1_*: the values 8 g -+ 1 of point k (grid bytes g + 1, so << 3 stays in each byte) */
template <int T> PQ_HD uint64_t iq1_values(const uint8_t *b, int k) {
    uint32_t h;
    int i;
    if (T == T_IQ1_S) {   /* d, qs[32], qh[8] uint16: 3-bit tops at 3 (k % 4), s at 12, delta sign at 15 */
        const uint32_t w = b[34 + 2 * (k >> 2)] | b[35 + 2 * (k >> 2)] << 8;
        i = b[2 + k] | ((w >> (3 * (k & 3))) & 7) << 8, h = w >> 15;
    } else {              /* qs[32], qh[16] (a nibble per point: 3-bit top, delta sign), scales[8] */
        const uint32_t n = b[32 + (k >> 1)] >> (4 * (k & 1));
        i = b[k] | (n & 7) << 8, h = (n >> 3) & 1;
    }
    const uint64_t g = grid_entry<T>(i);
    const uint32_t off = h ? 0x09090909u : 0x07070707u;
    return vsub4((uint32_t)g << 3, off) | (uint64_t)vsub4((uint32_t)(g >> 32) << 3, off) << 32;
}

/* the signed values of point k of the block at b (value j in byte j): its grid index and
 * sign bits as each layout stores them (quants.h) */
template <int T> PQ_HD uint64_t grid_values(const uint8_t *b, int k) {
    if (T == T_IQ1_S || T == T_IQ1_M) return iq1_values<T>(b, k);
    int i;
    uint32_t sg;
    if (T == T_IQ3_S) {          /* d, qs[64], qh[8] (bit 8 of each index), signs[32], scales[4] */
        i = b[2 + k] | ((b[66 + (k >> 3)] >> (k & 7)) & 1) << 8, sg = (b[74 + (k >> 1)] >> (4 * (k & 1))) & 15u;
    } else if (T == T_IQ3_XXS) { /* d, qs[64], a word per sub-block: 7-bit signs of 8 values, s */
        i = b[2 + k], sg = (signs8(ld32<2>(b + 66 + 4 * (k >> 3)) >> (7 * ((k & 7) >> 1))) >> (4 * (k & 1))) & 15u;
    } else if (T == T_IQ2_XXS) { /* 8 bytes per sub-block: 4 indices, then such a word */
        i = b[2 + 8 * (k >> 2) + (k & 3)], sg = signs8(ld32<2>(b + 6 + 8 * (k >> 2)) >> (7 * (k & 3)));
    } else if (T == T_IQ2_XS) {  /* uint16: 9-bit index | 7 signs << 9 */
        const uint32_t v = b[2 + 2 * k] | b[3 + 2 * k] << 8;
        i = (int)(v & 511u), sg = signs8(v >> 9);
    } else {                     /* qs[32], signs[32], qh[8] (2 bits a point), scales[8] */
        i = b[2 + k] | ((b[66 + (k >> 2)] >> (2 * (k & 3))) & 3) << 8, sg = b[34 + k];
    }
    const uint64_t g = grid_entry<T>(i);
    return signed4((uint32_t)g, sg & 15u) | (uint64_t)signed4((uint32_t)(g >> 32), sg >> 4) << 32;
}

/* the odd scale 2 s + 1 of 16-group j (0..15) */
template <int T> PQ_HD int grid_odd(const uint8_t *b, int j) {
    int s;
    if (T == T_IQ3_S) s = b[106 + (j >> 2)] >> (4 * ((j >> 1) & 1));
    else if (T == T_IQ3_XXS) s = (int)(ld32<2>(b + 66 + 4 * (j >> 1)) >> 28);
    else if (T == T_IQ2_XXS) s = (int)(ld32<2>(b + 6 + 8 * (j >> 1)) >> 28);
    else if (T == T_IQ1_S) s = (b[35 + 2 * (j >> 1)] >> 4) & 7;
    else if (T == T_IQ1_M) s = ((b[48 + 2 * (j >> 2)] | b[49 + 2 * (j >> 2)] << 8) >> (3 * (j & 3))) & 7;
    else s = b[(T == T_IQ2_XS ? 66 : 74) + (j >> 1)] >> (4 * (j & 1));
    return 2 * (s & 15) + 1;
}

/* the fp16 d (IQ1_M: the top nibbles of its 4 scale words, word 0 lowest) */
template <int T> PQ_HD float grid_d(const uint8_t *b) {
    if (T != T_IQ1_M) return ld_f16a(b);
    const uint32_t w0 = ld32<4>(b + 48), w1 = ld32<4>(b + 52);
    const uint32_t bits = (w0 >> 12 & 0x000f) | (w0 >> 24 & 0x00f0) | (w1 >> 4 & 0x0f00) | (w1 >> 16 & 0xf000);
    return __half2float(__ushort_as_half((unsigned short)bits));
}

/* group g: points P (g & 15) .. + P - 1 of super-block g / 16, P = 16 / width */
template <int T> PQ_HD void unpack16_grid(const uint8_t *row, int g, int q[4], float &a, float &b) {
    constexpr int W = grid_fmt<T>::width, P = 16 / W;
    const uint8_t *blk = row + (size_t)(g >> 4) * fmt<T>::bytes;
    for (int p = 0; p < P; p++) {
        const uint64_t v = grid_values<T>(blk, P * (g & 15) + p);
        for (int w = 0; w < W / 4; w++) q[p * (W / 4) + w] = (int)(uint32_t)(v >> 32 * w);
    }
    a = grid_fmt<T>::dmul * grid_d<T>(blk) * (float)grid_odd<T>(blk, g & 15);
    b = 0.0f;
}
template <> PQ_HD void unpack16<T_IQ3_S>(const uint8_t *row, int g, int q[4], float &a, float &b) { unpack16_grid<T_IQ3_S>(row, g, q, a, b); }
template <> PQ_HD void unpack16<T_IQ3_XXS>(const uint8_t *row, int g, int q[4], float &a, float &b) { unpack16_grid<T_IQ3_XXS>(row, g, q, a, b); }
template <> PQ_HD void unpack16<T_IQ2_XXS>(const uint8_t *row, int g, int q[4], float &a, float &b) { unpack16_grid<T_IQ2_XXS>(row, g, q, a, b); }
template <> PQ_HD void unpack16<T_IQ2_XS>(const uint8_t *row, int g, int q[4], float &a, float &b) { unpack16_grid<T_IQ2_XS>(row, g, q, a, b); }
template <> PQ_HD void unpack16<T_IQ2_S>(const uint8_t *row, int g, int q[4], float &a, float &b) { unpack16_grid<T_IQ2_S>(row, g, q, a, b); }
template <> PQ_HD void unpack16<T_IQ1_S>(const uint8_t *row, int g, int q[4], float &a, float &b) { unpack16_grid<T_IQ1_S>(row, g, q, a, b); }
template <> PQ_HD void unpack16<T_IQ1_M>(const uint8_t *row, int g, int q[4], float &a, float &b) { unpack16_grid<T_IQ1_M>(row, g, q, a, b); }

/* element k: ((dmul d) odd) * value, as the C reference */
template <int T> PQ_HD float dequant_grid(const uint8_t *row, int64_t k) {
    constexpr int W = grid_fmt<T>::width;
    const uint8_t *b = row + (k >> 8) * fmt<T>::bytes;
    const int e = (int)(k & 255);
    const int v = (int8_t)(grid_values<T>(b, e / W) >> (8 * (e % W)));
    return mul_rn(mul_rn(mul_rn(grid_fmt<T>::dmul, grid_d<T>(b)), (float)grid_odd<T>(b, e >> 4)), (float)v);
}

/* MXFP4: an E8M0 byte, then IQ4_NL's nibbles; w = 2^(e - 128) kvalues[nibble] */
template <> PQ_HD void unpack16<T_MXFP4>(const uint8_t *row, int g, int q[4], float &a, float &b) {
    const uint8_t *blk = row + (size_t)(g >> 1) * 17;
    kvalues16<T_MXFP4, 1>(blk + 1, (g & 1) * 4, q);
    a = e8m0_half(blk[0]);
    b = 0.0f;
}

/* Q2_K: 16 sub-blocks of 16; in half h, element 32 s + l is (qs[32 h + l] >> 2 s) & 3;
 * w = d (sc & 15) q - dmin (sc >> 4) */
template <> PQ_HD void unpack16<T_Q2_K>(const uint8_t *row, int g, int q[4], float &a, float &b) {
    const uint8_t *blk = row + (size_t)(g >> 4) * 84;
    const int sb = g & 15, h = sb >> 3, s = (sb >> 1) & 3, l0 = 16 * (sb & 1);
#pragma unroll
    for (int i = 0; i < 4; i++) q[i] = (int)((ld32<4>(blk + 16 + 32 * h + l0 + 4 * i) >> (2 * s)) & 0x03030303u);
    const int sc = blk[sb];
    a = ld_f16a(blk + 80) * (float)(sc & 15);
    b = -(ld_f16a(blk + 82) * (float)(sc >> 4));
}

/* Q3_K: as Q2_K's 2 bits, minus 4 where the hmask bit is clear; w = d sc q */
template <> PQ_HD void unpack16<T_Q3_K>(const uint8_t *row, int g, int q[4], float &a, float &b) {
    const uint8_t *blk = row + (size_t)(g >> 4) * 110;
    const int sb = g & 15, h = sb >> 3, s = (sb >> 1) & 3, l0 = 16 * (sb & 1);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t lo = (ld32<2>(blk + 32 + 32 * h + l0 + 4 * i) >> (2 * s)) & 0x03030303u;
        const uint32_t hm = (ld32<2>(blk + l0 + 4 * i) >> (sb >> 1)) & 0x01010101u;
        q[i] = (int)vsub4(lo | (hm << 2), 0x04040404u);   /* bytewise: 0..7 - 4 = -4..3 */
    }
    a = ld_f16a(blk + 108) * (float)scale_q3k(sb, blk + 96);
    b = 0.0f;
}

/* Q4_K: 4 chunks of 64; in chunk c, element 32 s + l is (qs[32 c + l] >> 4 s) & 15;
 * w = d sc q - dmin m, with the 6-bit sc, m of the 32-element sub-block */
template <> PQ_HD void unpack16<T_Q4_K>(const uint8_t *row, int g, int q[4], float &a, float &b) {
    const uint8_t *blk = row + (size_t)(g >> 4) * 144;
    const int sb = g & 15, c = sb >> 2, s = (sb >> 1) & 1, l0 = 16 * (sb & 1);
#pragma unroll
    for (int i = 0; i < 4; i++) q[i] = (int)((ld32<4>(blk + 16 + 32 * c + l0 + 4 * i) >> (4 * s)) & 0x0F0F0F0Fu);
    int sc, m;
    scale_min_k4(sb >> 1, blk + 4, sc, m);
    a = ld_f16a(blk) * (float)sc;
    b = -(ld_f16a(blk + 2) * (float)m);
}

/* Q5_K: Q4_K's nibble plus bit (qh[l] >> (k >> 5)) & 1 as bit 4 */
template <> PQ_HD void unpack16<T_Q5_K>(const uint8_t *row, int g, int q[4], float &a, float &b) {
    const uint8_t *blk = row + (size_t)(g >> 4) * 176;
    const int sb = g & 15, c = sb >> 2, s = (sb >> 1) & 1, l0 = 16 * (sb & 1);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t lo = (ld32<4>(blk + 48 + 32 * c + l0 + 4 * i) >> (4 * s)) & 0x0F0F0F0Fu;
        const uint32_t hb = (ld32<4>(blk + 16 + l0 + 4 * i) >> (sb >> 1)) & 0x01010101u;
        q[i] = (int)(lo | (hb << 4));
    }
    int sc, m;
    scale_min_k4(sb >> 1, blk + 4, sc, m);
    a = ld_f16a(blk) * (float)sc;
    b = -(ld_f16a(blk + 2) * (float)m);
}

/* Q6_K: 2 halves of 128; in half h, element 32 s + l takes its low nibble from
 * ql[64 h + l + 32 (s & 1)] (>> 4 when s >= 2) and 2 high bits from
 * (qh[32 h + l] >> 2 s) & 3; value - 32; w = d sc q */
template <> PQ_HD void unpack16<T_Q6_K>(const uint8_t *row, int g, int q[4], float &a, float &b) {
    const uint8_t *blk = row + (size_t)(g >> 4) * 210;
    const int sb = g & 15, h = sb >> 3, s = (sb >> 1) & 3, l0 = 16 * (sb & 1);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t lo = (ld32<2>(blk + 64 * h + l0 + 32 * (s & 1) + 4 * i) >> (4 * (s >> 1))) & 0x0F0F0F0Fu;
        const uint32_t hi = (ld32<2>(blk + 128 + 32 * h + l0 + 4 * i) >> (2 * s)) & 0x03030303u;
        q[i] = (int)vsub4(lo | (hi << 4), 0x20202020u);   /* bytewise: 0..63 - 32 */
    }
    a = ld_f16a(blk + 208) * (float)(int8_t)blk[192 + sb];
    b = 0.0f;
}

/* ---- float weights ---- */

template <int T> PQ_HD float load_wf(const uint8_t *row, int64_t k);
template <> PQ_HD float load_wf<T_F32>(const uint8_t *row, int64_t k) {
    return reinterpret_cast<const float *>(row)[k];
}
template <> PQ_HD float load_wf<T_F16>(const uint8_t *row, int64_t k) {
    return __half2float(reinterpret_cast<const __half *>(row)[k]);
}
template <> PQ_HD float load_wf<T_BF16>(const uint8_t *row, int64_t k) {
    return bits_float((uint32_t)reinterpret_cast<const uint16_t *>(row)[k] << 16);
}

/* ---- one element, as the C reference computes it ---- */

PQ_HD int nib(const uint8_t *qs, int j) {   /* 32-element blocks: j < 16 low, else high */
    return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
}

PQ_HD float dequant(int type, const uint8_t *row, int64_t k) {
    switch (type) {
    case T_F32: return load_wf<T_F32>(row, k);
    case T_F16: return load_wf<T_F16>(row, k);
    case T_BF16: return load_wf<T_BF16>(row, k);
    case T_Q4_0: {
        const uint8_t *b = row + (k >> 5) * 18;
        return mul_rn(ld_f16(b), (float)(nib(b + 2, (int)(k & 31)) - 8));
    }
    case T_Q4_1: {
        const uint8_t *b = row + (k >> 5) * 20;
        return add_rn(mul_rn(ld_f16(b), (float)nib(b + 4, (int)(k & 31))), ld_f16(b + 2));
    }
    case T_Q5_0:
    case T_Q5_1: {
        const bool one = type == T_Q5_1;
        const uint8_t *b = row + (k >> 5) * (one ? 24 : 22);
        const int j = (int)(k & 31);
        const uint32_t qh = ld_u32(b + (one ? 4 : 2));
        const int q = nib(b + (one ? 8 : 6), j) | (int)(((qh >> j) & 1u) << 4);
        return one ? add_rn(mul_rn(ld_f16(b), (float)q), ld_f16(b + 2)) : mul_rn(ld_f16(b), (float)(q - 16));
    }
    case T_Q8_0: {
        const uint8_t *b = row + (k >> 5) * 34;
        return mul_rn((float)(int8_t)b[2 + (k & 31)], ld_f16(b));
    }
    case T_IQ4_NL: {
        const uint8_t *b = row + (k >> 5) * 18;
        return mul_rn(ld_f16(b), (float)kvalue<T_IQ4_NL>(nib(b + 2, (int)(k & 31))));
    }
    case T_IQ4_XS: {
        const uint8_t *b = row + (k >> 8) * 136;
        const int e = (int)(k & 255), ib = e >> 5;
        return mul_rn(mul_rn(ld_f16(b), (float)scale_iq4xs(b, ib)), (float)kvalue<T_IQ4_NL>(nib(b + 8 + 16 * ib, e & 31)));
    }
    case T_IQ3_S: return dequant_grid<T_IQ3_S>(row, k);
    case T_IQ3_XXS: return dequant_grid<T_IQ3_XXS>(row, k);
    case T_IQ2_XXS: return dequant_grid<T_IQ2_XXS>(row, k);
    case T_IQ2_XS: return dequant_grid<T_IQ2_XS>(row, k);
    case T_IQ2_S: return dequant_grid<T_IQ2_S>(row, k);
    case T_IQ1_S: return dequant_grid<T_IQ1_S>(row, k);
    case T_IQ1_M: return dequant_grid<T_IQ1_M>(row, k);
    case T_MXFP4: {
        const uint8_t *b = row + (k >> 5) * 17;
        return mul_rn(e8m0_half(b[0]), (float)kvalue<T_MXFP4>(nib(b + 1, (int)(k & 31))));
    }
    case T_Q2_K: {
        const uint8_t *b = row + (k >> 8) * 84;
        const int e = (int)(k & 255), sb = e >> 4, h = e >> 7, s = (e >> 5) & 3, l = e & 31;
        const int sc = b[sb];
        const float dl = mul_rn(ld_f16(b + 80), (float)(sc & 15)), ml = mul_rn(ld_f16(b + 82), (float)(sc >> 4));
        return sub_rn(mul_rn(dl, (float)((b[16 + 32 * h + l] >> (2 * s)) & 3)), ml);
    }
    case T_Q3_K: {
        const uint8_t *b = row + (k >> 8) * 110;
        const int e = (int)(k & 255), sb = e >> 4, h = e >> 7, s = (e >> 5) & 3, l = e & 31;
        const int hbit = (b[l] >> (e >> 5)) & 1;
        const int q = ((b[32 + 32 * h + l] >> (2 * s)) & 3) - (hbit ? 0 : 4);
        return mul_rn(mul_rn(ld_f16(b + 108), (float)scale_q3k(sb, b + 96)), (float)q);
    }
    case T_Q4_K:
    case T_Q5_K: {
        const bool five = type == T_Q5_K;
        const uint8_t *b = row + (k >> 8) * (five ? 176 : 144);
        const int e = (int)(k & 255), c = e >> 6, s = (e >> 5) & 1, l = e & 31;
        int sc, m;
        scale_min_k4(e >> 5, b + 4, sc, m);
        int q = (b[(five ? 48 : 16) + 32 * c + l] >> (4 * s)) & 15;
        if (five) q |= ((b[16 + l] >> (e >> 5)) & 1) << 4;
        const float d1 = mul_rn(ld_f16(b), (float)sc), m1 = mul_rn(ld_f16(b + 2), (float)m);
        return sub_rn(mul_rn(d1, (float)q), m1);
    }
    case T_Q6_K: {
        const uint8_t *b = row + (k >> 8) * 210;
        const int e = (int)(k & 255), sb = e >> 4, h = e >> 7, s = (e >> 5) & 3, l = e & 31;
        const int lo = (b[64 * h + l + 32 * (s & 1)] >> (4 * (s >> 1))) & 15;
        const int hi = (b[128 + 32 * h + l] >> (2 * s)) & 3;
        const float dl = mul_rn(ld_f16(b + 208), (float)(int8_t)b[192 + sb]);
        return mul_rn(dl, (float)((lo | hi << 4) - 32));
    }
    default: return 0.0f;
    }
}

}  // namespace pq

#endif
