/* ops.c: (stub until the core lands) */
