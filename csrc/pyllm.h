/* pyllm.h: the ABI between Python (cffi reads this file) and the C core.
 *
 * Python describes a model's forward step once, as a flat array of op records
 * pointing at mmapped weights, scratch buffers and KV-cache pools. Each step
 * (a batch of tokens of one sequence) is then one call: pyllm_run() executes
 * every op on a persistent thread pool, with a barrier between ops.
 *
 * Only plain declarations here (no macros, no includes): cffi parses it.
 */

/* ---- op records ---- */

enum pyllm_op_kind {
    OP_EMBED = 1,     /* y[t] = dequant(w row tokens[t]) * scale; n_in = width, n_out = vocab; a token id
                         -1 - j < 0 (not OPF_BY_POS): y[t] = the step's media row j as it is (no scale) */
    OP_RMSNORM = 2,   /* y[t, g] = x[t, g] / rms(x[t, g]) * w; n_head groups of n_in per row;
                         type NORM_LAYER: LayerNorm, (x - mean) / sqrt(var + eps) * w (+ bias) */
    OP_QUANTIZE = 3,  /* xq[t] = quantize(x[t]) to activation format `type` (n_in elements) */
    OP_MATMUL = 4,    /* y[t, :n_out] (+)= W x[t] (+ bias); reads xq unless W takes f32 */
    OP_ROPE = 5,      /* rotate n_head heads of x[t] and n_kv_head heads of x2[t] by pos[t] */
    OP_KV_STORE = 6,  /* cache[pos[t]] = (k = x[t], v = x2[t]), as k_type / v_type, through the block table; with
                         OPF_V_IN_K the keys alone */
    OP_ATTENTION = 7, /* y[t] = softmax(scale * q[t] K^T) V over positions <= pos[t] (window; a
                         bidirectional step: <= its last position): keys of
                         head_dim, values (and y's heads) of head_dim_v; w: NULL, or one sink logit per head
                         (float[n_head]) that joins the softmax with no value */
    OP_GLU = 8,       /* y[t] = act(x[t]) * x2[t]; type = GLU_*; x2 NULL: y[t] = act(x[t]) */
    OP_ADD = 9,       /* y[t] += scale * x[t]; x NULL: y[t] += scale * w, float[n_in] (a row added to every row) */
    OP_SCALE = 10,    /* y[t] *= scale (w: NULL, or float[n_in], a factor per column too); then
                         y = softcap * tanh(y / softcap) if softcap > 0 */
    OP_MOE_ROUTE = 11, /* y[t] = [ids | weights] of the n_head best of n_in experts, from router
                          logits x[t]; type = MOE_* (gating, renormalized weights); weights * scale;
                          bias: NULL, or per expert, added to the gate values to choose (not to weigh);
                          n_kv_head > 1: the experts form that many equal groups, and only the head_dim
                          groups whose two best gate values (+ bias) sum highest are chosen from;
                          w: NULL, or a scale per expert multiplying its weight (Gemma 4) */
    OP_MATMUL_ID = 12, /* y[t, j n_out..] = W[e] x_j[t] for slots j < n_head, e = x2[t, j] (the
                          route's ids, of n_kv_head experts; x2 NULL: e = j, a matrix per head); W[e]: the
                          expert's n_out rows; x_j[t] = x[t], or its j-th n_in slice with OPF_SLOT_INPUT;
                          + bias[e] ([n_kv_head][n_out]) */
    OP_MOE_SUM = 13,  /* y[t] (+)= sum_j x2[t, n_head + j] x[t, j n_in ..] (the route's weights) */
    OP_MIX = 14,      /* y[t, j n_in + i] (+)= sum_{k < n_kv_head} x2[t, j n_kv_head + k] x[t, k n_in + i] for streams
                         j < n_head: n_kv_head streams of n_in mixed into n_head by a matrix per row (Gemma 3n's
                         AltUp); y must not overlap x */
    OP_POS_SCALE = 15, /* y[t, :n_in] *= 1 + scale ln(1 + floor((pos[t] + eps) / window)): the attention
                          temperature of long positions on q (Llama 4, Mistral 3) */
    OP_COPY = 16,     /* y[t, g head_dim + i] = x[t, g n_out + i] for i < n_in, groups g < n_head: columns
                         gathered by group (n_out 0: every group copies the same n_in) */
    OP_SSM_CONV = 17, /* y[t, c] = bias[c] + sum_{j < n_head} w[c n_head + j] z[t + j, c] for channels c < n_in, z = the
                         n_head - 1 rows of `state` (this layer's inputs before the step) then x's rows; `state` then
                         keeps z's last n_head - 1 rows: Mamba's causal depthwise convolution (bias may be NULL) */
    OP_SSM_SCAN = 18, /* Mamba's selective scan, n_head heads of head_dim channels, d_state = n_in, n_kv_head groups
                         of B and C: dt = softplus(x2[t, h] + bias[h]); state[h, p] = state[h, p] exp(dt A[h])
                         + dt x[t, h P + p] B[t, g]; y[t, h P + p] = state[h, p] . C[t, g] + D[h] x[t, h P + p];
                         x's row is [x | B | C], w is [A (n_head x n_rot: 1, or d_state per head) | D (n_head)],
                         state is [n_head][head_dim][d_state] */
    OP_DELTA_NET = 19, /* the gated delta rule (Qwen3.5's linear attention), n_head value heads of head_dim_v over
                          n_kv_head key heads of head_dim (value head h reads key head h % n_kv_head): x's row is
                          [q | k | v], x2's [a | b] (n_head each), w = [A | dt bias] (n_head each); q and k divided by
                          max(|q|, eps), q by sqrt(head_dim) too; g = exp(A softplus(a + dt bias)), beta = sigmoid(b);
                          S = g S; S += k ((v - S^T k) beta)^T; y = S^T q, S the head's [head_dim][head_dim_v] state */
    OP_MATCH_NORM = 20, /* y[t, g n_in ..] *= |x[t, :n_in]| / |y[t, g n_in ..]| for groups g < n_head: each group
                           rescaled to the Euclidean norm of x's row (Gemma 3n's AltUp streams) */
    OP_SPARSIFY = 21, /* y[t] = max(x[t] - (mean + scale std), 0) over the row's n_in, std with n - 1: Gemma 3n's
                         activation sparsity (keeps what is above the scale-sigma quantile of a normal fit) */
    OP_SUMSQ = 22,    /* w[i] += x[t, i]^2 summed over the step's rows t, i < n_in, w a float accumulator that
                         outlives the step: the activation statistics of an importance matrix (pyllm imatrix).
                         With a route x2 (MATMUL_ID's: n_head slots of n_kv_head experts), per expert:
                         w[e (n_in + 1) + i] += x_j[t, i]^2 and w[e (n_in + 1) + n_in] += 1 for each slot j of
                         row t routed to e (x_j: x[t], or its j-th n_in slice with OPF_SLOT_INPUT) */
    OP_MATMUL_COLS = 23, /* y[t] (+)= x[t] W, W float32 stored by its n_in input rows of n_out: a matrix of few
                            input columns (a LoRA pair's B, rank r) as r row updates of y, not n_out dot products
                            of r */
    OP_SAVE_ROWS = 24, /* w[t n_in + i] = x[t, i] for the step's rows t < n_out (w's capacity in rows), i < n_in:
                          a copy of the rows that outlives the step (the hidden states pyllm cvector-generator
                          reads after each layer) */
    OP_LERP = 25,     /* y[t, g n_in + i] = x[t, i] + x2[t, i] (w[g n_in + i] (+ y[t, g n_in + i] with OPF_ACCUMULATE))
                         for groups g < n_head: RWKV's token-shift interpolations between a row x and the step back
                         to the previous row's, x2 = x_prev - x, each group with its own mix (plus a mix of the
                         row's own, already in y: RWKV 6's data-dependent lerp) */
    OP_WKV = 26,      /* RWKV's linear attention, n_head heads of head_dim, a [head_dim][head_dim] state S each:
                         type WKV_6 (RWKV 6): x's row [r | k | v | w], u = op->w (n_head head_dim, "time_first"),
                         decay = exp(-exp(w)); y = r^T (S + diag(u) k v^T) ; S = diag(decay) S + k v^T
                         type WKV_GLA (QRWKV): x's row [r | k | v | w], decay as WKV_6, k' = k (1 - decay);
                         S = diag(decay) S + k' v^T ; y = scale r^T S
                         type WKV_7 (RWKV 7): x's row [r | k | v | w | a | b], decay = exp(-0.606531 sigmoid(w));
                         S (value rows, key columns) = S diag(decay) + (S a) b^T + v k^T ; y = S r, then per head
                         y = LayerNorm(y) (eps) * ln_w + ln_b with bias = [ln_w | ln_b] (NULL: none), then
                         y += (r . (w k)) v with w = op->w (n_head head_dim, "r_k"; NULL: none) */
    OP_KIND_COUNT = 27
};

