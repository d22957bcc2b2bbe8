/* ops.c: embedding lookup, RMSNorm, activation quantization, RoPE, KV-cache
 * writes, gated activations, elementwise ops. */
#include <math.h>
#include <string.h>

#include "core.h"

/* y[t] = dequant(w row tokens[t]) * scale; OPF_BY_POS: the row of pos[t] (learned positions),
 * with OPF_ACCUMULATE added into y. A token id -1 - j: the step's media row j from column
 * media_col, unscaled (zeros with OPF_MEDIA_ZERO; w's row 0, scaled, with OPF_MEDIA_PAD);
 * OPF_MEDIA_ONLY: text rows are left alone */
void op_embed(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    size_t row_bytes = weight_row_bytes(op->type, op->n_in);
    const int32_t *ids = op->flags & OPF_BY_POS ? r->step->pos : r->step->tokens;
    int64_t lo, hi;
    split_range(r->rows, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *y = OUT_ROW(op, t);
        if (ids[t] < 0 && !(op->flags & OPF_MEDIA_PAD)) {   /* media row -1 - id (check_step: one of the step's,
                                                                 holding the columns): as it is */
            const float *m = r->step->media + (-1 - (int64_t)ids[t]) * r->step->media_width + op->media_col;
            if (op->flags & OPF_MEDIA_ZERO) {
                if (!(op->flags & OPF_ACCUMULATE)) memset(y, 0, (size_t)op->n_in * sizeof(float));
            } else if (op->flags & OPF_ACCUMULATE) {
                for (int64_t i = 0; i < op->n_in; i++) y[i] += m[i];
            } else {
                memcpy(y, m, (size_t)op->n_in * sizeof(float));
            }
            continue;
        }
        if (op->flags & OPF_MEDIA_ONLY) continue;
        const int64_t id = ids[t] < 0 ? 0 : ids[t];
        float *e = op->flags & OPF_ACCUMULATE ? r->scratch : y;   /* added to y below */
        if (op->flags & OPF_ROWS4)
            rows4_dequant_row(op->type, op->n_in, op->w, op->n_out, id, e);
        else
            K.dequant[op->type]((const uint8_t *)op->w + (size_t)id * row_bytes, e, op->n_in);
        if (op->scale != 1.0f)
            for (int64_t i = 0; i < op->n_in; i++) e[i] *= op->scale;
        if (e != y)
            for (int64_t i = 0; i < op->n_in; i++) y[i] += e[i];
    }
}

/* sum of x[i] and of (x[i] - c)^2 over a row, in double, in 8 interleaved
 * partial sums: one serial chain of double adds was most of a norm's time */
