/* common.cuh: what the CUDA files share: the op ABI, type facts, launchers.
 *
 * Layouts are GGUF's (weights) and the C core's (activations: block_q8_32 =
 * {float d; float s; int8 qs[32]}, 40 bytes; block_q8_K = {float d; int8
 * qs[256]; int16 bsums[16]}, 292 bytes), so a quantized activation row means
 * the same bytes here as in csrc/quants.h.
 */
#ifndef PYLLM_CUDA_COMMON_CUH
#define PYLLM_CUDA_COMMON_CUH

#include <cstddef>
#include <cstdint>

/* PQ_LAUNCH(grid, block, smem, stream, kernel)(args...) is kernel<<<grid, block, smem,
 * stream>>>(args...), which only nvcc parses; PQ_EXTERN_SHARED(type, name) is dynamic
 * shared memory, `extern __shared__ type name[]`. The kernel comes last because a
 * template's name may hold commas (mmv_q<T, 1>). With -DPYLLM_CUDA_EMU, g++ compiles
 * these files for the CUDA emulator (make cuda-emu, emu/cuda_emu.h). */
#ifdef PYLLM_CUDA_EMU
#include "emu/cuda_emu.h"
#define PQ_LAUNCH(grid, block, smem, stream, ...) PQEMU_LAUNCH(grid, block, smem, stream, __VA_ARGS__)
#define PQ_EXTERN_SHARED(type, name) PQEMU_EXTERN_SHARED(type, name)
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define PQ_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#define PQ_EXTERN_SHARED(type, name) extern __shared__ type name[]
#endif

extern "C" {
#include "pyllm.h"
#include "pyllm_cuda.h"
}

namespace pq {

/* ggml type ids, as in GGUF files */
enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_IQ2_XXS = 16, T_IQ2_XS = 17, T_IQ3_XXS = 18, T_IQ1_S = 19, T_IQ4_NL = 20, T_IQ3_S = 21, T_IQ2_S = 22, T_IQ4_XS = 23, T_IQ1_M = 29, T_BF16 = 30,
    T_MXFP4 = 39, T_COUNT = 40
};

/* activation formats (csrc/quants.h) */
enum { ACT_F32 = 0, ACT_Q8_32 = 1, ACT_Q8_K = 2 };
constexpr int Q8_32_BYTES = 40;
constexpr int Q8_K_BYTES = 292;

struct type_info {
    int block;   /* elements per block; 0: unsupported */
    int bytes;   /* bytes per block */
    int act;     /* activation format its dot product takes */
};

/* host side */
type_info info(int type);
inline size_t weight_row_bytes(int type, int64_t n) {
    type_info t = info(type);
    return (size_t)(n / t.block) * t.bytes;
}
inline size_t act_row_bytes(int act, int64_t n) {
    return act == ACT_Q8_32 ? (size_t)(n / 32) * Q8_32_BYTES
         : act == ACT_Q8_K  ? (size_t)(n / 256) * Q8_K_BYTES
                            : (size_t)n * 4;
}

/* what a launcher needs besides the op record */
struct exec {
    int rows;                 /* rows the op processes */
    int row0;                 /* first input row (OPF_LAST_ROWS) */
    const int32_t *tokens;    /* device copies of the step's arrays */
    const int32_t *pos;
    const int32_t *table;
    const int32_t *rope_pos;  /* [3][n_tokens] M-RoPE positions (pyllm_step.rope_pos), or NULL */
    int n_tokens;             /* the step's rows (rope_pos's stride) */
    int block_size;
    bool bidirectional;       /* the step's rows see up to its last position (pyllm_step.bidirectional) */
    cudaStream_t stream;
};

/* launchers (one kernel each); errors are picked up by the caller */
void launch_embed(const pyllm_op *op, const exec &e);
void launch_rmsnorm(const pyllm_op *op, const exec &e);
void launch_quantize(const pyllm_op *op, const exec &e);
void launch_matmul(const pyllm_op *op, const exec &e);
void launch_rope(const pyllm_op *op, const exec &e);
void launch_kv_store(const pyllm_op *op, const exec &e);
void launch_attention(const pyllm_op *op, const exec &e);
void launch_glu(const pyllm_op *op, const exec &e);
void launch_add(const pyllm_op *op, const exec &e);
void launch_scale(const pyllm_op *op, const exec &e);
void launch_moe_route(const pyllm_op *op, const exec &e);
void launch_matmul_id(const pyllm_op *op, const exec &e);
void launch_moe_sum(const pyllm_op *op, const exec &e);
void launch_pos_scale(const pyllm_op *op, const exec &e);
void launch_copy(const pyllm_op *op, const exec &e);
void launch_matmul_cols(const pyllm_op *op, const exec &e);
void launch_mix(const pyllm_op *op, const exec &e);
void launch_match_norm(const pyllm_op *op, const exec &e);
void launch_sparsify(const pyllm_op *op, const exec &e);
void launch_ssm_conv(const pyllm_op *op, const exec &e);
void launch_ssm_scan(const pyllm_op *op, const exec &e);
void launch_delta_net(const pyllm_op *op, const exec &e);
void launch_wkv(const pyllm_op *op, const exec &e);
void launch_lerp(const pyllm_op *op, const exec &e);

constexpr int MAX_HEAD_DIM = 576;   /* as csrc/core.h: MLA keys, a 512-dim latent and 64 rotated */
constexpr int MAX_KV_BLOCK = 1024;
/* DELTA_NET keeps a token's normalized q and k (2 head_dim floats) in the 48 KB of shared
 * memory a kernel gets without opting in to more */
constexpr int DELTA_MAX_HEAD_DIM = 6144;
/* WKV: a thread per row of a head's state, all of a block */
constexpr int WKV_MAX_HEAD_DIM = 1024;

/* ---- device helpers ---- */

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum_double(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

inline unsigned blocks_for(int64_t n, int per_block) { return (unsigned)((n + per_block - 1) / per_block); }

}  // namespace pq

#endif
