/* matmul.cu: activation quantization and y (+)= W x (+ bias).
 *
 * Quantized weights take the activations the op program quantized before
 * them (OP_QUANTIZE, in the C core's formats), so the integer part of every
 * block's dot product is exactly the CPU's; only the float sums of the
 * per-group products are added in another order.
 *
 * - decode (1..8 rows): mmv, one warp per output row; each lane takes every
 *   32nd group of 16 weights, unpacks it once and uses it for every row of
 *   the batch (__dp4a against the 8-bit activations), then the warp sums.
 *   (Runs of 4 consecutive groups per lane, which load a block's shared bytes
 *   once, measured 15-40% slower on an H200: a warp's loads spread over 4x the
 *   sectors.)
 * - prefill (more rows): mmq, tiles of 64 output rows x 32 tokens per block
 *   of 128 threads; per step of 8 groups (128 elements) the block unpacks the
 *   weight tile and loads the activation tile into shared memory once, then
 *   each thread accumulates a 4 x 4 patch of outputs.
 * - float weights (F32, F16, BF16) read the float activations: the same two
 *   shapes with float products.
 */
#include <type_traits>

#include "quant.cuh"

namespace pq {

constexpr int MMV_WARPS = 4;
constexpr int MMV_MAX_ROWS = 8;
constexpr int TM = 64, TN = 32, GK = 8;   /* mmq tile: rows, tokens, groups of 16 per step */
constexpr int TK = 32;                    /* float tile: elements per step */

/* the g-th group of 16 activations of one quantized row, and its block scale */
template <int ACT>
__device__ __forceinline__ void act16(const uint8_t *arow, int g, int qa[4], float &da) {
    const uint8_t *blk, *qs;
    if (ACT == ACT_Q8_32) {
        blk = arow + (size_t)(g >> 1) * Q8_32_BYTES;
        qs = blk + 8 + 16 * (g & 1);
    } else {
        blk = arow + (size_t)(g >> 4) * Q8_K_BYTES;
        qs = blk + 4 + 16 * (g & 15);
    }
    da = *reinterpret_cast<const float *>(blk);
    const int *q = reinterpret_cast<const int *>(qs);   /* 4-byte aligned in both formats */
#pragma unroll
    for (int i = 0; i < 4; i++) qa[i] = q[i];
}

__device__ __forceinline__ void store(float *y, float v, const float *bias, int col, bool accumulate) {
    if (bias) v += bias[col];
    *y = accumulate ? *y + v : v;
}

/* weight group g (unpacked: q, scale a, offset b) against activation row x's group g */
template <int ACT>
__device__ __forceinline__ float group_dot(const int q[4], float a, float b, const uint8_t *x, int g) {
    int qa[4];
    float da;
    act16<ACT>(x, g, qa, da);
    int isum = 0, asum = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        isum = __dp4a(q[i], qa[i], isum);
        asum = __dp4a(0x01010101, qa[i], asum);
    }
    return a * (da * (float)isum) + b * (da * (float)asum);
}

/* ---- quantized weights, decode ---- */

template <int T, int NR>
__global__ void __launch_bounds__(MMV_WARPS * 32)
mmv_q(const uint8_t *__restrict__ W, size_t row_bytes, int n_groups, int n_out, const uint8_t *__restrict__ X,
      size_t x_row_bytes, int n_rows, float *__restrict__ Y, int64_t y_stride, const float *__restrict__ bias,
      bool accumulate) {
    constexpr int ACT = fmt<T>::act;
    const int lane = threadIdx.x & 31;
    const int col = blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (col >= n_out) return;
    const uint8_t *w = W + (size_t)col * row_bytes;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
#pragma unroll 4   /* several groups' loads in flight: one group's are too few to cover the latency */
    for (int g = lane; g < n_groups; g += 32) {
        int q[4];
        float a, b;
        unpack16<T>(w, g, q, a, b);
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r < n_rows) acc[r] += group_dot<ACT>(q, a, b, X + (size_t)r * x_row_bytes, g);
    }
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0 && r < n_rows) store(Y + (int64_t)r * y_stride + col, v, bias, col, accumulate);
    }
}

/* ---- quantized weights, prefill ---- */