static double row_sum(const float *x, int64_t n) {
    double part[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) part[k] += (double)x[i + k];
    for (; i < n; i++) part[0] += (double)x[i];
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

static double row_sum_sq(const float *x, int64_t n, float c) {
    double part[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) part[k] += (double)(x[i + k] - c) * (x[i + k] - c);
    for (; i < n; i++) part[0] += (double)(x[i] - c) * (x[i] - c);
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

/* RMSNorm: y = x / sqrt(mean(x^2) + eps) * w. LayerNorm (type NORM_LAYER), as
 * ggml_norm: y = (x - mean) / sqrt(mean((x - mean)^2) + eps) * w + bias.
 * Over groups of n_in elements (n_head groups per row: one per head for q/k
 * norms, 1 otherwise), all with the same weights or, OPF_GROUP_WEIGHTS, each its own. */
void op_rmsnorm(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    int64_t n = op->n_in, groups = op->n_head > 0 ? op->n_head : 1;
    int64_t lo, hi;
    split_range((int64_t)r->rows * groups, ith, nth, 1, &lo, &hi);
    for (int64_t item = lo; item < hi; item++) {
        int64_t t = item / groups, g = item % groups;
        const float *x = IN_ROW(op, r, t) + g * n;
        float *y = OUT_ROW(op, t) + g * n;
        const float *w = (const float *)op->w, *b = op->bias;
        if (op->flags & OPF_GROUP_WEIGHTS) {   /* each group its own weights (and biases) */
            w += g * n;
            if (b) b += g * n;
        }
        const float mean = op->type == NORM_LAYER ? (float)(row_sum(x, n) / (double)n) : 0.0f;
        const float inv = (float)(1.0 / sqrt(row_sum_sq(x, n, mean) / (double)n + (double)op->eps));
        if (b)
            for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * inv * w[i] + b[i];
        else
            for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * inv * w[i];
    }
}

/* xq[t] = quantize(x[t]): the work is split by blocks, so one row is shared too */
void op_quantize(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    int act = op->type;
    int64_t bs = act == ACT_Q8_K ? QK_K : act == ACT_Q8_32 ? QK : 1;
    size_t blk_bytes = act_row_bytes(act, bs);
    size_t row_bytes = act_row_bytes(act, op->n_in);
    int64_t nb = op->n_in / bs;
    int64_t lo, hi;
    /* chunks of 8 blocks keep each thread's writes apart in the cache */
    split_range((int64_t)r->rows * nb, ith, nth, 8, &lo, &hi);
    while (lo < hi) {
        int64_t t = lo / nb, b = lo % nb;
        int64_t nblk = nb - b < hi - lo ? nb - b : hi - lo;
        const float *x = IN_ROW(op, r, t) + b * bs;
        uint8_t *out = (uint8_t *)op->xq + (size_t)t * row_bytes + (size_t)b * blk_bytes;
        K.quantize_act[act](x, out, nblk * bs);
        lo += nblk;
    }
}

/* rotate the first n_rot dims of each head by angle pos * freq_i:
 * freq_i = freq_scale * base^(-2i/n_rot) / factor_i. ROPE_NORM rotates
 * adjacent pairs (2i, 2i+1), ROPE_NEOX the halves (i, i + n_rot/2). */
static void rope_heads(float *x, int n_head, int head_dim, int n_rot, int mode,
                       const float *cos_t, const float *sin_t) {
    int half = n_rot / 2;
    for (int h = 0; h < n_head; h++) {
        float *v = x + (int64_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            int a = mode == ROPE_NEOX ? i : 2 * i;
            int b = mode == ROPE_NEOX ? i + half : 2 * i + 1;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * cos_t[i] - x1 * sin_t[i];
            v[b] = x0 * sin_t[i] + x1 * cos_t[i];
        }
    }
}

void op_rope(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    float cos_t[MAX_HEAD_DIM / 2], sin_t[MAX_HEAD_DIM / 2];
    double inv_freq[MAX_HEAD_DIM / 2];
    int half = op->n_rot / 2;
    int64_t lo, hi;
    split_range(r->rows, ith, nth, 1, &lo, &hi);
    if (lo >= hi) return;
    for (int i = 0; i < half; i++) {
        inv_freq[i] = op->freq_scale * pow((double)op->freq_base, -2.0 * i / op->n_rot);
        if (op->freq_factors) inv_freq[i] /= op->freq_factors[i];
    }
    /* M-RoPE (Qwen VL): pair i turns by the row's time (0), height (1) or width (2) position, by its
     * section, the pairs past the three sections by the time's; interleaved (Qwen 3 VL): by i % 3
     * while i is within three times that section */
    const int32_t *sec = op->rope_sections;
    const int32_t *rp = sec[0] | sec[1] | sec[2] ? r->step->rope_pos : NULL;
    const int64_t n = r->step->n_tokens;
    int which[MAX_HEAD_DIM / 2];
    for (int i = 0; i < half; i++)
        if (op->flags & OPF_ROPE_INTERLEAVED)
            which[i] = i % 3 == 1 && i < 3 * sec[1] ? 1 : i % 3 == 2 && i < 3 * sec[2] ? 2 : 0;
        else
            which[i] = i < sec[0] ? 0 : i < sec[0] + sec[1] ? 1 : i < sec[0] + sec[1] + sec[2] ? 2 : 0;
    for (int64_t t = lo; t < hi; t++) {
        for (int i = 0; i < half; i++) {
            const int32_t p = rp ? rp[which[i] * n + t] : r->step->pos[t];
            double theta = p * inv_freq[i];
            cos_t[i] = (float)cos(theta);
            sin_t[i] = (float)sin(theta);
        }
        if (op->x) rope_heads(op->x + t * op->x_stride, op->n_head, op->head_dim, op->n_rot,
                              op->rope_mode, cos_t, sin_t);
        if (op->x2) rope_heads(op->x2 + t * op->x2_stride, op->n_kv_head, op->head_dim, op->n_rot,
                               op->rope_mode, cos_t, sin_t);
    }
}

/* a row of n floats into a KV pool of format type: f16, or Q8_0 / Q4_0 blocks (each head's dims whole blocks) */
static void kv_row_store(int type, const float *x, void *out, int64_t n) {
    if (type == T_Q8_0)
        quantize_row_q8_0(x, out, n);
    else if (type == T_Q4_0)
        quantize_row_q4_0(x, out, n);
    else
        K.f32_to_f16(x, out, n);
}

void hadamard_rotate(float *x, int64_t n, int piece) {
    const float scale = 1.0f / sqrtf((float)piece);
    for (int64_t p = 0; p < n; p += piece) {
        float *v = x + p;
        for (int h = 1; h < piece; h *= 2) /* the fast transform: butterflies of span h */
            for (int i = 0; i < piece; i += 2 * h)
                for (int j = i; j < i + h; j++) {
                    const float a = v[j], b = v[j + h];
                    v[j] = a + b;
                    v[j + h] = a - b;
                }
        for (int i = 0; i < piece; i++) v[i] *= scale;
    }
}

/* a row of n floats into a KV pool, rotated first in pieces of rot (0: as it is) */
static void kv_row_put(int type, int rot, const float *x, void *out, int64_t n, float *tmp) {
    if (rot > 0) {
        memcpy(tmp, x, (size_t)n * sizeof(float));
        hadamard_rotate(tmp, n, rot);
        x = tmp;
    }
    kv_row_store(type, x, out, n);
}

/* k_cache[pos] = x[t], v_cache[pos] = x2[t] (as k_type / v_type, rotated by k_rot / v_rot), through
 * the block table; the keys alone where the values are read from them (OPF_V_IN_K) */
void op_kv_store(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const pyllm_step *st = r->step;
    const int64_t k_dim = (int64_t)op->n_kv_head * op->head_dim, v_dim = (int64_t)op->n_kv_head * value_dim(op);
    const int64_t k_row = kv_bytes(op->k_type, k_dim), v_row = kv_bytes(op->v_type, v_dim);
    int64_t lo, hi;
    split_range(r->rows, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const int32_t p = st->pos[t], *table = row_blocks(st, t);
        size_t slot = (size_t)table[p / st->block_size] * st->block_size + p % st->block_size;
        kv_row_put(op->k_type, op->k_rot, op->x + t * op->x_stride, (uint8_t *)op->k_cache + slot * k_row, k_dim,
                   r->scratch);
        if (!(op->flags & OPF_V_IN_K))
            kv_row_put(op->v_type, op->v_rot, op->x2 + t * op->x2_stride, (uint8_t *)op->v_cache + slot * v_row,
                       v_dim, r->scratch);
    }
}

/* y[t, g head_dim + i] = x[t, g n_out + i]: columns gathered by group */
void op_copy(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    int64_t lo, hi;
    split_range(r->rows, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++)
        for (int g = 0; g < op->n_head; g++)
            memcpy(OUT_ROW(op, t) + (int64_t)g * op->head_dim, IN_ROW(op, r, t) + (int64_t)g * op->n_out,
                   sizeof(float) * (size_t)op->n_in);
}

/* y[t] *= 1 + scale ln(1 + floor((pos[t] + eps) / window)), the factor in double as llama.cpp
 * computes it */
void op_pos_scale(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    int64_t lo, hi;
    split_range(r->rows, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const float steps = floorf(((float)r->step->pos[t] + op->eps) / (float)op->window);
        const float f = (float)(log((double)steps + 1.0) * op->scale + 1.0);
        float *y = OUT_ROW(op, t);
        for (int64_t i = 0; i < op->n_in; i++) y[i] *= f;
    }
}

/* gpt-oss's gate: x sigmoid(a x) (clamp(u, -c, c) + 1), x = min(g, c), as silu(a x) / a through
 * the level's SIMD silu (a scalar expf loop was 20x slower than the SiLU GLU) */
static void glu_swiglu_oai(int64_t n, const float *g, const float *u, float *y, float a, float c) {
    float ax[256], v[256];
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        const int m = n - i0 < 256 ? (int)(n - i0) : 256;
        for (int i = 0; i < m; i++) {   /* comparisons, not fminf/fmaxf: these vectorize */
            const float x = g[i0 + i] < c ? g[i0 + i] : c, w = u[i0 + i];
            ax[i] = a * x;
            v[i] = (w < -c ? -c : w > c ? c : w) + 1.0f;
        }
        K.glu_silu(m, ax, v, y + i0);
        for (int i = 0; i < m; i++) y[i0 + i] /= a;
    }
}

/* Nemotron's and Arcee's activation: max(g, 0)^2 u */
static void glu_relu_sqr(int64_t n, const float *g, const float *u, float *y) {
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i] > 0.0f ? g[i] : 0.0f;
        y[i] = x * x * u[i];
    }
}

