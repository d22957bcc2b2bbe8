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
    /* DeepStack's slices touch media rows alone, and a step of media rows never reaches a device
       (the split backend keeps it on the host): nothing to do */
    if (op->flags & OPF_MEDIA_ONLY) return;
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

/* group_weights (OPF_GROUP_WEIGHTS): group g scales by its own n weights, w + g n, and biases (Mamba 2's norm);
 * otherwise every group by the same w */
__global__ void rmsnorm_kernel(const float *__restrict__ X, int64_t x_stride, float *Y, int64_t y_stride,
                               const float *__restrict__ W, const float *__restrict__ b, int64_t n, float eps,
                               int layer_norm, bool group_weights) {
    const int g = blockIdx.x, t = blockIdx.y;
    const float *x = X + (int64_t)t * x_stride + (int64_t)g * n;
    float *y = Y + (int64_t)t * y_stride + (int64_t)g * n;
    const float *w = group_weights ? W + (int64_t)g * n : W;
    if (group_weights && b) b += (int64_t)g * n;   /* and their own biases (RWKV's per-head LayerNorm) */
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
                                                      op->eps, op->type == NORM_LAYER,
                                                      (op->flags & OPF_GROUP_WEIGHTS) != 0);
}

/* ---- RoPE: theta_i = pos * freq_scale * base^(-2i/n_rot) / factors[i], in double as the CPU;
 * M-RoPE (rope_pos [3][n]): pair i's position the time's, height's or width's by its section
 * (s0, s1, s2 one after another, or interleaved: i % 3 while i < 3 s), as ops.c's op_rope ---- */

__device__ int mrope_which(int i, int s0, int s1, int s2, bool interleaved) {
    if (interleaved) return i % 3 == 1 && i < 3 * s1 ? 1 : i % 3 == 2 && i < 3 * s2 ? 2 : 0;
    return i < s0 ? 0 : i < s0 + s1 ? 1 : i < s0 + s1 + s2 ? 2 : 0;
}

__global__ void rope_kernel(float *Q, int64_t q_stride, float *K, int64_t k_stride, const int32_t *__restrict__ pos,
                            int n_head, int n_kv_head, int head_dim, int n_rot, int mode, float freq_base,
                            float freq_scale, const float *__restrict__ factors, const int32_t *__restrict__ rope_pos,
                            int n_tokens, int s0, int s1, int s2, bool interleaved) {
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
    const int32_t p = rope_pos ? rope_pos[mrope_which(i, s0, s1, s2, interleaved) * n_tokens + t] : pos[t];
    const double theta = p * inv_freq;
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
    const int32_t *sec = op->rope_sections;
    PQ_LAUNCH(grid, 128, 0, e.stream, rope_kernel)(op->x, op->x_stride, op->x2, op->x2_stride, e.pos, op->n_head,
                                                   op->n_kv_head, op->head_dim, op->n_rot, op->rope_mode,
                                                   op->freq_base, op->freq_scale, op->freq_factors,
                                                   sec[0] | sec[1] | sec[2] ? e.rope_pos : NULL, e.n_tokens,
                                                   sec[0], sec[1], sec[2], (op->flags & OPF_ROPE_INTERLEAVED) != 0);
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

/* y[t, o] (+)= sum_i x[t, i] w[i n_out + o]: w float32 stored by its n_in input rows (LoRA's B, n_in its
 * rank). A thread per output column, adding the inputs in order as the C core does; the threads of a
 * block read a row of w side by side. */
__global__ void matmul_cols_kernel(const float *__restrict__ X, int64_t x_stride, const float *__restrict__ W,
                                   float *Y, int64_t y_stride, int64_t n_in, int64_t n_out, bool accumulate) {
    const int t = blockIdx.y;
    const int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= n_out) return;
    const float *x = X + (int64_t)t * x_stride;
    float *y = Y + (int64_t)t * y_stride + o;
    float acc = accumulate ? *y : 0.0f;
    for (int64_t i = 0; i < n_in; i++) acc += x[i] * W[i * n_out + o];
    *y = acc;
}

