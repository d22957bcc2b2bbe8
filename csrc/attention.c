/* attention.c: causal attention over the paged KV cache, online softmax.
 *
 * For query row t at position p and head h (key/value head h / group):
 *     y = sum_j softmax_j(scale * q.k_j) v_j     over j in [max(0, p-window+1), p]
 * (OPF_CHUNKED: over [p - p % window, p] instead; a bidirectional step
 * (pyllm_step.bidirectional): up to the step's last position instead of p, from
 * the same first; OPF_NON_CAUSAL: over [0, the
 * step's last position], every row alike, or with a window over the positions
 * within window / 2 of p either way; keys of head_dim, values of
 * head_dim_v; with OPF_V_IN_K a value is the first
 * head_dim_v dims of its key row: MLA's latent, stored once). With ALiBi
 * (op->alibi > 0) head h's scale * q.k_j gains -slope_h |p - j| (BLOOM, MPT).
 *
 * K and V live in blocks of B positions; the step's block table maps
 * position j to block table[j / B], slot j % B. A pool holds f16 rows, or
 * Q8_0 / Q4_0 ones (k_type / v_type): then the scores are that type's
 * matmul's, of the keys against the queries quantized as its activations
 * (as llama.cpp computes them over a quantized cache), and the weighted
 * sums read the value rows dequantized.
 *
 * Positions are taken in segments of SEGMENT (aligned to absolute positions).
 * Within a segment, a softmax state (running max m, normalizer l, output
 * accumulator) is updated block by block (online softmax: no full score row
 * is ever held); the segments' states are then merged in order. Work items
 * are (KV head, tile of query rows): each block's K and V rows are read once
 * per item and used by every row of the tile and every query head of the
 * group, as small matrix products (the scores of all the item's queries
 * against the block's keys in one gemm; the weighted sums of V for several
 * queries in one pass over V), each query's numbers exactly as if it were
 * alone (the kernels' contract, quants.h). Where the level has the kernels
 * (an F16 gemm, wsum_many_f16) they read the f16 cache itself; elsewhere
 * a block's rows are first converted to float: the same numbers, f16 -> f32
 * being exact. A one-row step
 * (decode) on several threads instead makes each (KV head, segment) an
 * item, so every thread shares a long context; the states go to shared
 * scratch and the last item to finish merges them. Both schedules do the
 * same arithmetic in the same order, so a token's output depends neither
 * on batching nor on threads.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "core.h"

#define Q_TILE 16      /* query rows per work item, fewer where many query heads share a KV head */
#define SEGMENT 128    /* positions per segment (a multiple of any block size used) */

/* per query row and head: running max, normalizer, then head_dim_v accumulators */
#define STATE_FLOATS(hd) (2 + (size_t)(hd))

/* query rows per work item: Q_TILE, or as many as keep 256 query vectors (MQA over 16+ heads) */
static inline int tile_rows(int group) { return group >= 256 ? 1 : group > 16 ? 256 / group : Q_TILE; }

/* floats of one query vector quantized for the scores over a quantized K pool (both Q8_0 and
 * Q4_0 take their activations as ACT_Q8_32 blocks) */
static size_t quantized_query_floats(int hd) {
    return (act_row_bytes(ACT_Q8_32, hd) + sizeof(float) - 1) / sizeof(float);
}

size_t attention_scratch_floats(int head_dim, int head_dim_v, int group, int block_size) {
    const size_t nq = (size_t)tile_rows(group) * group; /* query vectors per work item */
    return 2 * nq * STATE_FLOATS(head_dim_v) + (size_t)block_size * (head_dim + head_dim_v) + nq * head_dim +
           nq * quantized_query_floats(head_dim) + nq * (size_t)block_size;
}


/* scores[q * n + i] = k_i . q_q for the n key rows kc (stride bytes apart)
 * and the nq query rows (qs as floats, qq quantized: see pack_queries), each
 * pair with the dot's steps however many share a call. An f16 pool: straight
 * from the cache where the level has an F16 gemm, else through float copies
 * in kb (the same numbers); a quantized pool: its matmul's kernels. */
