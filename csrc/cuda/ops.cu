/* ops.cu: embedding lookup, RMSNorm, RoPE, KV-cache writes, gated
 * activations, elementwise ops: the arithmetic of csrc/ops.c, one thread per
 * element (or per row for the reductions). Rows are read as csrc/ops.c reads
 * them: embed, rmsnorm, quantize, glu, add and copy start at row0 (the head's
 * OPF_LAST_ROWS); rope and kv_store use the step's rows 0.. directly. */
#include "quant.cuh"

namespace pq {

/* ---- embedding: y[t] = dequant(W row tokens[t]) * scale ---- */

/* y[t] (+)= scale W[ids[t]]: ids the tokens, or the positions (learned position embeddings) */
__global__ void embed_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int type, int64_t n,
                             const int32_t *__restrict__ ids, float *__restrict__ Y, int64_t y_stride, float scale,
                             bool accumulate) {
    const int t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = dequant(type, W + (size_t)ids[t] * row_bytes, i);
    if (scale != 1.0f) v *= scale;
    float *y = Y + (int64_t)t * y_stride + i;
    *y = accumulate ? *y + v : v;
}

void launch_embed(const pyllm_op *op, const exec &e) {
    dim3 grid(blocks_for(op->n_in, 256), e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, embed_kernel)((const uint8_t *)op->w, weight_row_bytes(op->type, op->n_in),
                                                    op->type, op->n_in, op->flags & OPF_BY_POS ? e.pos : e.tokens, op->y,
                                                    op->y_stride, op->scale, (op->flags & OPF_ACCUMULATE) != 0);
}

/* ---- RMSNorm / LayerNorm over groups of n: one block of 256 per (group, row); sums in double as the CPU ---- */

/* the sum of v over the block's threads, in every thread */
__device__ double block_sum_double(double v) {
    __shared__ double part[8];
    v = warp_sum_double(v);
    __syncthreads();  /* part[] may still be read from the previous call */
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
    for (int k = 0; k < (int)(blockDim.x >> 5); k++) s += part[k];
    return s;
}

__global__ void rmsnorm_kernel(const float *__restrict__ X, int64_t x_stride, float *Y, int64_t y_stride,
                               const float *__restrict__ w, const float *__restrict__ b, int64_t n, float eps,
                               int layer_norm) {
    const int g = blockIdx.x, t = blockIdx.y;
    const float *x = X + (int64_t)t * x_stride + (int64_t)g * n;
    float *y = Y + (int64_t)t * y_stride + (int64_t)g * n;
    float mean = 0.0f;
    if (layer_norm) {
        double s = 0.0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += (double)x[i];
        mean = (float)(block_sum_double(s) / (double)n);
    }
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += (double)(x[i] - mean) * (x[i] - mean);
    const float inv = (float)(1.0 / sqrt(block_sum_double(ss) / (double)n + (double)eps));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = (x[i] - mean) * inv * w[i];
        y[i] = b ? v + b[i] : v;
    }
}

void launch_rmsnorm(const pyllm_op *op, const exec &e) {
    const int groups = op->n_head > 0 ? op->n_head : 1;
    dim3 grid(groups, e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, rmsnorm_kernel)(op->x + (int64_t)e.row0 * op->x_stride, op->x_stride, op->y,
                                                      op->y_stride, (const float *)op->w, op->bias, op->n_in,
                                                      op->eps, op->type == NORM_LAYER);
}

/* ---- RoPE: theta_i = pos * freq_scale * base^(-2i/n_rot) / factors[i], in double as the CPU ---- */

__global__ void rope_kernel(float *Q, int64_t q_stride, float *K, int64_t k_stride, const int32_t *__restrict__ pos,
                            int n_head, int n_kv_head, int head_dim, int n_rot, int mode, float freq_base,
                            float freq_scale, const float *__restrict__ factors) {
    const int t = blockIdx.y;
    const int half = n_rot / 2;
    const int nq = Q ? n_head * half : 0, nk = K ? n_kv_head * half : 0;
    const int item = blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= nq + nk) return;
    const bool is_k = item >= nq;
    const int it = is_k ? item - nq : item;
    const int h = it / half, i = it % half;
    double inv_freq = (double)freq_scale * pow((double)freq_base, -2.0 * i / n_rot);
    if (factors) inv_freq /= factors[i];
    const double theta = pos[t] * inv_freq;
    const float c = (float)cos(theta), s = (float)sin(theta);
    float *v = (is_k ? K + (int64_t)t * k_stride : Q + (int64_t)t * q_stride) + (int64_t)h * head_dim;
    const int a = mode == ROPE_NEOX ? i : 2 * i;
    const int b = mode == ROPE_NEOX ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
}