void launch_matmul_cols(const pyllm_op *op, const exec &e) {
    dim3 grid(blocks_for(op->n_out, 256), e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, matmul_cols_kernel)(op->x + (int64_t)e.row0 * op->x_stride, op->x_stride,
                                                          (const float *)op->w, op->y, op->y_stride, op->n_in,
                                                          op->n_out, (op->flags & OPF_ACCUMULATE) != 0);
}

/* ---- state-space layers (csrc/ssm.c): Mamba's convolution and selective scan ----
 *
 * Both carry a state in device memory from one step to the next (op->state, allocated and
 * zeroed by the host); a step whose first position is 0 starts from zeros instead of reading
 * it. A step's tokens are consecutive positions (pyllm_cuda_run checks), and both kernels
 * walk them in order inside the kernel: the recurrence runs along the tokens, the
 * parallelism is across channels. */

/* y[t, c] = bias[c] + sum_j w[c K + j] z[t + j, c], z = the K - 1 rows of the state, then the step's
 * rows; afterwards the state holds z's last K - 1 rows. One thread per channel (channels are
 * independent), summing in tap order as the C core does; z is read where it lies, not copied. */
__global__ void ssm_conv_kernel(const float *__restrict__ X, int64_t x_stride, float *__restrict__ Y,
                                int64_t y_stride, const float *__restrict__ W, const float *__restrict__ bias,
                                float *state, int taps, int64_t n, int rows, const int32_t *__restrict__ pos) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    const int keep = taps - 1;
    const bool fresh = pos[0] == 0;   /* a new sequence: the state's rows count as zeros */
    auto z = [&](int k) {
        return k < keep ? (fresh ? 0.0f : state[(int64_t)k * n + c]) : X[(int64_t)(k - keep) * x_stride + c];
    };
    for (int t = 0; t < rows; t++) {
        float acc = bias ? bias[c] : 0.0f;
        for (int j = 0; j < taps; j++) acc += W[c * taps + j] * z(t + j);
        Y[(int64_t)t * y_stride + c] = acc;
    }
    /* in place, in ascending order: z(rows + i) is state row rows + i > i (a step shorter than
     * the state) or an input row, so nothing is read after it was overwritten */
    for (int i = 0; i < keep; i++) state[(int64_t)i * n + c] = z(rows + i);
}

void launch_ssm_conv(const pyllm_op *op, const exec &e) {
    PQ_LAUNCH(blocks_for(op->n_in, 128), 128, 0, e.stream, ssm_conv_kernel)(
        op->x + (int64_t)e.row0 * op->x_stride, op->x_stride, op->y, op->y_stride, (const float *)op->w, op->bias,
        op->state, op->n_head, op->n_in, e.rows, e.pos);
}

constexpr int SCAN_ROWS = 4;   /* (head, channel) rows per block, a warp each */
constexpr int SCAN_REGS = 4;   /* state values a lane keeps in registers: all of a d_state up to 128 */

/* The selective scan of one (head h, channel p) row per warp, over the step's tokens in order:
 *   dt = softplus(dt_in[t, h] + bias[h]),  g = h / (H / G)
 *   s[i] = s[i] exp(dt A[h, i]) + dt x[t, h P + p] B[t, g, i]     (A[h, i] = A[h] when a_n = 1)
 *   y[t, h P + p] = sum_i s[i] C[t, g, i] + D[h] x[t, h P + p]
 * with x's row [x (H P) | B (G N) | C (G N)]. Lane l owns the state values i = l + 32 k: the
 * first SCAN_REGS of them stay in registers for the whole step (read once, written back at the
 * end), any further ones (d_state > 128) are updated in place in the state; no other thread
 * touches a lane's values, so only the dot product needs the warp (a shuffle sum). */
