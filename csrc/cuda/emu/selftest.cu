/* selftest.cu: kernels for testing the CUDA emulator itself (only in
 * libpyllm_cuda_emu.so): one that keeps CUDA's rules and checks that
 * barriers, shuffles and indices work, and one per rule broken on purpose,
 * which the emulator must report instead of hanging or crashing
 * (tests/test_cuda.py, test_emulator_*). */
#include <cstdio>

#include "../common.cuh"

extern "C" {
#include "pyllm_cuda_emu.h"
}

namespace {

/* out[0]: the block's sum of thread ids (warp_sum, then shared memory); out[1 + t]: lane 0's id
 * by __shfl_sync; out[1 + n + t]: the next lane's id by __shfl_down_sync (its own id in lane 31) */
__global__ void good(float *out) {
    __shared__ float part[32];
    const int t = threadIdx.x, n = blockDim.x;
    const float s = pq::warp_sum((float)t);
    const float first = __shfl_sync(0xffffffffu, (float)t, 0);
    const int down = __shfl_down_sync(0xffffffffu, t, 1);
    if ((t & 31) == 0) part[t >> 5] = s;
    __syncthreads();
    if (t == 0) {
        float total = 0.0f;
        for (int w = 0; w < n / 32; w++) total += part[w];
        out[0] = total;
    }
    out[1 + t] = first;
    out[1 + n + t] = (float)down;
    __syncwarp();
}

/* every thread of a (2, 3) grid of (4, 2, 2) blocks writes where it is */
__global__ void indices(float *out) {
    const int b = blockIdx.x + gridDim.x * blockIdx.y;
    const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    out[b * 16 + t] = (float)(threadIdx.x + 10 * threadIdx.y + 100 * threadIdx.z + 1000 * blockIdx.x +
                              10000 * blockIdx.y);
}

/* reads a neighbour's shared write without a barrier: the result depends on the thread order */
__global__ void race(float *out) {
    __shared__ float s[256];
    const int t = threadIdx.x;
    s[t] = (float)t + 1.0f;
    out[t] = s[(t + 1) % blockDim.x];
    __syncthreads();
    s[t] = 0.0f;   /* the next run starts from zeros */
}

__global__ void divergent_barrier(float *) {
    if (threadIdx.x < 16) __syncthreads();
    else __syncthreads();
}

__global__ void exit_before_barrier(float *) {
    if (threadIdx.x == 5) return;
    __syncthreads();
}

__global__ void exited_lane(float *out) {
    if (threadIdx.x == 3) return;
    out[threadIdx.x] = pq::warp_sum(1.0f);
}

__global__ void deadlock(float *) {
    if (threadIdx.x == 0) __syncwarp();
    else __syncthreads();
}

/* 48 threads: the second warp has 16 lanes, and a full mask names 16 that do not exist */
__global__ void partial_warp(float *out) { out[threadIdx.x] = pq::warp_sum(1.0f); }

__global__ void nothing(float *) {}

/* reads dynamic shared memory before writing it: the emulator fills it with 0xff bytes (NaN) */
__global__ void shared_poison(float *out) {
    PQ_EXTERN_SHARED(float, dyn);
    out[blockIdx.x * blockDim.x + threadIdx.x] = dyn[threadIdx.x];
    __syncthreads();
    dyn[threadIdx.x] = 1.0f;
}

/* INDICES captured on a stream of its own: nothing may run until the graph is launched (the
 * first value read back then is 0); with copy_inside, a memset on the capturing stream, which
 * CUDA refuses and which invalidates the capture. The first error, else 0. */
cudaError_t graph_case(float *d, bool copy_inside, float *first) {
    cudaStream_t s;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) return e;
    cudaGraph_t g = nullptr;
    cudaGraphExec_t x = nullptr;
    e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        PQ_LAUNCH(dim3(2, 3), dim3(4, 2, 2), 0, s, indices)(d);
        e = copy_inside ? cudaMemsetAsync(d, 0, 4, s) : cudaSuccess;
        const cudaError_t ended = cudaStreamEndCapture(s, &g);
        if (e == cudaSuccess) e = ended;
    }
    if (e == cudaSuccess) e = cudaMemcpyAsync(first, d + 1, sizeof(float), cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&x, g, 0);
    for (int i = 0; i < 2 && e == cudaSuccess; i++) e = cudaGraphLaunch(x, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (x) cudaGraphExecDestroy(x);
    if (g) cudaGraphDestroy(g);
    cudaStreamDestroy(s);
    return e;
}

}  // namespace