template <int T>
__global__ void __launch_bounds__(128)
mmq(const uint8_t *__restrict__ W, size_t row_bytes, int n_groups, int n_out, const uint8_t *__restrict__ X,
    size_t x_row_bytes, int n_rows, float *__restrict__ Y, int64_t y_stride, const float *__restrict__ bias,
    bool accumulate) {
    constexpr int ACT = fmt<T>::act;
    __shared__ int4 s_wq[GK][TM];
    __shared__ float s_wa[GK][TM], s_wb[GK][TM];
    __shared__ int4 s_xq[GK][TN];
    __shared__ float s_xd[GK][TN];
    __shared__ int s_xs[GK][TN];
    const int tid = threadIdx.x;
    const int col0 = blockIdx.x * TM, row0 = blockIdx.y * TN;
    const int tc = tid & 15, tr = tid >> 4;    /* this thread: columns tc*4 + i, rows tr*4 + j */
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;

    for (int g0 = 0; g0 < n_groups; g0 += GK) {
        for (int it = tid; it < TM * GK; it += 128) {
            const int c = it % TM, k = it / TM, col = col0 + c, g = g0 + k;
            int q[4] = {0, 0, 0, 0};
            float a = 0.0f, b = 0.0f;
            if (col < n_out && g < n_groups) unpack16<T>(W + (size_t)col * row_bytes, g, q, a, b);
            s_wq[k][c] = make_int4(q[0], q[1], q[2], q[3]);
            s_wa[k][c] = a;
            s_wb[k][c] = b;
        }
        for (int it = tid; it < TN * GK; it += 128) {
            const int r = it % TN, k = it / TN, row = row0 + r, g = g0 + k;
            int qa[4] = {0, 0, 0, 0};
            float da = 0.0f;
            int asum = 0;
            if (row < n_rows && g < n_groups) {
                act16<ACT>(X + (size_t)row * x_row_bytes, g, qa, da);
#pragma unroll
                for (int i = 0; i < 4; i++) asum = __dp4a(0x01010101, qa[i], asum);
            }
            s_xq[k][r] = make_int4(qa[0], qa[1], qa[2], qa[3]);
            s_xd[k][r] = da;
            s_xs[k][r] = asum;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < GK; k++) {
            int4 xq[4];
            float xd[4];
            int xs[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                xq[j] = s_xq[k][tr * 4 + j];
                xd[j] = s_xd[k][tr * 4 + j];
                xs[j] = s_xs[k][tr * 4 + j];
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int4 wq = s_wq[k][tc * 4 + i];
                const float wa = s_wa[k][tc * 4 + i], wb = s_wb[k][tc * 4 + i];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    int isum = __dp4a(wq.x, xq[j].x, 0);
                    isum = __dp4a(wq.y, xq[j].y, isum);
                    isum = __dp4a(wq.z, xq[j].z, isum);
                    isum = __dp4a(wq.w, xq[j].w, isum);
                    acc[i][j] += wa * (xd[j] * (float)isum) + wb * (xd[j] * (float)xs[j]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int row = row0 + tr * 4 + j;
        if (row >= n_rows) continue;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int col = col0 + tc * 4 + i;
            if (col < n_out) store(Y + (int64_t)row * y_stride + col, acc[i][j], bias, col, accumulate);
        }
    }
}

/* ---- float weights ---- */

template <int T, int NR>
__global__ void __launch_bounds__(MMV_WARPS * 32)
mmv_f(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n, int n_out, const float *__restrict__ X,
      int64_t x_stride, int n_rows, float *__restrict__ Y, int64_t y_stride, const float *__restrict__ bias,
      bool accumulate) {
    const int lane = threadIdx.x & 31;
    const int col = blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (col >= n_out) return;
    const uint8_t *w = W + (size_t)col * row_bytes;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    for (int64_t k = lane; k < n; k += 32) {
        const float wk = load_wf<T>(w, k);
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r < n_rows) acc[r] += wk * X[(int64_t)r * x_stride + k];
    }
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0 && r < n_rows) store(Y + (int64_t)r * y_stride + col, v, bias, col, accumulate);
    }
}