__global__ void __launch_bounds__(32 * SCAN_ROWS)
ssm_scan_kernel(const float *__restrict__ X, int64_t x_stride, const float *__restrict__ DT, int64_t dt_stride,
                float *__restrict__ Y, int64_t y_stride, float *__restrict__ state, const float *__restrict__ A,
                const float *__restrict__ D, const float *__restrict__ bias, const int32_t *__restrict__ pos,
                int rows, int H, int P, int G, int64_t N, int a_n) {
    const int64_t row = (int64_t)blockIdx.x * SCAN_ROWS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= (int64_t)H * P) return;   /* a whole warp: the rows past the last */
    const int h = (int)(row / P), g = h / (H / G);
    const float *a = A + (int64_t)h * a_n;
    float *s = state + row * N;
    const bool fresh = pos[0] == 0;   /* a new sequence starts from a zero state */
    float reg[SCAN_REGS];
#pragma unroll
    for (int k = 0; k < SCAN_REGS; k++) {
        const int64_t i = lane + 32 * k;
        reg[k] = i < N && !fresh ? s[i] : 0.0f;
    }
    if (fresh)
        for (int64_t i = lane + 32 * SCAN_REGS; i < N; i += 32) s[i] = 0.0f;
    for (int t = 0; t < rows; t++) {
        const float *x = X + (int64_t)t * x_stride;
        const float *B = x + (int64_t)H * P + g * N, *C = x + (int64_t)H * P + G * N + g * N;
        const float v = DT[(int64_t)t * dt_stride + h] + (bias ? bias[h] : 0.0f);
        const float dt = v > 20.0f ? v : log1pf(expf(v));   /* softplus, as the C core */
        const float xdt = x[row] * dt;
        const float decay = a_n == 1 ? expf(dt * a[0]) : 0.0f;   /* Mamba 2: one decay per head */
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < SCAN_REGS; k++) {
            const int64_t i = lane + 32 * k;
            if (i < N) {
                reg[k] = reg[k] * (a_n == 1 ? decay : expf(dt * a[i])) + B[i] * xdt;
                dot += reg[k] * C[i];
            }
        }
        for (int64_t i = lane + 32 * SCAN_REGS; i < N; i += 32) {
            s[i] = s[i] * (a_n == 1 ? decay : expf(dt * a[i])) + B[i] * xdt;
            dot += s[i] * C[i];
        }
        dot = warp_sum(dot);
        if (lane == 0) Y[(int64_t)t * y_stride + row] = dot + D[h] * x[row];
    }
#pragma unroll
    for (int k = 0; k < SCAN_REGS; k++) {
        const int64_t i = lane + 32 * k;
        if (i < N) s[i] = reg[k];
    }
}

void launch_ssm_scan(const pyllm_op *op, const exec &e) {
    const int64_t H = op->n_head, a_n = op->n_rot;
    const float *A = (const float *)op->w, *D = A + H * a_n;   /* w = [A (H a_n) | D (H)] */
    PQ_LAUNCH(blocks_for(H * op->head_dim, SCAN_ROWS), 32 * SCAN_ROWS, 0, e.stream, ssm_scan_kernel)(
        op->x + (int64_t)e.row0 * op->x_stride, op->x_stride, op->x2 + (int64_t)e.row0 * op->x2_stride,
        op->x2_stride, op->y, op->y_stride, op->state, A, D, op->bias, e.pos, e.rows, op->n_head, op->head_dim,
        op->n_kv_head, op->n_in, op->n_rot);
}

