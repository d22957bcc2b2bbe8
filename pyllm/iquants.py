"""IQ4_NL and IQ4_XS quantizers: numpy ports of llama.cpp's quantize_iq4_nl and quantize_iq4_xs
(both quantize_row_iq4_nl_impl, with its 7 tries a side), bit for bit.

Both formats store each value as a nibble that indexes a fixed non-linear book of 16 int8
values (VALUES, ggml's kvalues_iq4nl), times a scale:

IQ4_NL (18 bytes per 32 values): d fp16, then qs[16]: byte j holds the nibbles of values j
    (low) and j + 16 (high). Value = d * VALUES[nibble].
IQ4_XS (136 bytes per 256 values): d fp16, scales_h (uint16), scales_l[4], qs[128]: 8
    sub-blocks of 32, each laid out as an IQ4_NL block's qs at qs[16 ib], with a 6-bit
    scale ls (low nibble in scales_l[ib / 2], at bit 4 (ib % 2); high 2 bits in scales_h at
    bit 2 ib). Value = d * (ls - 32) * VALUES[nibble].

The search, per block of 32 (weights w = x^2, or with an importance matrix qw * sqrt(sigma2
+ x^2), sigma2 twice the mean square of the super-block: 32 values for IQ4_NL, 256 for
IQ4_XS): with max the value of largest |x| (signed), start from d = max / 127 (the book's
-127 maps to -max), round each x / d to the nearest book value, and fit d = sum(w q x) /
sum(w q q) to those choices; then try the inverse scales (k - 127) / max, k = -7..7, keeping
a fit whose sum(w q x)^2 / sum(w q q) is larger. IQ4_NL stores that d; IQ4_XS codes the 8
sub-block scales against -(the one of largest |d|) / 32 as 6-bit integers and stores that.
Every value is then re-rounded against the scale it will decode with (before its fp16
rounding, as llama.cpp does). A block whose |x| stays below 1e-15 gets scale 0.

Arithmetic is float32 in llama.cpp's order, sums sequential (numpy's axis-0 sums of
[position, block] arrays run row after row), so the bytes equal llama.cpp's
(tests/test_iquants.py pins digests of llama-cpp-python 0.3.36's output).
"""
from __future__ import annotations

import numpy as np

from .kquants import GROUP_MAX_EPS, _f, _fp16_bytes, _nearest_int, _sum0

__all__ = ["VALUES", "quantize_iq4_nl", "quantize_iq4_xs"]

VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
_V = VALUES.astype(np.float32)
NTRY = 7
CHUNK_VALUES = 1 << 16     # values per pass: bounds the temporaries


_MID = (_V[:-1] + _V[1:]) / 2                                       # multiples of 1/2: exact
# count of the midpoints at or below h / 2, for h = -256 .. 255 (index h + 256)
_COUNT = np.searchsorted(_MID, np.arange(-256, 256, dtype=np.float32) / 2, side="right").astype(np.uint8)


def best_index(al: np.ndarray) -> np.ndarray:
    """ggml's best_index_int8: the book index nearest al, a tie going up, i.e. the count of
    the midpoints between neighbours at or below al (C's float32 test al - v[k] < v[k + 1] - al
    is exact for the neighbours around al: gaps under 32, al's grid 2^-17 or finer). The
    midpoints are multiples of 1/2, so the count is a table's at floor(2 al); NaN gives 15 as in C."""
    h = np.floor(al * np.float32(2))
    np.clip(h, -256, 255, out=h)
    np.nan_to_num(h, copy=False, nan=255)
    return _COUNT[h.astype(np.int32) + 256]