enum pyllm_op_flags {
    OPF_ACCUMULATE = 1, /* MATMUL, MOE_SUM, MIX: add into y instead of overwriting */
    OPF_LAST_ROWS = 2,  /* reads the last step.n_out input rows, writes output rows 0.. (the
                           first op of the output head) */
    OPF_NO_SYNC = 4,    /* no barrier after this op (the next op does not touch its output) */
    OPF_OUT_ROWS = 8,   /* only rows 0 .. step.n_out-1 (the rest of the output head) */
    OPF_SLOT_INPUT = 16, /* MATMUL_ID: each slot reads its own slice of the input row */
    OPF_BY_POS = 32,    /* EMBED: the rows of the positions, not of the tokens (learned position
                           embeddings: GPT-2); with OPF_ACCUMULATE added into y */
    OPF_V_IN_K = 64,    /* KV_STORE, ATTENTION: no value pool; a KV head's values are the first head_dim_v
                           dims of its keys (MLA's latent: DeepSeek 2/3) */
    OPF_CHUNKED = 128,  /* ATTENTION: `window` is a chunk: position p sees [p - p % window, p] (Llama 4) */
    OPF_GROUP_WEIGHTS = 256, /* RMSNORM: each of the n_head groups has its own n_in weights and biases (Mamba 2's
                                norm, RWKV's per-head LayerNorm) */
    OPF_KV_GROUPED = 512,    /* DELTA_NET: value head h reads key head h / (n_head / n_kv_head) (Qwen3-Next),
                                else h % n_kv_head (Qwen3.5) */
    OPF_NON_CAUSAL = 1024,   /* ATTENTION: every row sees every position up to the step's last (an encoder's
                                bidirectional attention: BERT), with a window those within window / 2 of its
                                own either way (EmbeddingGemma); the step's positions must be consecutive */
    OPF_MEDIA_ZERO = 2048,   /* EMBED: a media row's id gives a row of zeros (a LoRA's A rows of the token
                                embedding: media rows are not adapted) */
    OPF_MEDIA_PAD = 4096,    /* EMBED: a media row's id reads row 0, the padding token's (per-layer token inputs:
                                Gemma 3n, Gemma 4; llama.cpp's for an image's rows) */
    OPF_MEDIA_ONLY = 8192,   /* EMBED (with OPF_ACCUMULATE): a text row is left as it is; a media row adds its
                                columns media_col .. media_col + n_in (Qwen 3 VL's DeepStack: an image's
                                features of deeper encoder layers, added after the first layers) */
    OPF_ROPE_INTERLEAVED = 16384, /* ROPE: M-RoPE's sections interleaved (Qwen 3 VL): pair i turns by the height's
                                    position if i % 3 == 1 and i < 3 s1, the width's if i % 3 == 2 and
                                    i < 3 s2, else by the time's */
    OPF_ROWS4 = 32768        /* MATMUL, EMBED, MATMUL_ID (each expert's rows): w is in the ROWS4 layout
                                (pyllm_repack_rows4) */
};

