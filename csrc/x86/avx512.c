/* avx512.c (stub) */