def _fit(xt: np.ndarray, w: np.ndarray, inv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sum(w q x), sum(w q q)) per column of xt [32, blocks], q the book values nearest inv x."""
    q = _V[best_index(inv[None, :] * xt)]
    wq = w * q
    return _sum0(wq * xt), _sum0(wq * q)


def _block_scales(xt: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The scale search of each column of xt [32, blocks] (module docstring); 0 for a column of zeros."""
    cols = np.arange(xt.shape[1])
    amax = np.abs(xt).max(axis=0)
    mx = xt[np.abs(xt).argmax(axis=0), cols]                           # the first of largest |x|, signed
    sumqx, sumq2 = _fit(xt, w, _f(1) / (-mx / _V[0]))
    d = np.where(sumq2 > 0, sumqx / sumq2, _f(0))
    best = d * sumqx
    for itry in range(-NTRY, NTRY + 1):
        sumqx, sumq2 = _fit(xt, w, _f(itry + int(VALUES[0])) / mx)
        better = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
        d = np.where(better, sumqx / sumq2, d)
        best = np.where(better, d * sumqx, best)
    return np.where(amax < GROUP_MAX_EPS, _f(0), d).astype(np.float32)


def _weights(xt: np.ndarray, qwt: np.ndarray | None, super_block: int) -> np.ndarray:
    """x^2, or qw * sqrt(sigma2 + x^2) with sigma2 = 2 sum(x^2) / super_block over each
    super-block (super_block / 32 consecutive columns of xt [32, blocks])."""
    if qwt is None:
        return xt * xt
    per = super_block // 32
    full = np.ascontiguousarray(xt.T.reshape(-1, super_block).T)       # [super_block, super-blocks]
    sigma2 = _sum0(full * full) * _f(2.0 / super_block)
    return qwt * np.sqrt(np.repeat(sigma2, per)[None, :] + xt * xt)


def _nibbles(L: np.ndarray) -> np.ndarray:
    """[32, blocks] book indices -> [blocks, 16] bytes: value j low, value j + 16 high."""
    L = np.ascontiguousarray(L.T).astype(np.uint8)
    return L[:, :16] | (L[:, 16:] << 4)


def _inverse(d: np.ndarray) -> np.ndarray:
    return np.where(d != 0, _f(1) / np.where(d != 0, d, _f(1)), _f(0)).astype(np.float32)