/* GLU_SWIGLU_OAI (gpt-oss): g' = min(g, c), y = g' sigmoid(a g') (clamp(u, -c, c) + 1), a = scale, c = softcap;
 * GLU_RELU_SQR (Nemotron, Arcee): y = max(g, 0)^2 u; GLU_MUL: y = g u (LFM2's gates);
 * GLU_RELU (SmallThinker's experts): y = max(g, 0) u; GLU_SIGMOID (gated attention): y = sigmoid(g) u;
 * GLU_XIELU (Apertus), w = [alpha_n, alpha_p, beta, eps]: y = (g > 0 ? alpha_p g^2 + beta g
 * : (expm1(min(g, eps)) - g) alpha_n + beta g) u; GLU_TANH (Gemma 3n's AltUp router): y = tanh(g) u */
enum pyllm_glu { GLU_SILU = 0, GLU_GELU_TANH = 1, GLU_SWIGLU_OAI = 2, GLU_RELU_SQR = 3, GLU_MUL = 4, GLU_RELU = 5,
                 GLU_SIGMOID = 6, GLU_XIELU = 7, GLU_TANH = 8 };
enum pyllm_norm { NORM_RMS = 0, NORM_LAYER = 1 };
enum pyllm_wkv { WKV_6 = 0, WKV_GLA = 1, WKV_7 = 2 };
/* MOE_ROUTE type: gating (softmax over all experts, or each expert's sigmoid), | MOE_NORM to
 * divide the chosen experts' weights by their sum */
