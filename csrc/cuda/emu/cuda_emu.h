/* cuda_emu.h: enough of CUDA to run csrc/cuda/ on the CPU, for tests.
 *
 * With -DPYLLM_CUDA_EMU, common.cuh includes this header instead of
 * <cuda_runtime.h> and <cuda_fp16.h>, and g++ compiles the .cu files as C++
 * (`make cuda-emu` -> build/libpyllm_cuda_emu.so). It provides what those
 * sources use and nothing more.
 *
 * How kernels run (cuda_emu.cpp): a launch runs its blocks one after another
 * on the calling OS thread; in a block every CUDA thread is a coroutine with
 * its own small stack. The scheduler runs each thread until it reaches a
 * barrier (__syncthreads, or a warp operation: shuffles, __syncwarp) or
 * returns; a barrier releases its threads once all of them have arrived.
 * Since blocks never overlap, a function-local `static` is a correct
 * per-block __shared__ variable. Barriers that can never complete (some
 * threads exited, or wait at another barrier) end the launch with an error
 * that names the threads and source lines; nothing hangs.
 *
 * Race detection: the order in which runnable threads (and blocks) are run
 * is forward, reverse or a seeded shuffle (pyllm_cuda_emu_set_order, or
 * $PYLLM_CUDA_EMU_ORDER = forward | reverse | shuffle[:seed]). A kernel that
 * reads shared memory another thread writes without a barrier in between
 * gives different results under different orders.
 *
 * Device code here is the device pass (__CUDA_ARCH__ is defined), so
 * __host__ __device__ helpers take their device branches, with the
 * intrinsics below. Float math calls glibc's functions (expf, tanhf, pow,
 * sin, cos ...), which can differ from the GPU's by an ulp or two; and g++
 * never fuses a * b + c into an FMA (the build passes -ffp-contract=off)
 * where nvcc does by default. Everything else (integer and fp16 intrinsics,
 * conversions, single float operations) is bit-exact.
 */
#ifndef PYLLM_CUDA_EMU_H
#define PYLLM_CUDA_EMU_H

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>

#ifndef __CUDA_ARCH__
#define __CUDA_ARCH__ 900
#endif

/* ---- keywords ---- */

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
/* one block runs at a time, so a function-local static is per-block shared memory */
#define __shared__ static
#define PQEMU_API __attribute__((visibility("hidden")))

/* ---- vector types ---- */

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct alignas(16) int4 {
    int x, y, z, w;
};

inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }

/* ---- fp16 ---- */

struct __half {
    unsigned short x_;
};

namespace pqemu {

inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* IEEE binary16 -> binary32: exact for every input (NaN payloads kept) */
inline float half_to_float(unsigned short h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) return u2f(f2u((float)man * 0x1p-24f) | sign);   /* zero, subnormal: man 2^-24 */
    if (exp == 31) return u2f(sign | 0x7f800000u | (man << 13));
    return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

/* binary32 -> binary16, round to nearest even; overflow to inf; NaN to the
 * canonical 0x7fff, as the GPU's cvt.rn.f16.f32 gives */
inline unsigned short float_to_half(float f) {
    uint32_t x = f2u(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return 0x7fff;
    if (x >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);   /* >= 65520 (and inf) */
    if (x >= 0x38800000u) {                                          /* normal: rebias, drop 13 bits */
        uint32_t h = (x >> 13) - (112u << 10);
        const uint32_t rem = x & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;       /* may carry into the exponent */
        return (unsigned short)(sign | h);
    }
    if (x <= 0x33000000u) return (unsigned short)sign;               /* <= 2^-25: to (even) zero */
    const uint32_t e = x >> 23, man = (x & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;                                  /* subnormal: man 2^(e-126) units */
    uint32_t h = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (unsigned short)(sign | h);
}

}  // namespace pqemu

inline float __half2float(__half h) { return pqemu::half_to_float(h.x_); }
inline __half __float2half_rn(float f) { return __half{pqemu::float_to_half(f)}; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.x_; }

/* ---- integer and float intrinsics ---- */

inline int __dp4a(int a, int b, int c) {   /* c + sum of the four signed byte products */
    for (int j = 0; j < 4; j++) c += (int)(int8_t)(a >> (8 * j)) * (int)(int8_t)(b >> (8 * j));
    return c;
}

inline unsigned __vsub4(unsigned a, unsigned b) {   /* bytewise a - b, wrapping */
    unsigned r = 0;
    for (int j = 0; j < 4; j++) r |= ((((a >> (8 * j)) & 0xffu) - ((b >> (8 * j)) & 0xffu)) & 0xffu) << (8 * j);
    return r;
}

/* single IEEE operations; -ffp-contract=off keeps them apart */
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __uint_as_float(unsigned u) { return pqemu::u2f(u); }
inline unsigned __float_as_uint(float f) { return pqemu::f2u(f); }

/* cvt.rni.s32.f32: nearest even, saturating, NaN -> 0 */
inline int __float2int_rn(float f) {
    if (f != f) return 0;
    if (f >= 2147483648.0f) return INT_MAX;
    if (f <= -2147483648.0f) return INT_MIN;
    return (int)std::nearbyint(f);   /* the default rounding mode: to nearest even */
}

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

/* ---- the runtime API (the part runtime.cu uses) ---- */

enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
};

enum cudaDeviceAttr { cudaDevAttrClockRate = 13, cudaDevAttrMemoryClockRate = 36 };

constexpr unsigned cudaStreamNonBlocking = 1;

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor;
    int multiProcessorCount;
    int memoryBusWidth;
};