static void block_scores(const float *qs, const void *qq, int nq, const uint8_t *kc, int k_type, int64_t stride,
                         int n, int hd, float *kb, float *scores) {
    const size_t rb = (size_t)hd * sizeof(float);
    if (k_type != T_F16) {
        const size_t qrb = act_row_bytes(type_info(k_type)->act, hd);
        gemm_rows(k_type, hd, kc, (size_t)stride, n, qq, qrb, nq, scores, (size_t)n);
        return;
    }
    if (K.gemm[T_F16]) {
        K.gemm[T_F16](hd, kc, (size_t)stride, n, qs, rb, nq, scores, (size_t)n);
        return;
    }
    K.f16_to_f32((const f16_t *)kc, stride / (int64_t)sizeof(f16_t), n, kb, hd);
    gemm_rows(T_F32, hd, (const uint8_t *)kb, rb, n, (const uint8_t *)qs, rb, nq, scores, (size_t)n);
}

/* y = y * a + x * b and y = y * a: restrict-qualified, so the compiler vectorizes them */
static void scale_add(float *restrict y, float a, const float *restrict x, float b, int n) {
    for (int d = 0; d < n; d++) y[d] = y[d] * a + x[d] * b;
}

static void scale_by(float *restrict y, float a, int n) {
    for (int d = 0; d < n; d++) y[d] *= a;
}

/* The softmax part of one query's update by n positions with scores s:
 * s becomes the weights exp(score - m) of the new running max m, and what
 * was summed so far is rescaled to it. The weighted sum of V rows is left
 * to the caller (several queries' sums share the loads of V). */
static void softmax_step(float *state, float *s, int n, int hd, float scale, float softcap, float slope,
                         int32_t dist) {
    float *m = &state[0], *l = &state[1];
    if (softcap > 0)
        K.softcap(n, s, scale, softcap); /* s = softcap * tanh(scale * s / softcap) */
    else
        for (int i = 0; i < n; i++) s[i] *= scale;
    if (slope != 0.0f) /* ALiBi: score i is dist + i positions from the query's (either way) */
        for (int i = 0; i < n; i++) s[i] -= slope * (float)abs(dist + i);
    float mx[4] = {-FLT_MAX, -FLT_MAX, -FLT_MAX, -FLT_MAX}; /* four chains: max is exact in any order */
    for (int i = 0; i < n; i++) mx[i & 3] = s[i] > mx[i & 3] ? s[i] : mx[i & 3];
    const float bmax = fmaxf(fmaxf(mx[0], mx[1]), fmaxf(mx[2], mx[3]));
    if (bmax > *m) { /* new running max: rescale what was summed so far */
        float c = expf(*m - bmax);
        *l *= c;
        scale_by(state + 2, c, hd);
        *m = bmax;
    }
    *l += K.exp_sum(n, s, *m); /* s[i] = exp(s[i] - m), l += sum_i s[i] */
}

/* acc_q += sum_i w_q[i] v_i for nq queries (weights of stride ws, states of
 * stride sf) over the n value rows vc (stride bytes apart) of format v_type:
 * straight from the cache where the level can, else through float copies
 * in vb */
static void weighted_sum(int nq, const float *w, int64_t ws, const uint8_t *vc, int v_type, int64_t stride, int n,
                         int hd, float *vb, float *state, size_t sf) {
    if (v_type == T_Q8_0 && K.wsum_many_q8_0) {
        K.wsum_many_q8_0(hd, n, nq, w, ws, vc, stride, state + 2, (int64_t)sf);
        return;
    } else if (v_type != T_F16) {
        for (int i = 0; i < n; i++) K.dequant[v_type](vc + (size_t)i * stride, vb + (size_t)i * hd, hd);
    } else if (K.wsum_many_f16) {
        K.wsum_many_f16(hd, n, nq, w, ws, (const f16_t *)vc, stride / (int64_t)sizeof(f16_t), state + 2, (int64_t)sf);
        return;
    } else {
        K.f16_to_f32((const f16_t *)vc, stride / (int64_t)sizeof(f16_t), n, vb, hd);
    }
    if (K.wsum_many_f32) {
        K.wsum_many_f32(hd, n, nq, w, ws, vb, hd, state + 2, (int64_t)sf);
        return;
    }
    for (int q = 0; q < nq; q++) K.wsum_f32(hd, n, w + q * ws, vb, hd, state + q * sf + 2);
}