enum pyllm_moe { MOE_SOFTMAX = 0, MOE_SIGMOID = 1, MOE_NORM = 2 };
enum pyllm_rope_mode { ROPE_NORM = 0, ROPE_NEOX = 2 };

typedef struct pyllm_op {
    int32_t kind;
    int32_t flags;
    int32_t type;          /* weight type (EMBED, MATMUL), act format (QUANTIZE), GLU_* (GLU), NORM_* */
    int32_t layer;         /* for error messages and the profile */
    const void *w;         /* EMBED/MATMUL weights, RMSNORM weight (float) */
    const float *bias;     /* MATMUL and LayerNorm bias, or NULL */
    float *x;              /* main input rows */
    float *x2;             /* second input rows (GLU up, ROPE keys, KV_STORE values) */
    void *xq;              /* quantized rows of x (QUANTIZE writes, MATMUL reads) */
    float *y;              /* output rows */
    int64_t x_stride;      /* floats between consecutive rows */
    int64_t x2_stride;
    int64_t y_stride;
    int64_t n_in;          /* row length of the input (per group for RMSNORM) */
    int64_t n_out;         /* MATMUL output width; EMBED vocabulary size */
    int32_t n_head;        /* query heads (ROPE, ATTENTION); groups per row (RMSNORM) */
    int32_t n_kv_head;
    int32_t head_dim;
    int32_t head_dim_v;    /* KV_STORE, ATTENTION: value dims per head (0: head_dim) */
    int32_t n_rot;         /* ROPE: leading dims of each head that rotate */
    int32_t rope_mode;     /* ROPE_* */
    int32_t window;        /* ATTENTION: sliding window in tokens, 0 = none */
    float eps;             /* RMSNORM */
    float scale;           /* EMBED, SCALE, ATTENTION (softmax scale) */
    float freq_base;       /* ROPE */
    float freq_scale;      /* ROPE: linear position scaling (1 = none) */
    const float *freq_factors; /* ROPE: per-pair divisors (llama3 rope_freqs), or NULL */
    int32_t rope_sections[3];  /* ROPE: M-RoPE's pairs turned by a row's time, height and width positions
                                  (pyllm_step.rope_pos), in that order, the rest by time; all 0: plain */
    int64_t media_col;     /* EMBED: the first column of a media row taken (OPF_MEDIA_ONLY's slice; else 0) */
    float softcap;         /* ATTENTION (scores), SCALE (outputs): tanh soft-capping, 0 = none */
    void *k_cache;         /* KV_STORE/ATTENTION: this layer's pools, [pool blocks][block_size][a row of */
    void *v_cache;         /*   n_kv_head * head_dim (_v) values in k_type / v_type] */
    int32_t k_type;        /* KV_STORE/ATTENTION: the pools' formats, T_F16 (1), T_Q8_0 (8) or T_Q4_0 (2) */
    int32_t v_type;        /*   (quantized: each head's dims whole blocks of 32) */
    int32_t k_rot;         /* KV_STORE/ATTENTION: keys (and queries) rotated by the Walsh-Hadamard matrix in */
    int32_t v_rot;         /*   pieces of k_rot dims before a quantized pool stores them; values by v_rot, the
                              output rotated back (llama.cpp's for quantized caches); 0: none */
    float *state;          /* SSM_CONV/SSM_SCAN/DELTA_NET/WKV: the layer's recurrent state, carried from step to step; a step
                              starting at position 0 starts from zeros */
    float alibi;           /* ATTENTION: ALiBi's maximum bias (BLOOM, MPT: 8), 0 = none: head h's score of position j
                              from a query at p gains -slope_h |p - j| (pyllm_alibi_slope) */
} pyllm_op;