struct CUstream_st;
struct CUevent_st;
typedef CUstream_st *cudaStream_t;
typedef CUevent_st *cudaEvent_t;

PQEMU_API cudaError_t cudaGetDeviceCount(int *count);
PQEMU_API cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
PQEMU_API cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
PQEMU_API cudaError_t cudaSetDevice(int device);
PQEMU_API cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
PQEMU_API cudaError_t cudaGetLastError(void);
PQEMU_API cudaError_t cudaPeekAtLastError(void);
PQEMU_API const char *cudaGetErrorString(cudaError_t error);

PQEMU_API cudaError_t cudaMalloc(void **ptr, size_t bytes);
PQEMU_API cudaError_t cudaFree(void *ptr);
PQEMU_API cudaError_t cudaMallocHost(void **ptr, size_t bytes);
PQEMU_API cudaError_t cudaFreeHost(void *ptr);
PQEMU_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                                      cudaStream_t stream);
PQEMU_API cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream);

PQEMU_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
PQEMU_API cudaError_t cudaStreamDestroy(cudaStream_t stream);
PQEMU_API cudaError_t cudaStreamSynchronize(cudaStream_t stream);

/* graphs: launches on a capturing stream are recorded, not run; a graph's launch runs them in
 * order. Copies, memsets and synchronization of a capturing stream are refused (pyllm captures
 * kernels only), and they invalidate the capture as CUDA's do */
struct CUgraph_st;
struct CUgraphExec_st;
typedef CUgraph_st *cudaGraph_t;
typedef CUgraphExec_st *cudaGraphExec_t;
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};
PQEMU_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
PQEMU_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
PQEMU_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags);
PQEMU_API cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
PQEMU_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
PQEMU_API cudaError_t cudaGraphDestroy(cudaGraph_t graph);

PQEMU_API cudaError_t cudaEventCreate(cudaEvent_t *event);
PQEMU_API cudaError_t cudaEventDestroy(cudaEvent_t event);
PQEMU_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
PQEMU_API cudaError_t cudaEventSynchronize(cudaEvent_t event);
PQEMU_API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* ---- the scheduler's view from inside a kernel ---- */