extern "C" int pyllm_cuda_emu_selftest(int which, float *out, int n_out, char *msg, int msg_len) {
    float *d = nullptr;
    cudaError_t e = cudaMalloc((void **)&d, (size_t)n_out * sizeof(float));
    if (e != cudaSuccess) return (int)e;
    cudaMemsetAsync(d, 0, (size_t)n_out * sizeof(float), 0);
    switch (which) {
    case PYLLM_CUDA_EMU_TEST_GOOD: PQ_LAUNCH(2, 256, 0, 0, good)(d); break;
    case PYLLM_CUDA_EMU_TEST_INDICES: PQ_LAUNCH(dim3(2, 3), dim3(4, 2, 2), 0, 0, indices)(d); break;
    case PYLLM_CUDA_EMU_TEST_RACE: PQ_LAUNCH(1, 256, 0, 0, race)(d); break;
    case PYLLM_CUDA_EMU_TEST_DIVERGENT_BARRIER: PQ_LAUNCH(1, 64, 0, 0, divergent_barrier)(d); break;
    case PYLLM_CUDA_EMU_TEST_EXIT_BEFORE_BARRIER: PQ_LAUNCH(1, 64, 0, 0, exit_before_barrier)(d); break;
    case PYLLM_CUDA_EMU_TEST_EXITED_LANE: PQ_LAUNCH(1, 64, 0, 0, exited_lane)(d); break;
    case PYLLM_CUDA_EMU_TEST_DEADLOCK: PQ_LAUNCH(1, 64, 0, 0, deadlock)(d); break;
    case PYLLM_CUDA_EMU_TEST_PARTIAL_WARP: PQ_LAUNCH(1, 48, 0, 0, partial_warp)(d); break;
    case PYLLM_CUDA_EMU_TEST_BAD_CONFIG: PQ_LAUNCH(1, 2048, 0, 0, nothing)(d); break;
    case PYLLM_CUDA_EMU_TEST_SHARED_POISON: PQ_LAUNCH(2, 64, 64 * sizeof(float), 0, shared_poison)(d); break;
    case PYLLM_CUDA_EMU_TEST_GRAPH:
    case PYLLM_CUDA_EMU_TEST_COPY_IN_CAPTURE: {
        float first = -1.0f;   /* out[n_out - 1]: d[1] read back between the capture and the launch */
        e = graph_case(d, which == PYLLM_CUDA_EMU_TEST_COPY_IN_CAPTURE, &first);
        if (e != cudaSuccess) {
            if (msg && msg_len > 0) snprintf(msg, (size_t)msg_len, "%s", cudaGetErrorString(e));
            cudaFree(d);
            cudaGetLastError();
            return (int)e;
        }
        cudaStreamSynchronize(0);
        cudaMemcpyAsync(out, d, (size_t)(n_out - 1) * sizeof(float), cudaMemcpyDeviceToHost, 0);
        out[n_out - 1] = first;
        cudaFree(d);
        if (msg && msg_len > 0) snprintf(msg, (size_t)msg_len, "%s", cudaGetErrorString(cudaSuccess));
        return 0;
    }
    default: cudaFree(d); return (int)cudaErrorInvalidValue;
    }
    /* what the launch reported, then what the synchronization does: the first error wins */
    e = cudaGetLastError();
    const cudaError_t sync = cudaStreamSynchronize(0);
    if (e == cudaSuccess) e = sync;
    if (msg && msg_len > 0) snprintf(msg, (size_t)msg_len, "%s", cudaGetErrorString(e));
    cudaMemcpyAsync(out, d, (size_t)n_out * sizeof(float), cudaMemcpyDeviceToHost, 0);
    cudaFree(d);
    cudaGetLastError();
    return (int)e;
}