/* the first position row t sees: the window's (OPF_NON_CAUSAL: half of it back), or its chunk's (OPF_CHUNKED) */
static inline int32_t first_visible(const pyllm_op *op, int32_t p) {
    if (op->window > 0 && op->flags & OPF_CHUNKED) return p - p % op->window;
    const int32_t back = op->flags & OPF_NON_CAUSAL ? op->window / 2 : op->window - 1;
    return op->window > 0 && p - back > 0 ? p - back : 0;
}

/* the last position row t (at position p) sees: its own, or in a bidirectional step the step's last,
 * or with OPF_NON_CAUSAL the step's last (a window: at most half of it ahead) */
static inline int32_t last_visible(const pyllm_op *op, const pyllm_step *st, int32_t p) {
    if (!(op->flags & OPF_NON_CAUSAL)) return st->bidirectional ? st->pos[st->n_tokens - 1] : p;
    const int32_t last = st->pos[st->n_tokens - 1];
    return op->window > 0 && p + op->window / 2 < last ? p + op->window / 2 : last;
}

float pyllm_alibi_slope(float max_bias, int h, int n_head) {
    int n = 1;
    while (n * 2 <= n_head) n *= 2;
    const float m0 = powf(2.0f, -max_bias / (float)n), m1 = powf(2.0f, -max_bias / 2.0f / (float)n);
    return h < n ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n) + 1));
}

static void state_init(float *state, int64_t n, int hd) {
    const size_t sf = STATE_FLOATS(hd);
    for (int64_t i = 0; i < n; i++) {
        state[i * sf] = -FLT_MAX;
        state[i * sf + 1] = 0.0f;
        memset(state + i * sf + 2, 0, (size_t)hd * sizeof(float));
    }
}

/* total <- the softmax state of the union of both position sets */
static void state_merge(float *total, const float *part, int hd) {
    if (part[1] == 0.0f) return; /* the part saw no position */
    float M = total[0] > part[0] ? total[0] : part[0];
    float ct = expf(total[0] - M), cp = expf(part[0] - M);
    total[0] = M;
    total[1] = total[1] * ct + part[1] * cp;
    scale_add(total + 2, ct, part + 2, cp, hd);
}

/* y = the state's output; a head's sink logit (gpt-oss; -INFINITY: none) joins
 * the normalizer as one more score whose value is zero */
static void state_output(const float *state, float *y, int hd, float sink) {
    const float M = state[0] > sink ? state[0] : sink, c = expf(state[0] - M);
    const float inv = c / (state[1] * c + expf(sink - M));
    float *restrict out = y;
    const float *restrict acc = state + 2;
    for (int d = 0; d < hd; d++) out[d] = acc[d] * inv;
}

static float head_sink(const pyllm_op *op, int h) {
    return op->w ? ((const float *)op->w)[h] : -INFINITY;
}

/* head h's output from its state, rotated back where the values were stored rotated */
static void head_output(const pyllm_op *op, const float *state, float *y, int h) {
    const int hd_v = value_dim(op);
    state_output(state, y, hd_v, head_sink(op, h));
    if (op->v_rot > 0) hadamard_rotate(y, hd_v, op->v_rot);
}

/* scratch of a work item after its states: one block's K and V rows, the
 * item's queries packed (and quantized, for a Q8_0 key pool), and one
 * block's scores of every query */
typedef struct { float *kb, *vb, *qs, *qq, *scores; } item_scratch;

static item_scratch item_scratch_at(float *p, int hd, int hd_v, int group, int block_size) {
    const size_t nq = (size_t)tile_rows(group) * group;
    item_scratch w;
    w.kb = p;
    w.vb = w.kb + (size_t)block_size * hd;
    w.qs = w.vb + (size_t)block_size * hd_v;
    w.qq = w.qs + nq * hd;
    w.scores = w.qq + nq * quantized_query_floats(hd);
    return w;
}

