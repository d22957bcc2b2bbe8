/* attention.c: causal attention over the paged KV cache, online softmax.
 *
 * For query row t at position p and head h (key/value head h / group):
 *     y = sum_j softmax_j(scale * q.k_j) v_j     over j in [max(0, p-window+1), p]
 *
 * K and V live in f16 blocks of B positions; the step's block table maps
 * position j to block table[j / B], slot j % B.
 *
 * Positions are taken in segments of SEGMENT (aligned to absolute positions).
 * Within a segment, a softmax state (running max m, normalizer l, output
 * accumulator) is updated block by block (online softmax: no full score row
 * is ever held); the segments' states are then merged in order. Work items
 * are (KV head, tile of query rows): each block's K and V rows are converted
 * to float once per item and used by every row of the tile and every query
 * head of the group. A one-row step (decode) with fewer KV heads than
 * threads instead makes each (KV head, segment) an item, so every thread
 * shares a long context; the states go to shared scratch and the last item
 * to finish merges them. Both schedules do the same arithmetic in the same
 * order, so a token's output depends neither on batching nor on threads.
 */
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core.h"

#define Q_TILE 16      /* query rows per work item */
#define SEGMENT 128    /* positions per segment (a multiple of any block size used) */

/* per query row and head: running max, normalizer, then head_dim accumulators */
#define STATE_FLOATS(hd) (2 + (size_t)(hd))

size_t attention_scratch_floats(int head_dim, int group, int block_size) {
    return 2 * (size_t)Q_TILE * group * STATE_FLOATS(head_dim) + 2 * (size_t)block_size * head_dim;
}

/* one query row of one head over positions [j0, j0+n) of a converted block */
static void attend_block(float *state, const float *q, const float *kb, const float *vb, int n, int hd,
                         float scale, float softcap) {
    float *m = &state[0], *l = &state[1], *acc = state + 2;
    float s[MAX_KV_BLOCK];
    float bmax = -FLT_MAX;
    /* s[i] = k_i . q for the n key rows at once (the F32 matmul kernel: the
     * rows share the loads of q), or one dot at a time */
    if (K.gemv[T_F32])
        K.gemv[T_F32](hd, kb, (size_t)hd * sizeof(float), n, q, s);
    else
        for (int i = 0; i < n; i++) s[i] = K.vec_dot[T_F32](hd, kb + (int64_t)i * hd, q);
    for (int i = 0; i < n; i++) {
        float x = scale * s[i];
        if (softcap > 0) x = softcap * tanhf(x / softcap);
        s[i] = x;
        if (x > bmax) bmax = x;
    }
    if (bmax > *m) { /* new running max: rescale what was summed so far */
        float c = expf(*m - bmax);
        *l *= c;
        for (int d = 0; d < hd; d++) acc[d] *= c;
        *m = bmax;
    }
    *l += K.exp_sum(n, s, *m); /* s[i] = exp(s[i] - m), l += sum_i s[i] */
    K.wsum_f32(hd, n, s, vb, hd, acc); /* acc += sum_i s[i] v_i (an axpy per row, acc in registers) */
}

/* the first position row t sees */
static inline int32_t first_visible(const pyllm_op *op, int32_t p) {
    return op->window > 0 && p - op->window + 1 > 0 ? p - op->window + 1 : 0;
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
    for (int d = 0; d < hd; d++) total[2 + d] = total[2 + d] * ct + part[2 + d] * cp;
}

static void state_output(const float *state, float *y, int hd) {
    float inv = 1.0f / state[1];
    for (int d = 0; d < hd; d++) y[d] = state[2 + d] * inv;
}

/* Adds positions [from, to] (as far as each row sees them) to the softmax
 * state of rows t0..t1 and every query head of KV head kvh: state holds
 * (t1 - t0) * group entries. kb/vb: room for one block of K and V rows. */
static void attend_range(const pyllm_op *op, const op_rows *r, int kvh, int64_t t0, int64_t t1, int32_t from,
                         int32_t to, float *state, float *kb, float *vb) {
    const pyllm_step *st = r->step;
    const int hd = op->head_dim, B = st->block_size;
    const int group = op->n_head / op->n_kv_head;
    const int64_t kv_dim = (int64_t)op->n_kv_head * hd;
    const size_t sf = STATE_FLOATS(hd);
    const int32_t *pos = st->pos;

    for (int32_t blk = from / B; blk <= to / B; blk++) {
        const size_t base = (size_t)st->block_table[blk] * B;
        int32_t j0 = blk * B > from ? blk * B : from;
        int32_t j1 = (blk + 1) * B - 1 < to ? (blk + 1) * B - 1 : to;
        for (int32_t j = j0; j <= j1; j++) {
            size_t slot = (base + (size_t)(j - blk * B)) * kv_dim + (size_t)kvh * hd;
            K.f16_to_f32(op->k_cache + slot, kb + (int64_t)(j - j0) * hd, hd);
            K.f16_to_f32(op->v_cache + slot, vb + (int64_t)(j - j0) * hd, hd);
        }
        for (int64_t t = t0; t < t1; t++) {
            /* the part of [j0, j1] this row sees */
            int32_t first = first_visible(op, pos[t]);
            int32_t a = first > j0 ? first : j0, b = pos[t] < j1 ? pos[t] : j1;
            if (a > b) continue;
            for (int g = 0; g < group; g++) {
                int h = kvh * group + g;
                const float *q = op->x + t * op->x_stride + (int64_t)h * hd;
                attend_block(state + ((t - t0) * group + g) * sf, q, kb + (int64_t)(a - j0) * hd,
                             vb + (int64_t)(a - j0) * hd, b - a + 1, hd, op->scale, op->softcap);
            }
        }
    }
}

