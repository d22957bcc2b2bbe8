/* avx2.c (stub) */