void launch_rope(const pyllm_op *op, const exec &e) {
    const int half = op->n_rot / 2;
    const int items = (op->x ? op->n_head * half : 0) + (op->x2 ? op->n_kv_head * half : 0);
    if (items == 0) return;
    dim3 grid(blocks_for(items, 128), e.rows);
    PQ_LAUNCH(grid, 128, 0, e.stream, rope_kernel)(op->x, op->x_stride, op->x2, op->x2_stride, e.pos, op->n_head,
                                                   op->n_kv_head, op->head_dim, op->n_rot, op->rope_mode,
                                                   op->freq_base, op->freq_scale, op->freq_factors);
}

/* ---- KV store: cache[slot of pos[t]] = f16(k[t]), f16(v[t]); the keys alone with OPF_V_IN_K ---- */

/* k_dim, v_dim: f16 per position in each pool (v_dim 0: no value pool, the values live in the keys) */
__global__ void kv_store_kernel(const float *__restrict__ Kx, int64_t k_stride, const float *__restrict__ Vx,
                                int64_t v_stride, __half *kc, __half *vc, const int32_t *__restrict__ pos,
                                const int32_t *__restrict__ table, int block_size, int64_t k_dim, int64_t v_dim) {
    const int t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k_dim && i >= v_dim) return;
    const int p = pos[t];
    const int64_t slot = (int64_t)table[p / block_size] * block_size + p % block_size;
    if (i < k_dim) kc[slot * k_dim + i] = __float2half_rn(Kx[(int64_t)t * k_stride + i]);
    if (i < v_dim) vc[slot * v_dim + i] = __float2half_rn(Vx[(int64_t)t * v_stride + i]);
}

void launch_kv_store(const pyllm_op *op, const exec &e) {
    const bool v_in_k = op->flags & OPF_V_IN_K;
    const int64_t k_dim = (int64_t)op->n_kv_head * op->head_dim;
    const int64_t v_dim = v_in_k ? 0 : (int64_t)op->n_kv_head * (op->head_dim_v > 0 ? op->head_dim_v : op->head_dim);
    dim3 grid(blocks_for(k_dim > v_dim ? k_dim : v_dim, 256), e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, kv_store_kernel)(op->x, op->x_stride, v_in_k ? nullptr : op->x2, op->x2_stride,
                                                       (__half *)op->k_cache, v_in_k ? nullptr : (__half *)op->v_cache,
                                                       e.pos, e.table, e.block_size, k_dim, v_dim);
}

/* ---- copy: y[t, g step_y + i] = x[t, g step_x + i], i < n, g < groups (csrc/ops.c op_copy) ---- */

/* One thread per output column c of the span the groups cover. Where groups overlap
 * (step_y < n) the C core's later group overwrites the earlier, so c takes the last group
 * starting at or before it; a column in a gap between groups (step_y > n) is left alone. Each
 * column has one writer: no order between threads matters. */
__global__ void copy_kernel(const float *__restrict__ X, int64_t x_stride, float *__restrict__ Y, int64_t y_stride,
                            int64_t n, int groups, int64_t step_x, int64_t step_y, int64_t span) {
    const int t = blockIdx.y;
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= span) return;
    const int64_t g = step_y > 0 && c / step_y < groups ? c / step_y : groups - 1;
    const int64_t i = c - g * step_y;
    if (i < n) Y[(int64_t)t * y_stride + c] = X[(int64_t)t * x_stride + g * step_x + i];
}

void launch_copy(const pyllm_op *op, const exec &e) {
    const int64_t span = (int64_t)(op->n_head - 1) * op->head_dim + op->n_in;
    dim3 grid(blocks_for(span, 256), e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, copy_kernel)(op->x + (int64_t)e.row0 * op->x_stride, op->x_stride, op->y,
                                                   op->y_stride, op->n_in, op->n_head, op->n_out, (int64_t)op->head_dim,
                                                   span);
}

/* y[t, c] = sum_j w[c][j] s[pos[t] - L + 1 + j, c]: LFM2's causal depthwise convolution over the
 * rows the layer's KV_STORE keeps (channels [0, n/2) in the k pool, the rest in the v pool) */
__global__ void shortconv_kernel(const float *__restrict__ W, int taps, const __half *__restrict__ kc,
                                 const __half *__restrict__ vc, const int32_t *__restrict__ pos,
                                 const int32_t *__restrict__ table, int block_size, int64_t n,
                                 float *__restrict__ Y, int64_t y_stride) {
    const int t = blockIdx.y;
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    const int64_t half = n / 2;
    const __half *pool = c < half ? kc : vc;
    const int64_t ch = c < half ? c : c - half;
    float acc = 0.0f;
    for (int j = 0; j < taps; j++) {   /* in tap order, as the C core sums */
        const int p = pos[t] - taps + 1 + j;
        if (p < 0) continue;
        const int64_t slot = (int64_t)table[p / block_size] * block_size + p % block_size;
        acc += W[c * taps + j] * __half2float(pool[slot * half + ch]);
    }
    Y[(int64_t)t * y_stride + c] = acc;
}