template <int T>
__global__ void __launch_bounds__(128)
mmf(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n, int n_out, const float *__restrict__ X,
    int64_t x_stride, int n_rows, float *__restrict__ Y, int64_t y_stride, const float *__restrict__ bias,
    bool accumulate) {
    __shared__ float s_w[TK][TM + 1];
    __shared__ float s_x[TK][TN + 1];
    const int tid = threadIdx.x;
    const int col0 = blockIdx.x * TM, row0 = blockIdx.y * TN;
    const int tc = tid & 15, tr = tid >> 4;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int64_t k0 = 0; k0 < n; k0 += TK) {
        for (int it = tid; it < TM * TK; it += 128) {
            const int kk = it % TK, c = it / TK, col = col0 + c;
            const int64_t k = k0 + kk;
            s_w[kk][c] = (col < n_out && k < n) ? load_wf<T>(W + (size_t)col * row_bytes, k) : 0.0f;
        }
        for (int it = tid; it < TN * TK; it += 128) {
            const int kk = it % TK, r = it / TK, row = row0 + r;
            const int64_t k = k0 + kk;
            s_x[kk][r] = (row < n_rows && k < n) ? X[(int64_t)row * x_stride + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < TK; kk++) {
            float xv[4], wv[4];
#pragma unroll
            for (int j = 0; j < 4; j++) xv[j] = s_x[kk][tr * 4 + j];
#pragma unroll
            for (int i = 0; i < 4; i++) wv[i] = s_w[kk][tc * 4 + i];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += wv[i] * xv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int row = row0 + tr * 4 + j;
        if (row >= n_rows) continue;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int col = col0 + tc * 4 + i;
            if (col < n_out) store(Y + (int64_t)row * y_stride + col, acc[i][j], bias, col, accumulate);
        }
    }
}

/* ---- experts (OP_MATMUL_ID): one warp per output row of one (token, slot) ---- */

/* the expert of slot j of row t (route ids are floats), or -1; no route: matrix j (one per head) */
__device__ __forceinline__ int slot_expert(const float *route, int64_t route_stride, int t, int j, int n_experts) {
    if (!route) return j;
    const float id = route[(int64_t)t * route_stride + j];
    return id >= 0.0f && id < (float)n_experts ? (int)id : -1;
}

/* X: the activations, quantized (x_row_bytes per input row) or float (then in bytes too);
 * slot j of a row starts slot_bytes * j into it (0: every slot reads the whole row) */