/* ---- linear attention (csrc/ssm.c op_delta_net): the gated delta rule of Qwen3.5 ----
 *
 * Per value head h (key head hk = h % Hk, or h / (H / Hk) grouped), token by token over the step's rows in order:
 *   q, k = the key head's, each / max(|.|, eps), q also / sqrt(dk)
 *   g = exp(A[h] softplus(a[t, h] + dt_bias[h])),  beta = sigmoid(b[t, h])
 *   S = g S;  u = S^T k;  S += k ((v - u) beta)^T;  y[t, h dv + j] = (S^T q)[j]
 * with S the head's [dk][dv] state (row i: the values under key dim i), x's row
 * [q (Hk dk) | k (Hk dk) | v (H dv)], x2's [a (H) | b (H)], w = [A (H) | dt_bias (H)].
 *
 * A block is one warp, for DELTA_COLS columns j of one head's S (grid: heads x column
 * chunks). Lane l owns column j = chunk DELTA_COLS + l: its first DELTA_REGS values (key dims)
 * stay in registers for the whole step, any further ones are updated in place in the state,
 * and no other thread touches them, so u[j] and y[j] are sums inside one thread, over i in
 * ascending order as the C core adds them. The warp only works together on the two norms:
 * every lane squares and sums its key dims in double (as the core), a shuffle sum adds the
 * lanes' partial sums, and the normalized q and k go to shared memory for the lanes to read. */
constexpr int DELTA_COLS = 32;
constexpr int DELTA_REGS = 128;   /* all of a head_dim up to 128 (Qwen3.5's) in registers */

__global__ void __launch_bounds__(DELTA_COLS)
delta_net_kernel(const float *__restrict__ X, int64_t x_stride, const float *__restrict__ AB, int64_t ab_stride,
                 float *__restrict__ Y, int64_t y_stride, float *__restrict__ state, const float *__restrict__ W,
                 const int32_t *__restrict__ pos, int rows, int H, int Hk, int dk, int dv, float eps, bool grouped) {
    PQ_EXTERN_SHARED(float, sm);   /* [dk] q, normalized, then [dk] k */
    float *sq = sm, *sk = sm + dk;
    const int h = blockIdx.x, lane = threadIdx.x, hk = grouped ? h / (H / Hk) : h % Hk;
    const int j = blockIdx.y * DELTA_COLS + lane;
    const bool owner = j < dv;   /* lanes past the last column still help with the norms */
    float *s = state + (int64_t)h * dk * dv + j;   /* column j: s[i dv] */
    const bool fresh = pos[0] == 0;   /* a new sequence starts from a zero state */
    const float A = W[h], dt_bias = W[H + h];
    const float q_scale = 1.0f / sqrtf((float)dk);
    float reg[DELTA_REGS];
#pragma unroll
    for (int i = 0; i < DELTA_REGS; i++) reg[i] = owner && i < dk && !fresh ? s[(int64_t)i * dv] : 0.0f;
    if (owner && fresh)
        for (int i = DELTA_REGS; i < dk; i++) s[(int64_t)i * dv] = 0.0f;
    for (int t = 0; t < rows; t++) {
        const float *x = X + (int64_t)t * x_stride, *ab = AB + (int64_t)t * ab_stride;
        const float *q = x + (int64_t)hk * dk, *k = x + (int64_t)Hk * dk + (int64_t)hk * dk;
        double qq = 0.0, kk = 0.0;
        for (int i = lane; i < dk; i += DELTA_COLS) {
            qq += (double)(q[i] * q[i]);
            kk += (double)(k[i] * k[i]);
        }
        qq = warp_sum_double(qq);
        kk = warp_sum_double(kk);
        const float qn = sqrtf((float)qq), kn = sqrtf((float)kk);
        const float qs = 1.0f / (qn > eps ? qn : eps), ks = 1.0f / (kn > eps ? kn : eps);
        for (int i = lane; i < dk; i += DELTA_COLS) {
            sq[i] = q[i] * qs;
            sk[i] = k[i] * ks;
        }
        __syncwarp();
        const float v = ab[h] + dt_bias;
        const float sp = v > 20.0f ? v : log1pf(expf(v));   /* softplus, as the C core */
        const float g = expf(A * sp), beta = 1.0f / (1.0f + expf(-ab[H + h]));
        if (owner) {
            /* S = g S and u = S^T k in one pass over the key dims */
            float u = 0.0f;
#pragma unroll
            for (int i = 0; i < DELTA_REGS; i++)
                if (i < dk) {
                    reg[i] *= g;
                    u += reg[i] * sk[i];
                }
            for (int i = DELTA_REGS; i < dk; i++) {
                float *si = s + (int64_t)i * dv;
                *si *= g;
                u += *si * sk[i];
            }
            const float d = (x[(int64_t)2 * Hk * dk + (int64_t)h * dv + j] - u) * beta;
            /* S += k d^T and y = S^T q in one pass */
            float y = 0.0f;
#pragma unroll
            for (int i = 0; i < DELTA_REGS; i++)
                if (i < dk) {
                    reg[i] += sk[i] * d;
                    y += reg[i] * (sq[i] * q_scale);
                }
            for (int i = DELTA_REGS; i < dk; i++) {
                float *si = s + (int64_t)i * dv;
                *si += sk[i] * d;
                y += *si * (sq[i] * q_scale);
            }
            Y[(int64_t)t * y_stride + (int64_t)h * dv + j] = y;
        }
        __syncwarp();   /* sq, sk are rewritten for the next token */
    }
    if (owner) {
#pragma unroll
        for (int i = 0; i < DELTA_REGS; i++)
            if (i < dk) s[(int64_t)i * dv] = reg[i];
    }
}

