/* program.c: runs an op program for one step: the one FFI call per step.
 *
 * pyllm_program_check() validates a program once, when Python builds it;
 * pyllm_run() validates the step (token ids, positions, block table), then
 * every thread walks the op list, with a barrier after each op unless the
 * op says the next one does not depend on it.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core.h"
#include "threadpool.h"

#define MAX_THREADS 256

static _Thread_local char err_buf[512];

static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    return -1;
}

const char *pyllm_error(void) { return err_buf; }

typedef struct {
    double op_ns[OP_KIND_COUNT];
    double matmul_type_ns[PROFILE_TYPE_COUNT]; /* by type id */
    double busy_ns;
    char pad[64];
} thread_profile;
_Static_assert((int)PROFILE_TYPE_COUNT >= (int)T_COUNT, "every weight type has a profile slot");

struct pyllm_ctx {
    threadpool *pool;
    int n_threads;
    int profile;
    thread_profile *prof; /* [n_threads] */
    float **scratch;      /* [n_threads][SCRATCH_FLOATS] */
    float *shared;        /* [SHARED_FLOATS], seen by every thread */
    _Atomic int64_t *counters; /* one per op: chunks handed out so far */
    int n_counters;
    double wall_ns;
};

static inline double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

pyllm_ctx *pyllm_ctx_new(int n_threads) {
    if (n_threads < 1 || n_threads > MAX_THREADS) {
        fail("thread count %d is outside 1..%d", n_threads, MAX_THREADS);
        return NULL;
    }
    dispatch_init(ISA_COUNT);
    pyllm_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    ctx->n_threads = n_threads;
    ctx->prof = calloc((size_t)n_threads, sizeof(thread_profile));
    ctx->scratch = calloc((size_t)n_threads, sizeof(float *));
    ctx->shared = calloc(SHARED_FLOATS, sizeof(float));
    int scratch_ok = ctx->scratch != NULL && ctx->shared != NULL;
    for (int i = 0; scratch_ok && i < n_threads; i++) {
        /* calloc of this size maps fresh zero pages: only what is used costs memory */
        ctx->scratch[i] = calloc(SCRATCH_FLOATS, sizeof(float));
        scratch_ok = ctx->scratch[i] != NULL;
    }
    ctx->pool = threadpool_new(n_threads);
    if (!ctx->pool || !ctx->prof || !scratch_ok) {
        fail("could not start %d threads", n_threads);
        pyllm_ctx_free(ctx);
        return NULL;
    }
    return ctx;
}

void pyllm_ctx_free(pyllm_ctx *ctx) {
    if (!ctx) return;
    threadpool_free(ctx->pool);
    for (int i = 0; ctx->scratch && i < ctx->n_threads; i++) free(ctx->scratch[i]);
    free((void *)ctx->counters);
    free(ctx->scratch);
    free(ctx->shared);
    free(ctx->prof);
    free(ctx);
}

int pyllm_ctx_threads(const pyllm_ctx *ctx) { return ctx->n_threads; }

/* ---- validation ---- */

