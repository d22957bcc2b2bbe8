/* matmul.c: y[t, :] (+)= W x[t] (+ bias) for quantized or float weights.
 *
 * W has n_out rows of n_in elements in a GGUF format. The activations were
 * quantized once, by an OP_QUANTIZE before this op, into the format the
 * weight type's dot product takes (float weights read x as it is).
 *
 * The output columns are cut into chunks that threads take as they go, so
 * a thread slowed by something else on the machine does not hold the
 * others up. With many tokens (prefill) a chunk is a tile of rows that
 * every token goes through while it sits in cache (gemm: each weight block
 * decoded once per few tokens), so each weight byte is read from memory
 * once per op, not once per token; the tiles come from a shared counter.
 *
 * With one token (decode) a chunk is one gemv: the weights stream through
 * once, bound by memory bandwidth, and each thread should read one
 * contiguous stretch in order: the hardware prefetcher follows it, and the
 * gemv kernels prefetch past the end of each chunk into the next rows
 * (quants.h, GEMV_PREFETCH), which must be the thread's next chunk. (With
 * chunks from a shared counter the threads' chunks interleave: each chunk
 * started cold and the prefetch past its end went to the other thread's
 * chunk; 2 threads decoded ~25% slower.) So the chunks are cut into nseg
 * contiguous segments, one per thread (threads share them beyond
 * MAX_SEGS), and the op's counter holds one count per segment (chunks taken
 * from it, SEG_BITS each). A thread takes the chunks of its own segment
 * front to back, then helps with the others' (from their fronts) until
 * every chunk is taken: the balance of a shared counter, chunk by chunk.
 * A step of a few tokens (a batch of sequences' decode steps, or a token
 * and its guesses) is bound by the weights' stream as decode is: where the
 * level's gemm streams the weights once for up to K.gemm_streams activation
 * rows (AVX-512), the step takes it (from 2 rows on) with the same
 * contiguous per-thread segments; elsewhere, up to GEMV_MAX_ROWS tokens go
 * through a gemv each over chunks that stay in cache.
 * Any split gives the same results: a row's gemv result does not depend on
 * the rows that share the call (quants.h). */
#include <stdatomic.h>
#include <string.h>

#include "core.h"

#define DECODE_CHUNK 32   /* rows per chunk with one token */
#define PREFILL_TILE 64   /* rows per tile with many tokens */
#define MIN_TILE 16
#define ROWS4_COPY_BYTES ((size_t)2 << 20) /* the scratch a ROWS4 chunk is copied out into */
_Static_assert(DECODE_CHUNK % 4 == 0 && PREFILL_TILE % 4 == 0 && MIN_TILE % 4 == 0,
               "chunks of rows start at multiples of 4: each starts a ROWS4 group");
#define SEG_BITS 16 /* the op's 64-bit counter: one 16-bit count per decode segment */
#define MAX_SEGS 4
#ifndef GEMV_MAX_ROWS
#define GEMV_MAX_ROWS 2 /* up to this many tokens, a gemv per token beats decoding a gemm tile */
#endif

void gemv_rows(int type, int64_t n, const uint8_t *w, size_t row_bytes, int nrows, const void *a, float *out) {
    if (K.gemv[type]) {
        K.gemv[type](n, w, row_bytes, nrows, a, out);
        return;
    }
    for (int r = 0; r < nrows; r++) out[r] = K.vec_dot[type](n, w + (size_t)r * row_bytes, a);
}

const uint8_t *chunk_weights(int type, int64_t n, const uint8_t *w, int nrows, int rows4, int gemv, uint8_t *plain,
                             int *in_place) {
    *in_place = rows4 && gemv && K.gemv4[type];
    if (!rows4 || *in_place) return w;
    rows4_move(type, n, w, plain, nrows, 0, K.rows4_codec[type]);
    return plain;
}

void gemv_chunk(int type, int in_place, int64_t n, const uint8_t *w, size_t row_bytes, int nrows, const void *a,
                float *out) {
    if (in_place)
        K.gemv4[type](n, w, row_bytes, nrows, a, out);
    else
        gemv_rows(type, n, w, row_bytes, nrows, a, out);
}

