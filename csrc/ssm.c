/* ssm.c: the recurrent ops of state-space layers (Mamba 1 and 2) and of linear
 * attention (the gated delta rule of Qwen3.5, RWKV's WKV).
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
 * then state = the last K - 1 rows of z. Threads split the channels; each works row by row
 * over its channels (contiguous, so the loops vectorize), with its share of w transposed
 * into scratch ([K][channels]). */
void op_ssm_conv(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const pyllm_step *st = r->step;
    const int taps = op->n_head, keep = taps - 1, n_tok = r->rows;
    const int64_t n = op->n_in;
    const float *w = op->w, *bias = op->bias;
    float *state = op->state;
    const int fresh = st->pos[0] == 0;
    int64_t lo, hi;
    split_range(n, ith, nth, 16, &lo, &hi);
    const int64_t m = hi - lo;
    if (m <= 0) return;
    float *wt = r->scratch;   /* [taps][m]: tap j of channel lo + c at wt[j m + c] */
    for (int64_t c = 0; c < m; c++)
        for (int j = 0; j < taps; j++) wt[j * m + c] = w[(lo + c) * taps + j];
    if (fresh)
        for (int i = 0; i < keep; i++) memset(state + i * n + lo, 0, sizeof(float) * (size_t)m);
    /* row k of z, from channel lo on */
#define Z(k) ((k) < keep ? state + (int64_t)(k) * n + lo : IN_ROW(op, r, (k) - keep) + lo)
    for (int t = 0; t < n_tok; t++) {
        float *y = OUT_ROW(op, t) + lo;
        if (bias)
            memcpy(y, bias + lo, sizeof(float) * (size_t)m);
        else
            memset(y, 0, sizeof(float) * (size_t)m);
        for (int j = 0; j < taps; j++) {
            const float *z = Z(t + j), *wj = wt + j * m;
            for (int64_t c = 0; c < m; c++) y[c] += wj[c] * z[c];
        }
    }
    /* in ascending order: row n_tok + i of z is a later state row or an input row, so nothing
     * is read after it was overwritten */
    for (int i = 0; i < keep; i++) memmove(state + (int64_t)i * n + lo, Z(n_tok + i), sizeof(float) * (size_t)m);
#undef Z
}

#define SCAN_BLOCK 32 /* Mamba 1 channels whose states are updated together */

/* softplus as ggml computes it: x itself above 20, where log1p(exp(x)) rounds to x */
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* The selective scan, per head h (n_head) of head_dim channels, over d_state = n_in:
 *   dt = softplus(x2[t, h] + bias[h]),  g = the head's group of n_kv_head (B, C),
 *   s[h, p, :] = s[h, p, :] * exp(dt A[h, :]) + dt x[t, h P + p] B[t, g, :]
 *   y[t, h P + p] = s[h, p, :] . C[t, g, :] + D[h] x[t, h P + p]
 * with x's row [x (n_head P) | B (groups N) | C (groups N)], w = [A (n_head n_rot) | D (n_head)]:
 * n_rot = 1 (Mamba 2: one decay per head) or d_state (Mamba 1: one per state). Threads split
 * the (head, channel) rows; each row's state stays in cache across the step's tokens, and a
 * head's dt and decay are worked out once per token for all of its rows (the transcendentals
 * cost more than the state update otherwise). */
/* Mamba 1 (a decay per state, one channel a head): token by token, in blocks of SCAN_BLOCK
 * channels whose states (block x N, contiguous) and decays exp(dt A) are worked on together, the
 * exps of a whole block in one call of the level's exp (one per channel and state is the scan's
 * main cost, 16 times its multiply-adds' count). Channels [lo, hi) of this thread. */