void launch_delta_net(const pyllm_op *op, const exec &e) {
    dim3 grid(op->n_head, blocks_for(op->head_dim_v, DELTA_COLS));
    const size_t smem = 2 * (size_t)op->head_dim * sizeof(float);
    PQ_LAUNCH(grid, DELTA_COLS, smem, e.stream, delta_net_kernel)(
        op->x + (int64_t)e.row0 * op->x_stride, op->x_stride, op->x2 + (int64_t)e.row0 * op->x2_stride,
        op->x2_stride, op->y, op->y_stride, op->state, (const float *)op->w, e.pos, e.rows, op->n_head,
        op->n_kv_head, op->head_dim, op->head_dim_v, op->eps, (op->flags & OPF_KV_GROUPED) != 0);
}

/* ---- RWKV (csrc/ssm.c op_wkv, csrc/ops.c op_lerp) ----
 *
 * WKV: one block per head, a thread per row or column of its [D][D] state S (in device memory,
 * row-major), token by token over the step's rows; the token's decays go to shared memory first.
 *   WKV_6, WKV_GLA: S's rows are key dims, thread j owns column j (a value dim):
 *     WKV_6:   y_j = (r . (u k)) v_j + sum_i r_i S_ij ;  S_ij = S_ij d_i + k_i v_j
 *     WKV_GLA: S_ij = S_ij d_i + k_i (1 - d_i) v_j ;  y_j = sum_i (scale r_i) S_ij
 *   WKV_7: S's rows are value dims, thread i owns row i:
 *     sa = S_i . a ;  S_ij = S_ij d_j + sa b_j + v_i k_j ;  y_i = S_i . r
 *     then the head's LayerNorm (through shared memory) and the bonus (r . (r_k k)) v_i
 * Each sum runs over i (or j) in ascending order in one thread, as the C core adds it. */
