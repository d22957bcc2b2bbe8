/* quants.c: scalar reference kernels (stub) */
#include "quants.h"
