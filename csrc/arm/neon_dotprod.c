/* neon_dotprod.c: the NEON kernels again, built with +dotprod, so that
 * their integer dots use SDOT (see the header of neon.c). Picked by
 * dispatch.c where the CPU reports the dot product instructions. */
#define KERNELS_FILL_NEON kernels_fill_neon_dotprod
#include "neon.c"