/* ALiBi's slope of head h of n_head with maximum bias max_bias, as llama.cpp's soft_max:
 * with n = the largest power of 2 <= n_head, m0 = 2^(-max_bias / n), m1 = 2^(-max_bias / 2n),
 * slope = m0^(h + 1) for h < n, else m1^(2 (h - n) + 1) */
float pyllm_alibi_slope(float max_bias, int h, int n_head);

/* one forward step: a batch of tokens of one sequence, or of several (row_table) */
typedef struct pyllm_step {
    int32_t n_tokens;            /* rows in this batch (>= 1) */
    int32_t n_out;               /* rows the OPF_LAST_ROWS ops compute (1..n_tokens) */
    const int32_t *tokens;       /* [n_tokens] */
    const int32_t *pos;          /* [n_tokens] absolute positions */
    const int32_t *block_table;  /* KV block ids holding positions 0, B, 2B, ... */
    int32_t n_table;             /* entries in block_table */
    int32_t block_size;          /* tokens per KV block (B) */
    int32_t pool_blocks;         /* blocks in each layer's pool (ids must be below) */
    const int32_t *row_table;    /* NULL: every row is of one sequence, whose table is block_table. Else
                                    [n_tokens]: where row t's sequence's table begins in block_table (rows
                                    of several sequences in one step; attention-only models) */
    const float *media;          /* NULL, or [n_media][media_width] rows: a token id -1-j takes row j as
                                    its embedding (unscaled, as llama.cpp feeds raw embeddings) */
    int32_t n_media;
    int32_t media_width;
    int32_t bidirectional;       /* nonzero: every row of the step sees up to the step's last position
                                    (causal attention off for this step, as llama.cpp's for Gemma 3 images);
                                    the positions must be consecutive, of one sequence */
    const int32_t *rope_pos;     /* NULL, or [3][n_tokens]: each row's M-RoPE positions (time, height, width)
                                    for ROPE ops with rope_sections (an image's rows: row and column; NULL: pos
                                    in all three). The cache and attention still go by pos */
} pyllm_step;

/* ---- the engine context: thread pool, profile ---- */
typedef struct pyllm_ctx pyllm_ctx;

pyllm_ctx *pyllm_ctx_new(int n_threads);
void pyllm_ctx_free(pyllm_ctx *ctx);
int pyllm_ctx_threads(const pyllm_ctx *ctx);

/* Checks a program once, when it is built: kinds, types, sizes, pointers.
 * Returns 0, or the index + 1 of the first bad op (pyllm_error() says why). */
int pyllm_program_check(const pyllm_op *ops, int n_ops);

/* Runs the program for one step. Returns 0, or -1 with pyllm_error() set
 * (bad token id, position outside the block table, ...). */
int pyllm_run(pyllm_ctx *ctx, const pyllm_op *ops, int n_ops, const pyllm_step *step);

const char *pyllm_error(void);

/* ---- profile: time per op kind, per thread ---- */
void pyllm_profile_enable(pyllm_ctx *ctx, int on);
void pyllm_profile_reset(pyllm_ctx *ctx);
/* matmul_type_ns entries: one per ggml type id 0..39 (MXFP4 is 39) */
enum pyllm_profile_sizes { PROFILE_TYPE_COUNT = 40 };
/* ns spent per op kind (summed over threads) in [OP_KIND_COUNT]; busy ns per thread in [n_threads];
 * MATMUL and MATMUL_ID ns by weight type id in [PROFILE_TYPE_COUNT] */
void pyllm_profile_read(const pyllm_ctx *ctx, double *op_ns, double *thread_busy_ns, double *matmul_type_ns,
                        double *wall_ns);

