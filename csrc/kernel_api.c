/* kernel_api.c (stub) */
#include <stdint.h>
#include <stddef.h>
#include "pyllm.h"
int pyllm_cpu_level(void) { return 0; }
int pyllm_level_available(int isa) { return isa == 0; }
int pyllm_set_level(int isa) { return isa == 0 ? 0 : -1; }
int pyllm_get_level(void) { return 0; }
int pyllm_type_supported(int type) { (void)type; return 0; }
int pyllm_type_act(int type) { (void)type; return -1; }
size_t pyllm_act_row_bytes(int act, int64_t n) { (void)act; (void)n; return 0; }
int pyllm_kernel_provided(int isa, int kind, int type) { (void)isa; (void)kind; (void)type; return 0; }
int pyllm_kernel_dequant(int isa, int type, const void *w, float *out, int64_t n) { (void)isa; (void)type; (void)w; (void)out; (void)n; return -1; }
int pyllm_kernel_quantize_act(int isa, int act, const float *x, void *out, int64_t n) { (void)isa; (void)act; (void)x; (void)out; (void)n; return -1; }
int pyllm_kernel_vec_dot(int isa, int type, int64_t n, const void *w, const void *a, float *out) { (void)isa; (void)type; (void)n; (void)w; (void)a; (void)out; return -1; }
int pyllm_kernel_gemv(int isa, int type, int64_t n, const void *w, size_t row_bytes, int nrows, const void *a, float *out) { (void)isa; (void)type; (void)n; (void)w; (void)row_bytes; (void)nrows; (void)a; (void)out; return -1; }
int pyllm_kernel_float(int isa, int which, int64_t n, const void *a, const void *b, float s, void *out) { (void)isa; (void)which; (void)n; (void)a; (void)b; (void)s; (void)out; return -1; }
