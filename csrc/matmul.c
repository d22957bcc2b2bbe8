/* matmul.c: (stub until the core lands) */