def _iq4_nl_rows(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    rows, n = x.shape
    xt = np.ascontiguousarray(x.reshape(-1, 32).T)                      # [32, blocks]
    qwt = None if qw is None else np.tile(np.ascontiguousarray(qw.reshape(-1, 32).T), (1, rows))
    d = _block_scales(xt, _weights(xt, qwt, 32))
    L = best_index(_inverse(d)[None, :] * xt)
    out = np.concatenate([_fp16_bytes(d.astype(np.float16)), _nibbles(L)], axis=1)
    return out.reshape(rows, n // 32 * 18)


def _iq4_xs_rows(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    rows, n = x.shape
    nsb = rows * n // 256
    xt = np.ascontiguousarray(x.reshape(-1, 32).T)                      # [32, sub-blocks]
    qwt = None if qw is None else np.tile(np.ascontiguousarray(qw.reshape(-1, 32).T), (1, rows))
    scales = _block_scales(xt, _weights(xt, qwt, 256)).reshape(nsb, 8)
    # the super-block scale: -(the sub-block scale of largest |d|, the first such) / 32
    max_scale = scales[np.arange(nsb), np.abs(scales).argmax(axis=1)]
    d = -max_scale / _f(32)
    ls = np.clip(_nearest_int(_inverse(d)[:, None] * scales), -32, 31)
    dl = d[:, None] * ls.astype(np.float32)
    L = best_index(_inverse(dl).reshape(-1)[None, :] * xt)
    ls = (ls + 32).astype(np.uint16)
    scales_h = np.bitwise_or.reduce((ls >> 4) << (2 * np.arange(8, dtype=np.uint16)), axis=1).astype("<u2")
    scales_l = ((ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)).astype(np.uint8)
    out = np.concatenate([_fp16_bytes(d.astype(np.float16)), scales_h.view(np.uint8).reshape(nsb, 2), scales_l,
                          _nibbles(L).reshape(nsb, 128)], axis=1)
    return out.reshape(rows, n // 256 * 136)


def _quantize(x: np.ndarray, imatrix: np.ndarray | None, block: int, fn) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % block:
        raise ValueError(f"expected float32 [rows, n] with n a multiple of {block}, got {x.shape}")
    qw = None
    if imatrix is not None:
        qw = np.asarray(imatrix, dtype=np.float32)
        if qw.shape != (x.shape[1],):
            raise ValueError(f"expected {x.shape[1]} importances, one per column, got {qw.shape}")
    step = max(1, CHUNK_VALUES // x.shape[1])                             # rows per pass
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return np.concatenate([fn(x[i:i + step], qw) for i in range(0, x.shape[0], step)])


def quantize_iq4_nl(x: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """float32 [rows, n] (n a multiple of 32) -> IQ4_NL bytes uint8 [rows, n // 32 * 18]; imatrix:
    each column's importance ([n]), as llama-quantize --imatrix weighs them."""
    return _quantize(x, imatrix, 32, _iq4_nl_rows)


def quantize_iq4_xs(x: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """float32 [rows, n] (n a multiple of 256) -> IQ4_XS bytes uint8 [rows, n // 256 * 136]; imatrix:
    each column's importance ([n]), as llama-quantize --imatrix weighs them."""
    return _quantize(x, imatrix, 256, _iq4_xs_rows)


# -- the grids of the lattice i-quants ---------------------------------------------------------------
# IQ3_S, IQ3_XXS, IQ2_* and IQ1_* store each group of 4 or 8 values as an index into a
# fixed grid of points. The grids come from gguf-py (ggml's iq3s_grid...); the C kernels read
# them from csrc/iq_grids.h, which c_grids_header() writes and tests/test_iquants.py checks.

GRIDS = {"IQ3S_GRID": "IQ3_S", "IQ3XXS_GRID": "IQ3_XXS",            # C macro name: gguf.quants class
         "IQ2XXS_GRID": "IQ2_XXS", "IQ2XS_GRID": "IQ2_XS", "IQ2S_GRID": "IQ2_S", "IQ1S_GRID": "IQ1_S"}


def grid(name: str) -> np.ndarray:
    """The grid of i-quant `name` (e.g. "IQ3_S") as uint8 [points, values per point]; IQ1_S's
    values -1, 0, 1 (IQ1_M's too) as 0, 1, 2, unsigned as the others' (value = byte - 1)."""
    import gguf.quants
    cls = getattr(gguf.quants, name)
    cls.init_grid()
    g = cls.grid.reshape(cls.grid_shape)
    return (g + 1 if name == "IQ1_S" else g).astype(np.uint8)


def c_grids_header() -> str:
    """csrc/iq_grids.h: each grid as a C initializer list, one little-endian integer per point
    (byte j = value j): uint32 for points of 4 values, uint64 for points of 8."""
    out = ["/* iq_grids.h: the grids of the lattice i-quants (ggml's iq3s_grid, ...), one integer per",
           " * point of unsigned values, value j in byte j: uint32 for 4 values (IQ3), uint64 for 8",
           " * (IQ2; IQ1, its -1, 0, 1 stored as 0, 1, 2). Generated from gguf-py's tables by",
           " * pyllm.iquants.c_grids_header(); tests/test_iquants.py checks this file. Do not edit. */",
           "#ifndef PYLLM_IQ_GRIDS_H", "#define PYLLM_IQ_GRIDS_H", ""]
    for macro, name in GRIDS.items():
        g = grid(name)
        width = g.shape[1]
        assert width in (4, 8), name
        words = [int.from_bytes(row.tobytes(), "little") for row in g]
        per_line, fmt = (8, "0x{:08x}u") if width == 4 else (4, "0x{:016x}ull")
        out.append(f"#define {macro}_SIZE {len(words)}")
        out.append(f"#define {macro} \\")
        lines = [", ".join(fmt.format(w) for w in words[i:i + per_line]) for i in range(0, len(words), per_line)]
        out += [f"    {line}{', ' if i + 1 < len(lines) else ''}\\" for i, line in enumerate(lines)]
        out[-1] = out[-1].rstrip("\\").rstrip()
        out.append("")
    out.append("#endif")
    return "\n".join(out) + "\n"