/* rows t0..t1, every head of KV head kvh, over all they see: into y */
static void attend_tile(const pyllm_op *op, const op_rows *r, int kvh, int64_t t0, int64_t t1) {
    const int hd = op->head_dim, group = op->n_head / op->n_kv_head;
    const int32_t *pos = r->step->pos;
    const size_t sf = STATE_FLOATS(hd);
    const int64_t n_states = (t1 - t0) * group;
    int32_t lo = INT32_MAX, hi = 0; /* the positions any row of the tile sees */
    for (int64_t t = t0; t < t1; t++) {
        if (first_visible(op, pos[t]) < lo) lo = first_visible(op, pos[t]);
        if (pos[t] > hi) hi = pos[t];
    }
    /* scratch: the total and the current segment's state of every (row, head),
     * then one block's K and V rows */
    float *total = r->scratch, *seg = total + (size_t)Q_TILE * group * sf;
    float *kb = seg + (size_t)Q_TILE * group * sf, *vb = kb + (size_t)r->step->block_size * hd;
    state_init(total, n_states, hd);
    for (int32_t k = lo / SEGMENT; k <= hi / SEGMENT; k++) {
        int32_t from = k * SEGMENT > lo ? k * SEGMENT : lo;
        int32_t to = (k + 1) * SEGMENT - 1 < hi ? (k + 1) * SEGMENT - 1 : hi;
        state_init(seg, n_states, hd);
        attend_range(op, r, kvh, t0, t1, from, to, seg, kb, vb);
        for (int64_t i = 0; i < n_states; i++) state_merge(total + i * sf, seg + i * sf, hd);
    }
    for (int64_t t = t0; t < t1; t++)
        for (int g = 0; g < group; g++)
            state_output(total + ((t - t0) * group + g) * sf, op->y + t * op->y_stride + (int64_t)(kvh * group + g) * hd,
                         hd);
}

/* One row (decode) with fewer KV heads than threads: items are (KV head,
 * segment); each item's state goes to the shared scratch, and whoever
 * finishes the last item merges them in order, as attend_tile does. */
static void attend_split(const pyllm_op *op, const op_rows *r, int32_t seg0, int n_seg, int ith, int nth) {
    const int hd = op->head_dim, group = op->n_head / op->n_kv_head;
    const size_t sf = STATE_FLOATS(hd);
    const int32_t p = r->step->pos[0], first = first_visible(op, p);
    const int64_t items = (int64_t)op->n_kv_head * n_seg;
    float *kb = r->scratch, *vb = kb + (size_t)r->step->block_size * hd;
    int64_t lo, hi;
    split_range(items, ith, nth, 1, &lo, &hi);
    for (int64_t item = lo; item < hi; item++) {
        int kvh = (int)(item / n_seg);
        int32_t k = seg0 + (int32_t)(item % n_seg);
        int32_t from = k * SEGMENT > first ? k * SEGMENT : first;
        int32_t to = (k + 1) * SEGMENT - 1 < p ? (k + 1) * SEGMENT - 1 : p;
        float *state = r->shared + (size_t)item * group * sf;
        state_init(state, group, hd);
        attend_range(op, r, kvh, 0, 1, from, to, state, kb, vb);
    }
    if (hi == lo || atomic_fetch_add_explicit(r->counter, hi - lo, memory_order_acq_rel) + (hi - lo) != items)
        return;
    /* the last to finish: every item's state is written (acquire above) */
    float *total = r->scratch;
    for (int h = 0; h < op->n_head; h++) {
        int kvh = h / group, g = h % group;
        state_init(total, 1, hd);
        for (int s = 0; s < n_seg; s++)
            state_merge(total, r->shared + ((size_t)(kvh * n_seg + s) * group + g) * sf, hd);
        state_output(total, op->y + (int64_t)h * hd, hd);
    }
}

void op_attention(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    if (r->rows == 1 && op->n_kv_head < nth) {
        const int32_t p = r->step->pos[0], seg0 = first_visible(op, p) / SEGMENT;
        const int n_seg = p / SEGMENT - seg0 + 1;
        const size_t need = (size_t)op->n_kv_head * n_seg * (op->n_head / op->n_kv_head) *
                            STATE_FLOATS(op->head_dim);
        if (n_seg > 1 && need <= SHARED_FLOATS) {
            attend_split(op, r, seg0, n_seg, ith, nth);
            return;
        }
    }
    const int64_t tiles = (r->rows + Q_TILE - 1) / Q_TILE;
    int64_t lo, hi;
    split_range(tiles * op->n_kv_head, ith, nth, 1, &lo, &hi);
    for (int64_t item = lo; item < hi; item++) {
        int kvh = (int)(item % op->n_kv_head);
        int64_t t0 = item / op->n_kv_head * Q_TILE;
        int64_t t1 = t0 + Q_TILE < r->rows ? t0 + Q_TILE : r->rows;
        attend_tile(op, r, kvh, t0, t1);
    }
}
