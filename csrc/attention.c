/* attention.c: causal attention over the paged KV cache, online softmax.
 *
 * For query row t at position p and head h (key/value head h / group):
 *     y = sum_j softmax_j(scale * q.k_j) v_j     over j in [max(0, p-window+1), p]
 *
 * K and V live in f16 blocks of B positions; the step's block table maps
 * position j to block table[j / B], slot j % B. The work is split into items
 * of (key/value head, tile of query rows). An item walks the KV blocks that
 * its tile can see; each block's K and V rows (of its head) are converted to
 * float once and then used by every query row of the tile and every query
 * head of the group. Per query head the running max m, normalizer l and
 * output accumulator are updated once per block (online softmax): no full
 * score row is ever held.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "core.h"

#define Q_TILE 16      /* query rows per work item */

/* per query row and head: running max, normalizer, then head_dim accumulators */
#define STATE_FLOATS(hd) (2 + (size_t)(hd))

size_t attention_scratch_floats(int head_dim, int group, int block_size) {
    return (size_t)Q_TILE * group * STATE_FLOATS(head_dim) + 2 * (size_t)block_size * head_dim;
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

static void attend_tile(const pyllm_op *op, const op_rows *r, int kvh, int64_t t0, int64_t t1) {
    const pyllm_step *st = r->step;
    const int hd = op->head_dim, B = st->block_size;
    const int group = op->n_head / op->n_kv_head;
    const int64_t kv_dim = (int64_t)op->n_kv_head * hd;
    const int32_t *pos = st->pos;

    /* the positions any row of the tile can see */
    int32_t lo = INT32_MAX, hi = 0;
    for (int64_t t = t0; t < t1; t++) {
        int32_t first = op->window > 0 && pos[t] - op->window + 1 > 0 ? pos[t] - op->window + 1 : 0;
        if (first < lo) lo = first;
        if (pos[t] > hi) hi = pos[t];
    }

    /* scratch: the softmax state of every (row, head), then one block's K and V rows */
    const size_t sf = STATE_FLOATS(hd);
    float *state = r->scratch;
    float *kb = state + (size_t)Q_TILE * group * sf, *vb = kb + (size_t)B * hd;
    for (int64_t i = 0; i < (t1 - t0) * group; i++) {
        state[i * sf] = -FLT_MAX;
        state[i * sf + 1] = 0.0f;
        memset(state + i * sf + 2, 0, (size_t)hd * sizeof(float));
    }

    for (int32_t blk = lo / B; blk <= hi / B; blk++) {
        const size_t base = (size_t)st->block_table[blk] * B;
        int32_t j0 = blk * B > lo ? blk * B : lo;
        int32_t j1 = (blk + 1) * B - 1 < hi ? (blk + 1) * B - 1 : hi;
        for (int32_t j = j0; j <= j1; j++) {
            size_t slot = (base + (size_t)(j - blk * B)) * kv_dim + (size_t)kvh * hd;
            K.f16_to_f32(op->k_cache + slot, kb + (int64_t)(j - j0) * hd, hd);
            K.f16_to_f32(op->v_cache + slot, vb + (int64_t)(j - j0) * hd, hd);
        }
        for (int64_t t = t0; t < t1; t++) {
            /* the part of [j0, j1] this row sees */
            int32_t first = op->window > 0 && pos[t] - op->window + 1 > 0 ? pos[t] - op->window + 1 : 0;
            int32_t a = first > j0 ? first : j0, b = pos[t] < j1 ? pos[t] : j1;
            if (a > b) continue;
            for (int g = 0; g < group; g++) {
                int h = kvh * group + g;
                const float *q = op->x + t * op->x_stride + (int64_t)h * hd;
                attend_block(state + ((t - t0) * group + g) * sf, q, kb + (int64_t)(a - j0) * hd, vb + (int64_t)(a - j0) * hd,
                             b - a + 1, hd, op->scale, op->softcap);
            }
        }
    }

    for (int64_t t = t0; t < t1; t++)
        for (int g = 0; g < group; g++) {
            const float *s = state + ((t - t0) * group + g) * sf;
            float *y = op->y + t * op->y_stride + (int64_t)(kvh * group + g) * hd;
            float inv = 1.0f / s[1];
            for (int d = 0; d < hd; d++) y[d] = s[2 + d] * inv;
        }
}

void op_attention(const pyllm_op *op, const op_rows *r, int ith, int nth) {
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