__global__ void wkv_kernel(const float *__restrict__ X, int64_t x_stride, float *__restrict__ Y, int64_t y_stride,
                           float *__restrict__ state, const float *__restrict__ U, const float *__restrict__ LN,
                           const int32_t *__restrict__ pos, int rows, int H, int D, int kind, float scale, float eps) {
    PQ_EXTERN_SHARED(float, sm);   /* [D] the token's decays, [D] WKV 7's outputs before its norm */
    float *decay = sm, *ys = sm + D;
    const int h = blockIdx.x, j = threadIdx.x;
    const bool owner = j < D;
    const int64_t C = (int64_t)H * D;
    float *S = state + (int64_t)h * D * D;
    if (pos[0] == 0 && owner)   /* a new sequence starts from a zero state */
        for (int i = 0; i < D; i++) S[kind == WKV_7 ? (int64_t)j * D + i : (int64_t)i * D + j] = 0.0f;
    for (int t = 0; t < rows; t++) {
        const float *x = X + (int64_t)t * x_stride + (int64_t)h * D;
        const float *r = x, *k = x + C, *v = x + 2 * C, *w = x + 3 * C;
        __syncthreads();   /* the last token's decays and outputs are read */
        if (owner) decay[j] = kind == WKV_7 ? expf(-0.606531f / (1.0f + expf(-w[j]))) : expf(-expf(w[j]));
        __syncthreads();
        float y = 0.0f;
        if (owner && kind == WKV_6) {
            const float *u = U + (int64_t)h * D;
            float ruk = 0.0f;
            for (int i = 0; i < D; i++) ruk += r[i] * u[i] * k[i];
            y = ruk * v[j];
            for (int i = 0; i < D; i++) {
                float *s = S + (int64_t)i * D + j;
                y += r[i] * *s;
                *s = *s * decay[i] + k[i] * v[j];
            }
        } else if (owner && kind == WKV_GLA) {
            for (int i = 0; i < D; i++) {
                float *s = S + (int64_t)i * D + j;
                *s = *s * decay[i] + k[i] * (1.0f - decay[i]) * v[j];
                y += scale * r[i] * *s;
            }
        } else if (owner) {
            const float *a = x + 4 * C, *b = x + 5 * C;
            float *Sj = S + (int64_t)j * D;
            float sa = 0.0f;
            for (int i = 0; i < D; i++) sa += Sj[i] * a[i];
            for (int i = 0; i < D; i++) {
                Sj[i] = Sj[i] * decay[i] + sa * b[i] + v[j] * k[i];
                y += Sj[i] * r[i];
            }
        }
        if (kind == WKV_7 && LN) {   /* the head's LayerNorm: every thread sums all outputs, in order */
            if (owner) ys[j] = y;
            __syncthreads();
            if (owner) {
                double sum = 0.0, sq = 0.0;
                for (int i = 0; i < D; i++) sum += ys[i];
                const float mean = (float)(sum / (double)D);
                for (int i = 0; i < D; i++) sq += (double)(ys[i] - mean) * (ys[i] - mean);
                const float inv = (float)(1.0 / sqrt(sq / (double)D + (double)eps));
                y = (y - mean) * inv * LN[(int64_t)h * D + j] + LN[C + (int64_t)h * D + j];
            }
        }
        if (owner && kind == WKV_7 && U) {   /* the bonus (r . (r_k k)) v */
            const float *rk = U + (int64_t)h * D;
            float bonus = 0.0f;
            for (int i = 0; i < D; i++) bonus += r[i] * k[i] * rk[i];
            y += bonus * v[j];
        }
        if (owner) Y[(int64_t)t * y_stride + (int64_t)h * D + j] = y;
    }
}

void launch_wkv(const pyllm_op *op, const exec &e) {
    const int threads = (op->head_dim + 31) / 32 * 32;
    PQ_LAUNCH(op->n_head, threads, 2 * (size_t)op->head_dim * sizeof(float), e.stream, wkv_kernel)(
        op->x + (int64_t)e.row0 * op->x_stride, op->x_stride, op->y, op->y_stride, op->state, (const float *)op->w,
        op->bias, e.pos, e.rows, op->n_head, op->head_dim, op->type, op->scale, op->eps);
}

/* y[t, g n + i] = x[t, i] + dx[t, i] (mix[g n + i] (+ y[t, g n + i])) */
__global__ void lerp_kernel(const float *__restrict__ X, int64_t x_stride, const float *__restrict__ DX,
                            int64_t dx_stride, float *Y, int64_t y_stride, const float *__restrict__ mix, int64_t n,
                            int groups, bool accumulate) {
    const int t = blockIdx.y;
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i = c % n;
    if (c >= n * groups) return;
    float *y = Y + (int64_t)t * y_stride + c;
    const float dx = DX[(int64_t)t * dx_stride + i];
    *y = X[(int64_t)t * x_stride + i] + dx * (accumulate ? mix[c] + *y : mix[c]);
}

