/* pyllm_cuda.h: the ABI of libpyllm_cuda.so, the CUDA backend (`make cuda`).
 *
 * It runs the same op records as the C core (csrc/pyllm.h: include that
 * first), but every pointer in them is a device pointer: weights, vectors,
 * activation and quantized buffers, KV pools, all allocated and filled
 * through this API. The step record stays on the host (its tokens,
 * positions and block table are host arrays); pyllm_cuda_run copies what
 * the ops read of it to the device, then launches one kernel per op on the
 * context's stream (or replays them as a CUDA graph) and waits for them.
 *
 * Device pointers cross the ABI as uint64_t. Every function returns 0 (or a
 * non-zero pointer / a positive count) on success and a negative value (or
 * 0 / NULL) on failure, with pyllm_cuda_error() saying why. Nothing aborts.
 *
 * Only plain declarations here (no macros, no includes): cffi parses it.
 */

typedef struct pyllm_cuda pyllm_cuda;

/* devices the runtime sees (0 when there is no driver or no device: no error) */
int pyllm_cuda_device_count(void);
/* facts about one device; any output pointer may be NULL */
int pyllm_cuda_device_info(int device, char *name, int name_len, int *cc_major, int *cc_minor, int *sm_count,
                           size_t *total_bytes, int *clock_khz, int *mem_clock_khz, int *mem_bus_bits);

pyllm_cuda *pyllm_cuda_new(int device);
void pyllm_cuda_free(pyllm_cuda *ctx);
const char *pyllm_cuda_error(void);

int pyllm_cuda_mem_info(pyllm_cuda *ctx, size_t *free_bytes, size_t *total_bytes);
uint64_t pyllm_cuda_alloc(pyllm_cuda *ctx, size_t bytes);          /* 0 on failure */
int pyllm_cuda_release(pyllm_cuda *ctx, uint64_t ptr);
int pyllm_cuda_memset0(pyllm_cuda *ctx, uint64_t ptr, size_t bytes);
/* host <-> device copies; both are counted (pyllm_cuda_bus_bytes) */
int pyllm_cuda_upload(pyllm_cuda *ctx, uint64_t dst, const void *src, size_t bytes);
int pyllm_cuda_download(pyllm_cuda *ctx, void *dst, uint64_t src, size_t bytes);
/* bytes copied so far, each way (the step's arrays included) */
void pyllm_cuda_bus_bytes(const pyllm_cuda *ctx, uint64_t *h2d, uint64_t *d2h);

/* is this weight type supported (matmul and embedding)? */
int pyllm_cuda_type_supported(int type);
/* checks a program once: 0, or the index + 1 of the first op this backend cannot run */
int pyllm_cuda_check(const pyllm_op *ops, int n_ops);
/* runs ops[0 .. n_ops) for one step and waits for them; 0 or -1. Before the kernels it copies
 * what the ops read of the step (tokens: EMBED; positions: ROPE, POS_SCALE, KV_STORE, ATTENTION,
 * SSM_CONV, SSM_SCAN, DELTA_NET, WKV, EMBED by position instead of the tokens; block table: KV_STORE,
 * ATTENTION) to the device. The recurrent ops' states (SSM_CONV, SSM_SCAN, WKV,
 * DELTA_NET) stay in device memory from step to step (a step at position 0 starts from zeros),
 * so a step of theirs needs consecutive positions. new_step = 1 forgets what earlier calls sent; a caller running several op ranges
 * of one step passes 0 after the first, and only what was not sent yet is sent. */
int pyllm_cuda_run(pyllm_cuda *ctx, const pyllm_op *ops, int n_ops, const pyllm_step *step, int new_step);
int pyllm_cuda_sync(pyllm_cuda *ctx);
/* a step of at most 16 rows whose launches were seen before (the same op records, row counts and
 * step arrays' device copies) replays them as one CUDA graph, captured the second time they come;
 * on by default; off forgets the graphs */
int pyllm_cuda_set_graphs(pyllm_cuda *ctx, int on);
/* graphs captured and replayed so far */
void pyllm_cuda_graph_counts(const pyllm_cuda *ctx, uint64_t *captured, uint64_t *replayed);

/* measured copy rate in bytes/s: kind 0 host->device from pinned memory, 1 device->host to pinned,
 * 2 host->device from pageable memory, 3 device->host to pageable, 4 device->device (read + write) */
double pyllm_cuda_copy_rate(pyllm_cuda *ctx, int kind, size_t bytes, int reps);
/* seconds one small (4-byte) pageable host->device copy takes, the best of reps */
double pyllm_cuda_copy_latency(pyllm_cuda *ctx, int reps);
