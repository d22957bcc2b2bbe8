/* dense.c: float row operations for the vision encoder (pyllm/vision.py).
 *
 * numpy's BLAS multiplies the encoder's matrices; what lies between them
 * (attention's softmax, the activation, layer norms) is elementwise work that
 * numpy does one pass per operator on one core. These do it in one or two
 * passes with the level's vector kernels, on the rows they are given, so the
 * caller splits rows among threads (cffi releases the GIL around each call).
 *
 * Like kernel_api.c, each takes the level to run (tests compare the levels)
 * and returns -1, never crashing, on a bad argument.
 */
#include <math.h>
#include <stdint.h>
#include <stddef.h>

#include "pyllm.h"
#include "quants.h"

/* the largest of x[0..n), n > 0, in 16 lanes (a comparison, not fmaxf, so it vectorizes) */
static float row_max(const float *x, int64_t n) {
    float lane[16];
    int64_t i = 0;
    for (int j = 0; j < 16; j++) lane[j] = x[0];
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
    float m = lane[0];
    for (int j = 1; j < 16; j++) m = lane[j] > m ? lane[j] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

int pyllm_dense_softmax_rows(int isa, float *x, int rows, int64_t n, int64_t ld, float *sum) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || !x || !sum || rows < 0 || n <= 0 || ld < n) return -1;
    for (int r = 0; r < rows; r++) {
        float *row = x + (int64_t)r * ld;
        sum[r] = t->exp_sum(n, row, row_max(row, n));
    }
    return 0;
}

int pyllm_dense_activation(int isa, int act, float *x, int rows, int64_t n, const float *bias) {
    /* act(g) = act(g) * 1 through the GLU kernels, 256 at a time */
    static const float ones[256] = {[0 ... 255] = 1.0f};
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || !x || rows < 0 || n <= 0 || (act != DENSE_GELU_TANH && act != DENSE_QUICK_GELU && act != DENSE_GELU_ERF))
        return -1;
    float g[256];
    for (int r = 0; r < rows; r++) {
        float *row = x + (int64_t)r * n;
        if (act == DENSE_GELU_ERF) {   /* Whisper's exact GELU, x (1 + erf(x / sqrt 2)) / 2: libm's erff at every level */
            for (int64_t i = 0; i < n; i++) {
                const float v = bias ? row[i] + bias[i] : row[i];
                row[i] = 0.5f * v * (1.0f + erff(v * 0.70710678f));
            }
            continue;
        }
        for (int64_t i = 0; i < n; i += 256) {
            const int64_t m = n - i < 256 ? n - i : 256;
            /* the bias added here, not in a pass of its own over the matrix product's output */
            for (int64_t j = 0; j < m; j++) g[j] = bias ? row[i + j] + bias[i + j] : row[i + j];
            if (act == DENSE_GELU_TANH) {
                t->glu_gelu_tanh(m, g, ones, row + i);
            } else {
                /* x sigmoid(1.702 x) = silu(1.702 x) / 1.702 */
                for (int64_t j = 0; j < m; j++) g[j] *= 1.702f;
                t->glu_silu(m, g, ones, g);
                for (int64_t j = 0; j < m; j++) row[i + j] = g[j] / 1.702f;
            }
        }
    }
    return 0;
}

int pyllm_dense_gated(int isa, int act, float *x, int rows, int64_t n) {
    const kernel_table *t = dispatch_table_ready(isa);
    if (!t || !x || rows < 0 || n <= 0 || (act != DENSE_GELU_TANH && act != DENSE_QUICK_GELU && act != DENSE_SILU))
        return -1;
    float g[256];
    for (int r = 0; r < rows; r++) {
        float *gate = x + (int64_t)r * 2 * n, *up = gate + n;
        for (int64_t i = 0; i < n; i += 256) {
            const int64_t m = n - i < 256 ? n - i : 256;
            if (act == DENSE_GELU_TANH) {
                t->glu_gelu_tanh(m, gate + i, up + i, gate + i);
            } else if (act == DENSE_SILU) {
                t->glu_silu(m, gate + i, up + i, gate + i);
            } else {   /* x sigmoid(1.702 x) u = silu(1.702 x) u / 1.702 */
                for (int64_t j = 0; j < m; j++) g[j] = gate[i + j] * 1.702f;
                t->glu_silu(m, g, up + i, g);
                for (int64_t j = 0; j < m; j++) gate[i + j] = g[j] / 1.702f;
            }
        }
    }
    return 0;
}

int pyllm_dense_layernorm(const float *x, float *y, int rows, int64_t n, const float *w, const float *b, float eps) {
    if (!x || !y || rows < 0 || n <= 0 || !(eps > 0.0f)) return -1;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (int64_t)r * n;
        float *yr = y + (int64_t)r * n;
        double s = 0.0, ss = 0.0;
        for (int64_t i = 0; i < n; i++) s += xr[i];
        const float mean = (float)(s / (double)n);
        for (int64_t i = 0; i < n; i++) {
            const float d = xr[i] - mean;
            ss += (double)d * d;
        }
        const float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        for (int64_t i = 0; i < n; i++) {
            float v = (xr[i] - mean) * inv;
            if (w) v *= w[i];
            yr[i] = b ? v + b[i] : v;
        }
    }
    return 0;
}