static int check_op(const pyllm_op *op) {
    const type_traits *tt;
    switch (op->kind) {
    case OP_EMBED:
    case OP_MATMUL:
        tt = type_info(op->type);
        if (!tt || !K.vec_dot[op->type] || !K.dequant[op->type])
            return fail("weight type %d is not supported by the kernels", op->type);
        if (op->n_in <= 0 || op->n_in % tt->block_size)
            return fail("row length %lld is not a whole number of %s blocks", (long long)op->n_in, tt->name);
        if (op->n_out <= 0 || !op->w || !op->y) return fail("missing weights, output or size");
        if ((op->flags & OPF_ROWS4) && !rows4_fits(op->type, op->n_in))
            return fail("%s rows of %lld cannot be in the ROWS4 layout", tt->name, (long long)op->n_in);
        if (op->kind == OP_MATMUL) {
            if (tt->act == ACT_F32 ? !op->x : !op->xq) return fail("matmul input missing");
            if (tt->act == ACT_F32 && op->x_stride < op->n_in) return fail("input stride below row length");
            if (op->y_stride < op->n_out) return fail("output stride below row length");
        } else if (op->n_in > SCRATCH_FLOATS) {
            return fail("embedding rows of %lld are more than the core's scratch holds", (long long)op->n_in);
        } else if (op->media_col < 0 || (op->media_col && !(op->flags & OPF_MEDIA_ONLY)) ||
                   ((op->flags & OPF_MEDIA_ONLY) && !(op->flags & OPF_ACCUMULATE))) {
            return fail("embed: media column %lld without OPF_MEDIA_ONLY, or that without OPF_ACCUMULATE",
                        (long long)op->media_col);
        } else if (op->y_stride < op->n_in) {
            return fail("output stride below row length");
        }
        return 0;
    case OP_RMSNORM:
        if (op->type != NORM_RMS && op->type != NORM_LAYER) return fail("unknown norm %d", op->type);
        if (!op->w || !op->x || !op->y || op->n_in <= 0) return fail("rmsnorm: missing weight or buffers");
        if (op->x_stride < op->n_in * (op->n_head > 0 ? op->n_head : 1)) return fail("rmsnorm: bad stride");
        return 0;
    case OP_QUANTIZE:
        if (op->type != ACT_Q8_32 && op->type != ACT_Q8_K) return fail("unknown activation format %d", op->type);
        if (op->n_in % (op->type == ACT_Q8_K ? QK_K : QK)) return fail("quantize: row length not whole blocks");
        if (!op->x || !op->xq || op->x_stride < op->n_in) return fail("quantize: missing buffers");
        return 0;
    case OP_ROPE:
        if (op->head_dim <= 0 || op->head_dim > MAX_HEAD_DIM || op->n_rot <= 0 || op->n_rot > op->head_dim ||
            op->n_rot % 2)
            return fail("rope: bad head size %d / rotated dims %d", op->head_dim, op->n_rot);
        if (op->x && op->x_stride < (int64_t)op->n_head * op->head_dim) return fail("rope: bad query stride");
        if (op->x2 && op->x2_stride < (int64_t)op->n_kv_head * op->head_dim) return fail("rope: bad key stride");
        if (op->rope_sections[0] < 0 || op->rope_sections[1] < 0 || op->rope_sections[2] < 0 ||
            (int64_t)op->rope_sections[0] + op->rope_sections[1] + op->rope_sections[2] > op->n_rot / 2)
            return fail("rope: M-RoPE sections %d, %d, %d do not fit %d pairs", op->rope_sections[0],
                        op->rope_sections[1], op->rope_sections[2], op->n_rot / 2);
        return 0;
    case OP_KV_STORE:
    case OP_ATTENTION:
        if (op->head_dim <= 0 || op->head_dim > MAX_HEAD_DIM || op->head_dim_v < 0 || value_dim(op) > MAX_HEAD_DIM)
            return fail("head size %d / %d unsupported", op->head_dim, op->head_dim_v);
        if (op->flags & OPF_V_IN_K && value_dim(op) > op->head_dim)
            return fail("values of %d dims cannot be read from keys of %d", value_dim(op), op->head_dim);
        if (op->n_kv_head <= 0 || op->n_head <= 0 || op->n_head % op->n_kv_head)
            return fail("%d query heads cannot share %d key/value heads", op->n_head, op->n_kv_head);
        if (!op->k_cache || !op->x || (!op->v_cache && !(op->flags & OPF_V_IN_K)))
            return fail("missing KV cache or input");
        for (int i = 0; i < 2; i++) {
            const int type = i ? (op->flags & OPF_V_IN_K ? op->k_type : op->v_type) : op->k_type;
            const int dims = i ? value_dim(op) : op->head_dim;
            if (type != T_F16 && type != T_Q8_0 && type != T_Q4_0)
                return fail("KV cache format %d: f16 (1), q8_0 (8) or q4_0 (2) only", type);
            if (type != T_F16 && dims % QK)
                return fail("a %s KV cache needs heads of a multiple of %d dims, not %d", type_info(type)->name, QK,
                            dims);
            const int rot = i ? op->v_rot : op->k_rot;
            if (rot < 0 || (rot > 0 && (rot & (rot - 1) || dims % rot || (i && op->flags & OPF_V_IN_K))))
                return fail("a KV rotation in pieces of %d cannot rotate heads of %d dims", rot, dims);
        }
        if (op->kind == OP_KV_STORE && !op->x2 && !(op->flags & OPF_V_IN_K)) return fail("missing values");
        if (op->kind == OP_ATTENTION && !op->y) return fail("missing output");
        return 0;
    case OP_GLU:
        if (op->type < GLU_SILU || op->type > GLU_TANH)
            return fail("unknown gate activation %d", op->type);
        if (op->type == GLU_XIELU && !op->w) return fail("xielu: needs its 4 parameters");
        if (op->type == GLU_SWIGLU_OAI && (!op->x2 || !(op->softcap > 0.0f)))
            return fail("swiglu_oai: needs the up input and a clamp limit > 0");
        /* fall through */
    case OP_ADD:
        if (!op->x && !(op->kind == OP_ADD && op->w)) return fail("missing input");
        /* fall through */
    case OP_SCALE:
        if (!op->y || op->n_in <= 0) return fail("missing output");
        return 0;
    case OP_MOE_ROUTE:
        if (op->type & ~(MOE_SIGMOID | MOE_NORM)) return fail("unknown expert gating %d", op->type);
        if (!op->x || !op->y || op->n_in <= 0 || op->n_head <= 0 || op->n_head > op->n_in ||
            op->n_in > SCRATCH_FLOATS)
            return fail("moe route: choosing %d of %lld experts", op->n_head, (long long)op->n_in);
        if (op->y_stride < 2 * op->n_head || op->x_stride < op->n_in)
            return fail("moe route: bad sizes");
        if (op->n_kv_head > 1 &&
            (op->n_kv_head > MAX_EXPERT_GROUPS || op->n_in % op->n_kv_head || op->head_dim < 1 ||
             op->head_dim > op->n_kv_head || (int64_t)op->head_dim * (op->n_in / op->n_kv_head) < op->n_head))
            return fail("moe route: %d of %lld experts from %d of %d groups", op->n_head, (long long)op->n_in,
                        op->head_dim, op->n_kv_head);
        return 0;
    case OP_MATMUL_ID:
        tt = type_info(op->type);
        if (!tt || !K.vec_dot[op->type]) return fail("weight type %d is not supported by the kernels", op->type);
        if (op->n_in <= 0 || op->n_in % tt->block_size)
            return fail("row length %lld is not a whole number of %s blocks", (long long)op->n_in, tt->name);
        if (op->n_out <= 0 || op->n_head <= 0 || op->n_kv_head < op->n_head || !op->w || !op->y)
            return fail("matmul_id: missing weights or output");
        if (!op->x2 && op->n_kv_head != op->n_head)   /* no route: slot j's matrix is j */
            return fail("matmul_id without a route: %d slots for %d matrices", op->n_head, op->n_kv_head);
        if (tt->act == ACT_F32 ? !op->x : !op->xq) return fail("matmul_id input missing");
        if (op->y_stride < op->n_out * op->n_head || (op->x2 && op->x2_stride < 2 * op->n_head))
            return fail("matmul_id: output or route stride too small");
        if (tt->act == ACT_F32 && op->x_stride < op->n_in * (op->flags & OPF_SLOT_INPUT ? op->n_head : 1))
            return fail("matmul_id: input stride too small");
        if ((op->flags & OPF_ROWS4) && (!rows4_fits(op->type, op->n_in) || op->n_out % 4))
            return fail("experts of %lld x %lld %s cannot be in the ROWS4 layout", (long long)op->n_out,
                        (long long)op->n_in, tt->name);
        return 0;
    case OP_POS_SCALE:
        if (!op->y || op->n_in <= 0 || op->y_stride < op->n_in || op->window < 1)
            return fail("pos_scale: missing rows, or a period of %d positions", op->window);
        return 0;
    case OP_COPY:
        if (!op->x || !op->y || op->n_in <= 0 || op->n_head <= 0 || op->n_out < 0 || op->head_dim < 0)
            return fail("copy: missing rows, or %lld floats in %d groups", (long long)op->n_in, op->n_head);
        if (op->x_stride < (op->n_head - 1) * op->n_out + op->n_in ||
            op->y_stride < (int64_t)(op->n_head - 1) * op->head_dim + op->n_in)
            return fail("copy: %d groups of %lld floats outside the rows", op->n_head, (long long)op->n_in);
        return 0;
    case OP_SSM_CONV:
        if (!op->w || !op->x || !op->y || !op->state) return fail("ssm_conv: missing weights, state or rows");
        if (op->n_in <= 0 || op->n_head < 1 || op->n_head > 64 || op->x_stride < op->n_in || op->y_stride < op->n_in ||
            op->n_in * op->n_head > SCRATCH_FLOATS)
            return fail("ssm_conv: %lld channels, %d taps", (long long)op->n_in, op->n_head);
        return 0;
    case OP_SSM_SCAN:
        if (!op->w || !op->x || !op->x2 || !op->y || !op->state) return fail("ssm_scan: missing weights, state or rows");
        if (op->n_in <= 0 || op->n_in > SCRATCH_FLOATS / 2 || op->n_head <= 0 || op->head_dim <= 0 || op->n_kv_head <= 0 ||
            op->n_head % op->n_kv_head || (op->n_rot != 1 && op->n_rot != op->n_in))
            return fail("ssm_scan: %d heads of %d in %d groups, state %lld, %d decays per head", op->n_head,
                        op->head_dim, op->n_kv_head, (long long)op->n_in, op->n_rot);
        if (op->x_stride < (int64_t)op->n_head * op->head_dim + 2 * op->n_kv_head * op->n_in ||
            op->x2_stride < op->n_head || op->y_stride < (int64_t)op->n_head * op->head_dim)
            return fail("ssm_scan: rows too short for the heads, B and C");
        return 0;
    case OP_DELTA_NET:
        if (!op->w || !op->x || !op->x2 || !op->y || !op->state) return fail("delta_net: missing weights, state or rows");
        if (op->n_head <= 0 || op->n_kv_head <= 0 || op->n_head % op->n_kv_head || op->head_dim <= 0 ||
            op->head_dim_v <= 0 || 2 * (op->head_dim + op->head_dim_v) > SCRATCH_FLOATS || !(op->eps >= 0.0f))
            return fail("delta_net: %d value heads of %d over %d key heads of %d", op->n_head, op->head_dim_v,
                        op->n_kv_head, op->head_dim);
        if (op->x_stride < 2 * (int64_t)op->n_kv_head * op->head_dim + (int64_t)op->n_head * op->head_dim_v ||
            op->x2_stride < 2 * (int64_t)op->n_head || op->y_stride < (int64_t)op->n_head * op->head_dim_v)
            return fail("delta_net: rows too short for q, k, v and the gates");
        return 0;
    case OP_WKV: {
        const int parts = op->type == WKV_7 ? 6 : 4;
        if (!op->x || !op->y || !op->state || (op->type == WKV_6 && !op->w))
            return fail("wkv: missing rows, state or time_first");
        if (op->type < WKV_6 || op->type > WKV_7 || op->n_head <= 0 || op->head_dim <= 0 ||
            op->head_dim > SCRATCH_FLOATS)
            return fail("wkv: kind %d, %d heads of %d", op->type, op->n_head, op->head_dim);
        if (op->x_stride < parts * (int64_t)op->n_head * op->head_dim || op->y_stride < (int64_t)op->n_head * op->head_dim)
            return fail("wkv: rows too short for %d parts of %d heads of %d", parts, op->n_head, op->head_dim);
        return 0;
    }
    case OP_LERP:
        if (!op->x || !op->x2 || !op->y || !op->w || op->n_in <= 0 || op->n_head <= 0)
            return fail("lerp: missing rows or mixes");
        if (op->x_stride < op->n_in || op->x2_stride < op->n_in || op->y_stride < op->n_in * op->n_head)
            return fail("lerp: rows too short for %d groups of %lld", op->n_head, (long long)op->n_in);
        return 0;
    case OP_MOE_SUM:
        if (!op->x || !op->x2 || !op->y || op->n_in <= 0 || op->n_head <= 0) return fail("moe sum: missing buffers");
        if (op->x_stride < op->n_in * op->n_head || op->x2_stride < 2 * op->n_head) return fail("moe sum: bad strides");
        return 0;
    case OP_MIX:
        if (!op->x || !op->x2 || !op->y || op->n_in <= 0 || op->n_head <= 0 || op->n_kv_head <= 0)
            return fail("mix: missing rows, or %d streams of %lld from %d", op->n_head, (long long)op->n_in,
                        op->n_kv_head);
        if (op->x_stride < op->n_in * op->n_kv_head || op->y_stride < op->n_in * op->n_head ||
            op->x2_stride < (int64_t)op->n_head * op->n_kv_head)
            return fail("mix: rows too short for %d streams from %d", op->n_head, op->n_kv_head);
        return 0;
    case OP_MATCH_NORM:
        if (!op->x || !op->y || op->n_in <= 0 || op->n_head <= 0 || op->x_stride < op->n_in ||
            op->y_stride < op->n_in * op->n_head)
            return fail("match_norm: missing rows, or %d groups of %lld outside them", op->n_head, (long long)op->n_in);
        return 0;
    case OP_SPARSIFY:
        if (!op->x || !op->y || op->n_in <= 0 || op->x_stride < op->n_in || op->y_stride < op->n_in)
            return fail("sparsify: missing rows");
        return 0;
    case OP_SUMSQ:
        if (!op->x || !op->w || op->n_in <= 0 || op->x_stride < op->n_in)
            return fail("sumsq: missing rows or accumulator");
        if (op->x2 && (op->n_head <= 0 || op->n_kv_head <= 0 || op->x2_stride < 2 * op->n_head ||
                       (op->flags & OPF_SLOT_INPUT && op->x_stride < op->n_in * op->n_head)))
            return fail("sumsq: a route of %d slots over %d experts and rows to match", op->n_head, op->n_kv_head);
        return 0;
    case OP_SAVE_ROWS:
        if (!op->x || !op->w || op->n_in <= 0 || op->n_out <= 0 || op->x_stride < op->n_in)
            return fail("save_rows: missing rows, or no room for them");
        return 0;
    case OP_MATMUL_COLS:
        if (op->type != T_F32 || !op->x || !op->w || !op->y || op->n_in <= 0 || op->n_out <= 0 ||
            op->x_stride < op->n_in || op->y_stride < op->n_out)
            return fail("matmul_cols: a float32 matrix of %lld x %lld and rows to match", (long long)op->n_in,
                        (long long)op->n_out);
        return 0;
    default:
        return fail("unknown op kind %d", op->kind);
    }
}

