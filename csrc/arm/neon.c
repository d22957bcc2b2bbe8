/* neon.c: AArch64 Advanced SIMD kernels (compiled only on aarch64).
 *
 * Provides Q4_0, Q4_1, Q8_0 (dequant, vec_dot, gemv), quantize_act for Q8_32
 * and Q8_K, the float helpers and the vector math of GLU and attention;
 * everything else comes from quants.c.
 * The integer dot products use SDOT when the compiler targets it
 * (__ARM_FEATURE_DOTPROD, e.g. -march=armv8.2-a+dotprod), else widening
 * multiplies (smull + sadalp), which every AArch64 CPU has.
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

/* sum of 16 u8 (0..255 as s8-safe values < 128) x s8 products into 4 int32 lanes */
INLINE int32x4_t dot16(int32x4_t acc, int8x16_t w, int8x16_t a) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, w, a);
#else
    const int16x8_t p0 = vmull_s8(vget_low_s8(w), vget_low_s8(a));
    const int16x8_t p1 = vmull_high_s8(w, a);
    return vpadalq_s16(vpadalq_s16(acc, p0), p1);
#endif
}

INLINE float16x4_t ld_f16x4(const f16_t *p) { return vreinterpret_f16_u16(vld1_u16(p)); }

/* ------------------------------------------------------------------ */
/* vec_dot / gemv: Q4_0, Q4_1, Q8_0 x Q8_32                             */
/* ------------------------------------------------------------------ */
/* step(x, y, acc, accs): acc += the block's int dot (4 lanes) scaled by
 * d*da; accs += the bias/min term (Q4_0: d*s, later times -8; Q4_1: m*s) */

INLINE void step_q4_0(const block_q4_0 *x, const block_q8_32 *y, float32x4_t *acc, float *accs) {
    const uint8x16_t v = vld1q_u8(x->qs);
    const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
    const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
    int32x4_t s = dot16(vdupq_n_s32(0), lo, vld1q_s8(y->qs));
    s = dot16(s, hi, vld1q_s8(y->qs + 16));
    const float d = fp16_to_fp32(x->d);
    *acc = vfmaq_n_f32(*acc, vcvtq_f32_s32(s), d * y->d);
    *accs += d * y->s;
}

INLINE void step_q4_1(const block_q4_1 *x, const block_q8_32 *y, float32x4_t *acc, float *accs) {
    const uint8x16_t v = vld1q_u8(x->qs);
    const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
    const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
    int32x4_t s = dot16(vdupq_n_s32(0), lo, vld1q_s8(y->qs));
    s = dot16(s, hi, vld1q_s8(y->qs + 16));
    *acc = vfmaq_n_f32(*acc, vcvtq_f32_s32(s), fp16_to_fp32(x->d) * y->d);
    *accs += fp16_to_fp32(x->m) * y->s;
}

INLINE void step_q8_0(const block_q8_0 *x, const block_q8_32 *y, float32x4_t *acc, float *accs) {
    (void)accs;
    int32x4_t s = dot16(vdupq_n_s32(0), vld1q_s8(x->qs), vld1q_s8(y->qs));
    s = dot16(s, vld1q_s8(x->qs + 16), vld1q_s8(y->qs + 16));
    *acc = vfmaq_n_f32(*acc, vcvtq_f32_s32(s), fp16_to_fp32(x->d) * y->d);
}

#define FIN_q4_0(acc, accs) (vaddvq_f32(acc) - 8.0f * (accs))
#define FIN_q4_1(acc, accs) (vaddvq_f32(acc) + (accs))
#define FIN_q8_0(acc, accs) vaddvq_f32(acc)

/* R rows (compile-time) against one activation row: one accumulator per row,
 * blocks in order. vec_dot is the one-row case, so vec_dot and gemv agree
 * bit for bit whichever rows share a call (the contract of quants.h). */
