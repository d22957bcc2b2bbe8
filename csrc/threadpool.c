/* threadpool.c: (stub until the core lands) */