int pyllm_program_check(const pyllm_op *ops, int n_ops) {
    dispatch_init(ISA_COUNT);
    if (!ops || n_ops <= 0) { fail("empty program"); return 1; }
    for (int i = 0; i < n_ops; i++) {
        if (check_op(&ops[i]) != 0) {
            char msg[512];
            snprintf(msg, sizeof msg, "op %d (layer %d): %.400s", i, ops[i].layer, err_buf);
            memcpy(err_buf, msg, sizeof msg);
            return i + 1;
        }
    }
    return 0;
}

static int check_step(const pyllm_op *ops, int n_ops, const pyllm_step *st) {
    if (st->n_tokens < 1) return fail("empty batch");
    if (st->n_out < 1 || st->n_out > st->n_tokens) return fail("n_out %d outside 1..%d", st->n_out, st->n_tokens);
    if (matmul_scratch_floats(st->n_tokens) > SCRATCH_FLOATS)
        return fail("a step of %d tokens is more than the core's scratch holds", st->n_tokens);
    for (int i = 0; i < n_ops; i++)
        if (ops[i].kind == OP_MATMUL && (ops[i].flags & OPF_ROWS4) &&
            (size_t)matmul_scratch_floats(st->n_tokens) * sizeof(float) + matmul_rows4_bytes() >
                SCRATCH_FLOATS * sizeof(float))
            return fail("a step of %d tokens is more than the core's scratch holds with repacked weights",
                        st->n_tokens);
    if (!st->tokens || !st->pos) return fail("missing tokens or positions");
    if (st->block_size < 1 || st->block_size > MAX_KV_BLOCK || !st->block_table || st->n_table < 1)
        return fail("missing KV block table, or blocks of %d positions (at most %d)", st->block_size, MAX_KV_BLOCK);
    for (int i = 0; i < st->n_table; i++)
        if (st->block_table[i] < 0 || st->block_table[i] >= st->pool_blocks)
            return fail("KV block id %d outside the pool of %d", st->block_table[i], st->pool_blocks);
    for (int t = 0; t < st->n_tokens; t++) {
        const int32_t first = st->row_table ? st->row_table[t] : 0;
        if (first < 0 || first >= st->n_table)
            return fail("row %d's block table starts at %d, outside the %d entries", t, first, st->n_table);
        const int64_t capacity = (int64_t)(st->n_table - first) * st->block_size;
        if (st->pos[t] < 0 || st->pos[t] >= capacity)
            return fail("position %d outside the %lld the block table holds", st->pos[t], (long long)capacity);
    }
    if (st->n_media < 0 || (st->n_media > 0 && (!st->media || st->media_width < 1)))
        return fail("bad media rows: %d of %d floats%s", st->n_media, st->media_width, st->media ? "" : ", at NULL");
    if (st->bidirectional) {   /* every row sees up to the step's last position: one sequence, no gaps */
        if (st->row_table) return fail("a bidirectional step of several sequences");
        for (int t = 1; t < st->n_tokens; t++)
            if (st->pos[t] != st->pos[0] + t)
                return fail("a bidirectional step needs consecutive positions (%d after %d)", st->pos[t],
                            st->pos[t - 1]);
    }
    int64_t media_width = 0;   /* a media row: the embedding's columns, then DeepStack's slices */
    for (int i = 0; i < n_ops; i++)
        if (ops[i].kind == OP_EMBED && !(ops[i].flags & (OPF_MEDIA_ZERO | OPF_MEDIA_PAD | OPF_BY_POS)) &&
            ops[i].media_col + ops[i].n_in > media_width)
            media_width = ops[i].media_col + ops[i].n_in;
    for (int i = 0; i < n_ops; i++) {
        if (st->row_table && ops[i].state)
            return fail("a step of several sequences through a recurrent layer (its state is one sequence's)");
        if (st->row_table && ops[i].kind == OP_ATTENTION && ops[i].flags & OPF_NON_CAUSAL)
            return fail("a step of several sequences through bidirectional attention");
        if (ops[i].kind == OP_SSM_SCAN && ops[i].n_in * 33 + 2 * (int64_t)st->n_tokens + 32 > SCRATCH_FLOATS)
            return fail("a step of %d tokens through a scan of %lld states needs more scratch than the core has",
                        st->n_tokens, (long long)ops[i].n_in);
        if (ops[i].state || (ops[i].kind == OP_ATTENTION && ops[i].flags & OPF_NON_CAUSAL)) {
            /* a state carries one sequence on; every row of a bidirectional attention sees up to the last */
            for (int t = 1; t < st->n_tokens; t++)
                if (st->pos[t] != st->pos[0] + t)
                    return fail("a %s step needs consecutive positions (%d after %d)",
                                ops[i].kind == OP_ATTENTION ? "bidirectional attention's" : "recurrent layer's",
                                st->pos[t], st->pos[t - 1]);
        }
        if (ops[i].kind == OP_ATTENTION &&
            attention_scratch_floats(ops[i].head_dim, value_dim(&ops[i]), ops[i].n_head / ops[i].n_kv_head,
                                     st->block_size) >
                SCRATCH_FLOATS)
            return fail("attention with head size %d, %d heads per KV head and %d-position blocks needs more "
                        "scratch than the core has", ops[i].head_dim, ops[i].n_head / ops[i].n_kv_head,
                        st->block_size);
        if (ops[i].kind == OP_MATMUL_ID && matmul_id_scratch_floats(&ops[i], st->n_tokens) > SCRATCH_FLOATS)
            return fail("a step of %d tokens through %d experts of %lld inputs needs more scratch than the core "
                        "has", st->n_tokens, ops[i].n_kv_head, (long long)ops[i].n_in);
        if (ops[i].kind != OP_EMBED) continue;
        const int by_pos = ops[i].flags & OPF_BY_POS;
        for (int t = 0; t < st->n_tokens; t++) {
            const int32_t id = by_pos ? st->pos[t] : st->tokens[t];
            if (!by_pos && id < 0) {   /* media row -1 - id */
                const int64_t j = -1 - (int64_t)id;
                if (!st->media || j >= st->n_media)
                    return fail("token id %d names media row %lld; the step has %d", id, (long long)j,
                                st->media ? st->n_media : 0);
                if (!(ops[i].flags & (OPF_MEDIA_ZERO | OPF_MEDIA_PAD)) && st->media_width != media_width)
                    return fail("media rows are %d wide; the embedding is %lld", st->media_width,
                                (long long)media_width);
                continue;
            }
            if (id < 0 || id >= ops[i].n_out)
                return fail(by_pos ? "position %d outside the model's %lld learned positions"
                                   : "token id %d outside the vocabulary of %lld", id, (long long)ops[i].n_out);
        }
    }
    return 0;
}

