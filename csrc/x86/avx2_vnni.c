/* avx2_vnni.c: the AVX2 kernels again, built with -mavxvnni, so that their
 * integer dots use vpdpbusd / vpdpwssd (see the header of avx2.c). Picked
 * by dispatch.c for the AVX2 level where the CPU has AVX-VNNI. */
#define KERNELS_FILL_AVX2 kernels_fill_avx2_vnni
#include "avx2.c"