/* w.qs <- the query vectors of rows t0..t1 and the heads of KV head kvh, in
 * state order ((t - t0) * group + g); for a quantized key pool also w.qq,
 * each quantized as that type's matmul takes its activations */
static void pack_queries(const pyllm_op *op, int kvh, int64_t t0, int64_t t1, item_scratch w) {
    const int hd = op->head_dim, group = op->n_head / op->n_kv_head;
    for (int64_t t = t0; t < t1; t++)
        memcpy(w.qs + (t - t0) * group * hd, op->x + t * op->x_stride + (int64_t)kvh * group * hd,
               (size_t)group * hd * sizeof(float));
    if (op->k_rot > 0) hadamard_rotate(w.qs, (t1 - t0) * group * hd, op->k_rot); /* as the keys were stored */
    if (op->k_type == T_F16) return;
    const int act = type_info(op->k_type)->act;
    const size_t qrb = act_row_bytes(act, hd);
    for (int64_t q = 0; q < (t1 - t0) * group; q++) K.quantize_act[act](w.qs + q * hd, (uint8_t *)w.qq + q * qrb, hd);
}

/* the weighted sums of V over the whole block (n rows from vc) for rows
 * [u0, u1) of the tile starting at t0 (nothing when the run is empty) */
static void whole_block_sums(item_scratch w, const uint8_t *vc, int v_type, int64_t stride, int64_t u0, int64_t u1,
                             int64_t t0, int group, int n, int hd, float *state, size_t sf) {
    if (u1 <= u0) return;
    const int64_t q0 = (u0 - t0) * group;
    weighted_sum((int)((u1 - u0) * group), w.scores + q0 * n, n, vc, v_type, stride, n, hd, w.vb, state + q0 * sf,
                 sf);
}

/* Adds positions [from, to] (as far as each row sees them) to the softmax
 * state of rows t0..t1 and every query head of KV head kvh: state holds
 * (t1 - t0) * group entries, w.qs their queries. Per block: every query's
 * scores against the block's keys at once; then each query's softmax step
 * over the part it sees; then the weighted sums of V, shared by the runs of
 * rows that see the whole block (one row at a time where a row sees part). */