static void scan_per_state_decay(const pyllm_op *op, const op_rows *r, int64_t lo, int64_t hi) {
    const int64_t N = op->n_in, H = op->n_head;
    const float *A = op->w, *D = (const float *)op->w + H * N, *bias = op->bias;
    float *xdt = r->scratch, *decay = r->scratch + SCAN_BLOCK;   /* [SCAN_BLOCK], [SCAN_BLOCK][N] */
    for (int t = 0; t < r->rows; t++) {
        const float *x = IN_ROW(op, r, t), *B = x + H, *C = B + N;
        const float *dt_in = op->x2 + (int64_t)(r->row0 + t) * op->x2_stride;
        for (int64_t c0 = lo; c0 < hi; c0 += SCAN_BLOCK) {
            const int64_t nb = hi - c0 < SCAN_BLOCK ? hi - c0 : SCAN_BLOCK;
            for (int64_t c = 0; c < nb; c++) {
                const float dt = softplus(dt_in[c0 + c] + (bias ? bias[c0 + c] : 0.0f));
                xdt[c] = x[c0 + c] * dt;
                for (int64_t i = 0; i < N; i++) decay[c * N + i] = dt * A[(c0 + c) * N + i];
            }
            K.exp_sum(nb * N, decay, 0.0f); /* decay = exp(dt A) in place (dt A <= 0) */
            float *s = op->state + c0 * N;
            for (int64_t c = 0; c < nb; c++)
                for (int64_t i = 0; i < N; i++) s[c * N + i] = s[c * N + i] * decay[c * N + i] + B[i] * xdt[c];
            for (int64_t c = 0; c < nb; c++)
                OUT_ROW(op, t)[c0 + c] = K.dot_f32(N, s + c * N, C) + D[c0 + c] * x[c0 + c];
        }
    }
}

void op_ssm_scan(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const pyllm_step *st = r->step;
    const int64_t N = op->n_in, P = op->head_dim, H = op->n_head, G = op->n_kv_head, a_n = op->n_rot;
    const float *A = op->w, *D = (const float *)op->w + H * a_n, *bias = op->bias;
    const int fresh = st->pos[0] == 0, n_tok = r->rows;
    float *dts = r->scratch, *decays = r->scratch + n_tok;   /* [n_tok] each: this head's dt, exp(dt A) */
    float *decay = r->scratch + 2 * n_tok;                   /* [N]: exp(dt A) when A is per state */
    int64_t lo, hi;
    split_range(H * P, ith, nth, 1, &lo, &hi);
    if (a_n > 1 && P == 1 && G == 1) {
        if (fresh) memset(op->state + lo * N, 0, sizeof(float) * (size_t)((hi - lo) * N));
        scan_per_state_decay(op, r, lo, hi);
        return;
    }
    for (int64_t row0 = lo; row0 < hi;) {
        const int64_t h = row0 / P, g = h / (H / G), row1 = (h + 1) * P < hi ? (h + 1) * P : hi;
        for (int t = 0; t < n_tok; t++) {
            dts[t] = softplus(op->x2[(int64_t)(r->row0 + t) * op->x2_stride + h] + (bias ? bias[h] : 0.0f));
            decays[t] = a_n == 1 ? expf(dts[t] * A[h]) : 0.0f;
        }
        for (int64_t row = row0; row < row1; row++) {
            float *s = op->state + row * N;
            if (fresh) memset(s, 0, sizeof(float) * (size_t)N);
            if (a_n == 1) {   /* the level's kernel, then the skip */
                const float *x0 = IN_ROW(op, r, 0);
                K.ssm_scan_row(N, s, n_tok, x0 + H * P + g * N, op->x_stride, G * N, x0 + row, op->x_stride, dts,
                               decays, OUT_ROW(op, 0) + row, op->y_stride);
                for (int t = 0; t < n_tok; t++) OUT_ROW(op, t)[row] += D[h] * IN_ROW(op, r, t)[row];
                continue;
            }
            for (int t = 0; t < n_tok; t++) {
                const float *x = IN_ROW(op, r, t);
                const float *B = x + H * P + g * N, *C = x + H * P + G * N + g * N;
                const float xdt = x[row] * dts[t];   /* Mamba 1: a decay per state */
                for (int64_t i = 0; i < N; i++) decay[i] = dts[t] * A[h * N + i];
                K.exp_sum(N, decay, 0.0f); /* decay = exp(dt A) in place, the level's exp (dt A <= 0) */
                for (int64_t i = 0; i < N; i++) s[i] = s[i] * decay[i] + B[i] * xdt;
                OUT_ROW(op, t)[row] = K.dot_f32(N, s, C) + D[h] * x[row];
            }
        }
        row0 = row1;
    }
}

