/* neon.c (stub) */