/* ---- execution ---- */

typedef struct {
    pyllm_ctx *ctx;
    const pyllm_op *ops;
    int n_ops;
    const pyllm_step *step;
} job;

static void exec_op(const pyllm_op *op, const pyllm_step *st, float *scratch, float *shared,
                    _Atomic int64_t *counter, int ith, int nth) {
    op_rows r = {st, st->n_tokens, 0, scratch, counter, shared};
    if (op->flags & OPF_LAST_ROWS) {
        r.rows = st->n_out;
        r.row0 = st->n_tokens - st->n_out;
    } else if (op->flags & OPF_OUT_ROWS) {
        r.rows = st->n_out;
    }
    switch (op->kind) {
    case OP_EMBED: op_embed(op, &r, ith, nth); break;
    case OP_RMSNORM: op_rmsnorm(op, &r, ith, nth); break;
    case OP_QUANTIZE: op_quantize(op, &r, ith, nth); break;
    case OP_MATMUL: op_matmul(op, &r, ith, nth); break;
    case OP_ROPE: op_rope(op, &r, ith, nth); break;
    case OP_KV_STORE: op_kv_store(op, &r, ith, nth); break;
    case OP_ATTENTION: op_attention(op, &r, ith, nth); break;
    case OP_GLU: op_glu(op, &r, ith, nth); break;
    case OP_ADD: op_add(op, &r, ith, nth); break;
    case OP_SCALE: op_scale(op, &r, ith, nth); break;
    case OP_MOE_ROUTE: op_moe_route(op, &r, ith, nth); break;
    case OP_MATMUL_ID: op_matmul_id(op, &r, ith, nth); break;
    case OP_MOE_SUM: op_moe_sum(op, &r, ith, nth); break;
    case OP_POS_SCALE: op_pos_scale(op, &r, ith, nth); break;
    case OP_COPY: op_copy(op, &r, ith, nth); break;
    case OP_MIX: op_mix(op, &r, ith, nth); break;
    case OP_MATCH_NORM: op_match_norm(op, &r, ith, nth); break;
    case OP_SPARSIFY: op_sparsify(op, &r, ith, nth); break;
    case OP_SUMSQ: (op->x2 ? op_sumsq_routed : op_sumsq)(op, &r, ith, nth); break;
    case OP_MATMUL_COLS: op_matmul_cols(op, &r, ith, nth); break;
    case OP_SAVE_ROWS: op_save_rows(op, &r, ith, nth); break;
    case OP_SSM_CONV: op_ssm_conv(op, &r, ith, nth); break;
    case OP_SSM_SCAN: op_ssm_scan(op, &r, ith, nth); break;
    case OP_DELTA_NET: op_delta_net(op, &r, ith, nth); break;
    case OP_WKV: op_wkv(op, &r, ith, nth); break;
    case OP_LERP: op_lerp(op, &r, ith, nth); break;
    }
}