/* SmallThinker's experts: max(g, 0) u (a comparison: fmaxf does not vectorize here) */
static void glu_relu(int64_t n, const float *g, const float *u, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = (g[i] > 0.0f ? g[i] : 0.0f) * u[i];
}

/* gated attention's output gate: sigmoid(g) u */
/* Apertus's xIELU, p = [alpha_n, alpha_p, beta, eps]: a quadratic for g > 0, an exponential below */
static void glu_xielu(int64_t n, const float *g, const float *u, float *y, const float *p) {
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        y[i] = (x > 0.0f ? p[1] * x * x + p[2] * x : (expm1f(fminf(x, p[3])) - x) * p[0] + p[2] * x) * u[i];
    }
}

void op_glu(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    /* no x2: a plain activation, act(g) * 1 (exact) through the same kernels */
    static const float ones[256] = {[0 ... 255] = 1.0f};
    int64_t n = op->n_in, lo, hi;
    split_range((int64_t)r->rows * n, ith, nth, 64, &lo, &hi);
    while (lo < hi) {
        int64_t t = lo / n, i0 = lo % n, i1 = n < i0 + (hi - lo) ? n : i0 + (hi - lo);
        if (!op->x2 && i1 - i0 > 256) i1 = i0 + 256;
        const float *g = IN_ROW(op, r, t);
        const float *u = op->x2 ? op->x2 + (int64_t)(r->row0 + t) * op->x2_stride + i0 : ones;
        float *y = OUT_ROW(op, t);
        /* y = silu(g) * u = g / (1 + exp(-g)) * u, or
         * y = gelu_tanh(g) * u = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u */
        if (op->type == GLU_SWIGLU_OAI)
            glu_swiglu_oai(i1 - i0, g + i0, u, y + i0, op->scale, op->softcap);
        else if (op->type == GLU_RELU_SQR)
            glu_relu_sqr(i1 - i0, g + i0, u, y + i0);
        else if (op->type == GLU_RELU)
            glu_relu(i1 - i0, g + i0, u, y + i0);
        else if (op->type == GLU_SIGMOID)
            K.glu_sigmoid(i1 - i0, g + i0, u, y + i0);
        else if (op->type == GLU_XIELU)
            glu_xielu(i1 - i0, g + i0, u, y + i0, op->w);
        else if (op->type == GLU_MUL)
            for (int64_t i = i0; i < i1; i++) y[i] = g[i] * u[i - i0];
        else if (op->type == GLU_TANH)
            for (int64_t i = i0; i < i1; i++) y[i] = tanhf(g[i]) * u[i - i0];
        else
            (op->type == GLU_GELU_TANH ? K.glu_gelu_tanh : K.glu_silu)(i1 - i0, g + i0, u, y + i0);
        lo += i1 - i0;
    }
}