/* x / max(|x|, eps) in place, the sum of squares in double (ggml's l2_norm) */
static void l2_normalize(float *x, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float norm = sqrtf((float)sum), scale = 1.0f / (norm > eps ? norm : eps);
    for (int64_t i = 0; i < n; i++) x[i] *= scale;
}

static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* The gated delta rule per value head h (csrc/pyllm.h, OP_DELTA_NET), token by token:
 *   S' = g S + k d^T,  d = (v - g S^T k) beta,  y = S'^T q = g S^T q + (k . q) d
 * with q, k the head's key head's, L2-normalized (q also / sqrt(dk)): the same rule as
 * S = g S; S += k ((v - S^T k) beta)^T; y = S^T q, in two passes over S instead of four (the
 * first only reads it: u = S^T k and w = S^T q through the level's axpy, row by row). S is
 * [dk][dv], row i the values stored under key dim i. Threads split the value heads; q, k, u
 * and w live in scratch. */
void op_delta_net(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const pyllm_step *st = r->step;
    const int64_t H = op->n_head, Hk = op->n_kv_head, dk = op->head_dim, dv = op->head_dim_v;
    const float *A = op->w, *dt_bias = (const float *)op->w + H;
    const int fresh = st->pos[0] == 0;
    const float q_scale = 1.0f / sqrtf((float)dk);
    float *q = r->scratch, *k = q + dk, *u = k + dk, *w = u + dv;   /* [dk], [dk], [dv], [dv] */
    int64_t lo, hi;
    split_range(H, ith, nth, 1, &lo, &hi);
    for (int64_t h = lo; h < hi; h++) {
        float *S = op->state + h * dk * dv;
        const int64_t hk = op->flags & OPF_KV_GROUPED ? h / (H / Hk) : h % Hk;
        if (fresh) memset(S, 0, sizeof(float) * (size_t)(dk * dv));
        for (int t = 0; t < r->rows; t++) {
            const float *x = IN_ROW(op, r, t), *ab = op->x2 + (int64_t)(r->row0 + t) * op->x2_stride;
            const float *v = x + 2 * Hk * dk + h * dv;
            memcpy(q, x + hk * dk, sizeof(float) * (size_t)dk);
            memcpy(k, x + Hk * dk + hk * dk, sizeof(float) * (size_t)dk);
            l2_normalize(q, dk, op->eps);
            l2_normalize(k, dk, op->eps);
            for (int64_t i = 0; i < dk; i++) q[i] *= q_scale;
            const float g = expf(A[h] * softplus(ab[h] + dt_bias[h])), beta = sigmoid(ab[H + h]);
            memset(u, 0, sizeof(float) * (size_t)dv);
            memset(w, 0, sizeof(float) * (size_t)dv);
            for (int64_t i = 0; i < dk; i++) {   /* u = S^T k, w = S^T q */
                K.axpy_f32(dv, k[i], S + i * dv, u);
                K.axpy_f32(dv, q[i], S + i * dv, w);
            }
            const float kq = K.dot_f32(dk, k, q);
            float *y = OUT_ROW(op, t) + h * dv;
            for (int64_t j = 0; j < dv; j++) {
                u[j] = (v[j] - g * u[j]) * beta;   /* u becomes d */
                y[j] = g * w[j] + kq * u[j];
            }
            for (int64_t i = 0; i < dk; i++) {   /* S = g S + k d^T */
                float *Si = S + i * dv;
                const float ki = k[i];
                for (int64_t j = 0; j < dv; j++) Si[j] = Si[j] * g + ki * u[j];
            }
        }
    }
}

/* RWKV 7's output of head h after the recurrence: y = LayerNorm(y) ln_w + ln_b (bias = [ln_w | ln_b]),
 * then y += (r . (r_k k)) v (w = r_k), each where given; the sums in double, as op_rmsnorm's */
static void wkv7_output(const pyllm_op *op, float *y, const float *r, const float *k, const float *v, int64_t h) {
    const int64_t D = op->head_dim, C = op->n_head * D;
    if (op->bias) {
        const float *lw = op->bias + h * D, *lb = op->bias + C + h * D;
        double sum = 0.0, sq = 0.0;
        for (int64_t i = 0; i < D; i++) sum += y[i];
        const float mean = (float)(sum / (double)D);
        for (int64_t i = 0; i < D; i++) sq += (double)(y[i] - mean) * (y[i] - mean);
        const float inv = (float)(1.0 / sqrt(sq / (double)D + (double)op->eps));
        for (int64_t i = 0; i < D; i++) y[i] = (y[i] - mean) * inv * lw[i] + lb[i];
    }
    if (op->w) {
        const float *rk = (const float *)op->w + h * D;
        float bonus = 0.0f;
        for (int64_t j = 0; j < D; j++) bonus += r[j] * k[j] * rk[j];
        for (int64_t i = 0; i < D; i++) y[i] += bonus * v[i];
    }
}

/* RWKV's linear attention per head h (csrc/pyllm.h, OP_WKV), token by token; the head's state S
 * is [head_dim][head_dim], its decays worked out once per token into scratch:
 *   WKV_6:   y = r^T S + (r . (u k)) v ;  S[i, :] = decay_i S[i, :] + k_i v    (S: key rows)
 *   WKV_GLA: S[i, :] = decay_i S[i, :] + k_i (1 - decay_i) v ;  y = scale r^T S
 *   WKV_7:   S[i, :] = S[i, :] diag(decay) + (S[i, :] . a) b + v_i k ; y_i = S[i, :] . r  (S: value rows),
 *            then normed and given its bonus (wkv7_output)
 * Every inner loop runs along a row of S, contiguous: the state's update (which the compiler
 * vectorizes) apart from the dot products and axpys, the level's kernels. Threads split the heads. */
void op_wkv(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const int64_t H = op->n_head, D = op->head_dim, C = H * D;
    const int fresh = r->step->pos[0] == 0, kind = op->type;
    float *decay = r->scratch;   /* [D] */
    int64_t lo, hi;
    split_range(H, ith, nth, 1, &lo, &hi);
    for (int64_t h = lo; h < hi; h++) {
        float *S = op->state + h * D * D;
        if (fresh) memset(S, 0, sizeof(float) * (size_t)(D * D));
        for (int t = 0; t < r->rows; t++) {
            const float *x = IN_ROW(op, r, t) + h * D;
            const float *rr = x, *k = x + C, *v = x + 2 * C, *w = x + 3 * C;
            float *y = OUT_ROW(op, t) + h * D;
            if (kind == WKV_7)
                for (int64_t j = 0; j < D; j++) decay[j] = expf(-0.606531f * sigmoid(w[j]));
            else
                for (int64_t j = 0; j < D; j++) decay[j] = expf(-expf(w[j]));
            if (kind == WKV_6) {
                const float *u = (const float *)op->w + h * D;
                float ruk = 0.0f;
                for (int64_t i = 0; i < D; i++) ruk += rr[i] * u[i] * k[i];
                for (int64_t j = 0; j < D; j++) y[j] = ruk * v[j];
                for (int64_t i = 0; i < D; i++) {
                    float *Si = S + i * D;
                    const float ki = k[i], di = decay[i];
                    K.axpy_f32(D, rr[i], Si, y);
                    for (int64_t j = 0; j < D; j++) Si[j] = Si[j] * di + ki * v[j];
                }
            } else if (kind == WKV_GLA) {
                memset(y, 0, sizeof(float) * (size_t)D);
                for (int64_t i = 0; i < D; i++) {
                    float *Si = S + i * D;
                    const float ri = op->scale * rr[i], ki = k[i] * (1.0f - decay[i]), di = decay[i];
                    for (int64_t j = 0; j < D; j++) {
                        Si[j] = Si[j] * di + ki * v[j];
                        y[j] += ri * Si[j];
                    }
                }
            } else {
                const float *a = x + 4 * C, *b = x + 5 * C;
                for (int64_t i = 0; i < D; i++) {
                    float *Si = S + i * D;
                    const float sa = K.dot_f32(D, Si, a), vi = v[i];
                    for (int64_t j = 0; j < D; j++) Si[j] = Si[j] * decay[j] + sa * b[j] + vi * k[j];
                    y[i] = K.dot_f32(D, Si, rr);
                }
                wkv7_output(op, y, rr, k, v, h);
            }
        }
    }
}