namespace pqemu {

/* where the current thread is: set by the scheduler before it resumes a thread */
struct thread_regs {
    uint3 thread_idx, block_idx;
    dim3 block_dim, grid_dim;
    int lane;
};
extern PQEMU_API thread_regs regs;

PQEMU_API void block_barrier(const char *file, int line);
/* writes `value` to this lane's slot, waits for the lanes of `mask`, returns src_lane's value */
PQEMU_API uint64_t warp_exchange(unsigned mask, uint64_t value, int src_lane, const char *op, const char *file,
                                 int line);
PQEMU_API void *dynamic_shared(void);
/* a load of `bytes` at p that the GPU needs aligned: ends the block with an error if it is not */
PQEMU_API void check_aligned(const void *p, int bytes, const char *file, int line);

struct launch_config {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    const char *kernel, *file;
    int line;
};
/* runs body(arg) as every thread of the grid, then returns; errors go where CUDA's would */
PQEMU_API void run_grid(const launch_config &cfg, void (*body)(void *), void *arg);
/* on a capturing stream: checks the launch's configuration, records run for the graph and
 * returns true; else false (the caller runs the launch now) */
PQEMU_API bool capture_launch(const launch_config &cfg, std::function<void()> run);

/* k<<<grid, block, smem, stream>>>(args) as launcher(k, cfg)(args): the arguments
 * convert to the kernel's parameter types as in a call, and every thread calls the
 * kernel with its own copy of them */
template <class... P>
class launcher {
  public:
    launcher(void (*kernel)(P...), const launch_config &cfg) : kernel_(kernel), cfg_(cfg) {}
    void operator()(P... args) const {
        frame f{kernel_, std::tuple<P...>(args...)};
        if (capture_launch(cfg_, [f, cfg = cfg_]() mutable { run(cfg, f); })) return;
        run(cfg_, f);
    }

  private:
    struct frame {
        void (*kernel)(P...);
        std::tuple<P...> args;
    };
    static void run(const launch_config &cfg, frame &f) {
        run_grid(cfg, [](void *p) {
            frame *fr = static_cast<frame *>(p);
            std::apply(fr->kernel, fr->args);
        }, &f);
    }

    void (*kernel_)(P...);
    launch_config cfg_;
};

template <class... P>
launcher<P...> make_launcher(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             const char *name, const char *file, int line) {
    return launcher<P...>(kernel, launch_config{grid, block, smem, stream, name, file, line});
}

template <class T>
T shuffle(unsigned mask, T v, int src, const char *op, const char *file, int line) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = warp_exchange(mask, bits, src, op, file, line);
    T out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

}  // namespace pqemu

#define PQEMU_LAUNCH(grid, block, smem, stream, ...) \
    ::pqemu::make_launcher(__VA_ARGS__, grid, block, smem, stream, #__VA_ARGS__, __FILE__, __LINE__)
#define PQEMU_EXTERN_SHARED(type, name) type *const name = static_cast<type *>(::pqemu::dynamic_shared())

#define threadIdx (static_cast<const uint3 &>(::pqemu::regs.thread_idx))
#define blockIdx (static_cast<const uint3 &>(::pqemu::regs.block_idx))
#define blockDim (static_cast<const dim3 &>(::pqemu::regs.block_dim))
#define gridDim (static_cast<const dim3 &>(::pqemu::regs.grid_dim))
constexpr int warpSize = 32;

/* ---- barriers and warp operations (the call site names the barrier in error messages) ---- */

inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    pqemu::block_barrier(file, line);
}

inline void __syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
    pqemu::warp_exchange(mask, 0, pqemu::regs.lane, "__syncwarp", file, line);
}

/* the source lane of each shuffle, as the PTX shfl.sync modes define it for segments of
 * `width` lanes: a lane outside its segment's range reads its own value */
template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32, const char *file = __builtin_FILE(),
              int line = __builtin_LINE()) {
    const int lane = pqemu::regs.lane, seg = lane & ~(width - 1);
    return pqemu::shuffle(mask, v, seg + (src_lane & (width - 1)), "__shfl_sync", file, line);
}

template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, const char *file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
    const int lane = pqemu::regs.lane, seg = lane & ~(width - 1);
    int src = lane ^ lane_mask;
    if (src >= seg + width) src = lane;
    return pqemu::shuffle(mask, v, src, "__shfl_xor_sync", file, line);
}

template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32, const char *file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
    const int lane = pqemu::regs.lane;
    const int src = (lane & (width - 1)) + (int)delta < width ? lane + (int)delta : lane;
    return pqemu::shuffle(mask, v, src, "__shfl_down_sync", file, line);
}

#endif
