/* attention.cu: causal attention over the paged f16 KV cache.
 *
 * For query row t at position p and head h (KV head h / group):
 *     y = sum_j softmax_j(scale * q.k_j) v_j   over j in [max(0, p - window + 1), p]
 * (OPF_NON_CAUSAL: over [0, the step's last position], every row alike, or with a window over
 * the positions within window / 2 of p either way; a bidirectional step: up to the step's last
 * position instead of p, from the same first)
 * (scores soft-capped as softcap * tanh(s / softcap) when softcap > 0; a head's sink
 * logit, when given, joins the softmax's normalizer; with ALiBi, alibi > 0, the score of
 * position j gains -slope_h |p - j|, slope_h as pyllm_alibi_slope). Keys have head_dim dims, values
 * and y's heads head_dim_v; with OPF_V_IN_K there is no V pool and a value is the first
 * head_dim_v dims of its key row (MLA's latent, stored once).
 *
 * One block of 128 threads per (head, query row). It walks the visible
 * positions in tiles of 128: each warp scores every 4th position of the tile
 * (lanes split the head dims, K read through the block table), then the tile's
 * max updates the running max m (rescaling the running sum l and the output
 * accumulators, online softmax as in csrc/attention.c), the weights
 * exp(s - m) go to shared memory, and each thread accumulates its value dims
 * (tid + 128 i for i < ceil(head_dim_v / 128): 5 at most, for 576) over the
 * tile's V rows. No score row longer than a tile is ever held. Simple, not
 * fast: K/V are re-read per query head and per row (mostly from L2; MLA's
 * 16 heads on one KV head re-read its 576-dim keys 16 times); a
 * flash-attention kernel that shares a K/V tile between the heads of a group
 * and many rows is the obvious next step.
 */
#include <cfloat>

#include "common.cuh"

namespace pq {

constexpr int ATT_TILE = 128;
constexpr int ATT_THREADS = 128;
constexpr int ATT_MAX_NV = (MAX_HEAD_DIM + ATT_THREADS - 1) / ATT_THREADS;  /* 5: MLA's 576 */

/* NV: value dims per thread, head_dim_v <= NV * ATT_THREADS; one instance per NV, so a
 * 64- or 128-dim head holds 1 accumulator, not MAX_HEAD_DIM's 5.
 * Keys: k_stride f16 per position, head kvh at kvh * hd; values: v_stride per position, head
 * kvh at kvh * v_head (with OPF_V_IN_K, Vc is the K pool and these are the keys' own). */
/* ALiBi's slope of head h (pyllm_alibi_slope's formula, csrc/attention.c) */
__device__ inline float alibi_slope(float max_bias, int h, int n_head) {
    int n = 1;
    while (n * 2 <= n_head) n *= 2;
    const float m0 = powf(2.0f, -max_bias / (float)n), m1 = powf(2.0f, -max_bias / 2.0f / (float)n);
    return h < n ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n) + 1));
}

