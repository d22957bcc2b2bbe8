/* moe.c: mixture-of-experts FFNs, as three ops around the ordinary ones.
 *
 *   logits = W_router h                        OP_MATMUL
 *   route  = top-k of gate(logits)             OP_MOE_ROUTE: ids and weights per token
 *   g, u   = W_gate[e] h, W_up[e] h            OP_MATMUL_ID: one slot per chosen expert
 *   a      = act(g) * u                        OP_GLU over all slots at once
 *   d      = W_down[e] a_j                     OP_MATMUL_ID with OPF_SLOT_INPUT
 *   y    (+)= sum_j weight_j d_j               OP_MOE_SUM
 *
 * A route row holds the n_head chosen experts' ids (as floats: exact below
 * 2^24) then their weights. OP_MATMUL_ID's work items are (expert, chunk of
 * its output rows): each thread sorts the step's (token, slot) pairs by
 * expert itself (a counting sort, tiny next to the products), so an
 * expert's weights are read once per step however many tokens chose it,
 * through the gemm kernels when several did. A row's product does not
 * depend on the rows sharing the call (quants.h), so one token at a time
 * gives the same numbers as a batch. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core.h"

#define ID_CHUNK 32      /* output rows per work item */
#define GATHER_ROWS 64   /* activation rows gathered per gemm call */

/* expert e's gate value: its sigmoid, or its softmax over all (m the largest logit, sum the
 * exponentials' sum) */
static inline float gate_value(const float *x, int e, int sigmoid, float m, float sum) {
    return sigmoid ? 1.0f / (1.0f + expf(-x[e])) : expf(x[e] - m) / sum;
}

/* DeepSeek V3's group limit on the keys of n experts in `groups` equal groups: only the
 * `used` groups whose two best keys sum highest (ties to the lower group) keep theirs; the
 * others' become -INFINITY */
static void limit_groups(float *key, int n, int groups, int used) {
    const int per = n / groups;
    float score[MAX_EXPERT_GROUPS];
    for (int g = 0; g < groups; g++) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; e++) {
            if (key[e] > b1) b2 = b1, b1 = key[e];
            else if (key[e] > b2) b2 = key[e];
        }
        score[g] = per > 1 ? b1 + b2 : b1;
    }
    uint64_t chosen = 0;
    for (int j = 0; j < used; j++) {
        int best = -1;
        for (int g = 0; g < groups; g++)
            if (!(chosen >> g & 1) && (best < 0 || score[g] > score[best])) best = g;
        chosen |= (uint64_t)1 << best;
    }
    for (int e = 0; e < n; e++)
        if (!(chosen >> (e / per) & 1)) key[e] = -INFINITY;
}

/* The k experts of x[0..n) with the largest logits, in order, ties to the lower id (gating is
 * monotonic: the same as the k largest gate values), or with a selection bias the k largest
 * gate value + bias[e] (ERNIE 4.5 MoE, DeepSeek V3), or within the groups limit_groups keeps,
 * those keys made once in `keys` [n]; y[j] = id, y[k + j] = its gate value (the bias only
 * chooses), times expert_scale[id] where given (Gemma 4's per-expert scales) */
static void route_row(const float *x, int n, int k, int type, float scale, const float *bias,
                      const float *expert_scale, int groups, int groups_used, float *keys, float *y) {
    const int sigmoid = type & MOE_SIGMOID;
    float m = x[0], sum = 0.0f, wsum = 0.0f;
    for (int e = 1; e < n; e++) m = x[e] > m ? x[e] : m;
    if (!sigmoid)
        for (int e = 0; e < n; e++) sum += expf(x[e] - m);
    const float *key = x;
    if (bias || groups > 1) {   /* groups are scored by gate values, not logits */
        for (int e = 0; e < n; e++) keys[e] = gate_value(x, e, sigmoid, m, sum) + (bias ? bias[e] : 0.0f);
        if (groups > 1) limit_groups(keys, n, groups, groups_used);
        key = keys;
    }
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int c = 0; c < j; c++) taken |= (int)y[c] == e;
            if (!taken && (best < 0 || key[e] > key[best])) best = e;
        }
        y[j] = (float)best;
    }
    for (int j = 0; j < k; j++) {
        y[k + j] = gate_value(x, (int)y[j], sigmoid, m, sum);
        wsum += y[k + j];
    }
    for (int j = 0; j < k; j++) {
        y[k + j] = (type & MOE_NORM ? y[k + j] / wsum : y[k + j]) * scale;
        if (expert_scale) y[k + j] *= expert_scale[(int)y[j]];
    }
}

