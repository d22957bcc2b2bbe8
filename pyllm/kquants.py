"""Q2_K, Q3_K, Q4_K, Q5_K and Q6_K quantizers: numpy ports of llama.cpp's reference ones
(and, with an importance matrix, of its weighted ones for these and the legacy Q4_0, Q4_1,
Q5_0, Q5_1 at the end: quantize_row_q4_0_impl ... q5_1_impl).

These are the functions ggml-quants.c calls when there is no importance
matrix (quantize_row_q2_K_ref, _q3_K_ref, _q4_K_ref, _q5_K_ref, _q6_K_ref); their output is the
byte layout GGUF files carry, which gguf.quants.dequantize decodes. Each
function takes float32 [rows, n] (n a multiple of 256) and returns uint8
[rows, n // 256 * block_bytes]. All of a tensor's blocks are done at once:
the loops run only over the search steps, never over blocks.

What the formats store, per super-block of 256 values:

Q2_K (84 bytes): 16 sub-blocks of 16. Value = d*(sc_j & 15)*q - dmin*(sc_j >> 4), q in 0..3.
    scales    16 bytes: sc_j, its scale in the low nibble and its min in the high one
    qs        64 bytes: in each 128-value half, byte l holds q[l], q[l+32],
              q[l+64], q[l+96] at bits 0, 2, 4, 6
    d, dmin   fp16
Q3_K (110 bytes): 16 sub-blocks of 16. Value = d*(sc_j - 32)*(q - 4), q in 0..7.
    hmask     32 bytes: bit b of hmask[l] is bit 2 of q[32b + l]
    qs        64 bytes: the low 2 bits of q, packed as Q2_K's
    scales    12 bytes: sixteen 6-bit sc_j: bytes 0..7 hold the low nibbles
              of sc_0..7 (low) and sc_8..15 (high); byte 8 + j%4 holds the top
              2 bits of sc_j at bits 2*(j/4)
    d         fp16

Q4_K (144 bytes): 8 sub-blocks of 32. Value = d*sc_j*q - dmin*m_j, q in 0..15.
    d, dmin   fp16, the super-block scales of the scales and of the mins
    scales    12 bytes: eight 6-bit sc_j and eight 6-bit m_j, packed: bytes
              0..3 hold sc_0..3, bytes 4..7 hold m_0..3 (low 6 bits each);
              bytes 8..11 hold the low nibbles of sc_4..7 (low) and m_4..7
              (high); the top 2 bits of sc_4..7 / m_4..7 go to the top 2 bits
              of bytes 0..3 / 4..7
    qs        128 bytes: in each 64-value chunk, byte l holds q[l] in its low
              nibble and q[l+32] in its high nibble
Q5_K (176 bytes): as Q4_K with q in 0..31; d, dmin, scales[12], then
    qh        32 bytes: bit 2c of qh[l] is bit 4 of q[64c+l], bit 2c+1 is
              bit 4 of q[64c+32+l] (c = 0..3)
    qs        128 bytes: the low 4 bits of q, packed as Q4_K's qs
Q6_K (210 bytes): 16 sub-blocks of 16. Value = d*sc_j*(q - 32), q in 0..63.
    ql        128 bytes: low 4 bits of q; in each 128-value half, ql[l] holds
              q[l] (low nibble) and q[l+64] (high), ql[l+32] holds q[l+32]
              and q[l+96]
    qh        64 bytes: high 2 bits; in each half, qh[l] holds those of
              q[l], q[l+32], q[l+64], q[l+96] at bits 0, 2, 4, 6
    scales    16 int8 sc_j
    d         fp16

With an importance matrix (each column's mean square input, `pyllm imatrix`), the
_impl quantizers llama-quantize --imatrix runs: the values weighted by
qw * sqrt(sigma2 + x^2) (sigma2 the super-block's mean square, doubled for Q3_K..Q5_K;
Q6_K takes qw alone), make_qkx3_quants' search (make_qkx2's with rmin -0.9, rdelta 0.05,
36 steps) for the affine formats, and the sub-block scales and mins coded by
make_qp_quants (or make_qx_quants for Q3_K) weighted by the sub-blocks' total weight.

How the scales are searched (nearest_int is llama.cpp's round-half-to-even
on float32: np.rint in the searches, where its argument stays within
nmax + 1, and the 1.5*2^23 trick itself, _nearest_int, where it may not):

make_qx_quants (Q6_K, symmetric, per sub-block of 16, nmax = 32): with max the
    value of largest |x| (signed), try iscale = -(nmax + 0.1*k)/max for k = 0
    and k = -9..9; l = clamp(nearest_int(iscale*x), -nmax, nmax-1); with
    weights w = x^2 the best scale for those l is s = sum(w*x*l)/sum(w*l*l),
    and its weighted squared error is sum(w*x^2) - s*sum(w*x*l), so the try
    with the largest s*sum(w*x*l) wins.
make_q3_quants (Q3_K, symmetric, per sub-block of 16, nmax = 4): l =
    clamp(nearest_int(-nmax/max * x), -nmax, nmax-1), then up to 5 passes of
    coordinate descent: each l in turn is moved to the value the best scale
    for the others would give it, kept if sum(w*x*l)^2 / sum(w*l*l) grows
    (w = x^2); the scale is sum(w*x*l) / sum(w*l*l).
make_qkx2_quants (Q4_K/Q5_K, affine, per sub-block of 32, weights
    w = rms(sub-block) + |x|; Q2_K per sub-block of 16, w = |x|, and the
    weighted absolute error instead of the squared one): start from min = min(x, 0), scale =
    (max - min)/nmax; then for k = 0..nstep take iscale = (nmax + rmin +
    rdelta*k)/(max - min), round l = clamp(nearest_int(iscale*(x - min)), 0,
    nmax), fit scale and min to those l by weighted least squares (min
    clamped to <= 0), keep it if its weighted squared error is smaller. A kept
    try also moves `min`, which the later tries then round against (as in
    llama.cpp).

Then per super-block the sub-block scales (and mins) are themselves quantized
to 6 bits (Q4_K/Q5_K, against the largest) or int8 (Q6_K, the largest |scale|
maps to -128), the super-block scale is stored as fp16, and every value is
re-rounded against the scale the decoder will actually use. A sub-block whose
decoded scale is 0 keeps the l of its search, as llama.cpp's `continue` does
(they decode to -dmin*m, or 0, whatever they hold).

Arithmetic is float32 in llama.cpp's order of operations, and sums run
sequentially (numpy reduces over axis 0 of a [position, sub-block] array one
row after another, like the C loop), so the output is llama.cpp's bit for bit
(checked against llama-cpp-python 0.3.36's libggml-base, whose compiler does
not fuse or reorder these float operations; tests/test_kquants.py pins it).
"""
from __future__ import annotations

