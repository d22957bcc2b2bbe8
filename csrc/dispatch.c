/* dispatch.c: picks the kernel table for this CPU at run time.
 *
 * One table per ISA level is built once (pthread_once): the scalar entries
 * first, then each level up to it overwrites the entries it provides. The
 * global K is a copy of the table of the current level.
 *
 * Initialization contract (the core relies on this):
 *   - dispatch_init(max_isa) is idempotent and cheap. The first call (from
 *     anywhere) sets K to the best level the CPU has that is <= max_isa.
 *     Later calls never raise the level: they only lower it when max_isa is
 *     below the current one. So pyllm_ctx_new() may call
 *     dispatch_init(ISA_COUNT) every time without undoing a level a test
 *     forced with pyllm_set_level().
 *   - dispatch_set_level(isa) (pyllm_set_level) sets K to exactly that level
 *     (if the CPU has it), up or down.
 *   - The kernel_api.c entry points call dispatch_init(ISA_COUNT) lazily.
 *   Changing the level while another thread runs kernels is not supported.
 *
 * Environment (read once, at the first init; for debugging and tests):
 *   PYLLM_MAX_ISA=scalar|avx2|avx512|neon  caps the level of the first init
 *   PYLLM_AVX512_VNNI=0                     AVX-512 kernels use BW maddubs even
 *                                           where the CPU has VNNI
 *   PYLLM_AVX2_VNNI=0                       the AVX2 level uses maddubs even where
 *                                           the CPU has AVX-VNNI
 *   PYLLM_NEON_DOTPROD=0                    the NEON level uses widening multiplies
 *                                           even where the CPU has SDOT
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

#include "quants.h"

kernel_table K;

/* read by x86/avx512.c when it fills its table: use vpdpbusd */
int pyllm_avx512_vnni = 0;
/* the AVX2 level's table comes from x86/avx2_vnni.c (the same kernels with
 * AVX-VNNI dots; identical results) */
static int avx2_vnni = 0;
/* the NEON level's table comes from arm/neon_dotprod.c (SDOT; identical results) */
static int neon_dotprod = 0;

static kernel_table tables[ISA_COUNT];
static int available[ISA_COUNT];
static int env_max_isa = ISA_COUNT;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int level = -1; /* -1: K not set up yet */

/* a debugging switch set to 0 in the environment */
static int env_off(const char *name) {
    const char *v = getenv(name);
    return v && v[0] == '0';
}

static void detect(void) {
    available[ISA_SCALAR] = 1;
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
    available[ISA_AVX2] = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
    available[ISA_AVX512] = available[ISA_AVX2] && __builtin_cpu_supports("avx512f") &&
                            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                            __builtin_cpu_supports("avx512dq");
    pyllm_avx512_vnni = available[ISA_AVX512] && __builtin_cpu_supports("avx512vnni");
    if (env_off("PYLLM_AVX512_VNNI")) pyllm_avx512_vnni = 0;
    avx2_vnni = available[ISA_AVX2] && kernels_fill_avx2_vnni && __builtin_cpu_supports("avxvnni");
    if (env_off("PYLLM_AVX2_VNNI")) avx2_vnni = 0;
#elif defined(__aarch64__)
    available[ISA_NEON] = 1; /* Advanced SIMD is mandatory on AArch64 */
#if defined(__linux__)
    neon_dotprod = kernels_fill_neon_dotprod && (getauxval(AT_HWCAP) & HWCAP_ASIMDDP);
#elif defined(__APPLE__)
    neon_dotprod = kernels_fill_neon_dotprod != NULL; /* every Apple M-series core has it */
#endif
    if (env_off("PYLLM_NEON_DOTPROD")) neon_dotprod = 0;
#endif
    const char *m = getenv("PYLLM_MAX_ISA");
    if (m) {
        if (!strcmp(m, "scalar")) env_max_isa = ISA_SCALAR;
        else if (!strcmp(m, "avx2")) env_max_isa = ISA_AVX2;
        else if (!strcmp(m, "avx512")) env_max_isa = ISA_AVX512;
        else if (!strcmp(m, "neon")) env_max_isa = ISA_NEON;
    }
}

/* copy the non-NULL entries of src over dst */
static void overlay(kernel_table *dst, const kernel_table *src) {
#define OV(f) if (src->f) dst->f = src->f
    for (int i = 0; i < T_COUNT; i++) {
        OV(dequant[i]);
        OV(vec_dot[i]);
        OV(gemv[i]);
        OV(gemm[i]);
        /* a gemv4 gives its own level's gemv results: it goes with that gemv */
        if (src->gemv[i] || src->vec_dot[i]) dst->gemv4[i] = src->gemv4[i], dst->rows4_codec[i] = src->rows4_codec[i];
    }
    for (int i = 0; i < 3; i++) OV(quantize_act[i]);
    OV(f32_to_f16);
    OV(f16_to_f32);
    OV(dot_f16_f32);
    OV(axpy_f16);
    OV(dot_f32);
    OV(ssm_scan_row);
    OV(glu_silu);
    OV(glu_gelu_tanh);
    OV(glu_sigmoid);
    OV(exp_sum);
    OV(softcap);
    OV(axpy_f32);
    OV(wsum_f32);
    OV(wsum_many_f32);
    OV(wsum_many_f16);
#undef OV
}