/* y += scale * x (scale -1: a difference, exact) */
void op_add(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const float s = op->scale;
    int64_t n = op->n_in, lo, hi;
    split_range(r->rows, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const float *x = op->x ? IN_ROW(op, r, t) : (const float *)op->w; /* no x: one row w for every row */
        float *y = OUT_ROW(op, t);
        if (s == 1.0f)
            for (int64_t i = 0; i < n; i++) y[i] += x[i];
        else
            for (int64_t i = 0; i < n; i++) y[i] += s * x[i];
    }
}

/* y[t, g n + i] = x[t, i] + x2[t, i] (w[g n + i] (+ y[t, g n + i])): RWKV's token-shift mixes of a
 * row and the previous one (x2 = x_prev - x), n_head groups of n_in. Split by rows and groups. */
void op_lerp(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const int64_t n = op->n_in, groups = op->n_head;
    const int acc = op->flags & OPF_ACCUMULATE;
    int64_t lo, hi;
    split_range((int64_t)r->rows * groups, ith, nth, 1, &lo, &hi);
    for (int64_t item = lo; item < hi; item++) {
        const int64_t t = item / groups, g = item % groups;
        const float *x = IN_ROW(op, r, t), *dx = op->x2 + (int64_t)(r->row0 + t) * op->x2_stride;
        const float *mix = (const float *)op->w + g * n;
        float *y = OUT_ROW(op, t) + g * n;
        if (acc)
            for (int64_t i = 0; i < n; i++) y[i] = x[i] + dx[i] * (mix[i] + y[i]);
        else
            for (int64_t i = 0; i < n; i++) y[i] = x[i] + dx[i] * mix[i];
    }
}