import functools

import numpy as np

__all__ = ["quantize_q2_k", "quantize_q3_k", "quantize_q4_k", "quantize_q5_k", "quantize_q6_k",
           "quantize_legacy_weighted"]

QK_K = 256
BLOCK_BYTES = {"q2_k": 84, "q3_k": 110, "q4_k": 144, "q5_k": 176, "q6_k": 210}
CHUNK_BLOCKS = 256         # super-blocks per pass: bounds memory; ~256 KiB arrays stay in cache
GROUP_MAX_EPS = np.float32(1e-15)

_f = np.float32


def _columns(fn):
    """For a search over columns [n, S]: numpy sums axis 0 of a [n, S] array row after row,
    as C's loops do, only when S > 1 (one column is a contiguous run, summed pairwise), so a
    single column runs as two and is sliced back."""
    @functools.wraps(fn)
    def run(x, *args, **kw):
        if x.shape[1] != 1:
            return fn(x, *args, **kw)
        wide = [np.repeat(a, 2, axis=1) if isinstance(a, np.ndarray) and a.ndim == 2 else a for a in args]
        return tuple(r[..., :1] for r in fn(np.repeat(x, 2, axis=1), *wide, **kw))
    return run


def _sum0(a: np.ndarray) -> np.ndarray:
    """The sums over axis 0 of [n, S], row after row (C's order) also when S is 1."""
    return a.sum(axis=0) if a.shape[1] != 1 else np.repeat(a, 2, axis=1).sum(axis=0)[:1]


def _nearest(v):
    """Round half to even, in place (v is a float32 temporary). For the
    searches, whose arguments are bounded by nmax + 1 for finite input."""
    return np.rint(v, out=v)


def _nearest_int(v):
    """llama.cpp's nearest_int, bit for bit: add 1.5*2^23 in float32 and read
    the integer from the mantissa. Round half to even for |v| <= 4194303, and
    beyond that (inf, nan after an fp16 overflow of d) the same int as C gets."""
    b = (np.asarray(v, dtype=np.float32) + _f(12582912)).view(np.int32)
    return (b & 0x7FFFFF) - 0x400000