static void attend_range(const pyllm_op *op, const op_rows *r, int kvh, int64_t t0, int64_t t1, int32_t from,
                         int32_t to, float *state, item_scratch w) {
    const pyllm_step *st = r->step;
    const int32_t *table = row_blocks(st, t0); /* every row of the item is of one sequence */
    const int hd = op->head_dim, hd_v = value_dim(op), B = st->block_size;
    const int group = op->n_head / op->n_kv_head;
    const int v_in_k = op->flags & OPF_V_IN_K;
    const int k_type = op->k_type, v_type = v_in_k ? op->k_type : op->v_type;
    /* bytes between positions in the K pool and in the V pool (the K pool's, values read from keys) */
    const int64_t k_row = kv_bytes(k_type, (int64_t)op->n_kv_head * hd);
    const int64_t v_row = v_in_k ? k_row : kv_bytes(v_type, (int64_t)op->n_kv_head * hd_v);
    const uint8_t *k_pool = op->k_cache, *v_pool = v_in_k ? op->k_cache : op->v_cache;
    const int64_t k_head = kv_bytes(k_type, hd), v_head = kv_bytes(v_type, v_in_k ? hd : hd_v); /* head to head */
    const int64_t k_read = k_head, v_read = kv_bytes(v_type, hd_v); /* bytes one head's row reads */
    const size_t sf = STATE_FLOATS(hd_v);
    const int32_t *pos = st->pos;
    float slopes[group]; /* ALiBi's slope of each query head of the group (0: none), worked out once */
    for (int g = 0; g < group; g++)
        slopes[g] = op->alibi > 0 ? pyllm_alibi_slope(op->alibi, kvh * group + g, op->n_head) : 0.0f;

    for (int32_t blk = from / B; blk <= to / B; blk++) {
        const size_t base = (size_t)table[blk] * B;
        int32_t j0 = blk * B > from ? blk * B : from;
        int32_t j1 = (blk + 1) * B - 1 < to ? (blk + 1) * B - 1 : to;
        const int n = j1 - j0 + 1;
        if (blk < to / B) /* the next block's K and V rows, read while this one is worked on */
            for (int32_t i = 0; i < B; i++) {
                const size_t row = (size_t)table[blk + 1] * B + (size_t)i;
                const uint8_t *kp = k_pool + row * k_row + kvh * k_head, *vp = v_pool + row * v_row + kvh * v_head;
                for (int64_t b = 0; b < k_read; b += 64) __builtin_prefetch(kp + b);
                for (int64_t b = 0; !v_in_k && b < v_read; b += 64) __builtin_prefetch(vp + b);
            }
        const size_t row = base + (size_t)(j0 - blk * B);
        const uint8_t *kc = k_pool + row * k_row + kvh * k_head, *vc = v_pool + row * v_row + kvh * v_head;
        block_scores(w.qs, w.qq, (int)((t1 - t0) * group), kc, k_type, k_row, n, hd, w.kb, w.scores);
        /* each row's softmax step over the part of [j0, j1] it sees; the
         * weighted sums of V for runs of rows that see all of it at once */
        int64_t run = t0; /* first row of the current run of such rows */
        for (int64_t t = t0; t < t1; t++) {
            const int32_t first = first_visible(op, pos[t]), last = last_visible(op, st, pos[t]);
            const int32_t a = first > j0 ? first : j0, b = last < j1 ? last : j1;
            for (int g = 0; a <= b && g < group; g++) {
                int64_t q = (t - t0) * group + g;
                softmax_step(state + q * sf, w.scores + q * n + (a - j0), b - a + 1, hd_v, op->scale, op->softcap,
                             slopes[g], a - pos[t]);
            }
            if (a == j0 && b == j1) continue; /* the run goes on */
            whole_block_sums(w, vc, v_type, v_row, run, t, t0, group, n, hd_v, state, sf);
            run = t + 1;
            if (a <= b) { /* this row alone, over the part it sees */
                int64_t q0 = (t - t0) * group;
                weighted_sum(group, w.scores + q0 * n + (a - j0), n, vc + (int64_t)(a - j0) * v_row, v_type, v_row,
                             b - a + 1, hd_v, w.vb, state + q0 * sf, sf);
            }
        }
        whole_block_sums(w, vc, v_type, v_row, run, t1, t0, group, n, hd_v, state, sf);
    }
}

/* rows t0..t1, every head of KV head kvh, over all they see: into y */
static void attend_tile(const pyllm_op *op, const op_rows *r, int kvh, int64_t t0, int64_t t1) {
    const int hd = op->head_dim, hd_v = value_dim(op), group = op->n_head / op->n_kv_head;
    const int32_t *pos = r->step->pos;
    const size_t sf = STATE_FLOATS(hd_v);
    const int64_t n_states = (t1 - t0) * group;
    int32_t lo = INT32_MAX, hi = 0; /* the positions any row of the tile sees */
    for (int64_t t = t0; t < t1; t++) {
        if (first_visible(op, pos[t]) < lo) lo = first_visible(op, pos[t]);
        if (last_visible(op, r->step, pos[t]) > hi) hi = last_visible(op, r->step, pos[t]);
    }
    /* scratch: the total and the current segment's state of every (row, head),
     * then the item's working space */
    const size_t tile_states = (size_t)tile_rows(group) * group;
    float *total = r->scratch, *seg = total + tile_states * sf;
    const item_scratch w = item_scratch_at(seg + tile_states * sf, hd, hd_v, group, r->step->block_size);
    pack_queries(op, kvh, t0, t1, w);
    state_init(total, n_states, hd_v);
    for (int32_t k = lo / SEGMENT; k <= hi / SEGMENT; k++) {
        int32_t from = k * SEGMENT > lo ? k * SEGMENT : lo;
        int32_t to = (k + 1) * SEGMENT - 1 < hi ? (k + 1) * SEGMENT - 1 : hi;
        state_init(seg, n_states, hd_v);
        attend_range(op, r, kvh, t0, t1, from, to, seg, w);
        for (int64_t i = 0; i < n_states; i++) state_merge(total + i * sf, seg + i * sf, hd_v);
    }
    for (int64_t t = t0; t < t1; t++)
        for (int g = 0; g < group; g++)
            head_output(op, total + ((t - t0) * group + g) * sf, op->y + t * op->y_stride + (int64_t)(kvh * group + g) * hd_v,
                        kvh * group + g);
}