static void run_job(void *arg, int ith, int nth) {
    job *j = arg;
    thread_profile *prof = j->ctx->profile ? &j->ctx->prof[ith] : NULL;
    float *scratch = j->ctx->scratch[ith];
    for (int i = 0; i < j->n_ops; i++) {
        const pyllm_op *op = &j->ops[i];
        if (prof) {
            double t0 = now_ns();
            exec_op(op, j->step, scratch, j->ctx->shared, &j->ctx->counters[i], ith, nth);
            double dt = now_ns() - t0;
            prof->op_ns[op->kind] += dt;
            prof->busy_ns += dt;
            if ((op->kind == OP_MATMUL || op->kind == OP_MATMUL_ID) && (unsigned)op->type < PROFILE_TYPE_COUNT)
                prof->matmul_type_ns[op->type] += dt;   /* experts' products too */
        } else {
            exec_op(op, j->step, scratch, j->ctx->shared, &j->ctx->counters[i], ith, nth);
        }
        if (!(op->flags & OPF_NO_SYNC)) threadpool_barrier(j->ctx->pool);
    }
}

int pyllm_run(pyllm_ctx *ctx, const pyllm_op *ops, int n_ops, const pyllm_step *step) {
    if (!ctx || !ops || !step) return fail("null argument");
    if (check_step(ops, n_ops, step) != 0) return -1;
    if (n_ops > ctx->n_counters) {
        _Atomic int64_t *c = realloc((void *)ctx->counters, (size_t)n_ops * sizeof *c);
        if (!c) return fail("out of memory");
        ctx->counters = c;
        ctx->n_counters = n_ops;
    }
    memset((void *)ctx->counters, 0, (size_t)n_ops * sizeof *ctx->counters);
    job j = {ctx, ops, n_ops, step};
    double t0 = ctx->profile ? now_ns() : 0;
    threadpool_run(ctx->pool, run_job, &j);
    if (ctx->profile) ctx->wall_ns += now_ns() - t0;
    return 0;
}