template <int T>
__global__ void __launch_bounds__(MMV_WARPS * 32)
mmv_id(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n, int n_out, int n_experts, int k,
       const float *__restrict__ route, int64_t route_stride, const uint8_t *__restrict__ X, size_t x_row_bytes,
       size_t slot_bytes, float *__restrict__ Y, int64_t y_stride, const float *__restrict__ bias) {
    constexpr int ACT = fmt<T>::act;
    const int lane = threadIdx.x & 31;
    const int col = blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    const int t = blockIdx.y / k, j = blockIdx.y % k;
    const int e = slot_expert(route, route_stride, t, j, n_experts);
    if (col >= n_out || e < 0) return;
    const uint8_t *w = W + ((size_t)e * n_out + col) * row_bytes;
    const uint8_t *x = X + (size_t)t * x_row_bytes + (size_t)j * slot_bytes;
    float acc = 0.0f;
    if constexpr (ACT == ACT_F32) {
        const float *xf = reinterpret_cast<const float *>(x);
        for (int64_t i = lane; i < n; i += 32) acc += load_wf<T>(w, i) * xf[i];
    } else {
        for (int g = lane; g < (int)(n / 16); g += 32) {
            int q[4];
            float a, b;
            unpack16<T>(w, g, q, a, b);
            acc += group_dot<ACT>(q, a, b, x, g);
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) Y[(int64_t)t * y_stride + (int64_t)j * n_out + col] = acc + (bias ? bias[(int64_t)e * n_out + col] : 0.0f);
}

template <int T>
static void matmul_id(const pyllm_op *op, const exec &e) {
    const int64_t n = op->n_in;
    const int k = op->n_head, n_out = (int)op->n_out;
    const bool slot_input = op->flags & OPF_SLOT_INPUT;
    const bool f32 = fmt<T>::act == ACT_F32;
    const size_t row_bytes = (size_t)(n / fmt<T>::block) * fmt<T>::bytes;
    const size_t slot_bytes = f32 ? (size_t)n * sizeof(float) : act_row_bytes(fmt<T>::act, n);
    const size_t x_row_bytes = f32 ? (size_t)op->x_stride * sizeof(float) : slot_input ? slot_bytes * k : slot_bytes;
    const uint8_t *x = f32 ? (const uint8_t *)op->x : (const uint8_t *)op->xq;
    const dim3 grid(blocks_for(n_out, MMV_WARPS), e.rows * k);
    PQ_LAUNCH(grid, MMV_WARPS * 32, 0, e.stream, mmv_id<T>)((const uint8_t *)op->w, row_bytes, n, n_out,
                                                          op->n_kv_head, k, op->x2, op->x2_stride, x, x_row_bytes,
                                                          slot_input ? slot_bytes : 0, op->y, op->y_stride, op->bias);
}

/* ---- launch ---- */

template <int T>
static void matmul_q(const pyllm_op *op, const exec &e) {
    const int64_t n = op->n_in;
    const size_t row_bytes = (size_t)(n / fmt<T>::block) * fmt<T>::bytes;
    const size_t xrb = act_row_bytes(fmt<T>::act, n);
    const uint8_t *x = (const uint8_t *)op->xq + (size_t)e.row0 * xrb;
    const int groups = (int)(n / 16), n_out = (int)op->n_out;
    const bool acc = op->flags & OPF_ACCUMULATE;
    const uint8_t *w = (const uint8_t *)op->w;
    if (e.rows == 1) {
        PQ_LAUNCH(blocks_for(n_out, MMV_WARPS), MMV_WARPS * 32, 0, e.stream, mmv_q<T, 1>)(
            w, row_bytes, groups, n_out, x, xrb, e.rows, op->y, op->y_stride, op->bias, acc);
    } else if (e.rows <= MMV_MAX_ROWS) {
        PQ_LAUNCH(blocks_for(n_out, MMV_WARPS), MMV_WARPS * 32, 0, e.stream, mmv_q<T, MMV_MAX_ROWS>)(
            w, row_bytes, groups, n_out, x, xrb, e.rows, op->y, op->y_stride, op->bias, acc);
    } else {
        dim3 grid(blocks_for(n_out, TM), blocks_for(e.rows, TN));
        PQ_LAUNCH(grid, 128, 0, e.stream, mmq<T>)(w, row_bytes, groups, n_out, x, xrb, e.rows, op->y, op->y_stride,
                                                  op->bias, acc);
    }
}

template <int T>
static void matmul_f(const pyllm_op *op, const exec &e) {
    const int64_t n = op->n_in;
    const size_t row_bytes = (size_t)n * fmt<T>::bytes;
    const float *x = op->x + (int64_t)e.row0 * op->x_stride;
    const int n_out = (int)op->n_out;
    const bool acc = op->flags & OPF_ACCUMULATE;
    const uint8_t *w = (const uint8_t *)op->w;
    if (e.rows == 1) {
        PQ_LAUNCH(blocks_for(n_out, MMV_WARPS), MMV_WARPS * 32, 0, e.stream, mmv_f<T, 1>)(
            w, row_bytes, n, n_out, x, op->x_stride, e.rows, op->y, op->y_stride, op->bias, acc);
    } else if (e.rows <= MMV_MAX_ROWS) {
        PQ_LAUNCH(blocks_for(n_out, MMV_WARPS), MMV_WARPS * 32, 0, e.stream, mmv_f<T, MMV_MAX_ROWS>)(
            w, row_bytes, n, n_out, x, op->x_stride, e.rows, op->y, op->y_stride, op->bias, acc);
    } else {
        dim3 grid(blocks_for(n_out, TM), blocks_for(e.rows, TN));
        PQ_LAUNCH(grid, 128, 0, e.stream, mmf<T>)(w, row_bytes, n, n_out, x, op->x_stride, e.rows, op->y,
                                                  op->y_stride, op->bias, acc);
    }
}

/* f(std::integral_constant<int, T>) for the weight type T of a type id (nothing for others:
 * pyllm_cuda_check rejects them) */
template <typename F>
static void by_type(int type, F &&f) {
    switch (type) {
    case T_F32: f(std::integral_constant<int, T_F32>{}); break;
    case T_F16: f(std::integral_constant<int, T_F16>{}); break;
    case T_BF16: f(std::integral_constant<int, T_BF16>{}); break;
    case T_Q4_0: f(std::integral_constant<int, T_Q4_0>{}); break;
    case T_Q4_1: f(std::integral_constant<int, T_Q4_1>{}); break;
    case T_Q5_0: f(std::integral_constant<int, T_Q5_0>{}); break;
    case T_Q5_1: f(std::integral_constant<int, T_Q5_1>{}); break;
    case T_Q8_0: f(std::integral_constant<int, T_Q8_0>{}); break;
    case T_IQ4_NL: f(std::integral_constant<int, T_IQ4_NL>{}); break;
    case T_MXFP4: f(std::integral_constant<int, T_MXFP4>{}); break;
    case T_Q2_K: f(std::integral_constant<int, T_Q2_K>{}); break;
    case T_Q3_K: f(std::integral_constant<int, T_Q3_K>{}); break;
    case T_Q4_K: f(std::integral_constant<int, T_Q4_K>{}); break;
    case T_Q5_K: f(std::integral_constant<int, T_Q5_K>{}); break;
    case T_Q6_K: f(std::integral_constant<int, T_Q6_K>{}); break;
    case T_IQ4_XS: f(std::integral_constant<int, T_IQ4_XS>{}); break;
    case T_IQ3_S: f(std::integral_constant<int, T_IQ3_S>{}); break;
    case T_IQ3_XXS: f(std::integral_constant<int, T_IQ3_XXS>{}); break;
    case T_IQ2_XXS: f(std::integral_constant<int, T_IQ2_XXS>{}); break;
    case T_IQ2_XS: f(std::integral_constant<int, T_IQ2_XS>{}); break;
    case T_IQ2_S: f(std::integral_constant<int, T_IQ2_S>{}); break;
    case T_IQ1_S: f(std::integral_constant<int, T_IQ1_S>{}); break;
    case T_IQ1_M: f(std::integral_constant<int, T_IQ1_M>{}); break;
    default: break;
    }
}

void launch_matmul(const pyllm_op *op, const exec &e) {
    by_type(op->type, [&](auto t) {
        constexpr int T = decltype(t)::value;
        if constexpr (fmt<T>::act == ACT_F32)
            matmul_f<T>(op, e);
        else
            matmul_q<T>(op, e);
    });
}

void launch_matmul_id(const pyllm_op *op, const exec &e) {
    by_type(op->type, [&](auto t) { matmul_id<decltype(t)::value>(op, e); });
}

/* ---- activation quantization: d = amax / 127, q = round-to-nearest-even(x / d) ---- */

/* one warp per 32-element block: lane j holds element j */
__global__ void quantize_q8_32(const float *__restrict__ X, int64_t x_stride, uint8_t *__restrict__ out,
                               size_t out_row_bytes, int nb) {
    const int lane = threadIdx.x & 31;
    const int b = blockIdx.x * 8 + (threadIdx.x >> 5);
    const int t = blockIdx.y;
    if (b >= nb) return;
    const float v = X[(int64_t)t * x_stride + (int64_t)b * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = __float2int_rn(v * id);
    const int sum = warp_sum_int(q);
    uint8_t *blk = out + (size_t)t * out_row_bytes + (size_t)b * Q8_32_BYTES;
    if (lane == 0) {
        reinterpret_cast<float *>(blk)[0] = d;
        reinterpret_cast<float *>(blk)[1] = d * (float)sum;
    }
    reinterpret_cast<int8_t *>(blk + 8)[lane] = (int8_t)q;
}

/* one warp per 256-element block: lane j holds elements 8j .. 8j+7 */
__global__ void quantize_q8_K(const float *__restrict__ X, int64_t x_stride, uint8_t *__restrict__ out,
                              size_t out_row_bytes, int nb) {
    const int lane = threadIdx.x & 31;
    const int b = blockIdx.x * 8 + (threadIdx.x >> 5);
    const int t = blockIdx.y;
    if (b >= nb) return;
    const float *x = X + (int64_t)t * x_stride + (int64_t)b * 256 + lane * 8;
    float v[8], amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = x[i];
        amax = fmaxf(amax, fabsf(v[i]));
    }
    amax = warp_max(amax);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t *blk = out + (size_t)t * out_row_bytes + (size_t)b * Q8_K_BYTES;
    int8_t *qs = reinterpret_cast<int8_t *>(blk + 4) + lane * 8;
    int part = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int q = __float2int_rn(v[i] * id);
        qs[i] = (int8_t)q;
        part += q;
    }
    part += __shfl_down_sync(0xffffffffu, part, 1);   /* lanes 2g, 2g+1: the 16 elements of bsums[g] */
    if ((lane & 1) == 0) reinterpret_cast<int16_t *>(blk + 260)[lane >> 1] = (int16_t)part;
    if (lane == 0) reinterpret_cast<float *>(blk)[0] = d;
}

void launch_quantize(const pyllm_op *op, const exec &e) {
    const float *x = op->x + (int64_t)e.row0 * op->x_stride;
    const size_t orb = act_row_bytes(op->type, op->n_in);
    const int nb = (int)(op->n_in / (op->type == ACT_Q8_K ? 256 : 32));
    dim3 grid(blocks_for(nb, 8), e.rows);
    if (op->type == ACT_Q8_K)
        PQ_LAUNCH(grid, 256, 0, e.stream, quantize_q8_K)(x, op->x_stride, (uint8_t *)op->xq, orb, nb);
    else
        PQ_LAUNCH(grid, 256, 0, e.stream, quantize_q8_32)(x, op->x_stride, (uint8_t *)op->xq, orb, nb);
}

}  // namespace pq
