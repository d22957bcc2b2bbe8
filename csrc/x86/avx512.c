/* avx512.c: AVX-512 kernels (work in progress) */
#include <string.h>
#include "quants.h"
void kernels_fill_avx512(kernel_table *t) { (void)t; }