/* y[t] *= scale, or with softcap > 0 y = softcap * tanh(scale * y / softcap)
 * (Gemma 2's final logits). Split by elements: a decode step's one row of
 * logits is a whole vocabulary. */
void op_scale(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const int64_t n = op->n_in;
    const float s = op->scale, cap = op->softcap, *col = (const float *)op->w;
    int64_t lo, hi;
    split_range((int64_t)r->rows * n, ith, nth, 64, &lo, &hi);
    for (int64_t k = lo; k < hi;) {
        const int64_t t = k / n, i0 = k % n, i1 = n < i0 + (hi - k) ? n : i0 + (hi - k);
        float *y = OUT_ROW(op, t);
        if (col)
            for (int64_t i = i0; i < i1; i++) y[i] *= col[i];
        if (cap > 0)
            K.softcap(i1 - i0, y + i0, s, cap);
        else if (s != 1.0f)
            for (int64_t i = i0; i < i1; i++) y[i] *= s;
        k += i1 - i0;
    }
}

/* y[t, stream j] (+)= sum_k c[t, j K + k] x[t, stream k], c = x2's row: K streams mixed into
 * n_head by a matrix per row (AltUp's prediction and correction). Split by (row, stream). */
void op_mix(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const int64_t n = op->n_in;
    const int S = op->n_head, Kx = op->n_kv_head;
    int64_t lo, hi;
    split_range((int64_t)r->rows * S, ith, nth, 1, &lo, &hi);
    for (int64_t item = lo; item < hi; item++) {
        const int64_t t = item / S;
        const int j = (int)(item % S);
        const float *x = IN_ROW(op, r, t);
        const float *c = op->x2 + (int64_t)(r->row0 + t) * op->x2_stride + (int64_t)j * Kx;
        float *y = OUT_ROW(op, t) + (int64_t)j * n;
        if (!(op->flags & OPF_ACCUMULATE))
            memset(y, 0, sizeof(float) * (size_t)n);
        for (int k = 0; k < Kx; k++) {
            const float ck = c[k], *xk = x + (int64_t)k * n;
            for (int64_t i = 0; i < n; i++) y[i] += ck * xk[i];
        }
    }
}