#define DEFINE_Q32(name, block_t)                                                                     \
    INLINE void rows_##name(const int R, int64_t nb, const char *p, size_t rb, const block_q8_32 *y,  \
                            float *out) {                                                              \
        float32x4_t acc[4];                                                                            \
        float s[4];                                                                                    \
        for (int k = 0; k < R; k++) acc[k] = vdupq_n_f32(0.0f), s[k] = 0.0f;                          \
        for (int64_t i = 0; i < nb; i++)                                                               \
            for (int k = 0; k < R; k++)                                                                \
                step_##name((const block_t *)(const void *)(p + k * rb) + i, &y[i], &acc[k], &s[k]);   \
        for (int k = 0; k < R; k++) out[k] = FIN_##name(acc[k], s[k]);                                 \
    }                                                                                                  \
    static float vec_dot_##name(int64_t n, const void *restrict w, const void *restrict a) {          \
        float r;                                                                                       \
        rows_##name(1, n / QK, w, 0, a, &r);                                                           \
        return r;                                                                                      \
    }                                                                                                  \
    static void gemv_##name(int64_t n, const void *restrict w, size_t rb, int nrows,                  \
                            const void *restrict a, float *restrict out) {                             \
        const char *p = w;                                                                             \
        int r = 0;                                                                                     \
        for (; r + 4 <= nrows; r += 4, p += 4 * rb) rows_##name(4, n / QK, p, rb, a, out + r);         \
        for (; r < nrows; r++, p += rb) rows_##name(1, n / QK, p, rb, a, out + r);                     \
    }

DEFINE_Q32(q4_0, block_q4_0)
DEFINE_Q32(q4_1, block_q4_1)
DEFINE_Q32(q8_0, block_q8_0)

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

static void f16_to_f32_row(const f16_t *restrict x, float *restrict out, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(out + i, vcvt_f32_f16(ld_f16x4(x + i)));
    for (; i < n; i++) out[i] = fp16_to_fp32(x[i]);
}

static float dot_f16_f32(int64_t n, const f16_t *restrict a, const float *restrict b) {
    float32x4_t c0 = vdupq_n_f32(0.0f), c1 = c0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        c0 = vfmaq_f32(c0, vcvt_f32_f16(ld_f16x4(a + i)), vld1q_f32(b + i));
        c1 = vfmaq_f32(c1, vcvt_f32_f16(ld_f16x4(a + i + 4)), vld1q_f32(b + i + 4));
    }
    float sum = vaddvq_f32(vaddq_f32(c0, c1));
    for (; i < n; i++) sum += fp16_to_fp32(a[i]) * b[i];
    return sum;
}

static void axpy_f16(int64_t n, float s, const f16_t *restrict a, float *restrict out) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(out + i, vfmaq_n_f32(vld1q_f32(out + i), vcvt_f32_f16(ld_f16x4(a + i)), s));
    for (; i < n; i++) out[i] += s * fp16_to_fp32(a[i]);
}

static float dot_f32(int64_t n, const float *restrict a, const float *restrict b) {
    float32x4_t c0 = vdupq_n_f32(0.0f), c1 = c0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        c0 = vfmaq_f32(c0, vld1q_f32(a + i), vld1q_f32(b + i));
        c1 = vfmaq_f32(c1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    }
    float sum = vaddvq_f32(vaddq_f32(c0, c1));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static float vec_dot_f16(int64_t n, const void *restrict w, const void *restrict a) { return dot_f16_f32(n, w, a); }
static float vec_dot_f32(int64_t n, const void *restrict w, const void *restrict a) { return dot_f32(n, w, a); }

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

/* ------------------------------------------------------------------ */

void kernels_fill_neon(kernel_table *t) {
    t->dequant[T_Q4_0] = dequant_q4_0;
    t->dequant[T_Q4_1] = dequant_q4_1;
    t->dequant[T_Q8_0] = dequant_q8_0;
    t->vec_dot[T_Q4_0] = vec_dot_q4_0;
    t->vec_dot[T_Q4_1] = vec_dot_q4_1;
    t->vec_dot[T_Q8_0] = vec_dot_q8_0;
    t->gemv[T_Q4_0] = gemv_q4_0;
    t->gemv[T_Q4_1] = gemv_q4_1;
    t->gemv[T_Q8_0] = gemv_q8_0;
    t->vec_dot[T_F16] = vec_dot_f16;
    t->vec_dot[T_F32] = vec_dot_f32;
    t->quantize_act[ACT_Q8_32] = quantize_q8_32;
    t->quantize_act[ACT_Q8_K] = quantize_q8_K;
    t->f32_to_f16 = f32_to_f16_row;
    t->f16_to_f32 = f16_to_f32_row;
    t->dot_f16_f32 = dot_f16_f32;
    t->axpy_f16 = axpy_f16;
    t->dot_f32 = dot_f32;
    t->glu_silu = glu_silu;
    t->glu_gelu_tanh = glu_gelu_tanh;
    t->exp_sum = exp_sum;
    t->axpy_f32 = axpy_f32;
    t->wsum_f32 = wsum_f32;
}

#endif /* __aarch64__ */
