/* matmul.c: y[t, :] (+)= W x[t] (+ bias) for quantized or float weights.
 *
 * W has n_out rows of n_in elements in a GGUF format. The activations were
 * quantized once, by an OP_QUANTIZE before this op, into the format the
 * weight type's dot product takes (float weights read x as it is).
 *
 * Threads split the output columns. With one token (decode) each thread
 * streams its rows of W once: the op is bound by memory bandwidth. With many
 * tokens (prefill) a thread walks its rows in tiles of TILE_ROWS and runs
 * every token through a tile while it sits in L1, so each weight byte is
 * read from memory once per op instead of once per token.
 */
#include <string.h>

#include "core.h"

#define TILE_ROWS 16

static void gemv_rows(int type, int64_t n, const uint8_t *w, size_t row_bytes, int nrows,
                      const void *a, float *out) {
    if (K.gemv[type]) {
        K.gemv[type](n, w, row_bytes, nrows, a, out);
        return;
    }
    for (int r = 0; r < nrows; r++) out[r] = K.vec_dot[type](n, w + (size_t)r * row_bytes, a);
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

    int64_t lo, hi;
    split_range(op->n_out, ith, nth, TILE_ROWS, &lo, &hi);

    float part[TILE_ROWS];
    for (int64_t c0 = lo; c0 < hi; c0 += TILE_ROWS) {
        int nrows = (int)(hi - c0 < TILE_ROWS ? hi - c0 : TILE_ROWS);
        const uint8_t *w = (const uint8_t *)op->w + (size_t)c0 * row_bytes;
        for (int t = 0; t < r->rows; t++) {
            gemv_rows(type, n, w, row_bytes, nrows, act_base + (size_t)t * act_bytes, part);
            float *y = op->y + (int64_t)t * op->y_stride + c0;
            if (op->bias)
                for (int i = 0; i < nrows; i++) part[i] += op->bias[c0 + i];
            if (accumulate)
                for (int i = 0; i < nrows; i++) y[i] += part[i];
            else
                memcpy(y, part, (size_t)nrows * sizeof(float));
        }
    }
}
