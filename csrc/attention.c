/* attention.c: causal attention over the paged KV cache, online softmax.
 *
 * For query row t at position p, head h (key/value head h / (n_head/n_kv_head)):
 *     y = sum_j softmax_j(scale * q.k_j) v_j     over j in [max(0, p-window+1), p]
 * K and V rows live in f16 blocks of block_size positions; the step's block
 * table maps position j to block table[j / B], slot j % B. Scores are taken a
 * chunk of positions at a time: the running max and the output accumulator
 * are rescaled once per chunk, never holding a full score row.
 */
#include <float.h>
#include <math.h>

#include "core.h"

#define CHUNK 64

static inline const uint16_t *kv_row(const uint16_t *cache, const pyllm_step *st, int32_t j, int64_t kv_dim) {
    size_t slot = (size_t)st->block_table[j / st->block_size] * st->block_size + j % st->block_size;
    return cache + slot * kv_dim;
}

static void attend_one(const pyllm_op *op, const pyllm_step *st, const float *q, int32_t p, int kvh, float *y) {
    const int hd = op->head_dim;
    const int64_t kv_dim = (int64_t)op->n_kv_head * hd;
    const int32_t first = op->window > 0 && p - op->window + 1 > 0 ? p - op->window + 1 : 0;
    float acc[MAX_HEAD_DIM] = {0};
    float scores[CHUNK];
    float m = -FLT_MAX, l = 0.0f;

    for (int32_t j0 = first; j0 <= p; j0 += CHUNK) {
        int nj = p - j0 + 1 < CHUNK ? p - j0 + 1 : CHUNK;
        float cmax = -FLT_MAX;
        for (int i = 0; i < nj; i++) {
            float s = op->scale * K.dot_f16_f32(hd, kv_row(op->k_cache, st, j0 + i, kv_dim) + kvh * hd, q);
            if (op->softcap > 0) s = op->softcap * tanhf(s / op->softcap);
            scores[i] = s;
            if (s > cmax) cmax = s;
        }
        if (cmax > m) { /* new running max: rescale what was summed so far */
            float c = expf(m - cmax);
            l *= c;
            for (int d = 0; d < hd; d++) acc[d] *= c;
            m = cmax;
        }
        for (int i = 0; i < nj; i++) {
            float w = expf(scores[i] - m);
            l += w;
            K.axpy_f16(hd, w, kv_row(op->v_cache, st, j0 + i, kv_dim) + kvh * hd, acc);
        }
    }
    float inv = 1.0f / l;
    for (int d = 0; d < hd; d++) y[d] = acc[d] * inv;
}

void op_attention(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const int group = op->n_head / op->n_kv_head;
    int64_t lo, hi;
    split_range((int64_t)r->rows * op->n_head, ith, nth, 1, &lo, &hi);
    for (int64_t item = lo; item < hi; item++) {
        int64_t t = item / op->n_head;
        int h = (int)(item % op->n_head);
        const float *q = op->x + t * op->x_stride + (int64_t)h * op->head_dim;
        float *y = op->y + t * op->y_stride + (int64_t)h * op->head_dim;
        attend_one(op, r->step, q, r->step->pos[t], h / group, y);
    }
}