/* ---- profile ---- */

void pyllm_profile_enable(pyllm_ctx *ctx, int on) { ctx->profile = on; }

void pyllm_profile_reset(pyllm_ctx *ctx) {
    memset(ctx->prof, 0, (size_t)ctx->n_threads * sizeof(thread_profile));
    ctx->wall_ns = 0;
}

void pyllm_profile_read(const pyllm_ctx *ctx, double *op_ns, double *thread_busy_ns, double *matmul_type_ns,
                        double *wall_ns) {
    for (int k = 0; k < OP_KIND_COUNT; k++) op_ns[k] = 0;
    for (int k = 0; k < PROFILE_TYPE_COUNT; k++) matmul_type_ns[k] = 0;
    for (int t = 0; t < ctx->n_threads; t++) {
        for (int k = 0; k < OP_KIND_COUNT; k++) op_ns[k] += ctx->prof[t].op_ns[k];
        for (int k = 0; k < PROFILE_TYPE_COUNT; k++) matmul_type_ns[k] += ctx->prof[t].matmul_type_ns[k];
        thread_busy_ns[t] = ctx->prof[t].busy_ns;
    }
    *wall_ns = ctx->wall_ns;
}

/* ---- memory bandwidth: every thread sums its share of buf, reps times ---- */

typedef struct { const float *buf; size_t n; int reps; double sums[MAX_THREADS]; } membw_job;

