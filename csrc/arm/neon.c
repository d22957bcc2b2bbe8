/* neon.c: AArch64 NEON kernels (work in progress) */
#include "quants.h"
#if defined(__aarch64__)
void kernels_fill_neon(kernel_table *t) { (void)t; }
#endif
