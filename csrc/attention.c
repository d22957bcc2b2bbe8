/* attention.c: (stub until the core lands) */
