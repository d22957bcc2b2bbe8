/* pyllm_cuda_emu.h: what libpyllm_cuda_emu.so adds to the ABI of
 * libpyllm_cuda.so (pyllm_cuda.h): the CUDA emulator's controls, for tests.
 * Only plain declarations here (no macros, no includes): cffi parses it.
 */

/* the order a block's runnable threads (and a grid's blocks) run in between barriers */
enum pyllm_cuda_emu_order {
    PYLLM_CUDA_EMU_ORDER_FORWARD = 0,
    PYLLM_CUDA_EMU_ORDER_REVERSE = 1,
    PYLLM_CUDA_EMU_ORDER_SHUFFLE = 2   /* a permutation drawn from the seed, per block and round */
};

/* sets the order for later launches (the default comes from $PYLLM_CUDA_EMU_ORDER); 0 or -1 */
int pyllm_cuda_emu_set_order(int order, uint64_t seed);
int pyllm_cuda_emu_get_order(uint64_t *seed);
/* kernels launched, blocks run, and thread resumptions (context switches into a thread) so far */
void pyllm_cuda_emu_stats(uint64_t *launches, uint64_t *blocks, uint64_t *resumes);

/* the emulator's fp16 conversions (__float2half_rn, __half2float), for tests */
void pyllm_cuda_emu_f32_to_f16(const float *x, uint16_t *out, int64_t n);
void pyllm_cuda_emu_f16_to_f32(const uint16_t *x, float *out, int64_t n);

/* the emulator's own tests (csrc/cuda/emu/selftest.cu): runs one kernel into out[0 .. n_out);
 * returns the cudaError_t it ended with (0: none) and its description in msg */
enum pyllm_cuda_emu_selftest_case {
    PYLLM_CUDA_EMU_TEST_GOOD = 0,                /* barriers and shuffles that keep the rules */
    PYLLM_CUDA_EMU_TEST_INDICES = 1,             /* 2-d grid, 3-d blocks */
    PYLLM_CUDA_EMU_TEST_RACE = 2,                /* a shared read with no barrier after the write */
    PYLLM_CUDA_EMU_TEST_DIVERGENT_BARRIER = 3,   /* __syncthreads at two places */
    PYLLM_CUDA_EMU_TEST_EXIT_BEFORE_BARRIER = 4,
    PYLLM_CUDA_EMU_TEST_EXITED_LANE = 5,         /* a shuffle whose mask holds an exited lane */
    PYLLM_CUDA_EMU_TEST_DEADLOCK = 6,            /* __syncwarp against __syncthreads */
    PYLLM_CUDA_EMU_TEST_PARTIAL_WARP = 7,        /* a full mask in a 16-lane warp */
    PYLLM_CUDA_EMU_TEST_BAD_CONFIG = 8,          /* 2048 threads per block */
    PYLLM_CUDA_EMU_TEST_SHARED_POISON = 9,       /* dynamic shared memory read before written */
    PYLLM_CUDA_EMU_TEST_GRAPH = 10,              /* INDICES captured on a stream, then replayed twice */
    PYLLM_CUDA_EMU_TEST_COPY_IN_CAPTURE = 11     /* a memset on a capturing stream */
};
int pyllm_cuda_emu_selftest(int which, float *out, int n_out, char *msg, int msg_len);