void launch_shortconv(const pyllm_op *op, const exec &e) {
    dim3 grid(blocks_for(op->n_in, 256), e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, shortconv_kernel)((const float *)op->w, op->n_head, (const __half *)op->k_cache,
                                                        (const __half *)op->v_cache, e.pos, e.table, e.block_size,
                                                        op->n_in, op->y, op->y_stride);
}

/* y[t] *= 1 + s ln(1 + floor((pos[t] + off) / period)): attention temperature on q, the factor
 * in double as the C core computes it */
__global__ void pos_scale_kernel(float *Y, int64_t y_stride, int64_t n, const int32_t *__restrict__ pos, float s,
                                 float off, int period) {
    const int t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float steps = floorf(((float)pos[t] + off) / (float)period);
    Y[(int64_t)t * y_stride + i] *= (float)(log((double)steps + 1.0) * s + 1.0);
}

void launch_pos_scale(const pyllm_op *op, const exec &e) {
    dim3 grid(blocks_for(op->n_in, 256), e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, pos_scale_kernel)(op->y, op->y_stride, op->n_in, e.pos, op->scale, op->eps,
                                                        op->window);
}

/* ---- elementwise ---- */

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

/* 0.5 x (1 + tanh z), z = sqrt(2/pi) (x + 0.044715 x^3), as x / (1 + exp(-2z)) like the C
 * core: 1 + tanh z cancels for negative x (it is 0 in float below x = -5) */
__device__ __forceinline__ float gelu_tanh(float x) {
    const float c2 = 2.0f * 0.7978845608028654f; /* 2 sqrt(2/pi) */
    return x / (1.0f + expf(-c2 * (x + 0.044715f * x * x * x)));
}

/* gpt-oss: x sigmoid(a x) (clamp(u, -c, c) + 1), x = min(g, c), as silu(a x) / a like the C core */
__device__ __forceinline__ float swiglu_oai(float g, float u, float a, float c) {
    const float ax = a * fminf(g, c);
    return silu(ax) * (fminf(fmaxf(u, -c), c) + 1.0f) / a;
}

__global__ void glu_kernel(const float *__restrict__ G, int64_t g_stride, const float *__restrict__ U, int64_t u_stride,
                           float *__restrict__ Y, int64_t y_stride, int64_t n, int kind, float alpha, float limit) {
    const int t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = G[(int64_t)t * g_stride + i], u = U ? U[(int64_t)t * u_stride + i] : 1.0f;
    float a;
    switch (kind) {
    case GLU_SWIGLU_OAI: Y[(int64_t)t * y_stride + i] = swiglu_oai(g, u, alpha, limit); return;
    case GLU_RELU_SQR: a = fmaxf(g, 0.0f); a *= a; break;
    case GLU_MUL: a = g; break;
    case GLU_RELU: a = fmaxf(g, 0.0f); break;
    case GLU_SIGMOID: a = 1.0f / (1.0f + expf(-g)); break;
    case GLU_GELU_TANH: a = gelu_tanh(g); break;
    default: a = silu(g);
    }
    Y[(int64_t)t * y_stride + i] = a * u;
}

void launch_glu(const pyllm_op *op, const exec &e) {  /* no x2: y = act(x) */
    dim3 grid(blocks_for(op->n_in, 256), e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, glu_kernel)(op->x + (int64_t)e.row0 * op->x_stride, op->x_stride,
                                                  op->x2 ? op->x2 + (int64_t)e.row0 * op->x2_stride : nullptr,
                                                  op->x2_stride, op->y, op->y_stride, op->n_in, op->type, op->scale,
                                                  op->softcap);
}

__global__ void add_kernel(const float *__restrict__ X, int64_t x_stride, float *Y, int64_t y_stride, int64_t n) {
    const int t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Y[(int64_t)t * y_stride + i] += X[(int64_t)t * x_stride + i];
}

void launch_add(const pyllm_op *op, const exec &e) {
    dim3 grid(blocks_for(op->n_in, 256), e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, add_kernel)(op->x + (int64_t)e.row0 * op->x_stride, op->x_stride, op->y,
                                                  op->y_stride, op->n_in);
}

/* y *= s, then with softcap > 0 y = softcap * tanh(y / softcap) */
__global__ void scale_kernel(float *Y, int64_t y_stride, int64_t n, float s, float softcap) {
    const int t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = Y[(int64_t)t * y_stride + i] * s;
    if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
    Y[(int64_t)t * y_stride + i] = v;
}