/* y's groups each scaled to the norm of x's row: y_g *= |x| / |y_g| (norms in double) */
void op_match_norm(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const int64_t n = op->n_in, groups = op->n_head;
    int64_t lo, hi;
    split_range((int64_t)r->rows * groups, ith, nth, 1, &lo, &hi);
    for (int64_t item = lo; item < hi; item++) {
        const int64_t t = item / groups, g = item % groups;
        float *y = OUT_ROW(op, t) + g * n;
        const float f = (float)sqrt(row_sum_sq(IN_ROW(op, r, t), n, 0.0f) / row_sum_sq(y, n, 0.0f));
        for (int64_t i = 0; i < n; i++) y[i] *= f;
    }
}

/* y = max(x - (mean + scale std), 0), std = sqrt(sum (x - mean)^2 / (n - 1)): the values above the
 * normal fit's quantile, shifted down by it (Gemma 3n's gaussian top-k of the FFN gate) */
void op_sparsify(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const int64_t n = op->n_in;
    int64_t lo, hi;
    split_range(r->rows, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const float *x = IN_ROW(op, r, t);
        float *y = OUT_ROW(op, t);
        const double mean = row_sum(x, n) / (double)n;
        const double std = sqrt(row_sum_sq(x, n, (float)mean) / (double)(n > 1 ? n - 1 : 1));
        const float cut = (float)(mean + (double)op->scale * std);
        for (int64_t i = 0; i < n; i++) y[i] = x[i] > cut ? x[i] - cut : 0.0f;
    }
}

/* w[i] += sum over the step's rows of x[t, i]^2, row after row (llama-imatrix's order); the
 * threads take columns, so each accumulator has one writer */
void op_sumsq(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    float *acc = (float *)op->w;
    int64_t lo, hi;
    split_range(op->n_in, ith, nth, 16, &lo, &hi);
    for (int t = 0; t < r->rows; t++) {
        const float *x = IN_ROW(op, r, t);
        for (int64_t i = lo; i < hi; i++) acc[i] += x[i] * x[i];
    }
}

/* w[t, i] = x[t, i]: the step's rows (at most w's n_out) kept past the step. The threads
 * take columns. */
void op_save_rows(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    float *out = (float *)op->w;
    int64_t lo, hi;
    split_range(op->n_in, ith, nth, 16, &lo, &hi);
    const int rows = r->rows < op->n_out ? r->rows : (int)op->n_out;
    for (int t = 0; t < rows; t++) {
        const float *x = IN_ROW(op, r, t);
        float *restrict y = out + (int64_t)t * op->n_in;
        for (int64_t i = lo; i < hi; i++) y[i] = x[i];
    }
}

/* y[t, o] (+)= sum_i x[t, i] w[i, o], w's n_in rows of n_out: each input column adds its
 * scaled row of w into y, so the loops run along the outputs (vectorized) however few the
 * inputs are. The threads take output columns. */
void op_matmul_cols(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const float *w = (const float *)op->w;
    const int64_t n_out = op->n_out;
    int64_t lo, hi;
    split_range(n_out, ith, nth, 16, &lo, &hi);
    for (int t = 0; t < r->rows; t++) {
        const float *x = IN_ROW(op, r, t);
        float *restrict y = OUT_ROW(op, t);
        if (!(op->flags & OPF_ACCUMULATE))
            for (int64_t o = lo; o < hi; o++) y[o] = 0.0f;
        for (int64_t i = 0; i < op->n_in; i++) {
            const float xi = x[i];
            const float *restrict wi = w + i * n_out;
            for (int64_t o = lo; o < hi; o++) y[o] += xi * wi[o];
        }
    }
}