/* out[t * out_stride + r] for t < ncols: a tile of rows against ncols activation rows */
void gemm_rows(int type, int64_t n, const uint8_t *w, size_t row_bytes, int nrows, const uint8_t *a,
               size_t a_stride, int ncols, float *out, size_t out_stride) {
    if (K.gemm[type]) {
        K.gemm[type](n, w, row_bytes, nrows, a, a_stride, ncols, out, out_stride);
        return;
    }
    for (int t = 0; t < ncols; t++)
        gemv_rows(type, n, w, row_bytes, nrows, a + (size_t)t * a_stride, out + (size_t)t * out_stride);
}

/* ---- the ROWS4 layout (quants.h) ---- */

/* whether rows of n elements of `type` can be in the ROWS4 layout: whole blocks, and a tile of them
 * fits the scratch a prefill copies them out into */
int rows4_fits(int type, int64_t n) {
    const type_traits *t = type_info(type);
    return t && n > 0 && n % t->block_size == 0 &&
           (int64_t)weight_row_bytes(type, n) * PREFILL_TILE <= (int64_t)ROWS4_COPY_BYTES;
}

/* ROWS4 pays where the level's gemv reads it directly: copying each group out for a gemv
 * measured slower than the plain layout (per-unit copies; SmolLM2 Q4_1 decode 149 -> 70 tok/s) */
int pyllm_rows4_supported(int type, int64_t n) {
    dispatch_level();   /* K set up */
    return rows4_fits(type, n) && K.gemv4[type] != NULL;
}

int pyllm_repack_rows4(int type, const void *w, void *dst, int64_t n_rows, int64_t n) {
    if (!rows4_fits(type, n) || n_rows < 0 || !w || !dst) return -1;
    rows4_move(type, n, w, dst, n_rows, 1, K.rows4_codec[type]);
    return 0;
}

/* element row `row` of a ROWS4 matrix (n_rows x n) into out, as floats (EMBED) */
void rows4_dequant_row(int type, int64_t n, const uint8_t *w, int64_t n_rows, int64_t row, float *out) {
    const size_t rb = weight_row_bytes(type, n);
    if (row >= n_rows / 4 * 4) {
        K.dequant[type](w + (size_t)row * rb, out, n);
        return;
    }
    const int64_t unit = rows4_unit(type_info(type)->block_size);
    const size_t ub = weight_row_bytes(type, unit);
    const uint8_t *group = w + (size_t)(row / 4) * 4 * rb;
    const rows_at L = rows_group(ub, rb);
    uint8_t block[512]; /* one block: codecs are for super-block formats, whose unit is one block */
    for (int64_t i = 0; i < n; i += unit) {
        const size_t off = (size_t)(i / unit) * ub;
        const uint8_t *u = row_at(group, &L, (int)(row % 4), off, off);
        if (K.rows4_codec[type]) {   /* a re-encoded block (the K-quants' unit is one) back first */
            K.rows4_codec[type](u, block);
            u = block;
        }
        K.dequant[type](u, out + i, n - i < unit ? n - i : unit);
    }
}

/* rows per chunk: big enough to amortize a call, small enough to balance the threads */
static int chunk_rows(int64_t n_out, int rows, int nth) {
    int c = rows == 1 ? DECODE_CHUNK : PREFILL_TILE;
    while (c > MIN_TILE && n_out < (int64_t)c * nth * 4) c /= 2;
    return c;
}

int64_t matmul_scratch_floats(int64_t rows) { return rows * PREFILL_TILE; }

size_t matmul_rows4_bytes(void) { return ROWS4_COPY_BYTES; }

/* decode: the next chunk for a thread whose own segment is `home`, or -1
 * when every chunk is taken; *left counts the segments it has found empty
 * (each thread overshoots a segment's count at most once, so a count stays
 * below its segment's chunks + nth) */
static int64_t next_decode_chunk(_Atomic int64_t *counter, int64_t n_chunks, int nseg, int home, int *left) {
    for (; *left < nseg; ++*left) {
        const int s = (home + *left) % nseg;
        const int64_t lo = n_chunks * s / nseg, hi = n_chunks * (s + 1) / nseg;
        const uint64_t old = (uint64_t)atomic_fetch_add(counter, (int64_t)1 << (SEG_BITS * s));
        const int64_t k = (int64_t)(old >> (SEG_BITS * s) & ((1u << SEG_BITS) - 1));
        if (lo + k < hi) return lo + k;
    }
    return -1;
}

