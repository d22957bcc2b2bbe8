/* kernel_api.c: the kernel entry points of pyllm.h, for tests and tools.
 *
 * Every function validates its arguments and returns -1 (never crashes) for
 * an unknown type or activation format, a length that is not a positive
 * multiple of the block size, a level this CPU does not have, or a kernel the
 * level's table lacks. They run the table of the level asked for (with its
 * fallbacks from lower levels), not K, so tests can compare levels directly.
 */
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>

#include "pyllm.h"
#include "quants.h"

/* dispatch.c */
int dispatch_available(int isa);
int dispatch_set_level(int isa);
int dispatch_cpu_level(void);
const char *dispatch_level_name(int isa);
int dispatch_own(int isa, kernel_table *out);

/* block size of `type` when n is a valid row length for it, else 0 */
static int check_row(int type, int64_t n) {
    const type_traits *t = type_info(type);
    if (!t || n <= 0 || n % t->block_size) return 0;
    return t->block_size;
}

int pyllm_cpu_level(void) { return dispatch_cpu_level(); }

int pyllm_level_available(int isa) { return dispatch_available(isa); }

int pyllm_set_level(int isa) {
    dispatch_init(ISA_COUNT);
    return dispatch_set_level(isa);
}

int pyllm_get_level(void) { return dispatch_level(); }

const char *pyllm_level_name(int isa) { return dispatch_level_name(isa); }

int pyllm_type_supported(int type) { return type_info(type) != NULL; }

int pyllm_type_act(int type) {
    const type_traits *t = type_info(type);
    return t ? t->act : -1;
}

size_t pyllm_act_row_bytes(int act, int64_t n) { return act_row_bytes(act, n); }

int pyllm_kernel_provided(int isa, int kind, int type) {
    kernel_table own;
    if (dispatch_own(isa, &own) != 0) return 0;
    switch (kind) {
    case 0: return type_info(type) && own.dequant[type] != NULL;
    case 1: return type_info(type) && own.vec_dot[type] != NULL;
    case 2: return type_info(type) && own.gemv[type] != NULL;
    case 3: return type >= 0 && type <= ACT_Q8_K && own.quantize_act[type] != NULL;
    case 4: return type_info(type) && own.gemm[type] != NULL;
    case 6: return type_info(type) && own.gemv4[type] != NULL;
    case 7: return type_info(type) && own.rows4_codec[type] != NULL;
    case 5: /* vector math, type = pyllm_kernel_vmath's which */
        switch (type) {
        case 0: return own.glu_silu != NULL;
        case 1: return own.glu_gelu_tanh != NULL;
        case 2: return own.exp_sum != NULL;
        case 3: return own.axpy_f32 != NULL;
        case 4: return own.wsum_f32 != NULL;
        case 5: return own.wsum_many_f32 != NULL;
        case 6: return own.wsum_many_f16 != NULL;
        case 9: return own.wsum_many_q8_0 != NULL;
        case 10: return own.glu_sigmoid != NULL;
        case 7: return own.softcap != NULL;
        case 8: return own.ssm_scan_row != NULL;
        default: return 0;
        }
    default: return 0;
    }
}

int pyllm_kernel_dequant(int isa, int type, const void *w, float *out, int64_t n) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || !check_row(type, n) || !w || !out || !t->dequant[type]) return -1;
    t->dequant[type](w, out, n);
    return 0;
}

int pyllm_kernel_quantize_act(int isa, int act, const float *x, void *out, int64_t n) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || act < ACT_F32 || act > ACT_Q8_K || n <= 0 || !x || !out) return -1;
    const int64_t bs = act == ACT_Q8_32 ? QK : act == ACT_Q8_K ? QK_K : 1;
    if (n % bs || !t->quantize_act[act]) return -1;
    t->quantize_act[act](x, out, n);
    return 0;
}

int pyllm_kernel_vec_dot(int isa, int type, int64_t n, const void *w, const void *a, float *out) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || !check_row(type, n) || !w || !a || !out || !t->vec_dot[type]) return -1;
    *out = t->vec_dot[type](n, w, a);
    return 0;
}

/* uses the level's gemv when it has one, else loops over its vec_dot (as the
 * matmul does) */