void op_moe_route(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    int64_t lo, hi;
    split_range(r->rows, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++)
        route_row(IN_ROW(op, r, t), (int)op->n_in, op->n_head, op->type, op->scale, op->bias,
                  (const float *)op->w, op->n_kv_head, op->head_dim, r->scratch, OUT_ROW(op, t));
}

/* expert id of slot j of row t, or -1 if the route row holds no valid id there */
static inline int slot_expert(const pyllm_op *op, const op_rows *r, int t, int j) {
    if (!op->x2) return j; /* no route: a matrix per slot (per head) */
    const float id = op->x2[(int64_t)(r->row0 + t) * op->x2_stride + j];
    return id >= 0.0f && id < (float)op->n_kv_head ? (int)id : -1;
}

/* OP_SUMSQ with a route: each expert's sums of squares of the inputs routed to it, and their
 * count in the accumulator row's last column (llama-imatrix's statistics of MUL_MAT_ID). The
 * threads take columns; thread 0 counts. */
void op_sumsq_routed(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    float *acc = (float *)op->w;
    const int k = op->n_head;
    const int64_t n = op->n_in;
    int64_t lo, hi;
    split_range(n, ith, nth, 16, &lo, &hi);
    for (int t = 0; t < r->rows; t++) {
        const float *x = IN_ROW(op, r, t);
        for (int j = 0; j < k; j++) {
            const int e = slot_expert(op, r, t, j);
            if (e < 0) continue;
            const float *xj = op->flags & OPF_SLOT_INPUT ? x + (int64_t)j * n : x;
            float *a = acc + (int64_t)e * (n + 1);
            for (int64_t i = lo; i < hi; i++) a[i] += xj[i] * xj[i];
            if (ith == 0) a[n] += 1.0f;
        }
    }
}

/* the step's (token, slot) pairs grouped by expert: pairs[start[e] .. start[e + 1]) chose e */
static void group_by_expert(const pyllm_op *op, const op_rows *r, int *start, int *pairs) {
    const int k = op->n_head, n_exp = op->n_kv_head;
    memset(start, 0, sizeof(int) * (size_t)(n_exp + 1));
    for (int t = 0; t < r->rows; t++)
        for (int j = 0; j < k; j++) {
            const int e = slot_expert(op, r, t, j);
            if (e >= 0) start[e + 1]++;
        }
    for (int e = 0; e < n_exp; e++) start[e + 1] += start[e];
    int *fill = start + n_exp + 1; /* [n_exp] next free place of each expert */
    memcpy(fill, start, sizeof(int) * (size_t)n_exp);
    for (int t = 0; t < r->rows; t++)
        for (int j = 0; j < k; j++) {
            const int e = slot_expert(op, r, t, j);
            if (e >= 0) pairs[fill[e]++] = t * k + j;
        }
}

/* y[0 .. nrows) += expert e's bias of output rows c0 .. (gpt-oss) */
static void add_expert_bias(const pyllm_op *op, int e, int64_t c0, int nrows, float *y) {
    if (!op->bias) return;
    const float *b = op->bias + (int64_t)e * op->n_out + c0;
    for (int i = 0; i < nrows; i++) y[i] += b[i];
}

