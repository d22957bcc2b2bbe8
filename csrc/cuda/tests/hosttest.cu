/* hosttest.cu: quant.cuh's readings of the weight formats, compiled for the
 * host (`make cuda` builds build/libpyllm_cuda_hosttest.so next to the CUDA
 * library), so that tests/test_cuda.py checks the very code the kernels use
 * against the C core and gguf's dequantize on machines without a GPU. */
#include "../quant.cuh"

using namespace pq;

template <int T>
static void unpack(const uint8_t *row, int g, int32_t *q16, float *a, float *b) {
    int q[4];
    unpack16<T>(row, g, q, *a, *b);
    for (int i = 0; i < 16; i++) q16[i] = (int8_t)(((uint32_t)q[i / 4] >> (8 * (i % 4))) & 0xffu);
}

extern "C" {

/* group g (16 elements) of a weight row: q16[16] integers with w = a q + b; -1 for float/unknown types */
int pq_host_unpack16(int type, const uint8_t *row, int g, int32_t *q16, float *a, float *b) {
    switch (type) {
    case T_Q4_0: unpack<T_Q4_0>(row, g, q16, a, b); return 0;
    case T_Q4_1: unpack<T_Q4_1>(row, g, q16, a, b); return 0;
    case T_Q5_0: unpack<T_Q5_0>(row, g, q16, a, b); return 0;
    case T_Q5_1: unpack<T_Q5_1>(row, g, q16, a, b); return 0;
    case T_Q8_0: unpack<T_Q8_0>(row, g, q16, a, b); return 0;
    case T_IQ4_NL: unpack<T_IQ4_NL>(row, g, q16, a, b); return 0;
    case T_MXFP4: unpack<T_MXFP4>(row, g, q16, a, b); return 0;
    case T_Q2_K: unpack<T_Q2_K>(row, g, q16, a, b); return 0;
    case T_Q3_K: unpack<T_Q3_K>(row, g, q16, a, b); return 0;
    case T_Q4_K: unpack<T_Q4_K>(row, g, q16, a, b); return 0;
    case T_Q5_K: unpack<T_Q5_K>(row, g, q16, a, b); return 0;
    case T_Q6_K: unpack<T_Q6_K>(row, g, q16, a, b); return 0;
    case T_IQ4_XS: unpack<T_IQ4_XS>(row, g, q16, a, b); return 0;
    case T_IQ3_S: unpack<T_IQ3_S>(row, g, q16, a, b); return 0;
    case T_IQ3_XXS: unpack<T_IQ3_XXS>(row, g, q16, a, b); return 0;
    case T_IQ2_XXS: unpack<T_IQ2_XXS>(row, g, q16, a, b); return 0;
    case T_IQ2_XS: unpack<T_IQ2_XS>(row, g, q16, a, b); return 0;
    case T_IQ2_S: unpack<T_IQ2_S>(row, g, q16, a, b); return 0;
    case T_IQ1_S: unpack<T_IQ1_S>(row, g, q16, a, b); return 0;
    case T_IQ1_M: unpack<T_IQ1_M>(row, g, q16, a, b); return 0;
    default: return -1;
    }
}

/* element k of a weight row, as the embedding kernel computes it */
float pq_host_dequant(int type, const uint8_t *row, int64_t k) { return dequant(type, row, k); }

}