int pyllm_kernel_gemv(int isa, int type, int64_t n, const void *w, size_t row_bytes, int nrows,
                      const void *a, float *out) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || !check_row(type, n) || !w || !a || !out || nrows < 0) return -1;
    if (nrows > 0 && row_bytes < weight_row_bytes(type, n)) return -1;
    if (t->gemv[type]) {
        t->gemv[type](n, w, row_bytes, nrows, a, out);
        return 0;
    }
    if (!t->vec_dot[type]) return -1;
    for (int r = 0; r < nrows; r++) out[r] = t->vec_dot[type](n, (const char *)w + (size_t)r * row_bytes, a);
    return 0;
}

/* out[t*out_stride + r] for r < nrows, t < ncols; the level's gemm when it
 * has one, else its gemv for each activation row. */
int pyllm_kernel_gemm(int isa, int type, int64_t n, const void *w, size_t row_bytes, int nrows, const void *a,
                      size_t a_stride, int ncols, float *out, size_t out_stride) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || !check_row(type, n) || !w || !a || !out || nrows < 0 || ncols < 0) return -1;
    if (nrows > 0 && row_bytes < weight_row_bytes(type, n)) return -1;
    if (ncols > 1 && (a_stride < act_row_bytes(type_info(type)->act, n) || out_stride < (size_t)nrows)) return -1;
    if (t->gemm[type]) {
        t->gemm[type](n, w, row_bytes, nrows, a, a_stride, ncols, out, out_stride);
        return 0;
    }
    for (int c = 0; c < ncols; c++)
        if (pyllm_kernel_gemv(isa, type, n, w, row_bytes, nrows, (const char *)a + (size_t)c * a_stride,
                              out + (size_t)c * out_stride) != 0)
            return -1;
    return 0;
}

int pyllm_kernel_repack_rows4(int isa, int type, const void *w, void *dst, int64_t n_rows, int64_t n) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || !check_row(type, n) || n_rows < 0 || !w || !dst) return -1;
    rows4_move(type, n, w, dst, n_rows, 1, t->rows4_codec[type]);
    return 0;
}

int pyllm_kernel_gemv4(int isa, int kind, int type, int64_t n, const void *w, int nrows, const void *a, float *out) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || !check_row(type, n) || !w || !a || !out || nrows < 0 || (kind != 0 && kind != 1)) return -1;
    const size_t rb = weight_row_bytes(type, n);
    if (t->gemv4[type]) {
        t->gemv4[type](n, w, rb, nrows, a, out);
        return 0;
    }
    if (kind == 1) return -1;
    uint8_t *plain = malloc(4 * rb);
    if (!plain) return -1;
    for (int r = 0; r < nrows; r += 4) {   /* as the matmul does: each group copied out, then gemv */
        const int rows = nrows - r < 4 ? nrows - r : 4;
        rows4_move(type, n, (const uint8_t *)w + (size_t)r * rb, plain, rows, 0, t->rows4_codec[type]);
        if (pyllm_kernel_gemv(isa, type, n, plain, rb, rows, a, out + r) != 0) {
            free(plain);
            return -1;
        }
    }
    free(plain);
    return 0;
}

int pyllm_kernel_f16_rows(int isa, const void *x, int64_t x_stride, int rows, float *out, int64_t n) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || !x || !out || n < 0 || rows < 0 || x_stride < n) return -1;
    t->f16_to_f32(x, x_stride, rows, out, n);
    return 0;
}

int pyllm_kernel_float(int isa, int which, int64_t n, const void *a, const void *b, float s, void *out) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || n < 0 || !a || !out) return -1;
    switch (which) {
    case 0: t->f32_to_f16(a, out, n); return 0;
    case 1: t->f16_to_f32(a, n, 1, out, n); return 0;
    case 2:
        if (!b) return -1;
        *(float *)out = t->dot_f16_f32(n, a, b);
        return 0;
    case 3: t->axpy_f16(n, s, a, out); return 0;
    case 4:
        if (!b) return -1;
        *(float *)out = t->dot_f32(n, a, b);
        return 0;
    default: return -1;
    }
}

int pyllm_kernel_vmath(int isa, int which, int64_t n, const float *a, const float *b, float s, float *out,
                       float *sum) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || n < 0 || !a || !out) return -1;
    switch (which) {
    case 0:
    case 1:
        if (!b) return -1;
        (which ? t->glu_gelu_tanh : t->glu_silu)(n, a, b, out);
        return 0;
    case 10:
        if (!b) return -1;
        t->glu_sigmoid(n, a, b, out);
        return 0;
    case 2:
        if (!sum) return -1;
        if (a != out)
            for (int64_t i = 0; i < n; i++) out[i] = a[i];
        *sum = t->exp_sum(n, out, s);
        return 0;
    case 3: t->axpy_f32(n, s, a, out); return 0;
    case 4: /* wsum_f32: rows = (int)s rows of n at a (stride n), weights b */
        if (!b || s < 0) return -1;
        t->wsum_f32(n, (int)s, b, a, n, out);
        return 0;
    case 7: /* softcap: out = a soft-capped, scale s, cap b[0] */
        if (!b || !(b[0] > 0)) return -1;
        if (a != out)
            for (int64_t i = 0; i < n; i++) out[i] = a[i];
        t->softcap(n, out, s, b[0]);
        return 0;
    default: return -1;
    }
}

