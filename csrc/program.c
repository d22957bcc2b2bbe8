/* program.c: runs an op program for one step (stub until the core lands) */
#include <stdint.h>
#include <stddef.h>
#include "pyllm.h"

const char *pyllm_error(void) { return "not implemented"; }
pyllm_ctx *pyllm_ctx_new(int n_threads) { (void)n_threads; return NULL; }
void pyllm_ctx_free(pyllm_ctx *ctx) { (void)ctx; }
int pyllm_ctx_threads(const pyllm_ctx *ctx) { (void)ctx; return 0; }
int pyllm_program_check(const pyllm_op *ops, int n_ops) { (void)ops; (void)n_ops; return 1; }
int pyllm_run(pyllm_ctx *ctx, const pyllm_op *ops, int n_ops, const pyllm_step *step) {
    (void)ctx; (void)ops; (void)n_ops; (void)step; return -1;
}
void pyllm_profile_enable(pyllm_ctx *ctx, int on) { (void)ctx; (void)on; }
void pyllm_profile_reset(pyllm_ctx *ctx) { (void)ctx; }
void pyllm_profile_read(const pyllm_ctx *ctx, double *a, double *b, double *c, double *d) {
    (void)ctx; (void)a; (void)b; (void)c; (void)d;
}
double pyllm_membw(pyllm_ctx *ctx, const void *buf, size_t bytes, int reps) {
    (void)ctx; (void)buf; (void)bytes; (void)reps; return 0;
}
