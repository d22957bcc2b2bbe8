"""Single-threaded throughput of the weight kernels: GB/s of weight bytes.

For each format and ISA level, times
  gemv     one call over a whole matrix (rows x n) against one activation row:
           the decode step's matrix-vector product (the level's gemv, or its
           vec_dot looped over rows in C when it has none);
  gemm16, gemm64  (levels with a gemm for the format) one call over the
           matrix against 16 / 64 activation rows (prefill: the matmul hands
           its kernels a tile of rows x all tokens), in weight bytes times 16
           / 64 per second: compare with gemv;
  vec_dot  one call on a single row holding the same bytes (rows*n elements):
           the streaming speed of the plain dot product. Its activation row is
           as long (Q8_32: 40 bytes per 32 elements, twice the weight bytes of
           Q4_1), so this column counts weight + activation bytes;
in two regimes:
  hot      the same matrix again and again: it stays in L2/L3 (a small
           model's matrices are 0.3-1.5 MB), so this shows compute speed;
  cold     a different matrix each call, cycling through --cold-mb of them:
           DRAM streaming, the regime of decode on a large model;
           gemv4_cold: the same with the matrices repacked in the ROWS4 layout
           (csrc/quants.h) and the level's gemv4 (what decode runs by default).
For reference, the read bandwidth of numpy summing the same bytes (as
float32) in both regimes is printed first.

Shapes are those of the real models' matrices: SmolLM2-135M (hidden 576,
ffn 1536) and a 640/2048 model (Gemma-3-270M-like); K-quants need rows of
a multiple of 256, so they use the shapes with n = 1536 / 2048.

    python3 benchmarks/bench_kernels.py                  # all formats, all levels
    python3 benchmarks/bench_kernels.py -t Q4_1 Q8_0 -l avx512 --cold-mb 256
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pyllm._native import ffi, lib  # noqa: E402

GEMM_COLS = (16, 64)

ISA_NAMES = {0: "scalar", 1: "avx2", 2: "avx512", 3: "neon"}
TYPES = {  # name: (ggml id, block size, block bytes, act)
    "Q4_1": (3, 32, 20, 1), "Q8_0": (8, 32, 34, 1), "Q5_0": (6, 32, 22, 1),
    "Q4_K": (12, 256, 144, 2), "Q6_K": (14, 256, 210, 2), "Q4_0": (2, 32, 18, 1),
    "Q5_1": (7, 32, 24, 1), "Q5_K": (13, 256, 176, 2), "Q3_K": (11, 256, 110, 2),
    "Q2_K": (10, 256, 84, 2), "IQ4_NL": (20, 32, 18, 1), "MXFP4": (39, 32, 17, 1),
    "IQ4_XS": (23, 256, 136, 2), "IQ3_S": (21, 256, 110, 2), "IQ3_XXS": (18, 256, 98, 2),
    "IQ2_XXS": (16, 256, 66, 2), "IQ2_XS": (17, 256, 74, 2), "IQ2_S": (22, 256, 82, 2),
    "IQ1_S": (19, 256, 50, 2), "IQ1_M": (29, 256, 56, 2),
    "F16": (1, 1, 2, 0), "BF16": (30, 1, 2, 0), "F32": (0, 1, 4, 0),
}
# (rows, n): rows of the weight matrix, n = row length (input width)
SHAPES = [(1536, 576), (576, 1536), (2048, 640), (640, 2048)]


def random_matrix(tname, rows, n, rng):
    tid, bs, ts, _ = TYPES[tname]
    if tname == "F32":
        return rng.standard_normal(rows * n).astype(np.float32).view(np.uint8)
    if tname in ("F16", "BF16"):
        return rng.standard_normal(rows * n).astype(np.float16).view(np.uint8)
    raw = rng.integers(0, 256, size=(rows * n // bs, ts), dtype=np.uint8)
    if tname == "MXFP4":  # E8M0 exponents as in real files
        raw[:, 0] = rng.integers(110, 130, size=len(raw))
        return raw.reshape(-1)
    # finite fp16 scales everywhere a scale may sit (bytes 0..3 and the K-quant tails)
    half = np.array([0.01], dtype=np.float16).view(np.uint8)
    for off in {"Q2_K": (80, 82), "Q3_K": (108,), "Q6_K": (208,)}.get(tname, (0, 2)):
        raw[:, off:off + 2] = half
    return raw.reshape(-1)


def timeit(fn, min_time):
    fn()
    best, total, reps = float("inf"), 0.0, 0
    while total < min_time or reps < 3:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, total, reps = min(best, dt), total + dt, reps + 1
    return best


def bench_one(isa, tname, rows, n, rng, min_time, cold_mb):
    tid, bs, ts, act = TYPES[tname]
    row_bytes = n // bs * ts
    mat_bytes = rows * row_bytes
    x = rng.standard_normal(rows * n).astype(np.float32)
    a_row = np.zeros(lib.pyllm_act_row_bytes(act, n), dtype=np.uint8)
    a_long = np.zeros(lib.pyllm_act_row_bytes(act, rows * n), dtype=np.uint8)
    assert lib.pyllm_kernel_quantize_act(0, act, ffi.cast("float *", ffi.from_buffer(x)), ffi.from_buffer(a_row), n) == 0
    assert lib.pyllm_kernel_quantize_act(0, act, ffi.cast("float *", ffi.from_buffer(x)), ffi.from_buffer(a_long),
                                         rows * n) == 0
    n_cold = max(2, cold_mb * 2**20 // mat_bytes)
    mats = [random_matrix(tname, rows, n, rng)] if cold_mb == 0 else \
        [random_matrix(tname, rows, n, rng) for _ in range(n_cold)]
    out = np.zeros(rows, dtype=np.float32)
    o1 = np.zeros(1, dtype=np.float32)
    pa, pl = ffi.from_buffer(a_row), ffi.from_buffer(a_long)
    po, po1 = ffi.cast("float *", ffi.from_buffer(out)), ffi.cast("float *", ffi.from_buffer(o1))
    pm = [ffi.from_buffer(m) for m in mats]
    res = {}
    state = [0]

    def gemv_hot():
        lib.pyllm_kernel_gemv(isa, tid, n, pm[0], row_bytes, rows, pa, po)

    def dot_hot():
        lib.pyllm_kernel_vec_dot(isa, tid, rows * n, pm[0], pl, po1)

    def gemv_cold():
        state[0] = (state[0] + 1) % len(pm)
        lib.pyllm_kernel_gemv(isa, tid, n, pm[state[0]], row_bytes, rows, pa, po)

    res["gemv_hot"] = mat_bytes / timeit(gemv_hot, min_time) / 1e9
    for cols in GEMM_COLS:
        if not lib.pyllm_kernel_provided(isa, 4, tid):
            res[f"gemm{cols}"] = float("nan")
            continue
        xs = rng.standard_normal(cols * n).astype(np.float32)
        acts = np.zeros(cols * a_row.nbytes, dtype=np.uint8)
        for t in range(cols):
            lib.pyllm_kernel_quantize_act(0, act, ffi.cast("float *", ffi.from_buffer(xs[t * n:])),
                                          ffi.from_buffer(acts[t * a_row.nbytes:]), n)
        outg = np.zeros(cols * rows, dtype=np.float32)
        gw, ga, go = ffi.from_buffer(mats[0]), ffi.from_buffer(acts), ffi.cast("float *", ffi.from_buffer(outg))

        def gemm_hot():
            lib.pyllm_kernel_gemm(isa, tid, n, gw, row_bytes, rows, ga, a_row.nbytes, cols, go, rows)
        res[f"gemm{cols}"] = mat_bytes * cols / timeit(gemm_hot, min_time) / 1e9
    res["dot_w+a"] = (mat_bytes + a_long.nbytes) / timeit(dot_hot, min_time) / 1e9
    if cold_mb:
        res["gemv_cold"] = mat_bytes / timeit(gemv_cold, min_time) / 1e9
        res["gemv4_cold"] = float("nan")
        if lib.pyllm_kernel_provided(isa, 6, tid):   # the same matrices repacked in ROWS4 (csrc/quants.h)
            packed = [np.zeros_like(m) for m in mats]
            for m, p in zip(mats, packed):
                assert lib.pyllm_kernel_repack_rows4(isa, tid, ffi.from_buffer(m), ffi.from_buffer(p), rows, n) == 0
            pp = [ffi.from_buffer(p) for p in packed]

            def gemv4_cold():
                state[0] = (state[0] + 1) % len(pp)
                lib.pyllm_kernel_gemv4(isa, 1, tid, n, pp[state[0]], rows, pa, po)
            res["gemv4_cold"] = mat_bytes / timeit(gemv4_cold, min_time) / 1e9
    return res


def numpy_bw(nbytes, rng, min_time, cold_mb):
    bufs = [rng.standard_normal(nbytes // 4).astype(np.float32)]
    hot = nbytes / timeit(lambda: bufs[0].sum(), min_time) / 1e9
    if not cold_mb:
        return hot, None
    cold_bufs = [rng.standard_normal(nbytes // 4).astype(np.float32) for _ in range(max(2, cold_mb * 2**20 // nbytes))]
    st = [0]

    def f():
        st[0] = (st[0] + 1) % len(cold_bufs)
        cold_bufs[st[0]].sum()
    return hot, nbytes / timeit(f, min_time) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--types", nargs="*", default=list(TYPES))
    ap.add_argument("-l", "--levels", nargs="*", default=None, help="scalar avx2 avx512 neon (default: all available)")
    ap.add_argument("-s", "--shapes", nargs="*", default=None, help="ROWSxN, e.g. 1536x576")
    ap.add_argument("--min-time", type=float, default=0.05, help="seconds per measurement")
    ap.add_argument("--cold-mb", type=int, default=0, help="also time cold (DRAM) gemv cycling through this many MB")
    args = ap.parse_args()
    levels = [i for i in ISA_NAMES if lib.pyllm_level_available(i)]
    if args.levels:
        levels = [i for i in levels if ISA_NAMES[i] in args.levels]
    shapes = SHAPES if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    rng = np.random.default_rng(0)

    print(f"cpu level: {ffi.string(lib.pyllm_level_name(lib.pyllm_cpu_level())).decode()}; "
          + ", ".join(f"{ISA_NAMES[i]}: {ffi.string(lib.pyllm_level_name(i)).decode()}" for i in levels)
          + "; single thread; GB/s of weight bytes")
    hot, cold = numpy_bw(1536 * 576 // 2, rng, args.min_time, args.cold_mb)
    print(f"numpy float32 sum, 442 KB: hot {hot:.1f} GB/s" + (f", cold {cold:.1f} GB/s" if cold else ""))
    cols = ["gemv_hot"] + [f"gemm{c}" for c in GEMM_COLS] + ["dot_w+a"] + (["gemv_cold", "gemv4_cold"] if args.cold_mb else [])
    print(f"{'type':7s} {'shape':>10s} " + " ".join(f"{ISA_NAMES[i] + ':' + c:>17s}" for i in levels for c in cols))
    for tname in args.types:
        bs = TYPES[tname][1]
        for rows, n in shapes:
            if n % bs:
                continue
            line = f"{tname:7s} {f'{rows}x{n}':>10s} "
            for isa in levels:
                r = bench_one(isa, tname, rows, n, rng, args.min_time, args.cold_mb)
                line += " ".join(f"{r[c]:17.1f}" for c in cols) + " "
            print(line, flush=True)


if __name__ == "__main__":
    main()