#if defined(__x86_64__) || defined(_M_X64)
static void fill_avx2(kernel_table *t) {
    if (avx2_vnni) kernels_fill_avx2_vnni(t);
    else kernels_fill_avx2(t);
}
#elif defined(__aarch64__)
static void fill_neon(kernel_table *t) {
    if (neon_dotprod) kernels_fill_neon_dotprod(t);
    else kernels_fill_neon(t);
}
#endif

static void build_tables(void) {
    detect();
    kernels_fill_scalar(&tables[ISA_SCALAR]);
#if defined(__x86_64__) || defined(_M_X64)
    kernel_table t;
    if (available[ISA_AVX2]) {
        tables[ISA_AVX2] = tables[ISA_SCALAR];
        memset(&t, 0, sizeof t);
        fill_avx2(&t);
        overlay(&tables[ISA_AVX2], &t);
    }
    if (available[ISA_AVX512]) {
        tables[ISA_AVX512] = tables[ISA_AVX2];
        memset(&t, 0, sizeof t);
        kernels_fill_avx512(&t);
        overlay(&tables[ISA_AVX512], &t);
    }
#elif defined(__aarch64__)
    kernel_table t;
    tables[ISA_NEON] = tables[ISA_SCALAR];
    memset(&t, 0, sizeof t);
    fill_neon(&t);
    overlay(&tables[ISA_NEON], &t);
#endif
}

static void ensure_tables(void) { pthread_once(&once, build_tables); }

int dispatch_available(int isa) {
    ensure_tables();
    return isa >= 0 && isa < ISA_COUNT && available[isa];
}

/* the best available level <= max_isa */
static int best_level(int max_isa) {
    int best = ISA_SCALAR;
    for (int i = 0; i < ISA_COUNT && i <= max_isa; i++)
        if (available[i]) best = i;
    return best;
}

int dispatch_init(int max_isa) {
    ensure_tables();
    pthread_mutex_lock(&lock);
    if (level < 0) {
        level = best_level(max_isa < env_max_isa ? max_isa : env_max_isa);
        K = tables[level];
    } else if (max_isa < level) {
        level = best_level(max_isa);
        K = tables[level];
    }
    int r = level;
    pthread_mutex_unlock(&lock);
    return r;
}

int dispatch_set_level(int isa) {
    if (!dispatch_available(isa)) return -1;
    pthread_mutex_lock(&lock);
    level = isa;
    K = tables[isa];
    pthread_mutex_unlock(&lock);
    return isa;
}

int dispatch_level(void) {
    if (level < 0) dispatch_init(ISA_COUNT);
    return level;
}

int dispatch_cpu_level(void) {
    ensure_tables();
    return best_level(ISA_COUNT);
}

const char *dispatch_level_name(int isa) {
    if (!dispatch_available(isa)) return "";
    switch (isa) {
    case ISA_SCALAR: return "scalar";
    case ISA_AVX2: return avx2_vnni ? "avx2+avxvnni" : "avx2";
    case ISA_AVX512: return pyllm_avx512_vnni ? "avx512+vnni" : "avx512";
    case ISA_NEON: return neon_dotprod ? "neon+dotprod" : "neon";
    default: return "";
    }
}

const kernel_table *dispatch_table(int isa) {
    if (!dispatch_available(isa)) return NULL;
    return &tables[isa];
}

const kernel_table *dispatch_table_ready(int isa) {
    dispatch_init(ISA_COUNT);
    return dispatch_table(isa);
}

/* the level's own entries (not those inherited from below), for
 * pyllm_kernel_provided; NULL if unavailable */
int dispatch_own(int isa, kernel_table *out) {
    if (!dispatch_available(isa)) return -1;
    memset(out, 0, sizeof *out);
    switch (isa) {
    case ISA_SCALAR: kernels_fill_scalar(out); break;
#if defined(__x86_64__) || defined(_M_X64)
    case ISA_AVX2: fill_avx2(out); break;
    case ISA_AVX512: kernels_fill_avx512(out); break;
#elif defined(__aarch64__)
    case ISA_NEON: fill_neon(out); break;
#endif
    default: return -1;
    }
    return 0;
}