template <int NV>
__global__ void __launch_bounds__(ATT_THREADS)
attention_kernel(const float *__restrict__ Q, int64_t q_stride, float *__restrict__ Y, int64_t y_stride,
                 const __half *__restrict__ Kc, const __half *__restrict__ Vc, const int32_t *__restrict__ pos,
                 const int32_t *__restrict__ table, int block_size, int n_head, int n_kv_head, int hd, int hd_v,
                 int64_t v_stride, int64_t v_head, float scale, float softcap, int window,
                 const float *__restrict__ sinks, bool non_causal, bool bidirectional, float alibi) {
    PQ_EXTERN_SHARED(float, sm);
    float *s_q = sm;                                              /* hd */
    float *s_p = s_q + hd;                                        /* ATT_TILE scores, then weights */
    long long *s_slot = reinterpret_cast<long long *>(sm + ((hd + ATT_TILE + 1) & ~1)); /* ATT_TILE pool rows */
    const int h = blockIdx.x, t = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int group = n_head / n_kv_head, kvh = h / group;
    const int64_t k_stride = (int64_t)n_kv_head * hd;
    const __half *Kh = Kc + (int64_t)kvh * hd, *Vh = Vc + (int64_t)kvh * v_head;

    for (int d = tid; d < hd; d += ATT_THREADS) s_q[d] = Q[(int64_t)t * q_stride + (int64_t)h * hd + d];
    const int p = pos[t];
    const float slope = alibi > 0.0f ? alibi_slope(alibi, h, n_head) : 0.0f;
    /* window < 0: a chunk of -window positions (OPF_CHUNKED, Llama 4) */
    const int back = non_causal ? window / 2 : window - 1;   /* bidirectional: half the window either way */
    const int first = window < 0 ? p - p % -window : window > 0 && p - back > 0 ? p - back : 0;
    int last = non_causal || bidirectional ? pos[gridDim.y - 1] : p;   /* a grid row per step row */
    if (non_causal && window > 0 && p + window / 2 < last) last = p + window / 2;
    float m = -FLT_MAX, l = 0.0f;
    float acc[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) acc[i] = 0.0f;
    __syncthreads();

    for (int j0 = first; j0 <= last; j0 += ATT_TILE) {
        const int n = min(ATT_TILE, last - j0 + 1);
        for (int jj = warp; jj < n; jj += ATT_THREADS / 32) {
            const int j = j0 + jj;
            const long long slot = (long long)table[j / block_size] * block_size + j % block_size;
            const __half *k = Kh + slot * k_stride;
            float s = 0.0f;
            for (int d = lane; d < hd; d += 32) s += __half2float(k[d]) * s_q[d];
            s = warp_sum(s);
            if (lane == 0) {
                s *= scale;
                if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
                s -= slope * (float)abs(p - j);
                s_p[jj] = s;
                s_slot[jj] = slot;
            }
        }
        __syncthreads();
        float tmax = -FLT_MAX;
        for (int jj = 0; jj < n; jj++) tmax = fmaxf(tmax, s_p[jj]);
        const float m_new = fmaxf(m, tmax);
        const float c = expf(m - m_new);   /* 0 on the first tile (m = -FLT_MAX), 1 when the max holds */
        __syncthreads();                   /* every thread has read the scores */
        if (tid < n) s_p[tid] = expf(s_p[tid] - m_new);
        __syncthreads();
        float psum = 0.0f;
        for (int jj = 0; jj < n; jj++) psum += s_p[jj];
        l = l * c + psum;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int d = tid + i * ATT_THREADS;
            if (d < hd_v) {
                float a = acc[i] * c;
                for (int jj = 0; jj < n; jj++) a += s_p[jj] * __half2float(Vh[s_slot[jj] * v_stride + d]);
                acc[i] = a;
            }
        }
        m = m_new;
        __syncthreads();                   /* before the next tile overwrites s_p, s_slot */
    }
    /* a sink logit (gpt-oss) joins the normalizer as a score with no value */
    float inv = 1.0f / l;
    if (sinks) {
        const float M = fmaxf(m, sinks[h]), c = expf(m - M);
        inv = c / (l * c + expf(sinks[h] - M));
    }
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int d = tid + i * ATT_THREADS;
        if (d < hd_v) Y[(int64_t)t * y_stride + (int64_t)h * hd_v + d] = acc[i] * inv;
    }
}

template <int NV>
static void attention(const pyllm_op *op, const exec &e, int hd_v, const __half *vc, int64_t v_stride,
                      int64_t v_head) {
    dim3 grid(op->n_head, e.rows);
    const size_t smem = (size_t)((op->head_dim + ATT_TILE + 1) & ~1) * sizeof(float) + ATT_TILE * sizeof(long long);
    PQ_LAUNCH(grid, ATT_THREADS, smem, e.stream, attention_kernel<NV>)(
        op->x, op->x_stride, op->y, op->y_stride, (const __half *)op->k_cache, vc, e.pos, e.table, e.block_size,
        op->n_head, op->n_kv_head, op->head_dim, hd_v, v_stride, v_head, op->scale, op->softcap,
        op->flags & OPF_CHUNKED ? -op->window : op->window,
        (const float *)op->w, (op->flags & OPF_NON_CAUSAL) != 0, e.bidirectional, op->alibi);
}

void launch_attention(const pyllm_op *op, const exec &e) {
    const int hd_v = op->head_dim_v > 0 ? op->head_dim_v : op->head_dim;
    const bool v_in_k = op->flags & OPF_V_IN_K;
    /* with OPF_V_IN_K a head's values are the first hd_v dims of its key row */
    const __half *vc = (const __half *)(v_in_k ? op->k_cache : op->v_cache);
    const int64_t v_head = v_in_k ? op->head_dim : hd_v, v_stride = (int64_t)op->n_kv_head * v_head;
    static_assert(ATT_MAX_NV == 5, "one case per accumulator count below");
    switch ((hd_v + ATT_THREADS - 1) / ATT_THREADS) {   /* pyllm_cuda_check keeps hd_v in 1..MAX_HEAD_DIM */
    case 1: attention<1>(op, e, hd_v, vc, v_stride, v_head); break;
    case 2: attention<2>(op, e, hd_v, vc, v_stride, v_head); break;
    case 3: attention<3>(op, e, hd_v, vc, v_stride, v_head); break;
    case 4: attention<4>(op, e, hd_v, vc, v_stride, v_head); break;
    default: attention<5>(op, e, hd_v, vc, v_stride, v_head); break;
    }
}

}  // namespace pq
