/* core.h: the op kernels that program.c runs, one function per op kind.
 *
 * Each runs on every thread of the pool (ith of nth) and does its share of
 * the op's rows; program.c puts a barrier between ops. `rows` is how many
 * rows the op processes and `row0` the first input row (OPF_LAST_ROWS ops
 * read the last rows of their input and write rows 0.. of their output).
 */
#ifndef PYLLM_CORE_H
#define PYLLM_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "pyllm.h"
#include "quants.h"

#define MAX_HEAD_DIM 576 /* MLA's keys: a 512-dim latent and 64 rotated dims */
#define MAX_KV_BLOCK 1024 /* positions per KV block */
#define MAX_EXPERT_GROUPS 64 /* MOE_ROUTE's groups (DeepSeek V3: 8) */

typedef struct {
    const pyllm_step *step;
    int rows;
    int row0;
    float *scratch;        /* this thread's scratch, SCRATCH_FLOATS long */
    _Atomic int64_t *counter; /* this op's work counter, zero when the step starts */
    float *shared;         /* scratch all threads see, SHARED_FLOATS long */
} op_rows;

#define SCRATCH_FLOATS (1 << 20) /* 4 MB per thread, touched only as far as used */
#define SHARED_FLOATS (1 << 20)  /* 4 MB for the whole pool */

/* row t of an op's input (from row0: the head's first op reads the last rows) and of its output */
#define IN_ROW(op, r, t) ((op)->x + (int64_t)((r)->row0 + (t)) * (op)->x_stride)
#define OUT_ROW(op, t) ((op)->y + (int64_t)(t) * (op)->y_stride)

/* KV_STORE / ATTENTION: the block table of row t's sequence (pyllm_step.row_table) */
static inline const int32_t *row_blocks(const pyllm_step *st, int64_t t) {
    return st->row_table ? st->block_table + st->row_table[t] : st->block_table;
}

/* KV_STORE / ATTENTION: value dims per head (head_dim_v 0 means head_dim) */
static inline int value_dim(const pyllm_op *op) { return op->head_dim_v > 0 ? op->head_dim_v : op->head_dim; }

/* floats of scratch an attention work item needs (attention.c) */
size_t attention_scratch_floats(int head_dim, int head_dim_v, int group, int block_size);
int64_t matmul_scratch_floats(int64_t rows);
size_t matmul_rows4_bytes(void); /* the scratch past matmul_scratch_floats that a ROWS4 matmul copies into */
int rows4_fits(int type, int64_t n); /* rows of n elements of type can be in the ROWS4 layout */
/* element row `row` of a ROWS4 matrix (quants.h) of n_rows x n as floats */
void rows4_dequant_row(int type, int64_t n, const uint8_t *w, int64_t n_rows, int64_t row, float *out);
int64_t matmul_id_scratch_floats(const pyllm_op *op, int64_t rows);

/* A thread's way through an op's n_chunks work items (matmul.c). Streaming (a
 * decode step reading weights once): the items are cut into contiguous segments,
 * one per thread, each taken front to back before helping with the others', so a
 * thread reads one stretch of weights in order; else one shared counter. The
 * op's counter (op_rows.counter) serves either way. */
typedef struct { int64_t n_chunks; int nseg, home, left, segmented; } chunk_cursor;
chunk_cursor chunk_cursor_start(int64_t n_chunks, int streaming, int ith, int nth);
int64_t chunk_cursor_next(chunk_cursor *c, _Atomic int64_t *counter); /* the next item, -1 when none is left */

/* the share [*lo, *hi) of n items that thread ith of nth does, in multiples of `align` */
static inline void split_range(int64_t n, int ith, int nth, int64_t align, int64_t *lo, int64_t *hi) {
    int64_t chunks = (n + align - 1) / align;
    int64_t a = chunks * ith / nth, b = chunks * (ith + 1) / nth;
    *lo = a * align < n ? a * align : n;
    *hi = b * align < n ? b * align : n;
}

/* out[t * out_stride + r] = row r of w (type, n elements) . activation row t,
 * for r < nrows, t < ncols: the level's gemm, else its gemv per activation
 * row, else its vec_dot (matmul.c; attention's scores use it too) */
void gemm_rows(int type, int64_t n, const uint8_t *w, size_t row_bytes, int nrows, const uint8_t *a,
               size_t a_stride, int ncols, float *out, size_t out_stride);
/* out[r] = row r of w . activation a, r < nrows: the level's gemv, else its vec_dot */
void gemv_rows(int type, int64_t n, const uint8_t *w, size_t row_bytes, int nrows, const void *a, float *out);
/* a chunk of nrows weight rows (from a ROWS4 group's start when rows4) as its kernel reads it: in
 * place for a gemv where the level has a gemv4 (*in_place = 1), else a ROWS4 chunk copied out into
 * plain rows (returned), a plain chunk as it is */
const uint8_t *chunk_weights(int type, int64_t n, const uint8_t *w, int nrows, int rows4, int gemv, uint8_t *plain,
                             int *in_place);
/* gemv_rows, or the level's gemv4 on a chunk chunk_weights left in place */
void gemv_chunk(int type, int in_place, int64_t n, const uint8_t *w, size_t row_bytes, int nrows, const void *a,
                float *out);

void op_embed(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_rmsnorm(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_quantize(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_matmul(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_rope(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_kv_store(const pyllm_op *op, const op_rows *r, int ith, int nth);
/* x[0..n) <- the orthonormal Walsh-Hadamard matrix (Sylvester's order, 1/sqrt(piece) entries) times
 * each piece of `piece` values (a power of 2 dividing n); its own inverse */
void hadamard_rotate(float *x, int64_t n, int piece);

/* bytes of n values of a KV pool in format type (T_F16, or T_Q8_0 / T_Q4_0 with n % 32 == 0) */
static inline int64_t kv_bytes(int type, int64_t n) { return (int64_t)weight_row_bytes(type, n); }
void op_attention(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_pos_scale(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_glu(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_add(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_lerp(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_scale(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_moe_route(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_matmul_id(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_moe_sum(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_copy(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_mix(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_match_norm(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_sparsify(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_sumsq(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_save_rows(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_sumsq_routed(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_matmul_cols(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_ssm_conv(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_ssm_scan(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_delta_net(const pyllm_op *op, const op_rows *r, int ith, int nth);
void op_wkv(const pyllm_op *op, const op_rows *r, int ith, int nth);

#endif