void launch_lerp(const pyllm_op *op, const exec &e) {
    dim3 grid(blocks_for(op->n_in * op->n_head, 256), e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, lerp_kernel)(op->x + (int64_t)e.row0 * op->x_stride, op->x_stride,
                                                   op->x2 + (int64_t)e.row0 * op->x2_stride, op->x2_stride, op->y,
                                                   op->y_stride, (const float *)op->w, op->n_in, op->n_head,
                                                   (op->flags & OPF_ACCUMULATE) != 0);
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
                           float *__restrict__ Y, int64_t y_stride, int64_t n, int kind, float alpha, float limit,
                           const float *__restrict__ p) {
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
    case GLU_XIELU: a = g > 0.0f ? p[1] * g * g + p[2] * g : (expm1f(fminf(g, p[3])) - g) * p[0] + p[2] * g; break;
    case GLU_TANH: a = tanhf(g); break;
    default: a = silu(g);
    }
    Y[(int64_t)t * y_stride + i] = a * u;
}

void launch_glu(const pyllm_op *op, const exec &e) {  /* no x2: y = act(x) */
    dim3 grid(blocks_for(op->n_in, 256), e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, glu_kernel)(op->x + (int64_t)e.row0 * op->x_stride, op->x_stride,
                                                  op->x2 ? op->x2 + (int64_t)e.row0 * op->x2_stride : nullptr,
                                                  op->x2_stride, op->y, op->y_stride, op->n_in, op->type, op->scale,
                                                  op->softcap, (const float *)op->w);
}

/* y += s x (s = -1: a difference) */
__global__ void add_kernel(const float *__restrict__ X, int64_t x_stride, float *Y, int64_t y_stride, int64_t n,
                           float s) {
    const int t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = X[(int64_t)t * x_stride + i];
    Y[(int64_t)t * y_stride + i] += s == 1.0f ? x : s * x;
}

void launch_add(const pyllm_op *op, const exec &e) {
    dim3 grid(blocks_for(op->n_in, 256), e.rows);
    /* no x: the one row in w, added to every row (stride 0) */
    const float *x = op->x ? op->x + (int64_t)e.row0 * op->x_stride : (const float *)op->w;
    PQ_LAUNCH(grid, 256, 0, e.stream, add_kernel)(x, op->x ? op->x_stride : 0, op->y, op->y_stride, op->n_in,
                                                  op->scale);
}

/* y *= col[i] (where given) and s, then with softcap > 0 y = softcap * tanh(y / softcap) */
__global__ void scale_kernel(float *Y, int64_t y_stride, int64_t n, float s, float softcap,
                             const float *__restrict__ col) {
    const int t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = Y[(int64_t)t * y_stride + i];
    if (col) v *= col[i];
    v *= s;
    if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
    Y[(int64_t)t * y_stride + i] = v;
}

void launch_scale(const pyllm_op *op, const exec &e) {
    dim3 grid(blocks_for(op->n_in, 256), e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, scale_kernel)(op->y, op->y_stride, op->n_in, op->scale, op->softcap,
                                                    (const float *)op->w);
}

/* ---- Gemma 3n's AltUp streams and FFN sparsity ---- */

/* y[t, j n + i] (+)= sum_k c[t, j K + k] x[t, k n + i]: one thread per (stream j, column i) */
__global__ void mix_kernel(const float *__restrict__ X, int64_t x_stride, const float *__restrict__ C,
                           int64_t c_stride, float *__restrict__ Y, int64_t y_stride, int64_t n, int n_y, int n_x,
                           bool accumulate) {
    const int t = blockIdx.y;
    const int64_t item = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= n * n_y) return;
    const int j = (int)(item / n);
    const int64_t i = item % n;
    const float *c = C + (int64_t)t * c_stride + (int64_t)j * n_x, *x = X + (int64_t)t * x_stride + i;
    float *y = Y + (int64_t)t * y_stride + item;
    float acc = accumulate ? *y : 0.0f;
    for (int k = 0; k < n_x; k++) acc += c[k] * x[(int64_t)k * n];
    *y = acc;
}