void launch_scale(const pyllm_op *op, const exec &e) {
    dim3 grid(blocks_for(op->n_in, 256), e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, scale_kernel)(op->y, op->y_stride, op->n_in, op->scale, op->softcap);
}


/* ---- mixture of experts (csrc/moe.c): the route, and the weighted sum of the experts' outputs ---- */

__device__ __forceinline__ float gate_value(const float *x, int e, bool sigmoid, float m, float sum) {
    return sigmoid ? 1.0f / (1.0f + expf(-x[e])) : expf(x[e] - m) / sum;
}

/* one thread per row, as csrc/moe.c route_row: the k best logits in order (ties to the lower
 * id), or with a selection bias the k best gate value + bias[e] (each made where it is compared:
 * a thread has no room for n of them), within the groups route_row's limit_groups keeps when
 * there are groups (bit g of `chosen`); then their gate values */
__global__ void moe_route_kernel(const float *__restrict__ X, int64_t x_stride, float *__restrict__ Y,
                                 int64_t y_stride, int n, int k, int type, float scale, const float *__restrict__ bias,
                                 int groups, int groups_used, int rows) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows) return;
    const float *x = X + (int64_t)t * x_stride;
    float *y = Y + (int64_t)t * y_stride;
    const bool sigmoid = type & MOE_SIGMOID;
    float m = x[0], sum = 0.0f, wsum = 0.0f;
    for (int e = 1; e < n; e++) m = x[e] > m ? x[e] : m;
    if (!sigmoid)
        for (int e = 0; e < n; e++) sum += expf(x[e] - m);
    const bool keyed = bias || groups > 1;   /* groups are scored by gate values, not logits */
    auto key_of = [&](int e) { return keyed ? gate_value(x, e, sigmoid, m, sum) + (bias ? bias[e] : 0.0f) : x[e]; };
    unsigned long long chosen = ~0ull;
    const int per = groups > 1 ? n / groups : n;
    if (groups > 1) {
        float score[64];   /* MAX_EXPERT_GROUPS */
        for (int g = 0; g < groups; g++) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                const float v = key_of(e);
                if (v > b1) b2 = b1, b1 = v;
                else if (v > b2) b2 = v;
            }
            score[g] = per > 1 ? b1 + b2 : b1;
        }
        chosen = 0;
        for (int j = 0; j < groups_used; j++) {
            int best = -1;
            for (int g = 0; g < groups; g++)
                if (!(chosen >> g & 1) && (best < 0 || score[g] > score[best])) best = g;
            chosen |= 1ull << best;
        }
    }
    for (int j = 0; j < k; j++) {
        int best = -1;
        float best_key = 0.0f;
        for (int e = 0; e < n; e++) {
            bool taken = false;
            for (int c = 0; c < j; c++) taken |= (int)y[c] == e;
            const float key = chosen >> (e / per) & 1 ? key_of(e) : -INFINITY;
            if (!taken && (best < 0 || key > best_key)) best = e, best_key = key;
        }
        y[j] = (float)best;
    }
    for (int j = 0; j < k; j++) {
        y[k + j] = gate_value(x, (int)y[j], sigmoid, m, sum);
        wsum += y[k + j];
    }
    for (int j = 0; j < k; j++) y[k + j] = ((type & MOE_NORM) ? y[k + j] / wsum : y[k + j]) * scale;
}

void launch_moe_route(const pyllm_op *op, const exec &e) {
    PQ_LAUNCH(blocks_for(e.rows, 64), 64, 0, e.stream, moe_route_kernel)(op->x, op->x_stride, op->y, op->y_stride,
                                                                       (int)op->n_in, op->n_head, op->type,
                                                                       op->scale, op->bias, op->n_kv_head,
                                                                       op->head_dim, e.rows);
}

__global__ void moe_sum_kernel(const float *__restrict__ X, int64_t x_stride, const float *__restrict__ R,
                               int64_t r_stride, float *Y, int64_t y_stride, int64_t n, int k, bool accumulate) {
    const int t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float *x = X + (int64_t)t * x_stride, *w = R + (int64_t)t * r_stride + k;
    float s = 0.0f;
    for (int j = 0; j < k; j++) s += w[j] * x[(int64_t)j * n + i];
    float *y = Y + (int64_t)t * y_stride + i;
    *y = accumulate ? *y + s : s;
}

void launch_moe_sum(const pyllm_op *op, const exec &e) {
    dim3 grid(blocks_for(op->n_in, 256), e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, moe_sum_kernel)(op->x, op->x_stride, op->x2, op->x2_stride, op->y, op->y_stride,
                                                      op->n_in, op->n_head, (op->flags & OPF_ACCUMULATE) != 0);
}

}  // namespace pq