void op_matmul_id(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const int type = op->type, k = op->n_head, n_exp = op->n_kv_head;
    const int act = type_info(type)->act;
    const int64_t n = op->n_in, n_out = op->n_out;
    const size_t row_bytes = weight_row_bytes(type, n), expert_bytes = row_bytes * (size_t)n_out;
    /* one slot's activation, and one input row's */
    const size_t slot_bytes = act == ACT_F32 ? (size_t)n * sizeof(float) : act_row_bytes(act, n);
    const size_t in_row_bytes = act == ACT_F32 ? (size_t)op->x_stride * sizeof(float)
                                               : act_row_bytes(act, op->flags & OPF_SLOT_INPUT ? n * k : n);
    const uint8_t *act_base = act == ACT_F32 ? (const uint8_t *)(op->x + (int64_t)r->row0 * op->x_stride)
                                             : (const uint8_t *)op->xq + (size_t)r->row0 * in_row_bytes;
    const int slot_input = op->flags & OPF_SLOT_INPUT;

    /* this thread's scratch: the grouping, then gathered activations, then a tile of results */
    int *start = (int *)r->scratch, *pairs = start + 2 * n_exp + 1, *used = pairs + r->rows * k;
    group_by_expert(op, r, start, pairs);
    int n_used = 0;
    for (int e = 0; e < n_exp; e++)
        if (start[e + 1] > start[e]) used[n_used++] = e;
    uint8_t *gathered = (uint8_t *)(used + n_exp) + 64 - ((uintptr_t)(used + n_exp) & 63);
    float *part = (float *)(gathered + GATHER_ROWS * slot_bytes); /* [GATHER_ROWS][ID_CHUNK] */
    uint8_t *plain = (uint8_t *)(part + GATHER_ROWS * ID_CHUNK); /* a ROWS4 chunk copied out */
    const int rows4 = (op->flags & OPF_ROWS4) != 0;   /* each expert's rows in groups of 4 (quants.h) */

    const int64_t n_chunks = (n_out + ID_CHUNK - 1) / ID_CHUNK;
    /* one token (decode): each thread streams its own stretch of the chosen experts' rows */
    chunk_cursor cursor = chunk_cursor_start(n_used * n_chunks, r->rows == 1, ith, nth);
    for (;;) {
        const int64_t item = chunk_cursor_next(&cursor, r->counter);
        if (item < 0) break;
        const int e = used[item / n_chunks];
        const int64_t c0 = item % n_chunks * ID_CHUNK;
        const int nrows = (int)(n_out - c0 < ID_CHUNK ? n_out - c0 : ID_CHUNK);
        const int one = start[e + 1] - start[e] == 1;
        const uint8_t *chunk = (const uint8_t *)op->w + (size_t)e * expert_bytes + (size_t)c0 * row_bytes;
        int in_place;
        const uint8_t *w = chunk_weights(type, n, chunk, nrows, rows4, one, plain, &in_place);
        if (one) { /* one token chose it (decode): a gemv, nothing to gather */
            const int t = pairs[start[e]] / k, j = pairs[start[e]] % k;
            const uint8_t *a = act_base + (size_t)t * in_row_bytes + (slot_input ? (size_t)j * slot_bytes : 0);
            float *out = OUT_ROW(op, t) + (int64_t)j * n_out + c0;
            gemv_chunk(type, in_place, n, w, row_bytes, nrows, a, out);
            add_expert_bias(op, e, c0, nrows, out);
            continue;
        }
        for (int p0 = start[e]; p0 < start[e + 1]; p0 += GATHER_ROWS) {
            const int np = start[e + 1] - p0 < GATHER_ROWS ? start[e + 1] - p0 : GATHER_ROWS;
            for (int i = 0; i < np; i++) {
                const int t = pairs[p0 + i] / k, j = pairs[p0 + i] % k;
                memcpy(gathered + (size_t)i * slot_bytes,
                       act_base + (size_t)t * in_row_bytes + (slot_input ? (size_t)j * slot_bytes : 0), slot_bytes);
            }
            gemm_rows(type, n, w, row_bytes, nrows, gathered, slot_bytes, np, part, ID_CHUNK);
            for (int i = 0; i < np; i++) {
                const int t = pairs[p0 + i] / k, j = pairs[p0 + i] % k;
                memcpy(OUT_ROW(op, t) + (int64_t)j * n_out + c0, part + (size_t)i * ID_CHUNK,
                       sizeof(float) * (size_t)nrows);
                add_expert_bias(op, e, c0, nrows, OUT_ROW(op, t) + (int64_t)j * n_out + c0);
            }
        }
    }
}

/* floats of scratch OP_MATMUL_ID needs for `rows` tokens (checked per step) */
int64_t matmul_id_scratch_floats(const pyllm_op *op, int64_t rows) {
    const int act = type_info(op->type)->act;
    const size_t slot_bytes = act == ACT_F32 ? (size_t)op->n_in * sizeof(float) : act_row_bytes(act, op->n_in);
    const int64_t ints = 3 * (int64_t)op->n_kv_head + 1 + rows * op->n_head;
    const int64_t plain = op->flags & OPF_ROWS4 ? (int64_t)(ID_CHUNK * weight_row_bytes(op->type, op->n_in)) / 4 + 1 : 0;
    return ints + 16 + (int64_t)(GATHER_ROWS * slot_bytes) / 4 + GATHER_ROWS * ID_CHUNK + plain;
}

void op_moe_sum(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const int64_t n = op->n_in;
    const int k = op->n_head;
    int64_t lo, hi;
    split_range(r->rows, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const float *x = IN_ROW(op, r, t);
        const float *wt = op->x2 + (int64_t)(r->row0 + t) * op->x2_stride + k;
        float *y = OUT_ROW(op, t);
        const int accumulate = op->flags & OPF_ACCUMULATE;
        for (int64_t i = 0; i < n; i++) {
            float s = 0.0f;
            for (int j = 0; j < k; j++) s += wt[j] * x[(int64_t)j * n + i];
            y[i] = accumulate ? y[i] + s : s;
        }
    }
}