/* the sizes and pointers both wsum entry points take are consistent */
static int wsum_args_ok(int64_t n, int rows, int nq, const float *w, int64_t ws, const void *x, int64_t ld,
                        const float *y, int64_t ys) {
    return n >= 0 && rows >= 0 && nq >= 0 && w && x && y && ws >= rows && ld >= n && ys >= n;
}

/* y[q*ys + j] += sum_{i < rows} w[q*ws + i] * x[i*ld + j] for q < nq, j < n:
 * the level's wsum_many_f32 when it has one, else its wsum_f32 per output
 * (as attention does) */
int pyllm_kernel_wsum(int isa, int64_t n, int rows, int nq, const float *w, int64_t ws, const float *x, int64_t ld,
                      float *y, int64_t ys) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || !wsum_args_ok(n, rows, nq, w, ws, x, ld, y, ys)) return -1;
    if (t->wsum_many_f32) {
        t->wsum_many_f32(n, rows, nq, w, ws, x, ld, y, ys);
        return 0;
    }
    for (int q = 0; q < nq; q++) t->wsum_f32(n, rows, w + q * ws, x, ld, y + q * ys);
    return 0;
}

/* pyllm_kernel_wsum over rows of halves x: the level's wsum_many_f16 when it
 * has one, else the rows converted and its f32 form (as attention does) */
int pyllm_kernel_wsum_f16(int isa, int64_t n, int rows, int nq, const float *w, int64_t ws, const void *x, int64_t ld,
                          float *y, int64_t ys) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || !wsum_args_ok(n, rows, nq, w, ws, x, ld, y, ys)) return -1;
    if (t->wsum_many_f16) {
        t->wsum_many_f16(n, rows, nq, w, ws, x, ld, y, ys);
        return 0;
    }
    float *xf = malloc((size_t)(rows > 0 ? rows : 1) * (size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!xf) return -1;
    t->f16_to_f32(x, ld, rows, xf, n);
    const int rc = pyllm_kernel_wsum(isa, n, rows, nq, w, ws, xf, n, y, ys);
    free(xf);
    return rc;
}

/* pyllm_kernel_wsum over rows of Q8_0 blocks x, ld bytes apart (n a multiple of 32): the
 * level's wsum_many_q8_0 when it has one, else the rows dequantized and its f32 form (as
 * attention does) */
int pyllm_kernel_wsum_q8_0(int isa, int64_t n, int rows, int nq, const float *w, int64_t ws, const void *x,
                           int64_t ld, float *y, int64_t ys) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || n % QK || !wsum_args_ok(n, rows, nq, w, ws, x, ld, y, ys) || ld < n / QK * (int64_t)sizeof(block_q8_0))
        return -1;
    if (t->wsum_many_q8_0) {
        t->wsum_many_q8_0(n, rows, nq, w, ws, x, ld, y, ys);
        return 0;
    }
    float *xf = malloc((size_t)(rows > 0 ? rows : 1) * (size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!xf) return -1;
    for (int i = 0; i < rows; i++) t->dequant[T_Q8_0]((const uint8_t *)x + (size_t)i * ld, xf + (size_t)i * n, n);
    const int rc = pyllm_kernel_wsum(isa, n, rows, nq, w, ws, xf, n, y, ys);
    free(xf);
    return rc;
}

int pyllm_kernel_ssm_scan_row(int isa, int64_t n, float *s, int n_tok, const float *bc, int64_t bc_stride,
                              int64_t c_off, const float *x, int64_t x_stride, const float *dt, const float *decay,
                              float *y, int64_t y_stride) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || n < 1 || n_tok < 1 || !s || !bc || !x || !dt || !decay || !y || c_off < n || bc_stride < c_off + n)
        return -1;
    t->ssm_scan_row(n, s, n_tok, bc, bc_stride, c_off, x, x_stride, dt, decay, y, y_stride);
    return 0;
}