/* ---- kernels, for tests and tools ---- */
int pyllm_cpu_level(void);              /* best ISA level of this CPU (0 scalar, 1 avx2, 2 avx512, 3 neon) */
int pyllm_level_available(int isa);
int pyllm_set_level(int isa);           /* the level the core uses from now on; returns it, or -1 (weights
                                           repacked by pyllm_repack_rows4 are laid out for the level that
                                           ran then: repack them again after a change) */
int pyllm_get_level(void);
/* the kernels level `isa` runs on this CPU, by name: "scalar", "avx2", "avx2+avxvnni", "avx512",
 * "avx512+vnni", "neon", "neon+dotprod"; "" if unavailable */
const char *pyllm_level_name(int isa);
int pyllm_type_supported(int type);
int pyllm_type_act(int type);           /* activation format a weight type's dot product takes */
size_t pyllm_act_row_bytes(int act, int64_t n);
/* does level `isa` itself provide this kernel (kind: 0 dequant, 1 vec_dot, 2 gemv, 3 quantize_act,
 * 4 gemm, 5 vector math with type = pyllm_kernel_vmath's which, or 5 for wsum_many_f32, 6 for
 * wsum_many_f16, 8 for ssm_scan_row, 9 for wsum_many_q8_0; 6 gemv4, the ROWS4 gemv; 7 rows4_codec,
 * its own encoding of the format's blocks inside ROWS4)? */
int pyllm_kernel_provided(int isa, int kind, int type);
/* run one kernel of one level; 0 on success, -1 if unsupported */
int pyllm_kernel_dequant(int isa, int type, const void *w, float *out, int64_t n);
int pyllm_kernel_quantize_act(int isa, int act, const float *x, void *out, int64_t n);
int pyllm_kernel_vec_dot(int isa, int type, int64_t n, const void *w, const void *a, float *out);
int pyllm_kernel_gemv(int isa, int type, int64_t n, const void *w, size_t row_bytes, int nrows,
                      const void *a, float *out);
/* out[t*out_stride + r] for r < nrows, t < ncols (the level's gemm, else its gemv per column) */
int pyllm_kernel_gemm(int isa, int type, int64_t n, const void *w, size_t row_bytes, int nrows, const void *a,
                      size_t a_stride, int ncols, float *out, size_t out_stride);
/* level isa's gemv over rows in the ROWS4 layout: its gemv4, or (kind 0) the matmul's way without one,
 * each group copied out and run through gemv; w starts at a group; -1 if it has no gemv4 (kind 1) */
int pyllm_kernel_gemv4(int isa, int kind, int type, int64_t n, const void *w, int nrows, const void *a, float *out);
/* pyllm_repack_rows4 as level isa lays the blocks out (its rows4_codec) */
int pyllm_kernel_repack_rows4(int isa, int type, const void *w, void *dst, int64_t n_rows, int64_t n);

/* ---- the ROWS4 layout: weights repacked for decode (csrc/quants.h) ---- */
/* whether rows of n elements of `type` are worth repacking: the layout takes them and the running
 * level's gemv reads it directly (pyllm_repack_rows4 takes any that fit the layout) */
int pyllm_rows4_supported(int type, int64_t n);
/* writes the n_rows x n matrix w to dst (as many bytes) in the ROWS4 layout; -1 if not supported */
int pyllm_repack_rows4(int type, const void *w, void *dst, int64_t n_rows, int64_t n);
/* the float helpers of attention and the KV cache, by `which`:
 *   0 f32_to_f16(a=float[n]) -> out=f16[n]     1 f16_to_f32(a=f16[n]) -> out=float[n]
 *   2 dot_f16_f32(a=f16[n], b=float[n]) -> out=float[1]
 *   3 axpy_f16: out=float[n] += s * a=f16[n]    4 dot_f32(a, b=float[n]) -> out=float[1] */
