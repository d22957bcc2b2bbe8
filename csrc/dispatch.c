/* dispatch.c (stub) */
#include "quants.h"