void launch_mix(const pyllm_op *op, const exec &e) {
    dim3 grid(blocks_for(op->n_in * op->n_head, 256), e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, mix_kernel)(op->x + (int64_t)e.row0 * op->x_stride, op->x_stride,
                                                  op->x2 + (int64_t)e.row0 * op->x2_stride, op->x2_stride, op->y,
                                                  op->y_stride, op->n_in, op->n_head, op->n_kv_head,
                                                  (op->flags & OPF_ACCUMULATE) != 0);
}

/* y's group g *= |x| / |y_g|: a block per (group, row), the sums in double as the C core */
__global__ void match_norm_kernel(const float *__restrict__ X, int64_t x_stride, float *Y, int64_t y_stride,
                                  int64_t n) {
    const int g = blockIdx.x, t = blockIdx.y;
    const float *x = X + (int64_t)t * x_stride;
    float *y = Y + (int64_t)t * y_stride + (int64_t)g * n;
    double sx = 0.0, sy = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        sx += (double)x[i] * x[i];
        sy += (double)y[i] * y[i];
    }
    sx = block_sum_double(sx);
    sy = block_sum_double(sy);
    const float f = (float)sqrt(sx / sy);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] *= f;
}

void launch_match_norm(const pyllm_op *op, const exec &e) {
    dim3 grid(op->n_head, e.rows);
    PQ_LAUNCH(grid, 256, 0, e.stream, match_norm_kernel)(op->x + (int64_t)e.row0 * op->x_stride, op->x_stride, op->y,
                                                         op->y_stride, op->n_in);
}

/* y = max(x - (mean + s std), 0) over each row, std with n - 1: a block per row */
__global__ void sparsify_kernel(const float *__restrict__ X, int64_t x_stride, float *Y, int64_t y_stride, int64_t n,
                                float s) {
    const int t = blockIdx.x;
    const float *x = X + (int64_t)t * x_stride;
    float *y = Y + (int64_t)t * y_stride;
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += (double)x[i];
    const double mean = block_sum_double(sum) / (double)n;
    const float m = (float)mean;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += (double)(x[i] - m) * (x[i] - m);
    const double std = sqrt(block_sum_double(ss) / (double)(n > 1 ? n - 1 : 1));
    const float cut = (float)(mean + (double)s * std);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = x[i] > cut ? x[i] - cut : 0.0f;
}

void launch_sparsify(const pyllm_op *op, const exec &e) {
    PQ_LAUNCH(dim3(e.rows), 256, 0, e.stream, sparsify_kernel)(op->x + (int64_t)e.row0 * op->x_stride, op->x_stride,
                                                               op->y, op->y_stride, op->n_in, op->scale);
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
                                 const float *__restrict__ expert_scale, int groups, int groups_used, int rows) {
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
    for (int j = 0; j < k; j++) {
        y[k + j] = ((type & MOE_NORM) ? y[k + j] / wsum : y[k + j]) * scale;
        if (expert_scale) y[k + j] *= expert_scale[(int)y[j]];
    }
}

void launch_moe_route(const pyllm_op *op, const exec &e) {
    PQ_LAUNCH(blocks_for(e.rows, 64), 64, 0, e.stream, moe_route_kernel)(op->x, op->x_stride, op->y, op->y_stride,
                                                                       (int)op->n_in, op->n_head, op->type,
                                                                       op->scale, op->bias, (const float *)op->w,
                                                                       op->n_kv_head, op->head_dim, e.rows);
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