/* The thread's share is read in spans of MEMBW_SPAN floats, asking
 * (prefetcht0) for the lines GEMV_PREFETCH bytes ahead, as the gemv kernels
 * do: without it one core keeps too few misses in flight to reach the
 * memory's rate, and decode (which prefetches) would read faster than the
 * "machine bandwidth" it is compared with. */
#define MEMBW_SPAN 1024
static void membw_run(void *arg, int ith, int nth) {
    membw_job *j = arg;
    int64_t lo, hi;
    split_range((int64_t)j->n, ith, nth, 1024, &lo, &hi);
    double total = 0;
    for (int r = 0; r < j->reps; r++)
        for (int64_t i = lo; i < hi; i += MEMBW_SPAN) {
            const int64_t n = hi - i < MEMBW_SPAN ? hi - i : MEMBW_SPAN;
            prefetch_lines((uintptr_t)(j->buf + i) + GEMV_PREFETCH, MEMBW_SPAN * sizeof(float));
            total += K.dot_f32(n, j->buf + i, j->buf + i);
        }
    j->sums[ith] = total;
}

double pyllm_membw(pyllm_ctx *ctx, const void *buf, size_t bytes, int reps) {
    membw_job *j = calloc(1, sizeof *j);
    if (!j || reps < 1) { free(j); return 0; }
    j->buf = buf;
    j->n = bytes / sizeof(float);
    j->reps = reps;
    double t0 = now_ns();
    threadpool_run(ctx->pool, membw_run, j);
    double dt = now_ns() - t0;
    free(j);
    return (double)bytes * reps / dt; /* bytes per ns = GB/s */
}