int pyllm_kernel_float(int isa, int which, int64_t n, const void *a, const void *b, float s, void *out);
/* out[r*n + i] = f16_to_f32(x[r*x_stride + i]) for r < rows, i < n (x_stride >= n) */
int pyllm_kernel_f16_rows(int isa, const void *x, int64_t x_stride, int rows, float *out, int64_t n);
/* the vector math of GLU and attention, by `which` (float arrays of n):
 *   0 glu_silu:      out[i] = silu(a[i]) * b[i]
 *   1 glu_gelu_tanh: out[i] = gelu_tanh(a[i]) * b[i]
 *   2 exp_sum:       out[i] = exp(a[i] - s), *sum = their sum (a may be out)
 *   3 axpy_f32:      out[i] += s * a[i]
 *   4 wsum_f32:      out[j] += sum_{i < rows} b[i] * a[i*n + j], rows = (int)s
 *   7 softcap:       out[i] = c * tanh(s * a[i] / c) with c = b[0] > 0 (a may be out)
 *  10 glu_sigmoid:   out[i] = sigmoid(a[i]) * b[i] */
int pyllm_kernel_vmath(int isa, int which, int64_t n, const float *a, const float *b, float s, float *out,
                       float *sum);
/* wsum_f32 for nq outputs: y[q*ys + j] += sum_{i < rows} w[q*ws + i] * x[i*ld + j]
 * (the level's wsum_many_f32, else its wsum_f32 per output) */
int pyllm_kernel_wsum(int isa, int64_t n, int rows, int nq, const float *w, int64_t ws, const float *x, int64_t ld,
                      float *y, int64_t ys);
/* pyllm_kernel_wsum over f16 rows x (attention's V straight from the cache):
 * exactly pyllm_kernel_wsum on the rows converted to float */
int pyllm_kernel_wsum_f16(int isa, int64_t n, int rows, int nq, const float *w, int64_t ws, const void *x, int64_t ld,
                          float *y, int64_t ys);
/* pyllm_kernel_wsum over rows of Q8_0 blocks x, ld bytes apart, n % 32 == 0 (a q8_0 cache's V):
 * exactly pyllm_kernel_wsum on the rows dequantized */
int pyllm_kernel_wsum_q8_0(int isa, int64_t n, int rows, int nq, const float *w, int64_t ws, const void *x,
                           int64_t ld, float *y, int64_t ys);

/* one row of the selective scan (csrc/quants.h ssm_scan_row): for t < n_tok,
 * s = s decay[t] + x[t x_stride] dt[t] B_t, y[t y_stride] = s . C_t, B_t = bc + t bc_stride, C_t = B_t + c_off */
int pyllm_kernel_ssm_scan_row(int isa, int64_t n, float *s, int n_tok, const float *bc, int64_t bc_stride,
                              int64_t c_off, const float *x, int64_t x_stride, const float *dt, const float *decay,
                              float *y, int64_t y_stride);

/* ---- dense float rows: the vision encoder's work between its matrix products (csrc/dense.c) ----
 * Each runs level `isa`'s kernels on the rows it is given (callers split rows among threads);
 * 0 on success, -1 on a bad argument. */
/* rows r < rows of x, ld floats apart: x[r, :n] = exp(x[r, :n] - max x[r, :n]), sum[r] = their sum */
int pyllm_dense_softmax_rows(int isa, float *x, int rows, int64_t n, int64_t ld, float *sum);
enum pyllm_dense_act { DENSE_GELU_TANH = 0, DENSE_QUICK_GELU = 1, DENSE_SILU = 2, DENSE_GELU_ERF = 3 };
/* x[r, i] = act(x[r, i] + bias[i]) for rows r < rows of n floats, in place (bias may be NULL): gelu
 * (tanh form) or quick-gelu x sigmoid(1.702 x) */
int pyllm_dense_activation(int isa, int act, float *x, int rows, int64_t n, const float *bias);
/* rows r < rows of 2n floats [gate | up]: x[r, :n] = act(gate) * up (a gated FFN's activation, in
 * place; the up half is left as it was): gelu (tanh form), quick-gelu or silu */
int pyllm_dense_gated(int isa, int act, float *x, int rows, int64_t n);
/* y[r] = (x[r] - mean x[r]) / sqrt(var x[r] + eps) * w + b over rows of n floats (w, b may be NULL;
 * y may be x) */
int pyllm_dense_layernorm(const float *x, float *y, int rows, int64_t n, const float *w, const float *b, float eps);

/* ---- memory bandwidth probe (pyllm bench --membw) ---- */
double pyllm_membw(pyllm_ctx *ctx, const void *buf, size_t bytes, int reps);