@_columns
def make_qx_quants(x: np.ndarray, nmax: int, qw: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric scale search, rmse_type 1 (weights x^2, or qw), for sub-blocks.

    x (qw): float32 [n, S], column s one sub-block (position-major, so that sums
    over axis 0 are sequential). Returns (scale [S], L [n, S] uint8 = l + nmax;
    all-zero sub-blocks give scale 0 and L 0).
    """
    S = x.shape[1]
    cols = np.arange(S)
    mx = x[np.argmax(np.abs(x), axis=0), cols]           # signed value of largest |x|, first one
    zero = np.abs(mx) < GROUP_MAX_EPS
    mx = np.where(zero, _f(1), mx)                        # keep the all-zero columns finite
    w = x * x if qw is None else qw
    wx = w * x                                            # C: w*x[i]*l == (w*x)*l

    def fit(iscale):
        l = _nearest(iscale * x)
        np.clip(l, -nmax, nmax - 1, out=l)
        sumlx = (wx * l).sum(axis=0)
        wl = w * l
        wl *= l
        return sumlx, wl.sum(axis=0)

    best_is = _f(-nmax) / mx
    sumlx, suml2 = fit(best_is)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 != 0, sumlx / suml2, _f(0))
    best = scale * sumlx
    for k in range(-9, 10):
        if k == 0:
            continue
        iscale = -(_f(nmax) + _f(0.1) * _f(k)) / mx
        sumlx, suml2 = fit(iscale)
        # s*sumlx is the error reduction of the best scale s for these l
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        with np.errstate(divide="ignore", invalid="ignore"):
            s = sumlx / suml2
        scale = np.where(better, s, scale)
        best = np.where(better, s * sumlx, best)
        best_is = np.where(better, iscale, best_is)
    # L of the winning try (recomputed: same float ops, so the same l)
    L = _nearest(best_is * x)
    np.clip(L, -nmax, nmax - 1, out=L)
    L += nmax
    L[:, zero] = 0
    scale[zero] = 0
    return scale, L.astype(np.uint8)


@_columns
def make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric scale search by coordinate descent (do_rmse), for sub-blocks.

    x: float32 [n, S], column s one sub-block. Returns (scale [S], L [n, S] uint8 =
    l + nmax; all-zero sub-blocks give scale 0 and L 0). C stops a sub-block after a
    pass that changes nothing; the passes after such a pass change nothing either,
    so every column runs all 5 here.
    """
    S = x.shape[1]
    mx = x[np.argmax(np.abs(x), axis=0), np.arange(S)]
    zero = np.abs(mx) < GROUP_MAX_EPS
    mx = np.where(zero, _f(1), mx)
    L = _nearest(_f(-nmax) / mx * x)
    np.clip(L, -nmax, nmax - 1, out=L)
    w = x * x
    wx = w * x
    sumlx = (wx * L).sum(axis=0)
    suml2 = ((w * L) * L).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for _ in range(5):
            for i in range(x.shape[0]):
                li = L[i]
                slx = sumlx - wx[i] * li
                sl2 = suml2 - (w[i] * li) * li
                new_l = np.clip(_nearest_int((x[i] * sl2) / slx), -nmax, nmax - 1).astype(np.float32)
                slx_new = slx + wx[i] * new_l
                sl2_new = sl2 + (w[i] * new_l) * new_l
                take = (slx > 0) & (new_l != li) & (sl2_new > 0) & \
                    ((slx_new * slx_new) * suml2 > (sumlx * sumlx) * sl2_new)
                L[i] = np.where(take, new_l, li)
                sumlx = np.where(take, slx_new, sumlx)
                suml2 = np.where(take, sl2_new, suml2)
        scale = sumlx / suml2
    L += nmax
    L[:, zero] = 0
    scale[zero] = 0
    return scale, L.astype(np.uint8)


@_columns
def make_qp_quants(x: np.ndarray, nmax: int, qw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scale search for non-negative values (the sub-block scales or mins of an
    importance-weighted super-block), weights qw: the best of 9 trial scales by weighted
    squared error, then coordinate descent as make_q3_quants'. x, qw: float32 [n, S].
    Returns (scale [S], L [n, S] uint8 in 0..nmax; an all-zero column gives 0 and 0)."""
    mx = np.maximum(x.max(axis=0), _f(0))                 # C starts its max at 0
    zero = mx == 0
    mx = np.where(zero, _f(1), mx)
    iscale = _f(nmax) / mx
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        L = (_nearest_int(iscale * x) & 0xFF).astype(np.float32)   # stored in a uint8
        e = x - (_f(1) / iscale) * L
        best = ((qw * e) * e).sum(axis=0)
        for k in (-4, -3, -2, -1, 1, 2, 3, 4):
            iscale_k = (_f(0.1) * _f(k) + _f(nmax)) / mx
            lk = np.minimum(_nearest_int(iscale_k * x), nmax).astype(np.float32)
            e = x - (_f(1) / iscale_k) * lk
            mse = ((qw * e) * e).sum(axis=0)
            better = mse < best
            best = np.where(better, mse, best)
            iscale = np.where(better, iscale_k, iscale)
        l = np.minimum(_nearest_int(iscale * x), nmax).astype(np.float32)
        qx = qw * x
        sumlx = (qx * l).sum(axis=0)
        suml2 = ((qw * l) * l).sum(axis=0)
        L = (l.astype(np.int64) & 0xFF).astype(np.float32)
        for _ in range(5):
            for i in range(x.shape[0]):
                li = L[i]
                slx = sumlx - qx[i] * li
                sl2 = suml2 - (qw[i] * li) * li
                new_l = np.minimum(_nearest_int((x[i] * sl2) / slx), nmax).astype(np.float32)
                slx_new = slx + qx[i] * new_l
                sl2_new = sl2 + (qw[i] * new_l) * new_l
                take = (slx > 0) & (sl2 > 0) & (new_l != li) & \
                    ((slx_new * slx_new) * suml2 > (sumlx * sumlx) * sl2_new)
                L[i] = np.where(take, (new_l.astype(np.int64) & 0xFF).astype(np.float32), li)
                sumlx = np.where(take, slx_new, sumlx)
                suml2 = np.where(take, sl2_new, suml2)
        scale = sumlx / suml2
    L = L.astype(np.uint8)
    L[:, zero] = 0
    scale[zero] = 0
    return scale, L


@_columns
def make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float,
                     rdelta: float, nstep: int, use_mad: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Affine (scale, min) search with weights w, for sub-blocks.

    x, w: float32 [n, S], column s one sub-block. Returns (scale [S],
    the_min [S] = -min >= 0, L [n, S] uint8 in 0..nmax), value ~ scale*L - the_min.
    use_mad: weigh the absolute error (Q2_K), not the squared one.
    """
    mn = np.minimum(x.min(axis=0), _f(0))
    mx = x.max(axis=0)
    sum_w = w.sum(axis=0)
    sum_x = (w * x).sum(axis=0)
    flat = mx == mn                                       # nothing to spread: L = 0, scale 0
    nmax_f = _f(nmax)
    tmp = np.empty_like(x)

    def round_l(iscale, base):
        l = np.subtract(x, base, out=np.empty_like(x))
        l *= iscale
        _nearest(l)
        return np.clip(l, 0, nmax_f, out=l)

    def werr(scale, l, m):
        e = np.multiply(l, scale, out=tmp)                # (scale*l + min - x)^2 * w, or |.| * w
        e += m
        e -= x
        if use_mad:
            np.abs(e, out=e)
        else:
            e *= e
        e *= w
        return e.sum(axis=0)

    with np.errstate(divide="ignore", invalid="ignore"):
        best_is = np.where(flat, _f(0), nmax_f / (mx - mn))
        scale = np.where(flat, _f(0), _f(1) / best_is)
        best_base = mn.copy()                            # the min the winning l were rounded against
        best_err = werr(scale, round_l(best_is, mn), mn)
        for k in range(nstep + 1):
            iscale = (_f(rmin) + _f(rdelta) * _f(k) + nmax_f) / (mx - mn)
            l = round_l(iscale, mn)
            wl = w * l
            sum_l = wl.sum(axis=0)
            sum_xl = np.multiply(wl, x, out=tmp).sum(axis=0)
            wl *= l
            sum_l2 = wl.sum(axis=0)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0                             # a positive min is not storable
            this_min[pos] = 0
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            err = werr(this_scale, l, this_min)
            better = (D > 0) & (err < best_err) & ~flat
            best_err = np.where(better, err, best_err)
            scale = np.where(better, this_scale, scale)
            best_is = np.where(better, iscale, best_is)
            best_base = np.where(better, mn, best_base)
            mn = np.where(better, this_min, mn)            # later tries round against the new min
    L = round_l(best_is, best_base)
    return scale, -mn, L.astype(np.uint8)


def _blocks(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK_K:
        raise ValueError(f"expected float32 [rows, n] with n a multiple of {QK_K}, got {x.shape}")
    return x.reshape(-1, QK_K)


def _chunked(x: np.ndarray, block_bytes: int, fn, qw: np.ndarray | None = None) -> np.ndarray:
    """fn over the super-blocks of x, CHUNK_BLOCKS at a time; with qw (an importance per
    column, [n]), fn(blocks, their columns' importances)."""
    xb = _blocks(x)
    rows, n = np.shape(x)
    if qw is not None:
        qw = np.asarray(qw, dtype=np.float32)
        if qw.shape != (n,):
            raise ValueError(f"expected {n} importances, one per column, got {qw.shape}")
        qwb = np.tile(qw.reshape(-1, QK_K), (rows, 1))      # each super-block's columns
    out = np.empty((xb.shape[0], block_bytes), dtype=np.uint8)
    # fp16 overflow of d (|x| beyond ~1e6) gives inf/nan as in C; no warnings
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        for i in range(0, xb.shape[0], CHUNK_BLOCKS):
            part = xb[i:i + CHUNK_BLOCKS]
            out[i:i + CHUNK_BLOCKS] = fn(part) if qw is None else fn(part, qwb[i:i + CHUNK_BLOCKS])
    return out.reshape(rows, n // QK_K * block_bytes)


def _importance(xb: np.ndarray, qwb: np.ndarray, sub: int, factor: int) -> tuple[np.ndarray, np.ndarray]:
    """The _impl quantizers' per-value weights qw * sqrt(sigma2 + x^2), sigma2 = factor *
    sum(x^2) / 256 over the super-block; (x, weights) position-major by sub-blocks of `sub`."""
    xfull = np.ascontiguousarray(xb.T)                      # [256, nb]: sequential sums
    sigma2 = (_f(factor) * _sum0(xfull * xfull)) / _f(QK_K)
    xt = np.ascontiguousarray(xb.reshape(-1, sub).T)        # [sub, sub-blocks]
    qt = np.ascontiguousarray(qwb.reshape(-1, sub).T)
    return xt, qt * np.sqrt(np.repeat(sigma2, QK_K // sub)[None, :] + xt * xt)


def _fp16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype("<f2").view(np.uint8).reshape(-1, 2)


def _q45_k_blocks(xb: np.ndarray, nmax: int, rmin: float, nstep: int, qwb: np.ndarray | None = None):
    """The part Q4_K and Q5_K share: scales, mins, their packing, and L. With qwb (the
    columns' importances, [nb, 256]): quantize_row_q4_K_impl's / _q5_K_impl's search."""
    nb = xb.shape[0]
    if qwb is not None:
        xt, w = _importance(xb, qwb, 32, 2)
        sw = w.sum(axis=0).reshape(nb, 8).T
        scales, mins, L = make_qkx2_quants(xt, w, nmax, -0.9, 0.05, 36)
        d_block, ls = make_qp_quants(np.ascontiguousarray(scales.reshape(nb, 8).T), 63, sw)
        m_block, lm = make_qp_quants(np.ascontiguousarray(mins.reshape(nb, 8).T), 63, sw)
        return _q45_k_finish(xb, nmax, L, np.minimum(ls.T, 63), np.minimum(lm.T, 63),
                             d_block.astype(np.float16), m_block.astype(np.float16))
    xt = np.ascontiguousarray(xb.reshape(nb * 8, 32).T)     # [32, sub-blocks]
    av_x = np.sqrt((xt * xt).sum(axis=0) / _f(32))
    w = av_x + np.abs(xt)                                   # favour large values, floor at the rms
    scales, mins, L = make_qkx2_quants(xt, w, nmax, rmin, 0.1, nstep)
    scales = scales.reshape(nb, 8)
    mins = mins.reshape(nb, 8)

    # 6-bit sub-block scales and mins against the largest of each
    max_scale = np.maximum(scales.max(axis=1), _f(0))
    max_min = np.maximum(mins.max(axis=1), _f(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, _f(63) / max_scale, _f(0))
        inv_min = np.where(max_min > 0, _f(63) / max_min, _f(0))
    # C stores nearest_int into a uint8 before MIN(63, .): a negative wraps to >= 64 -> 63
    ls = np.minimum(_nearest_int(inv_scale[:, None] * scales) & 0xFF, 63).astype(np.uint8)
    lm = np.minimum(_nearest_int(inv_min[:, None] * mins) & 0xFF, 63).astype(np.uint8)
    d = (max_scale / _f(63)).astype(np.float16)
    dmin = (max_min / _f(63)).astype(np.float16)
    return _q45_k_finish(xb, nmax, L, ls, lm, d, dmin)


def _q45_k_finish(xb, nmax, L, ls, lm, d, dmin):
    """Packs the 6-bit scales and mins, re-rounds the values against them."""
    nb = xb.shape[0]
    ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
    sc_bytes = np.empty((nb, 12), dtype=np.uint8)
    sc_bytes[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    sc_bytes[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    sc_bytes[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)

    # re-round every value against the scale and min the decoder will use
    dd = d.astype(np.float32)[:, None] * ls                 # [nb, 8]
    dm = dmin.astype(np.float32)[:, None] * lm
    xs = xb.reshape(nb, 8, 32)
    Lq = np.clip(_nearest_int((xs + dm[:, :, None]) / dd[:, :, None]), 0, nmax).astype(np.uint8)
    keep = np.broadcast_to((dd == 0)[:, :, None], Lq.shape)     # scale 0: keep the search's l
    np.copyto(Lq, L.T.reshape(nb, 8, 32), where=keep)
    L = Lq
    head = np.concatenate([_fp16_bytes(d), _fp16_bytes(dmin), sc_bytes], axis=1)
    return head, L.reshape(nb, 4, 2, 32)                    # [block, 64-chunk, half, l]


def _pack_2bit(L: np.ndarray) -> np.ndarray:
    """[nb, 256] values 0..3 -> [nb, 64] bytes: per 128-value half, byte l holds values
    l, l+32, l+64, l+96 at bits 0, 2, 4, 6 (Q2_K's and Q3_K's qs)."""
    L = L.reshape(-1, 2, 4, 32)
    return (L[:, :, 0] | (L[:, :, 1] << 2) | (L[:, :, 2] << 4) | (L[:, :, 3] << 6)).reshape(-1, 64)


def _q2_k_chunk(xb: np.ndarray, qwb: np.ndarray | None = None) -> np.ndarray:
    nb = xb.shape[0]
    if qwb is not None:   # quantize_row_q2_K_impl: importance-weighted searches, 4-bit codes by make_qp_quants
        xt, w = _importance(xb, qwb, 16, 1)
        sw = np.ascontiguousarray(w.sum(axis=0).reshape(nb, 16).T)
        scales, mins, L = make_qkx2_quants(xt, w, 3, -0.9, 0.05, 36)
        dm, ls = make_qp_quants(np.ascontiguousarray(scales.reshape(nb, 16).T), 15, sw)
        mm, lm = make_qp_quants(np.ascontiguousarray(mins.reshape(nb, 16).T), 15, sw)
        sc = (ls.T | (lm.T << 4)).astype(np.uint8)
        return _q2_k_finish(xb, L, sc, dm.astype(np.float16), mm.astype(np.float16))
    xt = np.ascontiguousarray(xb.reshape(nb * 16, 16).T)   # [16, sub-blocks]
    scales, mins, L = make_qkx2_quants(xt, np.abs(xt), 3, -0.5, 0.1, 15, use_mad=True)
    scales = scales.reshape(nb, 16)
    mins = mins.reshape(nb, 16)

    # 4-bit sub-block scales and mins against the largest of each (C stores an int in a
    # uint8, then ors the min's shifted int in: both keep their low 8 bits)
    max_scale = np.maximum(scales.max(axis=1), _f(0))
    max_min = np.maximum(mins.max(axis=1), _f(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, _f(15) / max_scale, _f(0))
        inv_min = np.where(max_min > 0, _f(15) / max_min, _f(0))
    ls = np.where(max_scale[:, None] > 0, _nearest_int(inv_scale[:, None] * scales), 0)
    lm = np.where(max_min[:, None] > 0, _nearest_int(inv_min[:, None] * mins), 0)
    sc = ((ls & 0xFF) | ((lm << 4) & 0xFF)).astype(np.uint8)
    d = np.where(max_scale > 0, max_scale / _f(15), _f(0)).astype(np.float16)
    dmin = np.where(max_min > 0, max_min / _f(15), _f(0)).astype(np.float16)
    return _q2_k_finish(xb, L, sc, d, dmin)


def _q2_k_finish(xb, L, sc, d, dmin):
    """Re-rounds every value against the scale and min the decoder will use; packs."""
    nb = xb.shape[0]
    dd = d.astype(np.float32)[:, None] * (sc & 0xF)         # [nb, 16]
    dm = dmin.astype(np.float32)[:, None] * (sc >> 4)
    xs = xb.reshape(nb, 16, 16)
    Lq = np.clip(_nearest_int((xs + dm[:, :, None]) / dd[:, :, None]), 0, 3).astype(np.uint8)
    keep = np.broadcast_to((dd == 0)[:, :, None], Lq.shape)     # scale 0: keep the search's l
    np.copyto(Lq, L.T.reshape(nb, 16, 16), where=keep)
    return np.concatenate([sc, _pack_2bit(Lq), _fp16_bytes(d), _fp16_bytes(dmin)], axis=1)


def _q3_k_chunk(xb: np.ndarray, qwb: np.ndarray | None = None) -> np.ndarray:
    nb = xb.shape[0]
    if qwb is not None:   # quantize_row_q3_K_impl: weighted make_qx_quants for the values and the scales
        xt, w = _importance(xb, qwb, 16, 2)
        sw = np.ascontiguousarray(w.sum(axis=0).reshape(nb, 16).T)
        scales, L = make_qx_quants(xt, 4, w)
        d_block, ls = make_qx_quants(np.ascontiguousarray(scales.reshape(nb, 16).T), 32, sw)
        return _q3_k_finish(xb, L, ls.T, d_block.astype(np.float16))
    xt = np.ascontiguousarray(xb.reshape(nb * 16, 16).T)   # [16, sub-blocks]
    scales, L = make_q3_quants(xt, 4)
    scales = scales.reshape(nb, 16)

    # 6-bit sub-block scales; the one of largest |scale| (first such) maps to -32
    max_scale = scales[np.arange(nb), np.argmax(np.abs(scales), axis=1)]
    some = max_scale != 0
    iscale = _f(-32) / np.where(some, max_scale, _f(1))
    l = _nearest_int(iscale[:, None] * scales)
    l = ((l + 128) & 0xFF) - 128                            # C keeps it in an int8_t
    l = np.where(some[:, None], np.clip(l, -32, 31) + 32, 0).astype(np.uint8)
    d = np.where(some, _f(1) / iscale, _f(0)).astype(np.float16)
    return _q3_k_finish(xb, L, l, d)


def _q3_k_finish(xb, L, l, d):
    """Packs the 6-bit scale codes l (0..63, the scale being l - 32), re-rounds the values, packs."""
    nb = xb.shape[0]
    l = l.astype(np.uint8)
    sc_bytes = np.zeros((nb, 12), dtype=np.uint8)
    sc_bytes[:, :8] = (l[:, :8] & 0xF) | ((l[:, 8:] & 0xF) << 4)
    high = (l >> 4).reshape(nb, 4, 4) << (2 * np.arange(4, dtype=np.uint8))[None, :, None]
    sc_bytes[:, 8:] = np.bitwise_or.reduce(high, axis=1)    # byte 8 + j%4, bits 2*(j/4)

    # re-round every value against d*(sc - 32) as the decoder will use it
    dd = d.astype(np.float32)[:, None] * (l.astype(np.int32) - 32)   # [nb, 16]
    xs = xb.reshape(nb, 16, 16)
    Lq = (np.clip(_nearest_int(xs / dd[:, :, None]), -4, 3) + 4).astype(np.uint8)
    keep = np.broadcast_to((dd == 0)[:, :, None], Lq.shape)     # scale 0: keep the search's l
    np.copyto(Lq, L.T.reshape(nb, 16, 16), where=keep)
    Lq = Lq.reshape(nb, 8, 32)
    hmask = np.bitwise_or.reduce((Lq >> 2) << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    return np.concatenate([hmask, _pack_2bit(Lq & 3), sc_bytes, _fp16_bytes(d)], axis=1)


def _q4_k_chunk(xb: np.ndarray, qwb: np.ndarray | None = None) -> np.ndarray:
    head, L = _q45_k_blocks(xb, 15, -1.0, 20, qwb)
    qs = L[:, :, 0] | (L[:, :, 1] << 4)                     # [nb, 4, 32]
    return np.concatenate([head, qs.reshape(-1, 128)], axis=1)


def _q5_k_chunk(xb: np.ndarray, qwb: np.ndarray | None = None) -> np.ndarray:
    head, L = _q45_k_blocks(xb, 31, -0.5, 15, qwb)
    nb = L.shape[0]
    qs = (L[:, :, 0] & 0xF) | ((L[:, :, 1] & 0xF) << 4)     # [nb, 4, 32]
    # bit 4 of each q: chunk c's first half -> bit 2c, second half -> bit 2c+1
    shift = (2 * np.arange(4)[:, None] + np.arange(2)[None, :]).astype(np.uint8)
    qh = ((L >> 4) << shift[None, :, :, None]).reshape(nb, 8, 32)
    qh = np.bitwise_or.reduce(qh, axis=1)
    return np.concatenate([head, qh, qs.reshape(nb, 128)], axis=1)


def _q6_k_chunk(xb: np.ndarray, qwb: np.ndarray | None = None) -> np.ndarray:
    nb = xb.shape[0]
    xt = np.ascontiguousarray(xb.reshape(nb * 16, 16).T)   # [16, sub-blocks]
    qt = None if qwb is None else np.ascontiguousarray(qwb.reshape(nb * 16, 16).T)   # _impl: the importances
    scales, L = make_qx_quants(xt, 32, qt)
    scales = scales.reshape(nb, 16)

    # int8 sub-block scales; the one of largest |scale| (first such) maps to -128
    max_scale = scales[np.arange(nb), np.argmax(np.abs(scales), axis=1)]
    zero_block = np.abs(max_scale) < GROUP_MAX_EPS
    max_scale = np.where(zero_block, _f(1), max_scale)
    iscale = _f(-128) / max_scale
    d = (_f(1) / iscale).astype(np.float16)
    sc = np.minimum(_nearest_int(iscale[:, None] * scales), 127).astype(np.int8)

    # re-round every value against d*sc as the decoder will use it
    dd = d.astype(np.float32)[:, None] * sc                 # [nb, 16]
    xs = xb.reshape(nb, 16, 16)
    Lq = (np.clip(_nearest_int(xs / dd[:, :, None]), -32, 31) + 32).astype(np.uint8)
    keep = np.broadcast_to((dd == 0)[:, :, None], Lq.shape)     # scale 0: keep the search's l
    np.copyto(Lq, L.T.reshape(nb, 16, 16), where=keep)
    L = Lq

    L = L.reshape(nb, 2, 4, 32)                             # [block, 128-half, quarter, l]
    lo = L & 0xF
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4),
                         lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2)   # [nb, 2, 64]
    hi = L >> 4
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)  # [nb, 2, 32]
    out = np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64),
                          sc.view(np.uint8), _fp16_bytes(d)], axis=1)
    out[zero_block] = 0                                     # all-zero block: all-zero bytes
    return out


def quantize_q2_k(x: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """float32 [rows, n] -> Q2_K bytes uint8 [rows, n // 256 * 84]; imatrix: each
    column's importance ([n], the mean of its input's square), llama.cpp's _impl quantizer."""
    return _chunked(x, BLOCK_BYTES["q2_k"], _q2_k_chunk, imatrix)


def quantize_q3_k(x: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """float32 [rows, n] -> Q3_K bytes uint8 [rows, n // 256 * 110]; imatrix: each
    column's importance ([n], the mean of its input's square), llama.cpp's _impl quantizer."""
    return _chunked(x, BLOCK_BYTES["q3_k"], _q3_k_chunk, imatrix)


def quantize_q4_k(x: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """float32 [rows, n] -> Q4_K bytes uint8 [rows, n // 256 * 144]; imatrix: each
    column's importance ([n], the mean of its input's square), llama.cpp's _impl quantizer."""
    return _chunked(x, BLOCK_BYTES["q4_k"], _q4_k_chunk, imatrix)


def quantize_q5_k(x: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """float32 [rows, n] -> Q5_K bytes uint8 [rows, n // 256 * 176]; imatrix: each
    column's importance ([n], the mean of its input's square), llama.cpp's _impl quantizer."""
    return _chunked(x, BLOCK_BYTES["q5_k"], _q5_k_chunk, imatrix)


def quantize_q6_k(x: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """float32 [rows, n] -> Q6_K bytes uint8 [rows, n // 256 * 210]; imatrix: each
    column's importance ([n], the mean of its input's square), llama.cpp's _impl quantizer."""
    return _chunked(x, BLOCK_BYTES["q6_k"], _q6_k_chunk, imatrix)


# -- the legacy formats with an importance matrix ---------------------------------------------------------------
# Blocks of 32, weighted by qw * sqrt(sigma2 + x^2) with sigma2 the ROW's mean square; no
# re-rounding against the stored fp16 scale (as in llama.cpp). Q4_0 / Q5_0: weighted
# make_qx_quants (nmax 8 / 16, L = l + nmax); Q4_1 / Q5_1: make_qkx3_quants (nmax 15 / 31).
LEGACY_BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24}
_LEGACY_NMAX = {"q4_0": 8, "q4_1": 15, "q5_0": 16, "q5_1": 31}


def _legacy_rows(x: np.ndarray, qw: np.ndarray, fmt: str) -> np.ndarray:
    rows, n = x.shape
    nb = n // 32
    xt_rows = np.ascontiguousarray(x.T)
    sigma2 = _sum0(xt_rows * xt_rows) / _f(n)                         # [rows], sequential sums
    xt = np.ascontiguousarray(x.reshape(-1, 32).T)                    # [32, blocks]
    qt = np.tile(np.ascontiguousarray(qw.reshape(nb, 32).T), (1, rows))
    w = qt * np.sqrt(np.repeat(sigma2, nb)[None, :] + xt * xt)
    nmax = _LEGACY_NMAX[fmt]
    if fmt in ("q4_0", "q5_0"):
        d, L = make_qx_quants(xt, nmax, w)
        head = [_fp16_bytes(d.astype(np.float16))]
    else:
        d, the_min, L = make_qkx2_quants(xt, w, nmax, -0.9, 0.05, 36)
        head = [_fp16_bytes(d.astype(np.float16)), _fp16_bytes((-the_min).astype(np.float16))]
    L = np.ascontiguousarray(L.T)                                     # [blocks, 32]
    qs = (L[:, :16] & 0xF) | ((L[:, 16:] & 0xF) << 4)
    if fmt in ("q5_0", "q5_1"):                                       # bit 4 of value j -> bit j of qh
        qh = np.packbits((L >> 4).astype(np.uint8), axis=1, bitorder="little")
        head.append(qh)
    return np.concatenate(head + [qs.astype(np.uint8)], axis=1).reshape(rows, nb * LEGACY_BLOCK_BYTES[fmt])


def quantize_legacy_weighted(x: np.ndarray, imatrix: np.ndarray, fmt: str) -> np.ndarray:
    """float32 [rows, n] (n a multiple of 32) -> fmt ("q4_0", "q4_1", "q5_0" or "q5_1") bytes
    [rows, n // 32 * block bytes], weighted by imatrix ([n]) as llama.cpp's _impl quantizers."""
    x = np.asarray(x, dtype=np.float32)
    qw = np.asarray(imatrix, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % 32 or qw.shape != (x.shape[1],):
        raise ValueError(f"expected float32 [rows, n], n a multiple of 32, and n importances; got {x.shape}, "
                         f"{qw.shape}")
    step = max(1, CHUNK_BLOCKS * 8 // (x.shape[1] // 32))             # rows per pass
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return np.concatenate([_legacy_rows(x[i:i + step], qw, fmt) for i in range(0, x.shape[0], step)])