chunk_cursor chunk_cursor_start(int64_t n_chunks, int streaming, int ith, int nth) {
    const int nseg = nth < MAX_SEGS ? nth : MAX_SEGS;
    return (chunk_cursor){n_chunks, nseg, ith * nseg / nth, 0,
                          streaming && n_chunks / nseg + 1 + nth < (1 << SEG_BITS) - 1};
}

int64_t chunk_cursor_next(chunk_cursor *c, _Atomic int64_t *counter) {
    const int64_t ci = c->segmented ? next_decode_chunk(counter, c->n_chunks, c->nseg, c->home, &c->left)
                                    : atomic_fetch_add(counter, 1);
    return ci >= 0 && ci < c->n_chunks ? ci : -1;
}

void op_matmul(const pyllm_op *op, const op_rows *r, int ith, int nth) {
    const int type = op->type;
    const int act = type_info(type)->act;
    const int64_t n = op->n_in;
    const size_t row_bytes = weight_row_bytes(type, n);
    const size_t act_bytes = act == ACT_F32 ? (size_t)op->x_stride * sizeof(float) : act_row_bytes(act, n);
    const uint8_t *act_base = act == ACT_F32 ? (const uint8_t *)(op->x + (int64_t)r->row0 * op->x_stride)
                                             : (const uint8_t *)op->xq + (size_t)r->row0 * act_bytes;
    const int accumulate = op->flags & OPF_ACCUMULATE;
    const int by_gemv = r->rows <= GEMV_MAX_ROWS && (r->rows == 1 || r->rows > K.gemm_streams[type]);
    const int chunk = chunk_rows(op->n_out, by_gemv ? 1 : r->rows, nth);
    const int64_t n_chunks = (op->n_out + chunk - 1) / chunk;
    float *part = r->scratch; /* [rows][chunk] */
    const int rows4 = (op->flags & OPF_ROWS4) != 0;
    uint8_t *plain = (uint8_t *)(part + matmul_scratch_floats(r->rows)); /* a ROWS4 chunk copied out */
    const int streams = !by_gemv && r->rows <= K.gemm_streams[type]; /* gemm as a gemv of several rows */
    chunk_cursor cursor = chunk_cursor_start(n_chunks, by_gemv || streams, ith, nth);

    for (;;) {
        const int64_t ci = chunk_cursor_next(&cursor, r->counter);
        if (ci < 0) break;
        const int64_t c0 = ci * chunk;
        const int nrows = (int)(op->n_out - c0 < chunk ? op->n_out - c0 : chunk);
        int in_place;
        const uint8_t *w = chunk_weights(type, n, (const uint8_t *)op->w + (size_t)c0 * row_bytes, nrows, rows4,
                                         by_gemv, plain, &in_place);
        const float *b = op->bias ? op->bias + c0 : NULL;
        /* with nothing to add, the products go straight into y; else into part first */
        const int direct = !accumulate && !b;
        float *dst = direct ? op->y + c0 : part;
        if (by_gemv) /* the chunk's weights stay in cache from one activation row to the next */
            for (int t = 0; t < r->rows; t++) {
                const uint8_t *a = act_base + (size_t)t * act_bytes;
                float *o = dst + (size_t)t * (direct ? (size_t)op->y_stride : (size_t)nrows);
                gemv_chunk(type, in_place, n, w, row_bytes, nrows, a, o);
            }
        else
            gemm_rows(type, n, w, row_bytes, nrows, act_base, act_bytes, r->rows, dst,
                      direct ? (size_t)op->y_stride : (size_t)nrows);
        if (direct) continue;
        for (int t = 0; t < r->rows; t++) {
            const float *p = part + (size_t)t * nrows;
            float *y = op->y + (int64_t)t * op->y_stride + c0;
            if (accumulate && b)
                for (int i = 0; i < nrows; i++) y[i] += p[i] + b[i];
            else if (accumulate)
                for (int i = 0; i < nrows; i++) y[i] += p[i];
            else
                for (int i = 0; i < nrows; i++) y[i] = p[i] + b[i];
        }
    }
}