/* One row (decode) on several threads: items are (KV head,
 * segment); each item's state goes to the shared scratch, and whoever
 * finishes the last item merges them in order, as attend_tile does. */
static void attend_split(const pyllm_op *op, const op_rows *r, int32_t seg0, int n_seg, int ith, int nth) {
    const int hd = op->head_dim, hd_v = value_dim(op), group = op->n_head / op->n_kv_head;
    const size_t sf = STATE_FLOATS(hd_v);
    const int32_t p = r->step->pos[0], first = first_visible(op, p);
    const int64_t items = (int64_t)op->n_kv_head * n_seg;
    const item_scratch w = item_scratch_at(r->scratch, hd, hd_v, group, r->step->block_size);
    int64_t lo, hi;
    split_range(items, ith, nth, 1, &lo, &hi);
    for (int64_t item = lo; item < hi; item++) {
        int kvh = (int)(item % op->n_kv_head);
        int32_t k = seg0 + (int32_t)(item / op->n_kv_head);
        int32_t from = k * SEGMENT > first ? k * SEGMENT : first;
        int32_t to = (k + 1) * SEGMENT - 1 < p ? (k + 1) * SEGMENT - 1 : p;
        float *state = r->shared + (size_t)item * group * sf;
        state_init(state, group, hd_v);
        pack_queries(op, kvh, 0, 1, w);
        attend_range(op, r, kvh, 0, 1, from, to, state, w);
    }
    if (hi == lo || atomic_fetch_add_explicit(r->counter, hi - lo, memory_order_acq_rel) + (hi - lo) != items)
        return;
    /* the last to finish: every item's state is written (acquire above) */
    float *total = r->scratch;
    for (int h = 0; h < op->n_head; h++) {
        int kvh = h / group, g = h % group;
        state_init(total, 1, hd_v);
        for (int s = 0; s < n_seg; s++)
            state_merge(total, r->shared + ((size_t)(s * op->n_kv_head + kvh) * group + g) * sf, hd_v);
        head_output(op, total, op->y + (int64_t)h * hd_v, h);
    }
}

void op_attention(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    /* one row: (KV head, segment) items as soon as there are segments to
     * share (with KV heads alone as items, 3 heads on 2 threads left one
     * thread idle half the time) */
    if (r->rows == 1 && nth > 1) {
        const int32_t p = r->step->pos[0], seg0 = first_visible(op, p) / SEGMENT;
        const int n_seg = p / SEGMENT - seg0 + 1;
        const size_t need = (size_t)op->n_kv_head * n_seg * (op->n_head / op->n_kv_head) *
                            STATE_FLOATS(value_dim(op));
        if (n_seg > 1 && need <= SHARED_FLOATS) {
            attend_split(op, r, seg0, n_seg, ith, nth);
            return;
        }
    }
    /* items handed out one at a time, last tiles first: a causal prompt's
     * later rows see more positions (a fixed split gave the last thread
     * most of the work). Rows of several sequences: a row to a tile, as
     * each reads its own sequence's blocks. */
    const int rows = r->step->row_table ? 1 : tile_rows(op->n_head / op->n_kv_head);
    const int64_t tiles = (r->rows + rows - 1) / rows, items = tiles * op->n_kv_head;
    for (int64_t item; (item = atomic_fetch_add_explicit(r->counter, 1, memory_order_relaxed)) < items;) {
        int kvh = (int)(item % op->n_kv_head);
        int64_t t0 = (tiles - 1 - item / op->n_kv_head) * rows;
        int64_t t1 = t0 + rows < r->rows ? t0 + rows : r->rows;
        attend_tile(op, r, kvh, t0, t1);
    }
}
