/* ssm.c: the recurrent ops of state-space layers (Mamba 1 and 2).
 *
 * Unlike attention, which rereads every earlier position from the KV cache,
 * these layers carry a fixed-size state from one position to the next: the
 * last few inputs of a causal convolution, and the SSM's hidden state. The
 * state lives in op->state and holds what the positions before this step
 * left there; a step starting at position 0 starts from zeros instead. A
 * step's tokens are consecutive positions of one sequence (program.c checks).
 */
#include <math.h>
#include <string.h>

#include "core.h"

/* y[t, c] = bias[c] + sum_j w[c K + j] z[t + j, c], z = [state rows (K - 1) ; x rows (T)];
 * then state = the last K - 1 rows of z. Threads split the channels. */
void op_ssm_conv(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const pyllm_step *st = r->step;
    const int taps = op->n_head, keep = taps - 1, n_tok = r->rows;
    const int64_t n = op->n_in;
    const float *w = op->w, *bias = op->bias;
    float *state = op->state;
    const int fresh = st->pos[0] == 0;
    int64_t lo, hi;
    split_range(n, ith, nth, 16, &lo, &hi);
    float z[64];   /* one channel's window: taps <= 64 (program.c) */
    for (int64_t c = lo; c < hi; c++) {
        for (int i = 0; i < keep; i++) z[i] = fresh ? 0.0f : state[(int64_t)i * n + c];
        for (int t = 0; t < n_tok; t++) {
            z[keep] = IN_ROW(op, r, t)[c];
            float acc = bias ? bias[c] : 0.0f;
            for (int j = 0; j < taps; j++) acc += w[c * taps + j] * z[j];
            OUT_ROW(op, t)[c] = acc;
            memmove(z, z + 1, sizeof(float) * (size_t)keep);
        }
        for (int i = 0; i < keep; i++) state[(int64_t)i * n + c] = z[i];
    }
}

/* softplus as ggml computes it: x itself above 20, where log1p(exp(x)) rounds to x */
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* The selective scan, per head h (n_head) of head_dim channels, over d_state = n_in:
 *   dt = softplus(x2[t, h] + bias[h]),  g = the head's group of n_kv_head (B, C),
 *   s[h, p, :] = s[h, p, :] * exp(dt A[h, :]) + dt x[t, h P + p] B[t, g, :]
 *   y[t, h P + p] = s[h, p, :] . C[t, g, :] + D[h] x[t, h P + p]
 * with x's row [x (n_head P) | B (groups N) | C (groups N)], w = [A (n_head n_rot) | D (n_head)]:
 * n_rot = 1 (Mamba 2: one decay per head) or d_state (Mamba 1: one per state). Threads split
 * the (head, channel) rows; each row's state stays in cache across the step's tokens. */
void op_ssm_scan(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const pyllm_step *st = r->step;
    const int64_t N = op->n_in, P = op->head_dim, H = op->n_head, G = op->n_kv_head, a_n = op->n_rot;
    const float *A = op->w, *D = (const float *)op->w + H * a_n, *bias = op->bias;
    const int fresh = st->pos[0] == 0;
    float *decay = r->scratch;   /* [N]: exp(dt A) when A is per state */
    int64_t lo, hi;
    split_range(H * P, ith, nth, 1, &lo, &hi);
    for (int64_t row = lo; row < hi; row++) {
        const int64_t h = row / P, g = h / (H / G);
        float *s = op->state + row * N;
        if (fresh) memset(s, 0, sizeof(float) * (size_t)N);
        for (int t = 0; t < r->rows; t++) {
            const float *x = IN_ROW(op, r, t);
            const float *B = x + H * P + g * N, *C = x + H * P + G * N + g * N;
            const float dt = softplus(op->x2[(int64_t)(r->row0 + t) * op->x2_stride + h] + (bias ? bias[h] : 0.0f));
            const float xdt = x[row] * dt;
            if (a_n == 1) {
                const float dA = expf(dt * A[h]);
                for (int64_t i = 0; i < N; i++) s[i] = s[i] * dA + B[i] * xdt;
            } else {
                for (int64_t i = 0; i < N; i++) decay[i] = expf(dt * A[h * N + i]);
                for (int64_t i = 0; i < N; i++) s[i] = s[i] * decay[i] + B[i] * xdt;
            }
            OUT_ROW(op, t)[row] = K.dot_f32(N, s, C) + D[h] * x[row];
        }
    }
}
