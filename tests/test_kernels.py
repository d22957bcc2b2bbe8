"""Tests of the quantized-format kernels (csrc/quants.c, x86/*.c, arm/neon.c).

For every weight type and every ISA level this CPU has (scalar always):
  * scalar dequant == gguf.quants.dequantize, bit for bit (the executable spec);
  * each SIMD level's dequant == scalar dequant, bit for bit;
  * each level's vec_dot and gemv == scalar vec_dot on the same quantized
    activations, within 1e-5 of the magnitude sum (only summation order and
    FMA contraction differ);
  * within a level, exactly (the determinism contract of quants.h): gemm ==
    gemv == gemv of one row == vec_dot, bit for bit, whatever rows and
    activation rows share a call;
  * scalar vec_dot == float64 dot(dequant(w), dequant(act)) within 1e-5 of the
    magnitude sum, and == float64 dot(dequant(w), x) within the activation
    quantization bound sum_i |w_i| * d_block(i) / 2 (round to nearest: each
    activation is off by at most half its block's step d);
  * quantize_act: numpy reference bit for bit (scalar), SIMD == scalar bit
    for bit, round trip within d/2;
  * fp16 <-> fp32 exact against numpy on all 65536 halves and on float32
    values of every exponent incl. ties, subnormals, inf, nan;
  * the float helpers against numpy.

"Magnitude sum" bounds the size of every intermediate term of the kernels:
2 * sum over groups (a block, or a 16-element sub-block of the K-quants) of
max|w| in the group * sum|x| in the group.

Run with -s to see which kernels each level provides.
"""
import itertools
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize as gguf_dequantize

import synth
from pyllm._native import ffi, lib


ISA_NAMES = {0: "scalar", 1: "avx2", 2: "avx512", 3: "neon"}
LEVELS = [i for i in ISA_NAMES if lib.pyllm_level_available(i)]
SIMD_LEVELS = [i for i in LEVELS if i != 0]
ACT_F32, ACT_Q8_32, ACT_Q8_K = 0, 1, 2

# type name -> (ggml id, block size, block bytes, act format)
TYPES = {
    "F32": (0, 1, 4, ACT_F32),
    "F16": (1, 1, 2, ACT_F32),
    "BF16": (30, 1, 2, ACT_F32),
    "Q4_0": (2, 32, 18, ACT_Q8_32),
    "Q4_1": (3, 32, 20, ACT_Q8_32),
    "Q5_0": (6, 32, 22, ACT_Q8_32),
    "Q5_1": (7, 32, 24, ACT_Q8_32),
    "Q8_0": (8, 32, 34, ACT_Q8_32),
    "IQ4_NL": (20, 32, 18, ACT_Q8_32),
    "MXFP4": (39, 32, 17, ACT_Q8_32),
    "Q2_K": (10, 256, 84, ACT_Q8_K),
    "Q3_K": (11, 256, 110, ACT_Q8_K),
    "Q4_K": (12, 256, 144, ACT_Q8_K),
    "Q5_K": (13, 256, 176, ACT_Q8_K),
    "Q6_K": (14, 256, 210, ACT_Q8_K),
    "IQ4_XS": (23, 256, 136, ACT_Q8_K),
    "IQ3_S": (21, 256, 110, ACT_Q8_K),
    "IQ3_XXS": (18, 256, 98, ACT_Q8_K),
    "IQ2_XXS": (16, 256, 66, ACT_Q8_K),
    "IQ2_XS": (17, 256, 74, ACT_Q8_K),
    "IQ2_S": (22, 256, 82, ACT_Q8_K),
    "IQ1_S": (19, 256, 50, ACT_Q8_K),
    "IQ1_M": (29, 256, 56, ACT_Q8_K),
}
PRIORITY = ["Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q6_K", "Q4_0"]
GEMV_REQUIRED = ["Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q6_K"]

# byte offsets of the fp16 scale fields in each block: (d fields, min fields);
# MXFP4's scale is a byte exponent (mxfp4_exponents)
SCALE_FIELDS = {
    "Q4_0": ([0], []), "Q5_0": ([0], []), "Q8_0": ([0], []), "IQ4_NL": ([0], []),
    "Q4_1": ([0], [2]), "Q5_1": ([0], [2]),
    "Q2_K": ([80], [82]), "Q3_K": ([108], []),
    "Q4_K": ([0], [2]), "Q5_K": ([0], [2]), "Q6_K": ([208], []), "IQ4_XS": ([0], []),
    "IQ3_S": ([0], []), "IQ3_XXS": ([0], []), "IQ2_XXS": ([0], []), "IQ2_XS": ([0], []), "IQ2_S": ([0], []),
    "IQ1_S": ([0], []), "IQ1_M": ([], []),   # IQ1_M's d is in its scale words (synth.set_iq1_m_d)
}

# SIMD vs scalar differ only in summation order and FMA rounding: measured
# differences are ~5e-8 of the magnitude sum; 2e-6 leaves a wide margin and
# still catches a term off by 1e-4 of itself.
TOL_SIMD = 2e-6

Q8_32 = np.dtype([("d", "<f4"), ("s", "<f4"), ("qs", "i1", 32)])
Q8_K = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])


def level_params(levels):
    return [pytest.param(i, id=ISA_NAMES[i]) for i in levels]


def type_params(names=None):
    return [pytest.param(t, id=t) for t in (names or TYPES)]


def row_lengths(tname):
    bs = TYPES[tname][1]
    if bs == 1:
        return [1, 7, 33, 64, 257, 576]
    if bs == 32:
        return [32, 32 * 7, 32 * 18]
    return [256, 256 * 3]


def ptr(a):
    return ffi.from_buffer(a)


def fptr(a):
    return ffi.cast("float *", ffi.from_buffer(a))


# ---------------------------------------------------------------- data
def mxfp4_exponents(rng, nrows, nb):
    """E8M0 exponents for nrows rows of nb MXFP4 blocks: each row a window of 9
    around its own centre in 104..136, so that every exponent of 100..140 (what
    real files hold) turns up and every block of a row counts in its dot
    product, and about one block in 16 with e < 2 (the subnormal scales)."""
    e = rng.integers(104, 137, size=(nrows, 1)) + rng.integers(-4, 5, size=(nrows, nb))
    tiny = rng.random((nrows, nb)) < 1 / 16
    e[tiny] = rng.integers(0, 2, size=int(tiny.sum()))
    return e.astype(np.uint8)


def random_weights(tname, n, rng, nrows=1):
    """nrows rows of n elements of type tname, as raw GGUF bytes (uint8)."""
    tid, bs, ts, _ = TYPES[tname]
    if tname == "MXFP4":
        raw = rng.integers(0, 256, size=(nrows, n // bs, ts), dtype=np.uint8)
        raw[:, :, 0] = mxfp4_exponents(rng, nrows, n // bs)
        return raw.reshape(nrows, -1)
    if tname == "F32":
        return rng.standard_normal(nrows * n).astype(np.float32).view(np.uint8).reshape(nrows, -1)
    if tname == "F16":
        return rng.standard_normal(nrows * n).astype(np.float16).view(np.uint8).reshape(nrows, -1)
    if tname == "BF16":
        f = rng.standard_normal(nrows * n).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(nrows, -1)
    nb = nrows * n // bs
    raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    dfields, mfields = SCALE_FIELDS[tname]
    for off in dfields:  # sane, finite scales of both signs
        d = rng.uniform(0.5, 2.0, nb) * 1e-2 * rng.choice([-1.0, 1.0], nb)
        raw[:, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
    for off in mfields:
        m = rng.uniform(-0.1, 0.1, nb)
        raw[:, off:off + 2] = m.astype(np.float16).view(np.uint8).reshape(nb, 2)
    if tname == "IQ1_M":
        synth.set_iq1_m_d(raw, rng.uniform(0.5, 2.0, nb) * 1e-2 * rng.choice([-1.0, 1.0], nb))
    return raw.reshape(nrows, -1)


def gguf_deq(tname, wbytes):
    tid = TYPES[tname][0]
    return gguf_dequantize(np.ascontiguousarray(wbytes), GT(tid)).astype(np.float32).reshape(-1)


def dequant(isa, tname, wbytes, n):
    out = np.full(n, np.nan, dtype=np.float32)
    rc = lib.pyllm_kernel_dequant(isa, TYPES[tname][0], ptr(wbytes), fptr(out), n)
    assert rc == 0
    return out


def act_bytes(act, n):
    return lib.pyllm_act_row_bytes(act, n)


def quantize(isa, act, x):
    n = x.size
    out = np.zeros(act_bytes(act, n), dtype=np.uint8)
    rc = lib.pyllm_kernel_quantize_act(isa, act, ffi.cast("float *", ptr(x)), ptr(out), n)
    assert rc == 0
    return out


def act_values(act, abytes, n):
    """the float values an activation row stands for (d * q)"""
    if act == ACT_F32:
        return abytes.view(np.float32).astype(np.float64), np.zeros(n)
    b = abytes.view(Q8_32 if act == ACT_Q8_32 else Q8_K)
    vals = (b["d"][:, None].astype(np.float64) * b["qs"].astype(np.float64)).reshape(-1)
    step = np.repeat(b["d"].astype(np.float64), n // b.size)
    return vals, step


def vec_dot(isa, tname, n, wbytes, abytes):
    out = np.zeros(1, dtype=np.float32)
    rc = lib.pyllm_kernel_vec_dot(isa, TYPES[tname][0], n, ptr(wbytes), ptr(abytes), fptr(out))
    assert rc == 0
    return float(out[0])


def magnitude(tname, w, x):
    """2 * sum over groups of max|w| * sum|x| (bounds every intermediate term)"""
    g = {1: 1, 32: 32, 256: 16}[TYPES[tname][1]]
    w = np.abs(w.astype(np.float64)).reshape(-1, g).max(axis=1)
    x = np.abs(x.astype(np.float64)).reshape(-1, g).sum(axis=1)
    return 2.0 * float(np.dot(w, x))


# ---------------------------------------------------------------- dequant
@pytest.mark.parametrize("tname", type_params())
def test_scalar_dequant_equals_gguf(tname):
    rng = np.random.default_rng(1)
    for n in row_lengths(tname):
        w = random_weights(tname, n, rng)
        ref = gguf_deq(tname, w)
        got = dequant(0, tname, w, n)
        assert np.isfinite(ref).all() and np.abs(ref).max() > 0
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32), err_msg=f"n={n}")


@pytest.mark.parametrize("tname", type_params(["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"]))
def test_scalar_dequant_of_gguf_quantize(tname):
    """blocks made by gguf's own quantizer (realistic data, not just random bytes)"""
    from gguf.quants import quantize as gguf_quantize
    rng = np.random.default_rng(2)
    x = rng.standard_normal(32 * 16).astype(np.float32)
    w = gguf_quantize(x, GT(TYPES[tname][0]))
    got = dequant(0, tname, w, x.size)
    np.testing.assert_array_equal(got, gguf_deq(tname, w))
    if tname == "MXFP4":
        # and it is the data we quantized: the block scale d = 2^(e - 128) puts the block's
        # max at 8..16 d, E2M1 steps are at most 4 d and values above 12 d round down to it
        d = np.repeat(np.ldexp(1.0, w.reshape(-1, 17)[:, 0].astype(np.int64) - 128), 32)
        assert (np.abs(got - x) <= 4 * d).all() and (np.abs(got - x) <= 2 * d).mean() > 0.95
    else:
        assert np.abs(got - x).max() < 0.2  # and it is the data we quantized


def test_mxfp4_every_exponent_and_nibble():
    """MXFP4's scale decode on every E8M0 byte (0 and 1: subnormal scales; 255:
    2^127, whose larger values overflow to inf as in gguf) and every nibble:
    scalar == gguf, every SIMD level == scalar, bit for bit"""
    rng = np.random.default_rng(15)
    raw = rng.integers(0, 256, size=(256, 17), dtype=np.uint8)
    raw[:, 0] = np.arange(256)
    raw[:, 1:9] = (np.arange(16, dtype=np.uint8) * 17).reshape(2, 8).repeat(128, axis=0)  # every nibble, both halves
    w = raw.reshape(1, -1)
    with np.errstate(over="ignore"):
        ref = gguf_deq("MXFP4", w)
    got = dequant(0, "MXFP4", w, 256 * 32)
    assert np.isinf(got).any()
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
    vals = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float64)
    for e in [0, 1, 2, 127, 128, 200]:  # and it means 2^(e - 128) times the doubled E2M1 value
        blk = got[32 * e:32 * e + 32].astype(np.float64)
        np.testing.assert_array_equal(blk[:16], vals[raw[e, 1:] & 15] * 2.0 ** (e - 128))
        np.testing.assert_array_equal(blk[16:], vals[raw[e, 1:] >> 4] * 2.0 ** (e - 128))
    for isa in SIMD_LEVELS:
        out = dequant(isa, "MXFP4", w, 256 * 32)
        np.testing.assert_array_equal(out.view(np.uint32), got.view(np.uint32), err_msg=ISA_NAMES[isa])


@pytest.mark.parametrize("tname", type_params())
@pytest.mark.parametrize("isa", level_params(SIMD_LEVELS))
def test_simd_dequant_equals_scalar(isa, tname):
    rng = np.random.default_rng(3)
    for n in row_lengths(tname):
        w = random_weights(tname, n, rng)
        ref = dequant(0, tname, w, n)
        got = dequant(isa, tname, w, n)
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32), err_msg=f"n={n}")


# ---------------------------------------------------------------- quantize_act
def ref_quantize_groups(x, g):
    """numpy reference: d = amax/127 (float32), q = round-half-even(x * (1/d))"""
    xb = x.reshape(-1, g)
    amax = np.abs(xb).max(axis=1).astype(np.float32)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.rint(xb * idv[:, None]).astype(np.int8)
    return d, q


def act_inputs(rng, n, g):
    """random activations with an all-zero first group (d = 0) and a group of
    exact ties: max 127/64 makes the step d = 1/64, and (m + 0.5)/64 lie halfway"""
    x = (rng.standard_normal(n) * rng.uniform(0.1, 10)).astype(np.float32)
    if n >= 3 * g and g > 1:
        x[:g] = 0.0
        x[g:2 * g] = ((np.arange(g) % 64) - 32 + 0.5) / 64
        x[g] = -127 / 64
    return x


@pytest.mark.parametrize("act,n", [pytest.param(ACT_Q8_32, 32 * 9, id="Q8_32"),
                                   pytest.param(ACT_Q8_K, 256 * 3, id="Q8_K")])
def test_scalar_quantize_act_reference(act, n):
    rng = np.random.default_rng(4)
    g = 32 if act == ACT_Q8_32 else 256
    x = act_inputs(rng, n, g)
    b = quantize(0, act, x).view(Q8_32 if act == ACT_Q8_32 else Q8_K)
    d, q = ref_quantize_groups(x, g)
    np.testing.assert_array_equal(b["d"], d)
    np.testing.assert_array_equal(b["qs"], q)
    assert b["d"][0] == 0 and (b["qs"][0] == 0).all()
    assert b["d"][1] == np.float32(1 / 64) and b["qs"][1][0] == -127
    assert b["qs"][1][1] == -30 and b["qs"][1][2] == -30 and b["qs"][1][4] == -28  # -30.5, -29.5, -27.5: to even
    assert np.abs(b["qs"]).max() == 127
    # round trip within half a step
    vals, step = act_values(act, b.view(np.uint8), n)
    err = np.abs(vals - x.astype(np.float64))
    assert (err <= step / 2 * (1 + 1e-6)).all()
    if act == ACT_Q8_32:
        np.testing.assert_array_equal(b["s"], (b["d"] * b["qs"].astype(np.int32).sum(axis=1).astype(np.float32)))
    else:
        np.testing.assert_array_equal(b["bsums"], b["qs"].reshape(-1, 16, 16).astype(np.int32).sum(axis=2))


@pytest.mark.parametrize("act", [pytest.param(a, id=s) for a, s in [(ACT_F32, "F32"), (ACT_Q8_32, "Q8_32"), (ACT_Q8_K, "Q8_K")]])
@pytest.mark.parametrize("isa", level_params(SIMD_LEVELS))
def test_simd_quantize_act_equals_scalar(isa, act):
    rng = np.random.default_rng(5)
    for n in ([256, 256 * 3, 256 * 9] if act != ACT_F32 else [1, 33, 576]):
        x = act_inputs(rng, n, {ACT_F32: 1, ACT_Q8_32: 32, ACT_Q8_K: 256}[act])
        ref = quantize(0, act, x)
        got = quantize(isa, act, x)
        np.testing.assert_array_equal(got, ref, err_msg=f"n={n}")


# ---------------------------------------------------------------- vec_dot / gemv
def make_case(tname, n, rng, nrows=1):
    act = TYPES[tname][3]
    w = random_weights(tname, n, rng, nrows)
    x = rng.standard_normal(n).astype(np.float32)
    a = quantize(0, act, x)
    return w, x, a


@pytest.mark.parametrize("tname", type_params())
def test_scalar_vec_dot_vs_float64(tname):
    rng = np.random.default_rng(6)
    act = TYPES[tname][3]
    for n in row_lengths(tname):
        w, x, a = make_case(tname, n, rng)
        wf = gguf_deq(tname, w).astype(np.float64)
        av, step = act_values(act, a, n)
        got = vec_dot(0, tname, n, w, a)
        mag = magnitude(tname, wf, x)
        assert mag > 0
        # exact arithmetic on the same quantized values: only float rounding
        exact = float(np.dot(wf, av))
        assert abs(got - exact) <= 1e-5 * mag, (n, got, exact, mag)
        # against the unquantized activations: within the quantization bound
        bound = float(np.dot(np.abs(wf), step)) / 2 + 1e-5 * mag
        if act == ACT_F32:
            assert bound == 1e-5 * mag
        assert abs(got - float(np.dot(wf, x.astype(np.float64)))) <= bound


@pytest.mark.parametrize("tname", type_params())
@pytest.mark.parametrize("isa", level_params(SIMD_LEVELS))
def test_simd_vec_dot_equals_scalar(isa, tname):
    rng = np.random.default_rng(7)
    for n in row_lengths(tname) + ([2048] if TYPES[tname][1] != 256 else [2560]):
        w, x, a = make_case(tname, n, rng)
        ref = vec_dot(0, tname, n, w, a)
        got = vec_dot(isa, tname, n, w, a)
        mag = magnitude(tname, gguf_deq(tname, w), x)
        assert abs(ref) > 1e-7 * mag  # not a degenerate zero
        assert abs(got - ref) <= TOL_SIMD * mag, (n, got, ref, mag)


@pytest.mark.parametrize("tname", type_params())
@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_gemv_equals_scalar_vec_dot(isa, tname):
    rng = np.random.default_rng(8)
    tid, bs, _, act = TYPES[tname]
    # row lengths: every remainder of blocks mod 4 and mod 8 (the AVX-512
    # quads, octs and two-row tails), and one past the 8192-element chunk
    # of prepared activations
    # (n, nrows, padding bytes after each row)
    cases = {1: [(96, 4, 0), (7, 5, 6), (64, 1, 0)],
             32: [(32 * 18, 16, 0), (32 * 18, 1, 0), (32 * 5, 7, 6), (32 * 7, 8, 64), (32 * 20, 5, 0),
                  (32 * 301, 5, 2)],
             256: [(256 * 3, 7, 0), (256 * 4, 4, 6), (256, 1, 0)]}[bs]
    for n, nrows, pad in cases:
        w, x, a = make_case(tname, n, rng, nrows)
        rb = w.shape[1] + pad
        wp = np.zeros((nrows, rb), dtype=np.uint8)
        wp[:, : w.shape[1]] = w
        out = np.full(nrows, np.nan, dtype=np.float32)
        rc = lib.pyllm_kernel_gemv(isa, tid, n, ptr(wp), rb, nrows, ptr(a), fptr(out))
        assert rc == 0
        for r in range(nrows):
            ref = vec_dot(0, tname, n, w[r], a)
            mag = magnitude(tname, gguf_deq(tname, w[r]), x)
            assert abs(out[r] - ref) <= TOL_SIMD * mag, (nrows, r, out[r], ref)


GEMM_TYPES = [t for t, (tid, *_) in TYPES.items() if any(lib.pyllm_kernel_provided(i, 4, tid) for i in LEVELS)]


@pytest.mark.parametrize("tname", type_params(GEMM_TYPES + [t for t in ["Q8_0", "Q4_K"] if t not in GEMM_TYPES]))
@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_gemm_equals_scalar_vec_dot(isa, tname):
    """out[t*os + r] = vec_dot(row r, activation t), for tiles of every shape
    (rows and activation rows not multiples of 4, partial quads, more than
    one chunk of prepared activations, padded strides)"""
    rng = np.random.default_rng(11)
    tid, bs, _, act = TYPES[tname]
    shapes = [(32 * 18, 16, 9), (32 * 5, 7, 4), (32 * 7, 4, 3), (32 * 70, 5, 5), (32, 1, 1)] if bs == 32 else \
        [(256 * 3, 7, 5), (256, 1, 1)]
    for n, nrows, ncols in shapes:
        w, _, _ = make_case(tname, n, rng, nrows)
        xs = rng.standard_normal((ncols, n)).astype(np.float32)
        ab = act_bytes(act, n)
        a_stride = ab + 8
        acts = np.zeros((ncols, a_stride), dtype=np.uint8)
        for t in range(ncols):
            acts[t, :ab] = quantize(0, act, xs[t])
        os_ = nrows + 3
        out = np.full(ncols * os_, np.nan, dtype=np.float32)
        rc = lib.pyllm_kernel_gemm(isa, tid, n, ffi.from_buffer(w), w.shape[1], nrows, ffi.from_buffer(acts),
                                       a_stride, ncols, ffi.cast("float *", ffi.from_buffer(out)), os_)
        assert rc == 0
        for t in range(ncols):
            for r in range(nrows):
                ref = vec_dot(0, tname, n, w[r], acts[t, :ab])
                mag = magnitude(tname, gguf_deq(tname, w[r]), xs[t])
                assert abs(out[t * os_ + r] - ref) <= TOL_SIMD * mag, (n, nrows, ncols, t, r, out[t * os_ + r], ref)
    assert lib.pyllm_kernel_gemm(isa, 4, 32, ffi.NULL, 18, 1, ffi.NULL, 40, 1, ffi.NULL, 1) == -1


@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_mxfp4_edge_scales_in_vec_dot_gemv_gemm(isa):
    """MXFP4 rows of only the smallest exponents (e = 0, 1: subnormal scales
    2^-128, 2^-127; e = 2, 3 the first normal ones), and rows of exponents
    past what real files hold (141..200), where any slip in a scale decode
    would show: vec_dot, gemv and gemm against the scalar vec_dot, and the
    scalar against float64 (with subnormal scales d * da is subnormal too, so
    each block's product may round off by 2^-150 absolute, times |isum|)"""
    rng = np.random.default_rng(16)
    tid = TYPES["MXFP4"][0]
    for (elo, ehi), (n, nrows, ncols) in itertools.product([(0, 3), (141, 200)],
                                                            [(32 * 5, 7, 3), (32 * 18, 4, 5), (32 * 21, 5, 2)]):
        nb = n // 32
        w = rng.integers(0, 256, size=(nrows, nb, 17), dtype=np.uint8)
        w[:, :, 0] = rng.integers(elo, ehi + 1, size=(nrows, nb))
        w = w.reshape(nrows, -1)
        xs = rng.standard_normal((ncols, n)).astype(np.float32)
        ab = act_bytes(ACT_Q8_32, n)
        acts = np.stack([quantize(0, ACT_Q8_32, xs[t]) for t in range(ncols)])
        out = np.full(ncols * nrows, np.nan, dtype=np.float32)
        assert lib.pyllm_kernel_gemm(isa, tid, n, ptr(w), w.shape[1], nrows, ptr(acts), ab, ncols, fptr(out),
                                     nrows) == 0
        for t in range(ncols):
            gv = gemv_call(isa, "MXFP4", n, np.ascontiguousarray(w).reshape(-1), w.shape[1], nrows,
                           np.ascontiguousarray(acts[t]))
            av, _ = act_values(ACT_Q8_32, acts[t], n)
            for r in range(nrows):
                wf = gguf_deq("MXFP4", w[r]).astype(np.float64)
                assert 0 < np.abs(wf).max() < (2.0**-120 if ehi < 128 else 2.0**76)
                ref = vec_dot(0, "MXFP4", n, w[r], acts[t])
                mag = magnitude("MXFP4", wf, xs[t])
                # |isum| <= 32 * 12 * 127 per block
                assert abs(ref - float(np.dot(wf, av))) <= 1e-5 * mag + nb * 32 * 12 * 127 * 2.0**-150, (n, r, t)
                assert abs(ref) > 1e-7 * mag
                for got in (vec_dot(isa, "MXFP4", n, w[r], acts[t]), gv[r], out[t * nrows + r]):
                    assert abs(got - ref) <= TOL_SIMD * mag, (n, r, t, got, ref)
                assert gv[r] == out[t * nrows + r] == vec_dot(isa, "MXFP4", n, w[r], acts[t])


# ---------------------------------------------------------------- determinism (exact)
# The kernel contract of quants.h: a (weight row, activation row) pair gives
# the same float, bit for bit, whichever kernel of a level computes it and
# whichever other rows share the call. The matmul splits rows into chunks by
# thread count and token count, and runs one token through gemv but a prompt
# through gemm; the logits of a token must not depend on either.

def det_lengths(tname):
    bs = TYPES[tname][1]
    if bs == 1:   # and ROWS4's units of 32: one short one, several, a last one shorter with a partial vector
        return [7, 64, 200, 1000, 1536]
    if bs == 32:
        # partial quads / octs / pairs (mod 4, mod 8), several 2048-element
        # reduction chunks, past the 8192-element activation chunk
        return [32, 32 * 3, 32 * 18, 32 * 21, 32 * 70, 32 * 301]
    return [256, 256 * 3, 256 * 9, 256 * 33]


def gemv_call(isa, tname, n, wbuf, rb, nrows, a, off=0):
    out = np.full(max(nrows, 1), np.nan, dtype=np.float32)
    wp = ffi.cast("uint8_t *", ffi.from_buffer(wbuf)) + off * rb
    rc = lib.pyllm_kernel_gemv(isa, TYPES[tname][0], n, wp, rb, nrows, ptr(a), fptr(out))
    assert rc == 0
    return out[:nrows]


@pytest.mark.parametrize("tname", type_params())
@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_gemv_rows_are_independent(isa, tname):
    """gemv(nrows=k) on rows s..s+k-1 == gemv(nrows=1) on each row == vec_dot, exactly"""
    rng = np.random.default_rng(12)
    for n in det_lengths(tname):
        nrows = 13
        w, x, a = make_case(tname, n, rng, nrows)
        rb = w.shape[1]
        wbuf = np.ascontiguousarray(w).reshape(-1)
        one = np.array([gemv_call(isa, tname, n, wbuf, rb, 1, a, r)[0] for r in range(nrows)], dtype=np.float32)
        vd = np.array([vec_dot(isa, tname, n, w[r], a) for r in range(nrows)], dtype=np.float32)
        np.testing.assert_array_equal(one, vd, err_msg=f"gemv(1) vs vec_dot, n={n}")
        for k in range(1, 10):
            for s in sorted({0, 1, 2, 3, nrows - k}):
                if s + k > nrows:
                    continue
                got = gemv_call(isa, tname, n, wbuf, rb, k, a, s)
                np.testing.assert_array_equal(got, one[s:s + k], err_msg=f"n={n} nrows={k} start={s}")


def rows4_unit_bytes(tname):
    """bytes of a ROWS4 unit (quants.h rows4_unit): a super-block, 512 elements, or 32 of a float"""
    _, bs, tsize, _ = TYPES[tname]
    return tsize if bs >= 256 else 32 * tsize if bs == 1 else (512 - 512 % bs) // bs * tsize


def rows4_by_hand(w, ub):
    """the ROWS4 layout written out in numpy: groups of 4 rows, their units interleaved"""
    nrows, rb = w.shape
    out = [w[nrows // 4 * 4:].reshape(-1)]
    for g in range(nrows // 4 - 1, -1, -1):
        out.insert(0, np.concatenate([w[4 * g + q, off:off + ub] for off in range(0, rb, ub) for q in range(4)]))
    return np.concatenate(out) if out else np.zeros(0, np.uint8)


def k_quants(tname, blocks):
    """the quants (integers, element order) of Q2_K - Q6_K and IQ4_XS blocks, from the formats' layouts"""
    blocks = blocks.reshape(-1, TYPES[tname][2])
    if tname == "IQ4_XS":   # element 32 i + 16 h + j: nibble h of qs[16 i + j]
        qs = blocks[:, 8:].reshape(-1, 8, 1, 16)
        return np.concatenate([qs & 15, qs >> 4], axis=2).reshape(-1, 256)
    if tname in ("Q2_K", "Q3_K"):   # element 128 h + 32 s + l: bits 2s of qs[32 h + l] (+ 4: hmask bit 4h + s)
        qs = blocks[:, 16:80] if tname == "Q2_K" else blocks[:, 32:96]
        q = (qs.reshape(-1, 2, 1, 32) >> (2 * np.arange(4)[:, None])) & 3
        if tname == "Q3_K":
            hm = blocks[:, None, :32]
            q = q | (((hm >> np.arange(8)[:, None]) & 1) << 2).reshape(-1, 2, 4, 32)
        return q.reshape(-1, 256)
    if tname == "Q6_K":   # element 128 n + 32 j + l: ql nibble, 2 bits of qh[32 n + l] at 2 j
        ql, qh = blocks[:, :128].reshape(-1, 2, 2, 32), blocks[:, 128:192].reshape(-1, 2, 1, 32)
        low = np.stack([ql[:, :, 0] & 15, ql[:, :, 1] & 15, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], axis=2)
        return (low | (((qh >> (2 * np.arange(4)[:, None])) & 3) << 4)).reshape(-1, 256)
    qs = blocks[:, -128:].reshape(-1, 4, 32)   # element 64 c + 32 h + l: nibble h of qs[32 c + l]
    q = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 256)
    if tname == "Q5_K":   # + bit i of qh[l] for element 32 i + l, as bit 4
        qh = blocks[:, 16:48]
        q = q | (((qh[:, None, :] >> np.arange(8)[:, None]) & 1) << 4).reshape(-1, 256)
    return q


def chained_order(tname):
    """(element of byte x of AVX-512's decoded vector q, element stored there once chained):
    the chained encoding holds, at vector q byte x = 16 L + 4 k + b, what the file's holds at
    vector k byte 16 L + 4 q + b (avx512.c K_CHAIN: a dword transpose in each 128-bit lane)"""
    def element(q, x):   # avx512.c dec_*
        if tname in ("Q2_K", "Q3_K"):
            return 128 * (x // 32) + 32 * q + x % 32
        if tname == "IQ4_XS":
            return 128 * (q // 2) + 32 * (x // 16) + 16 * (q % 2) + x % 16
        return 64 * q + x if tname == "Q6_K" else 128 * (q // 2) + 32 * (q % 2) + x + 32 * (x >= 32)
    at, holds = [], []
    for q in range(4):
        for x in range(64):
            lane, k, b = x // 16, x % 16 // 4, x % 4
            at.append(element(q, x))
            holds.append(element(k, 16 * lane + 4 * q + b))
    return np.array(at), np.array(holds)


CHAINED = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")   # the formats AVX-512 re-encodes in ROWS4


def check_chained(tname, packed, file_rows):
    """packed's groups (as rows4_by_hand lays them out, re-encoded) hold the file's quants in
    the chained order, and every other byte of each block unchanged"""
    nrows, rb = file_rows.shape
    groups = nrows // 4 * 4
    bsz = TYPES[tname][2]
    by_hand = rows4_by_hand(file_rows, bsz)[:groups * rb].reshape(-1, bsz)
    got = packed[:groups * rb].reshape(-1, bsz)
    at, holds = chained_order(tname)
    np.testing.assert_array_equal(k_quants(tname, got)[:, at], k_quants(tname, by_hand)[:, holds])
    scales = {"Q2_K": np.r_[0:16, 80:84], "Q3_K": np.r_[96:110], "Q4_K": np.r_[0:16], "Q5_K": np.r_[0:16],
              "Q6_K": np.r_[192:210], "IQ4_XS": np.r_[0:8]}[tname]
    np.testing.assert_array_equal(got[:, scales], by_hand[:, scales])
    np.testing.assert_array_equal(packed[groups * rb:], file_rows[groups:].reshape(-1))


@pytest.mark.parametrize("tname", type_params())
@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_rows4_gemv_equals_gemv_exactly(isa, tname):
    """Weights repacked into ROWS4 as the level lays them out (pyllm_kernel_repack_rows4, checked
    against the layout written out by hand) give gemv's results bit for bit: through the level's
    own gemv4 where it has one, and through the matmul's copy-out otherwise; row counts that leave
    a last group of 1-3 rows"""
    rng = np.random.default_rng(14)
    tid, _, _, act = TYPES[tname]
    own = lib.pyllm_kernel_provided(isa, 6, tid)
    recoded = lib.pyllm_kernel_provided(isa, 7, tid)
    assert recoded == (tname in CHAINED and isa == 2), "a level re-encodes a format's blocks: add it here"
    for n in det_lengths(tname):
        for nrows in (4, 7, 13, 32) if n < 8192 else (5,):
            w, _, a = make_case(tname, n, rng, nrows)
            rb = w.shape[1]
            packed = np.zeros(nrows * rb, np.uint8)
            assert lib.pyllm_kernel_repack_rows4(isa, tid, ptr(np.ascontiguousarray(w)), ptr(packed), nrows, n) == 0
            if recoded:
                check_chained(tname, packed, w)
            else:
                np.testing.assert_array_equal(packed, rows4_by_hand(w, rows4_unit_bytes(tname)), err_msg=f"n={n}")
            ref = gemv_call(isa, tname, n, np.ascontiguousarray(w).reshape(-1), rb, nrows, a)
            for kind in (0, 1):
                out = np.full(nrows, np.nan, dtype=np.float32)
                rc = lib.pyllm_kernel_gemv4(isa, kind, tid, n, ptr(packed), nrows, ptr(a), fptr(out))
                if kind == 1 and not own:
                    assert rc == -1
                    continue
                assert rc == 0
                np.testing.assert_array_equal(out, ref, err_msg=f"n={n} nrows={nrows} kind={kind}")


def test_rows4_gemv_provided():
    """AVX-512 reads the quantized formats' ROWS4 groups itself"""
    assert lib.pyllm_rows4_supported(TYPES["Q4_K"][0], 100) == 0     # not whole super-blocks
    tid = TYPES["Q4_K"][0]   # worth it where the running level reads it directly
    assert lib.pyllm_rows4_supported(tid, 256) == bool(lib.pyllm_kernel_provided(lib.pyllm_get_level(), 6, tid))
    assert lib.pyllm_repack_rows4(TYPES["Q4_K"][0], ffi.NULL, ffi.NULL, 4, 256) == -1
    # the core's repack lays blocks out as the running level does
    w = np.random.default_rng(3).integers(0, 256, (4, 144), dtype=np.uint8)
    w[:, :4] = 0   # d, dmin: zero halves
    mine, levels = np.zeros(w.size, np.uint8), np.zeros(w.size, np.uint8)
    assert lib.pyllm_repack_rows4(tid, ptr(w), ptr(mine), 4, 256) == 0
    assert lib.pyllm_kernel_repack_rows4(lib.pyllm_get_level(), tid, ptr(w), ptr(levels), 4, 256) == 0
    np.testing.assert_array_equal(mine, levels)
    if 2 not in LEVELS:
        pytest.skip("this CPU has no AVX-512")
    for tname in ("Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_XS", "IQ2_XXS", "IQ1_M", "Q4_0", "Q4_1", "Q8_0",
                  "MXFP4", "F16", "BF16", "F32"):
        assert lib.pyllm_kernel_provided(2, 6, TYPES[tname][0]), tname


@pytest.mark.parametrize("tname", type_params())
@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_gemm_equals_gemv_exactly(isa, tname):
    """gemm(...)[t][r] == gemv(activation row t)[r], bit for bit, for tiles of
    every shape (rows and activation rows not multiples of the kernels' tiles)"""
    rng = np.random.default_rng(13)
    tid, bs, _, act = TYPES[tname]
    for n in det_lengths(tname):
        # (45, 19): more rows than one pass of decoded weights holds and
        # more activation rows than one prepared panel (AVX-512 gemm); up to
        # 8 activation rows the AVX-512 gemm streams the weights (few_*, kfew_*):
        # every count of them
        # (11, 40) for float weights: a 1536-long row's activations fill AVX-512's column
        # block (FTILE_ACT_BYTES) in 28 rows, so the tile moves on to a second block
        shapes = [(7, 5), (16, 9), (1, 1), (4, 4), (5, 2), (45, 19), (3, 3), (9, 6), (2, 7), (6, 8)]
        for nrows, ncols in shapes + ([(11, 40)] if bs == 1 and n == 1536 else []):
            if n > 4096 and nrows > 5 or nrows > 16 and n not in (32 * 70, 256 * 9):
                continue
            w, _, _ = make_case(tname, n, rng, nrows)
            rb = w.shape[1]
            xs = rng.standard_normal((ncols, n)).astype(np.float32)
            ab = act_bytes(act, n)
            acts = np.zeros((ncols, ab + 8), dtype=np.uint8)
            for t in range(ncols):
                acts[t, :ab] = quantize(0, act, xs[t])
            os_ = nrows + 3
            out = np.full(ncols * os_, np.nan, dtype=np.float32)
            rc = lib.pyllm_kernel_gemm(isa, tid, n, ptr(w), rb, nrows, ptr(acts), ab + 8, ncols, fptr(out), os_)
            assert rc == 0
            wbuf = np.ascontiguousarray(w).reshape(-1)
            for t in range(ncols):
                ref = gemv_call(isa, tname, n, wbuf, rb, nrows, np.ascontiguousarray(acts[t, :ab]))
                np.testing.assert_array_equal(out[t * os_:t * os_ + nrows], ref,
                                              err_msg=f"n={n} nrows={nrows} ncols={ncols} t={t}")
            # the matmul has gemm write straight into the output rows: the
            # stride's padding (the neighbours' columns) stays untouched
            assert np.isnan(out.reshape(ncols, os_)[:, nrows:]).all(), (n, nrows, ncols)


@pytest.mark.parametrize("tname", [t for t in ["Q5_0", "Q4_K"] if t in GEMM_TYPES])
def test_gemm_on_a_small_stack(tname):
    """the gemm kernels' buffers (~200 KB on AVX-512) are not on the stack: a
    thread with a 128 KB stack (musl's default) runs them, with the main
    thread's results bit for bit"""
    import threading
    rng = np.random.default_rng(14)
    tid, bs, _, act = TYPES[tname]
    n, nrows, ncols = bs * (64 if bs == 32 else 9), 45, 19
    w, _, _ = make_case(tname, n, rng, nrows)
    ab = act_bytes(act, n)
    acts = np.zeros((ncols, ab), dtype=np.uint8)
    for t in range(ncols):
        acts[t] = quantize(0, act, rng.standard_normal(n).astype(np.float32))
    def run(isa, out):
        out[:] = np.nan
        assert lib.pyllm_kernel_gemm(isa, tid, n, ptr(w), w.shape[1], nrows, ptr(acts), ab, ncols, fptr(out), nrows) == 0
    for isa in [i for i in LEVELS if lib.pyllm_kernel_provided(i, 4, tid)]:
        ref, got = np.empty(nrows * ncols, np.float32), np.empty(nrows * ncols, np.float32)
        run(isa, ref)
        old = threading.stack_size(128 * 1024)
        try:
            th = threading.Thread(target=run, args=(isa, got))
            th.start()
            th.join()
        finally:
            threading.stack_size(old)
        np.testing.assert_array_equal(got, ref, err_msg=f"isa={isa}")


@pytest.mark.parametrize("n_threads", [2, 3, 5, 8])
def test_decode_thread_counts_agree_exactly(tmp_path, n_threads):
    """Decode (one token a step) splits each matmul's rows among the threads
    (csrc/matmul.c: a contiguous segment per thread, shared beyond 4
    threads, then helping with the others' segments); since a row's gemv
    result does not depend on the rows that share the call, every step's
    logits are the same bit for bit for any thread count."""
    import synth
    from pyllm.arch import load_architecture
    from pyllm.backend.cpu import CpuBackend
    from pyllm.graph import Graph
    from pyllm.model_file import ModelFile
    path = synth.write_llama(tmp_path / "d.gguf", GT.Q4_1)

    def decode(nth):
        g = Graph()
        load_architecture(ModelFile(path)).build(g)
        be = CpuBackend(g, nth, 8, 8, 4, 16)
        return np.stack([be.forward([t], pos, [0, 1, 2, 3], 1)[0].copy()
                         for pos, t in enumerate([5, 17, 300, 2, 44, 9])])

    np.testing.assert_array_equal(decode(n_threads), decode(1))


# ---------------------------------------------------------------- fp16 / float helpers
def f16_f32_cases():
    rng = np.random.default_rng(9)
    h = np.arange(65536, dtype=np.uint32)
    f16 = h.astype(np.uint16).view(np.float16)
    fin = np.isfinite(f16) & (h < 0x7bff)
    lo = f16[fin & (h < 0x7bff)].astype(np.float32)
    hi = (h[fin & (h < 0x7bff)] + 1).astype(np.uint16).view(np.float16).astype(np.float32)
    mid = ((lo.astype(np.float64) + hi.astype(np.float64)) / 2).astype(np.float32)  # exact ties
    mid = mid[np.abs(lo) < np.abs(hi)]
    near = np.concatenate([np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))])
    rnd = rng.integers(0, 2**32, size=200000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504, 65519.99, 65520, 65536, 1e10,
                        2.0**-24, 2.0**-25, 2.0**-25 * 1.0000001, 2.0**-26, 2.0**-14, 2.0**-14 * (1 - 2**-11),
                        1e-45, -1e-45, 3.0**-20], dtype=np.float32)
    return np.concatenate([special, lo, mid, near, -mid, rnd]).astype(np.float32)


def run_float(isa, which, n, a, b=None, s=0.0, out=None):
    rc = lib.pyllm_kernel_float(isa, which, n, ptr(a), ptr(b) if b is not None else ffi.NULL, s, ptr(out))
    assert rc == 0
    return out


@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_fp16_to_fp32_all_halves(isa):
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    out = run_float(isa, 1, h.size, h, out=np.zeros(h.size, dtype=np.float32))
    ref = h.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert nan.sum() == 2046
    assert np.isnan(out[nan]).all()
    np.testing.assert_array_equal(out[~nan].view(np.uint32), ref[~nan].view(np.uint32))


@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_fp32_to_fp16_exact(isa):
    x = f16_f32_cases()
    out = run_float(isa, 0, x.size, x, out=np.zeros(x.size, dtype=np.uint16))
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    assert nan.sum() > 500
    assert np.isnan(out[nan].view(np.float16)).all()
    np.testing.assert_array_equal(out[~nan], ref[~nan])
    sub = (np.abs(x) < 2.0**-14) & (x != 0)
    assert (ref[sub] & 0x7fff).max() > 0  # subnormal halves were exercised


@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_float_helpers(isa):
    rng = np.random.default_rng(10)
    for n in [1, 7, 16, 33, 64, 100, 1000]:
        a16 = rng.standard_normal(n).astype(np.float16)
        b = rng.standard_normal(n).astype(np.float32)
        a32 = rng.standard_normal(n).astype(np.float32)
        mag16 = float(np.abs(a16.astype(np.float64) * b).sum())
        r = run_float(isa, 2, n, a16, b, out=np.zeros(1, dtype=np.float32))[0]
        assert abs(r - np.dot(a16.astype(np.float64), b.astype(np.float64))) <= 1e-6 * mag16 + 1e-30
        r = run_float(isa, 4, n, a32, b, out=np.zeros(1, dtype=np.float32))[0]
        mag = float(np.abs(a32.astype(np.float64) * b).sum())
        assert abs(r - np.dot(a32.astype(np.float64), b.astype(np.float64))) <= 1e-6 * mag
        y = rng.standard_normal(n).astype(np.float32)
        y0 = y.copy()
        s = np.float32(0.37)
        run_float(isa, 3, n, a16, s=float(s), out=y)
        exp = y0.astype(np.float64) + float(s) * a16.astype(np.float64)
        tol = 1.2e-7 * (np.abs(y0) + np.abs(float(s) * a16.astype(np.float64)))
        assert (np.abs(y - exp) <= tol).all()
        assert not np.array_equal(y, y0)


@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_f16_rows_to_f32_exact(isa):
    """the K/V block conversion: rows of n halves, x_stride apart, into rows x n
    floats back to back, exactly numpy's conversion (infs, nans, subnormals
    included), nothing written past rows x n"""
    rng = np.random.default_rng(14)
    for n, rows, stride in [(64, 32, 192), (7, 3, 7), (33, 5, 40), (200, 2, 256), (16, 1, 16), (1, 4, 3)]:
        bits = rng.integers(0, 1 << 16, size=rows * stride, dtype=np.uint16)
        x = bits.view(np.float16)
        out = np.full(rows * n + 5, 7.0, dtype=np.float32)
        assert lib.pyllm_kernel_f16_rows(isa, ptr(x), stride, rows, fptr(out), n) == 0
        want = x.reshape(rows, stride)[:, :n].astype(np.float32).reshape(-1)
        got = out[:rows * n]
        nan = np.isnan(want)
        assert (np.isnan(got) == nan).all(), (n, rows, stride)
        np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
        assert (out[rows * n:] == 7.0).all()
    x = np.zeros(8, dtype=np.float16)
    assert lib.pyllm_kernel_f16_rows(isa, ptr(x), 3, 2, fptr(np.zeros(8, dtype=np.float32)), 4) == -1  # stride < n


# ---------------------------------------------------------------- vector math (GLU, softmax)
# Error bounds (stated in quants.c), against float64 numpy:
#   glu_silu       |err| <= 1e-6 |silu(g) u| + 1e-30
#   glu_gelu_tanh  |err| <= 1e-6 max(1, |g|) |u|
#   glu_sigmoid    |err| <= 1e-6 |sigmoid(g) u| + 1e-30
#   exp_sum        each value within 4e-7 relative (values below 1.2e-38 may be 0),
#                  the sum within 1e-6 relative
#   axpy_f32       y + a x within 1 ulp of the exact result (one fma, or mul + add)
#   softcap        |err| <= 1e-6 |result| + 1e-12 cap
# and, exactly, an element's result does not depend on n or on where it sits.

def vmath(isa, which, a, b=None, s=0.0, out=None):
    a = np.ascontiguousarray(a, dtype=np.float32)
    if out is None:
        out = np.zeros(a.size, dtype=np.float32)
    tot = np.zeros(1, dtype=np.float32)
    n = out.size if which == 4 else a.size  # wsum: a holds rows of n
    pa = fptr(a) if a.size else fptr(np.zeros(1, dtype=np.float32))
    rc = lib.pyllm_kernel_vmath(isa, which, n, pa, fptr(b) if b is not None else ffi.NULL, s, fptr(out),
                                fptr(tot))
    assert rc == 0
    return out, float(tot[0])


def glu_inputs(rng, n):
    g = (rng.standard_normal(n) * rng.choice([0.1, 1, 3, 10], n)).astype(np.float32)
    special = np.array([0, -0.0, 1e-30, -1e-30, 1e-3, -1e-3, 5, -5, 20, -20, 87, -87, 88.5, -88.5, 89, -89, 100,
                        -100, 1e4, -1e4, 3e38, -3e38], dtype=np.float32)
    g[:special.size] = special
    u = rng.standard_normal(n).astype(np.float32)
    return g, u


def silu64(g):
    g = g.astype(np.float64)
    with np.errstate(over="ignore"):
        return g / (1 + np.exp(-g))


def sigmoid64(g):
    g = g.astype(np.float64)
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-g))


def gelu64(g):
    g = g.astype(np.float64)
    return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))


@pytest.mark.parametrize("which", [pytest.param(0, id="silu"), pytest.param(1, id="gelu_tanh"),
                                   pytest.param(10, id="sigmoid")])
@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_glu(isa, which):
    rng = np.random.default_rng(14)
    g, u = glu_inputs(rng, 4099)
    got, _ = vmath(isa, which, g, u)
    with np.errstate(over="ignore", invalid="ignore"):
        exact = {0: silu64, 1: gelu64, 10: sigmoid64}[which](g) * u.astype(np.float64)
    ok = np.isfinite(exact)
    assert ok.sum() > 4000 and np.isfinite(got[ok]).all()
    err = np.abs(got[ok] - exact[ok])
    if which != 1:
        bound = 1e-6 * np.abs(exact[ok]) + 1e-30
    else:
        bound = 1e-6 * np.maximum(1, np.abs(g[ok].astype(np.float64))) * np.abs(u[ok])
    bad = np.flatnonzero(err > bound)
    assert bad.size == 0, [(g[ok][i], u[ok][i], got[ok][i], exact[ok][i]) for i in bad[:5]]
    # against the scalar reference: the same bounds hold between the two
    ref, _ = vmath(0, which, g, u)
    assert (np.abs(got[ok] - ref[ok]) <= 2 * bound).all()
    # an element's result does not depend on n or its position; in place works
    for off in [1, 3, 7, 15, 17]:
        for n in [1, 5, 8, 13, 16, 31, 100]:
            part, _ = vmath(isa, which, g[off:off + n], u[off:off + n])
            np.testing.assert_array_equal(part, got[off:off + n], err_msg=f"off={off} n={n}")
    inplace = g.copy()
    vmath(isa, which, inplace, u, out=inplace)
    np.testing.assert_array_equal(inplace, got)


@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_softcap(isa):
    """c * tanh(scale * x / c) (Gemma 2's scores and logits) against float64
    tanh, on every range its branches and clamp meet: tiny, around the 0.3
    switch, saturating, huge, signed zeros"""
    rng = np.random.default_rng(21)
    x = (rng.standard_normal(5003) * rng.choice([1e-3, 0.1, 1, 10, 100, 1e4], 5003)).astype(np.float32)
    x[:14] = [0, -0.0, 1e-30, -1e-30, 1e-8, 0.3, -0.3, 0.29999998, 0.30000001, 9, -9, 9.5, 3e38, -3e38]
    for scale, cap in [(1.0, 1.0), (0.0625, 50.0), (1.0, 30.0), (2.5, 0.5)]:
        got, _ = vmath(isa, 7, x, np.array([cap], dtype=np.float32), s=scale)
        with np.errstate(over="ignore"):
            u = (x * np.float32(scale)).astype(np.float64) / np.float64(cap)  # the kernels' rounded product
        exact = cap * np.tanh(u)
        bound = 1e-6 * np.abs(exact) + 1e-12 * cap
        bad = np.flatnonzero(~(np.abs(got - exact) <= bound))
        assert bad.size == 0, [(x[i], scale, cap, got[i], exact[i]) for i in bad[:5]]
        assert np.signbit(got[1]) and not np.signbit(got[0]) and (np.abs(got) <= cap).all()
        ref, _ = vmath(0, 7, x, np.array([cap], dtype=np.float32), s=scale)
        assert (np.abs(got - ref) <= 2 * bound).all()
        for off in [1, 3, 7, 15, 17]:
            for n in [1, 5, 8, 13, 16, 31, 100]:
                part, _ = vmath(isa, 7, x[off:off + n], np.array([cap], dtype=np.float32), s=scale)
                np.testing.assert_array_equal(part, got[off:off + n], err_msg=f"off={off} n={n}")
        inplace = x.copy()
        vmath(isa, 7, inplace, np.array([cap], dtype=np.float32), s=scale, out=inplace)
        np.testing.assert_array_equal(inplace, got)
    nan = vmath(isa, 7, np.array([np.nan, 1.0], dtype=np.float32), np.array([30.0], dtype=np.float32), s=1.0)[0]
    assert np.isnan(nan[0]) and not np.isnan(nan[1])


@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_exp_sum(isa):
    rng = np.random.default_rng(15)
    for n in [0, 1, 5, 8, 15, 16, 17, 33, 64, 255, 1000]:
        m = float(rng.uniform(-5, 5))
        x = (m - np.abs(rng.standard_normal(n)) * rng.choice([0.1, 3, 30], n)).astype(np.float32)
        if n >= 8:
            x[:6] = [m, -np.inf, m - 87.0, m - 87.5, m - 200.0, m - 1e-7]
        got, tot = vmath(isa, 2, x, s=m)
        exact = np.exp((x - np.float32(m)).astype(np.float64))  # the kernels see the rounded difference
        tiny = exact < 1.2e-38
        assert (np.abs(got[~tiny] - exact[~tiny]) <= 4e-7 * exact[~tiny]).all(), n
        assert (got[tiny] <= 1.2e-38).all() and (got >= 0).all()
        assert abs(tot - exact.sum()) <= 1e-6 * exact.sum() + 1e-37, (n, tot, exact.sum())
        if n >= 8:
            assert got[1] == 0 and got[4] == 0 and got[0] == 1.0
        ref, rtot = vmath(0, 2, x, s=m)
        assert abs(tot - rtot) <= 2e-6 * rtot + 1e-37
        for off in [1, 3, 9]:
            if off < n:
                part, _ = vmath(isa, 2, x[off:], s=m)
                np.testing.assert_array_equal(part, got[off:])
        inplace = x.copy()
        _, t2 = vmath(isa, 2, inplace, s=m, out=inplace)
        np.testing.assert_array_equal(inplace, got)
        assert t2 == tot


@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_axpy_f32(isa):
    rng = np.random.default_rng(16)
    for n in [0, 1, 7, 8, 9, 16, 17, 64, 100, 1000]:
        x = rng.standard_normal(n).astype(np.float32)
        y0 = rng.standard_normal(n).astype(np.float32)
        a = np.float32(rng.standard_normal())
        y, _ = vmath(isa, 3, x, s=float(a), out=y0.copy())
        exact = y0.astype(np.float64) + float(a) * x.astype(np.float64)
        ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
        assert (np.abs(y - exact) <= ulp + np.spacing(np.abs(float(a) * x)).astype(np.float64)).all(), n
        for off in [1, 5]:
            if off < n:
                yy, _ = vmath(isa, 3, x[off:], s=float(a), out=y0[off:].copy())
                np.testing.assert_array_equal(yy, y[off:])


def ssm_scan_row(isa, s, bc, c_off, x, dt, decay, n_tok):
    """Runs level isa's ssm_scan_row over rows of bc ([B | ... | C ...] per token) and a column of x; (y, s)."""
    s = s.copy()
    y = np.full((n_tok, 3), np.nan, dtype=np.float32)   # a column of y, 3 apart
    rc = lib.pyllm_kernel_ssm_scan_row(isa, s.size, fptr(s), n_tok, fptr(bc), bc.shape[1], c_off, fptr(x), x.shape[1],
                                       fptr(dt), fptr(decay), fptr(y), 3)
    assert rc == 0
    return y[:, 0].copy(), s


@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_ssm_scan_row(isa):
    """One row of Mamba 2's scan against float64, and each level against the scalar
    reference: state sizes around the 8-, 16- and 32-wide steps and their tails, one token
    and many, the state carried in place; each step of a state value is within a few ulp."""
    assert lib.pyllm_kernel_provided(isa, 5, 8) or ISA_NAMES[isa] == "neon"   # NEON runs the scalar one
    rng = np.random.default_rng(18)
    for n, n_tok in [(1, 1), (7, 3), (8, 2), (16, 5), (19, 4), (33, 2), (64, 9), (128, 17), (130, 3), (200, 1)]:
        c_off = n + 3
        bc = rng.standard_normal((n_tok, c_off + n + 5)).astype(np.float32)
        x = rng.standard_normal((n_tok, 4)).astype(np.float32)
        dt = rng.uniform(0.01, 2.0, n_tok).astype(np.float32)
        decay = np.exp(-dt * rng.uniform(1, 8)).astype(np.float32)
        s0 = rng.standard_normal(n).astype(np.float32)
        y, s = ssm_scan_row(isa, s0, bc, c_off, x, dt, decay, n_tok)
        exact = s0.astype(np.float64)
        want, mag = np.empty(n_tok), np.empty(n_tok)
        for t in range(n_tok):
            B, C = bc[t, :n].astype(np.float64), bc[t, c_off:c_off + n].astype(np.float64)
            exact = exact * float(decay[t]) + float(np.float32(x[t, 0] * dt[t])) * B
            want[t], mag[t] = exact @ C, np.abs(exact) @ np.abs(C)
        np.testing.assert_allclose(s, exact, rtol=0, atol=1e-6 * (1 + np.abs(exact).max()) * n_tok)
        assert (np.abs(y - want) <= 1e-6 * n_tok * (mag + 1)).all(), (n, n_tok)
        ref_y, ref_s = ssm_scan_row(0, s0, bc, c_off, x, dt, decay, n_tok)
        np.testing.assert_allclose(s, ref_s, rtol=0, atol=4 * n_tok * np.spacing(np.abs(ref_s).max()))


@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_wsum_f32(isa):
    rng = np.random.default_rng(17)
    for n, rows in [(64, 16), (1, 3), (7, 1), (33, 5), (100, 0), (128, 33), (256, 2)]:
        x = rng.standard_normal((rows, n)).astype(np.float32)
        w = rng.standard_normal(rows).astype(np.float32)
        y0 = rng.standard_normal(n).astype(np.float32)
        y, _ = vmath(isa, 4, x, w, s=float(rows), out=y0.copy())
        exact = y0.astype(np.float64) + w.astype(np.float64) @ x.astype(np.float64)
        mag = np.abs(y0) + np.abs(w.astype(np.float64)) @ np.abs(x.astype(np.float64))
        assert (np.abs(y - exact) <= 1.2e-7 * (rows + 1) * mag).all(), (n, rows)
        ref, _ = vmath(0, 4, x, w, s=float(rows), out=y0.copy())
        assert (np.abs(y - ref) <= 2.4e-7 * (rows + 1) * mag).all(), (n, rows)
        # a column's result does not depend on where the columns start or end
        if n > 8 and rows:
            for c0 in [1, 5, 17]:
                if c0 < n:
                    sub = np.ascontiguousarray(x[:, c0:])
                    yy, _ = vmath(isa, 4, sub, w, s=float(rows), out=y0[c0:].copy())
                    np.testing.assert_array_equal(yy, y[c0:])


@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_wsum_many_equals_wsum_exactly(isa):
    """attention's weighted sum for several queries at once gives each query
    exactly wsum_f32's result (so a token's attention output does not depend
    on how many queries shared the call), for every output count and column
    tail; the strides' padding stays untouched"""
    rng = np.random.default_rng(18)
    for n, rows in [(256, 32), (64, 7), (33, 5), (100, 1), (128, 0), (17, 3)]:
        x = rng.standard_normal((rows, n)).astype(np.float32)
        for nq in [1, 2, 3, 4, 5, 7, 9]:
            ws, ys = rows + 3, n + 5
            w = rng.standard_normal((nq, ws)).astype(np.float32)
            y0 = rng.standard_normal((nq, ys)).astype(np.float32)
            y0[:, n:] = np.nan
            y = y0.copy()
            xp = fptr(x) if x.size else fptr(np.zeros(1, dtype=np.float32))
            assert lib.pyllm_kernel_wsum(isa, n, rows, nq, fptr(w), ws, xp, n, fptr(y), ys) == 0
            for q in range(nq):
                one, _ = vmath(isa, 4, x, np.ascontiguousarray(w[q, :rows]), s=float(rows), out=y0[q, :n].copy())
                np.testing.assert_array_equal(y[q, :n], one, err_msg=f"n={n} rows={rows} nq={nq} q={q}")
            assert np.isnan(y[:, n:]).all()
    assert lib.pyllm_kernel_wsum(isa, 8, 4, 1, fptr(w), 2, fptr(x), 8, fptr(y), 8) == -1  # ws < rows



def check_wsum_from_stored_rows(isa, kernel, cases, stored_rows, seed):
    """kernel (pyllm_kernel_wsum_f16 or _q8_0) on rows as a cache stores them against
    pyllm_kernel_wsum on those rows as floats, bit for bit, for every output count; the
    strides' padding stays untouched. stored_rows(rng, n, rows, ld) -> (stored, as floats)."""
    rng = np.random.default_rng(seed)
    for n, rows, ld in cases:
        stored, xf = stored_rows(rng, n, rows, ld)
        for nq in [1, 2, 3, 4, 5, 9]:
            ws, ys = rows + 3, n + 5
            w = rng.standard_normal((nq, ws)).astype(np.float32)
            y0 = rng.standard_normal((nq, ys)).astype(np.float32)
            y0[:, n:] = np.nan
            got, want = y0.copy(), y0.copy()
            xfp = fptr(xf) if xf.size else fptr(np.zeros(1, dtype=np.float32))
            assert kernel(isa, n, rows, nq, fptr(w), ws, ptr(stored), ld, fptr(got), ys) == 0
            assert lib.pyllm_kernel_wsum(isa, n, rows, nq, fptr(w), ws, xfp, n, fptr(want), ys) == 0
            np.testing.assert_array_equal(got, want, err_msg=f"n={n} rows={rows} ld={ld} nq={nq}")
            assert np.isnan(got[:, n:]).all()
    return stored, w, got


@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_wsum_from_f16_rows_equals_wsum_on_floats_exactly(isa):
    """attention's weighted sum reads V straight from the f16 cache (rows ld
    halves apart, a block's rows of one KV head): exactly the float form on
    the rows converted, for every output count and column tail (AVX2 pads a
    partial last 8 through a copy)"""
    def f16_rows(rng, n, rows, ld):
        xh = rng.standard_normal((max(rows, 1), ld)).astype(np.float16)
        return xh, np.ascontiguousarray(xh[:rows, :n].astype(np.float32))
    xh, w, got = check_wsum_from_stored_rows(
        isa, lib.pyllm_kernel_wsum_f16,
        [(64, 32, 192), (256, 16, 256), (33, 5, 40), (100, 1, 100), (7, 3, 9), (128, 0, 128)], f16_rows, 19)
    assert lib.pyllm_kernel_wsum_f16(isa, 8, 4, 1, fptr(w), 4, ptr(xh), 7, fptr(got), 8) == -1  # ld < n


@pytest.mark.parametrize("isa", level_params(LEVELS))
def test_wsum_from_q8_0_rows_equals_wsum_on_dequantized_rows_exactly(isa):
    """attention's weighted sum reads V straight from a q8_0 cache (rows ld bytes apart, a
    block's rows of one KV head): exactly the float form on the rows dequantized (q * d, d the
    block's f16 scale). Levels without the kernel dequantize first, as attention does."""
    from pyllm.reference import q8_round
    assert lib.pyllm_kernel_provided(isa, 5, 9) == (isa in (1, 2))   # AVX2 and AVX-512 have it; NEON dequantizes

    def q8_0_rows(rng, n, rows, ld):
        x = (rng.standard_normal((max(rows, 1), n)) * rng.uniform(0.01, 50, (max(rows, 1), 1))).astype(np.float32)
        blocks = np.zeros((max(rows, 1), ld), np.uint8)
        for r in range(max(rows, 1)):   # Q8_0 rows as the cache stores them
            b = x[r].reshape(-1, 32)
            d = (np.abs(b).max(axis=1) / np.float32(127)).astype(np.float32)
            inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
            row = blocks[r, :n // 32 * 34].reshape(-1, 34)
            row[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
            row[:, 2:] = np.rint(b * inv[:, None]).astype(np.int8).view(np.uint8)
        return blocks, np.ascontiguousarray(q8_round(x, f16_scale=True)[:rows])
    blocks, w, got = check_wsum_from_stored_rows(
        isa, lib.pyllm_kernel_wsum_q8_0,
        [(64, 32, 3 * 68), (128, 16, 136), (32, 5, 40), (576, 3, 612), (96, 1, 102), (64, 0, 68)], q8_0_rows, 20)
    assert lib.pyllm_kernel_wsum_q8_0(isa, 48, 1, 1, fptr(w), 4, ptr(blocks), 68, fptr(got), 64) == -1  # n % 32
    assert lib.pyllm_kernel_wsum_q8_0(isa, 64, 1, 1, fptr(w), 4, ptr(blocks), 66, fptr(got), 64) == -1  # ld short


def test_vmath_provided():
    """AVX2 and AVX-512 have their own vector math; bad arguments are refused"""
    for isa in [i for i in (1, 2) if lib.pyllm_level_available(i)]:
        for which in (0, 1, 2, 3, 4, 7, 10):
            assert lib.pyllm_kernel_provided(isa, 5, which), (isa, which)
    f = np.zeros(4, dtype=np.float32)
    assert lib.pyllm_kernel_vmath(0, 7, 4, fptr(f), fptr(f), 1.0, fptr(f), fptr(f)) == -1  # cap 0
    assert lib.pyllm_kernel_vmath(0, 5, 4, fptr(f), fptr(f), 0.0, fptr(f), fptr(f)) == -1
    assert lib.pyllm_kernel_vmath(0, 4, 4, fptr(f), fptr(f), -1.0, fptr(f), fptr(f)) == -1
    assert lib.pyllm_kernel_vmath(0, 0, 4, fptr(f), ffi.NULL, 0.0, fptr(f), fptr(f)) == -1
    assert lib.pyllm_kernel_vmath(0, 10, 4, fptr(f), ffi.NULL, 0.0, fptr(f), fptr(f)) == -1
    assert lib.pyllm_kernel_vmath(0, 2, 4, fptr(f), ffi.NULL, 0.0, fptr(f), ffi.NULL) == -1
    assert lib.pyllm_kernel_vmath(99, 3, 4, fptr(f), ffi.NULL, 0.0, fptr(f), ffi.NULL) == -1


# ---------------------------------------------------------------- API, provided kernels
def test_levels_and_api_validation():
    cpu = lib.pyllm_cpu_level()
    assert lib.pyllm_level_available(0) == 1 and lib.pyllm_level_available(cpu) == 1
    assert lib.pyllm_level_available(-1) == 0 and lib.pyllm_level_available(4) == 0
    assert lib.pyllm_set_level(99) == -1
    before = lib.pyllm_get_level()
    try:
        assert lib.pyllm_set_level(0) == 0 and lib.pyllm_get_level() == 0
        assert lib.pyllm_set_level(cpu) == cpu and lib.pyllm_get_level() == cpu
    finally:
        lib.pyllm_set_level(before)
    for t in [4, 5, 9, 15, 31, 34, 35, 38, 40, -1, 1000]:
        assert lib.pyllm_type_supported(t) == 0 and lib.pyllm_type_act(t) == -1
    for name, (tid, bs, ts, act) in TYPES.items():
        assert lib.pyllm_type_supported(tid) == 1 and lib.pyllm_type_act(tid) == act, name
    assert lib.pyllm_act_row_bytes(ACT_Q8_32, 64) == 80
    assert lib.pyllm_act_row_bytes(ACT_Q8_K, 512) == 584
    assert lib.pyllm_act_row_bytes(ACT_F32, 10) == 40
    buf = np.zeros(4096, dtype=np.uint8)
    f = np.zeros(1024, dtype=np.float32)
    P, F = ptr(buf), fptr(f)
    assert lib.pyllm_kernel_dequant(0, 4, P, F, 32) == -1           # unknown type
    assert lib.pyllm_kernel_dequant(0, 2, P, F, 33) == -1           # not a block multiple
    assert lib.pyllm_kernel_dequant(0, 12, P, F, 128) == -1
    assert lib.pyllm_kernel_dequant(0, 2, P, F, 0) == -1
    assert lib.pyllm_kernel_dequant(0, 2, ffi.NULL, F, 32) == -1
    assert lib.pyllm_kernel_dequant(99, 2, P, F, 32) == -1          # no such level
    assert lib.pyllm_kernel_dequant(-1, 2, P, F, 32) == -1
    assert lib.pyllm_kernel_dequant(0, 2, P, F, 32) == 0
    assert lib.pyllm_kernel_quantize_act(0, 3, F, P, 32) == -1
    assert lib.pyllm_kernel_quantize_act(0, ACT_Q8_K, F, P, 32) == -1
    assert lib.pyllm_kernel_quantize_act(0, ACT_Q8_32, F, P, 32) == 0
    assert lib.pyllm_kernel_vec_dot(0, 15, 256, P, P, F) == -1     # Q8_K is not a weight type
    assert lib.pyllm_kernel_vec_dot(0, 2, 48, P, P, F) == -1
    assert lib.pyllm_kernel_vec_dot(0, 2, 32, P, P, F) == 0
    assert lib.pyllm_kernel_gemv(0, 2, 32, P, 10, 2, P, F) == -1   # row_bytes < row size
    assert lib.pyllm_kernel_gemv(0, 2, 32, P, 18, -1, P, F) == -1
    assert lib.pyllm_kernel_float(0, 5, 4, P, P, 0.0, F) == -1
    assert lib.pyllm_kernel_float(0, 2, 4, P, ffi.NULL, 0.0, F) == -1
    for isa in range(4):
        if not lib.pyllm_level_available(isa):
            assert lib.pyllm_kernel_vec_dot(isa, 2, 32, P, P, F) == -1
            assert lib.pyllm_kernel_float(isa, 4, 4, P, P, 0.0, F) == -1
            assert lib.pyllm_kernel_provided(isa, 1, 2) == 0


KINDS = ["dequant", "vec_dot", "gemv", "quantize_act", "gemm"]


def provided_table():
    rows = {}
    for isa in LEVELS:
        rows[isa] = {k: [t for t, (tid, *_) in TYPES.items() if lib.pyllm_kernel_provided(isa, ki, tid)]
                     for ki, k in enumerate(KINDS) if k != "quantize_act"}
        rows[isa]["quantize_act"] = [s for a, s in [(0, "F32"), (1, "Q8_32"), (2, "Q8_K")]
                                     if lib.pyllm_kernel_provided(isa, 3, a)]
    return rows


def test_report_provided_kernels():
    rows = provided_table()
    print()
    for isa, r in rows.items():
        for k in KINDS:
            print(f"  {ISA_NAMES[isa]:7s} {k:12s} {' '.join(r[k]) or '-'}")
    # the scalar level is complete
    assert rows[0]["dequant"] == list(TYPES) and rows[0]["vec_dot"] == list(TYPES)
    assert rows[0]["gemv"] == [] and rows[0]["gemm"] == [] and rows[0]["quantize_act"] == ["F32", "Q8_32", "Q8_K"]


@pytest.mark.parametrize("isa", level_params([1, 2]))
def test_priority_formats_provided(isa):
    """AVX2 and AVX-512 each have their own vec_dot and gemv for the priority
    formats and a gemm for every format; AVX2 also every format's vec_dot,
    dequant and quantize_act (AVX-512 inherits those)"""
    if not lib.pyllm_level_available(isa):
        pytest.skip(f"CPU lacks {ISA_NAMES[isa]}")
    for t in PRIORITY:
        tid = TYPES[t][0]
        assert lib.pyllm_kernel_provided(isa, 1, tid), f"{ISA_NAMES[isa]} vec_dot {t}"
    for t in GEMV_REQUIRED:
        assert lib.pyllm_kernel_provided(isa, 2, TYPES[t][0]), f"{ISA_NAMES[isa]} gemv {t}"
    # every weight type: without a gemm, prefill reads the weights once per prompt token
    for t, (tid, *_) in TYPES.items():
        assert lib.pyllm_kernel_provided(isa, 4, tid), f"{ISA_NAMES[isa]} gemm {t}"
    if isa == 1:
        for t, (tid, *_) in TYPES.items():
            assert lib.pyllm_kernel_provided(isa, 1, tid), t
            assert lib.pyllm_kernel_provided(isa, 0, tid) or t == "F32", t  # F32 dequant is a memcpy
        assert lib.pyllm_kernel_provided(isa, 3, ACT_Q8_32) and lib.pyllm_kernel_provided(isa, 3, ACT_Q8_K)


AVX2_VNNI = lib.pyllm_level_available(1) and ffi.string(lib.pyllm_level_name(1)) == b"avx2+avxvnni"
AVX512_VNNI = lib.pyllm_level_available(2) and ffi.string(lib.pyllm_level_name(2)) == b"avx512+vnni"
INT_TYPES = [t for t, (_, bs, *_) in TYPES.items() if bs > 1]


# (the variable that turns a level's VNNI form off, the tests rerun, whether this CPU has that form)
WITHOUT_VNNI = [
    pytest.param("PYLLM_AVX512_VNNI", "avx512 and (vec_dot or gemv or gemm)", AVX512_VNNI, id="avx512"),
    pytest.param("PYLLM_AVX2_VNNI", "avx2 and (vec_dot or gemv or gemm or provided)", AVX2_VNNI, id="avx2"),
]


@pytest.mark.parametrize("var,tests,has_vnni", WITHOUT_VNNI)
def test_level_without_vnni(var, tests, has_vnni):
    """the maddubs path of a level (AVX-512BW, AVX2), forced on a VNNI CPU by
    PYLLM_..._VNNI=0: that level's kernel tests pass on it too"""
    if not has_vnni or os.environ.get(var) == "0":
        pytest.skip("needs a CPU with that VNNI form (and runs once, from the parent)")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__,
                        "-k", f"{tests} and not vnni"],
                       env=dict(os.environ, **{var: "0"}), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout


def avx2_int_outputs():
    """gemm and gemv of the AVX2 level on fixed random data, every integer format"""
    rng = np.random.default_rng(21)
    outs = []
    for tname in INT_TYPES:
        tid, bs, _, act = TYPES[tname]
        n, nrows, ncols = (32 * 21, 9, 10) if bs == 32 else (256 * 3, 5, 6)
        w = random_weights(tname, n, rng, nrows)
        ab = act_bytes(act, n)
        acts = np.stack([quantize(0, act, rng.standard_normal(n).astype(np.float32) * 3) for _ in range(ncols)])
        out = np.zeros(ncols * nrows, dtype=np.float32)
        assert lib.pyllm_kernel_gemm(1, tid, n, ptr(w), w.shape[1], nrows, ptr(acts), ab, ncols, fptr(out),
                                     nrows) == 0
        outs.append(out)
        outs.append(gemv_call(1, tname, n, np.ascontiguousarray(w).reshape(-1), w.shape[1], nrows,
                              np.ascontiguousarray(acts[0])))
    return np.concatenate(outs)


@pytest.mark.skipif(not AVX2_VNNI or os.environ.get("PYLLM_AVX2_VNNI") == "0",
                    reason="needs AVX-VNNI (and runs once, from the parent)")
def test_avx2_avxvnni_equals_maddubs_exactly(tmp_path):
    """the AVX-VNNI dots give the same integers as maddubs + madd, so the same
    floats: a model gives the same logits on either form of the AVX2 level"""
    out_file = tmp_path / "maddubs.npy"
    code = ("import sys, numpy as np; sys.path.insert(0, sys.argv[1]); import test_kernels as tk; "
            "assert tk.ffi.string(tk.lib.pyllm_level_name(1)) == b'avx2'; np.save(sys.argv[2], tk.avx2_int_outputs())")
    r = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__), str(out_file)],
                       env=dict(os.environ, PYLLM_AVX2_VNNI="0"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    vnni = avx2_int_outputs()
    assert np.isfinite(vnni).all() and np.abs(vnni).max() > 0
    np.testing.assert_array_equal(vnni, np.load(out_file))


def test_level_names():
    names = {i: ffi.string(lib.pyllm_level_name(i)).decode() for i in ISA_NAMES}
    for i, name in names.items():
        if lib.pyllm_level_available(i):
            assert name.split("+")[0] == ISA_NAMES[i], (i, name)
        else:
            assert name == "", (i, name)
    assert ffi.string(lib.pyllm_level_name(99)) == b""


# ---------------------------------------------------------------- NEON, on x86
# On an x86 machine the NEON kernels cannot run in this process; when a cross
# compiler and qemu-user are installed (apt-get install gcc-aarch64-linux-gnu
# qemu-user), this C harness checks them against the scalar reference the
# same way as the tests above (dequant and quantize bit-exact, dots within
# 2e-6 of the magnitude sum, fp16 exact), built with and without SDOT.
NEON_HARNESS = r"""
/* NEON vs scalar, run under qemu-aarch64 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pyllm.h"
#include "quants.h"

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }
static float frnd(void) { return ((float)(rnd() % 2000001) - 1000000.0f) / 1000000.0f; }

static int fails = 0, checks = 0;
#define CHECK(c, ...) do { checks++; if (!(c)) { fails++; printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

int main(void) {
    CHECK(pyllm_level_available(ISA_NEON) == 1, "neon available");
    CHECK(pyllm_cpu_level() == ISA_NEON, "cpu level");
    printf("level %s\n", pyllm_level_name(ISA_NEON));
    /* with SDOT in use, the plain table (widening multiplies) must give the same floats */
    const int sdot = strcmp(pyllm_level_name(ISA_NEON), "neon+dotprod") == 0;
    static kernel_table plain;
    kernels_fill_neon(&plain);
    const int types[12] = {T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0, T_IQ4_NL, T_MXFP4, T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K,
                           T_Q6_K};
    /* byte offsets of each type's fp16 scale d and min (-1: none; MXFP4: its E8M0 byte at 0, made
     * 100..140 as in real files, with about one block in 16 at 0 or 1); random bytes elsewhere */
    const int d_off[12] = {0, 0, 0, 0, 0, 0, 0, 80, 108, 0, 0, 208}, m_off[12] = {-1, 2, -1, 2, -1, -1, -1, 82, -1, 2, 2, -1};
    const int lens32[4] = {32, 32 * 7, 32 * 18, 2048}, lensK[3] = {256, 256 * 3, 2048};
    static uint8_t w[8][4096], acts[6][4096];
    static float x[6][4096], o0[4096], o1[4096];
    uint8_t *a0 = acts[0];
    for (int ti = 0; ti < 12; ti++) {
        const int t = types[ti];
        const type_traits *tt = type_info(t);
        const int bs = tt->block_size, act = tt->act, group = bs == 32 ? 32 : 16;
        CHECK(pyllm_kernel_provided(ISA_NEON, 1, t) && pyllm_kernel_provided(ISA_NEON, 2, t) &&
              pyllm_kernel_provided(ISA_NEON, 4, t), "provided %d", t);
        for (int li = 0; li < (bs == 32 ? 4 : 3); li++) {
            const int n = bs == 32 ? lens32[li] : lensK[li], nb = n / bs;
            for (int r = 0; r < 8; r++) {
                for (int b = 0; b < nb * tt->type_size; b++) w[r][b] = (uint8_t)rnd();
                for (int b = 0; b < nb; b++) {
                    uint8_t *blk = w[r] + b * tt->type_size;
                    if (t == T_MXFP4) {
                        blk[0] = rnd() % 16 ? (uint8_t)(100 + rnd() % 41) : (uint8_t)(rnd() % 2);
                        continue;
                    }
                    f16_t d = fp32_to_fp16((0.5f + (rnd() % 1000) / 666.0f) * 1e-2f * ((rnd() & 1) ? 1 : -1));
                    memcpy(blk + d_off[ti], &d, 2);
                    if (m_off[ti] >= 0) { f16_t m = fp32_to_fp16(frnd() * 0.1f); memcpy(blk + m_off[ti], &m, 2); }
                }
            }
            if (pyllm_kernel_provided(ISA_NEON, 0, t)) {
                CHECK(pyllm_kernel_dequant(0, t, w[0], o0, n) == 0 && pyllm_kernel_dequant(ISA_NEON, t, w[0], o1, n) == 0, "dq rc");
                CHECK(memcmp(o0, o1, (size_t)n * 4) == 0, "dequant type %d n %d", t, n);
            }
            const size_t ab = act_row_bytes(act, n);
            for (int c = 0; c < 6; c++) {
                for (int i = 0; i < n; i++) x[c][i] = frnd() * 3.0f;
                CHECK(pyllm_kernel_quantize_act(0, act, x[c], acts[c], n) == 0, "q rc");
            }
            static uint8_t a1[4096];
            CHECK(pyllm_kernel_quantize_act(ISA_NEON, act, x[0], a1, n) == 0, "q rc");
            CHECK(memcmp(a0, a1, ab) == 0, "quantize act %d n %d", act, n);
            float out[8], gout[6 * 9];
            CHECK(pyllm_kernel_gemv(ISA_NEON, t, n, w, sizeof w[0], 7, a0, out) == 0, "gemv rc");
            /* 7 rows x 6 activation rows: a tile of 4 and a remainder of 2 */
            CHECK(pyllm_kernel_gemm(ISA_NEON, t, n, w, sizeof w[0], 7, acts, sizeof acts[0], 6, gout, 9) == 0, "gemm rc");
            if (sdot) {
                float pout[6 * 9];
                plain.gemm[t](n, w, sizeof w[0], 7, acts, sizeof acts[0], 6, pout, 9);
                for (int c = 0; c < 6; c++)
                    CHECK(memcmp(pout + 9 * c, gout + 9 * c, 7 * 4) == 0, "SDOT != plain type %d n %d col %d", t, n, c);
            }
            for (int r = 0; r < 7; r++) {
                float ref, got;
                pyllm_kernel_vec_dot(0, t, n, w[r], a0, &ref);
                pyllm_kernel_vec_dot(ISA_NEON, t, n, w[r], a0, &got);
                pyllm_kernel_dequant(0, t, w[r], o0, n);
                /* magnitude: 2 * sum over groups max|w| * sum|x| */
                double mag = 0;
                for (int b = 0; b < n / group; b++) {
                    double mw = 0, sx = 0;
                    for (int j = 0; j < group; j++) { mw = fmax(mw, fabs(o0[group * b + j])); sx += fabs(x[0][group * b + j]); }
                    mag += 2 * mw * sx;
                }
                CHECK(fabs(got - ref) <= 2e-6 * mag, "vec_dot type %d n %d: %g vs %g", t, n, got, ref);
                CHECK(fabs(out[r] - ref) <= 2e-6 * mag, "gemv type %d n %d row %d: %g vs %g", t, n, r, out[r], ref);
                CHECK(fabs(ref) > 1e-7 * mag, "degenerate");
                /* exact: vec_dot == gemv == gemm on that row, whatever rows share the call */
                CHECK(memcmp(&got, &out[r], 4) == 0, "vec_dot != gemv type %d n %d row %d", t, n, r);
                for (int k = 1; k + r <= 8; k++) {
                    float part[8];
                    pyllm_kernel_gemv(ISA_NEON, t, n, w[r], sizeof w[0], k, a0, part);
                    CHECK(memcmp(&part[0], &got, 4) == 0, "gemv(nrows=%d) from row %d type %d n %d", k, r, t, n);
                }
                for (int c = 0; c < 6; c++) {
                    float v;
                    pyllm_kernel_vec_dot(ISA_NEON, t, n, w[r], acts[c], &v);
                    CHECK(memcmp(&v, &gout[c * 9 + r], 4) == 0, "gemm != vec_dot type %d n %d row %d col %d", t, n, r, c);
                }
            }
        }
    }
    /* float weights (F32, F16, BF16): gemm == vec_dot bit for bit over tiles
     * of 4 and 1 rows, 2 and 1 activation rows and every tail length; vec_dot
     * within 2e-6 of the magnitude sum from the scalar reference */
    {
        const int ftypes[3] = {T_F32, T_F16, T_BF16}, flens[5] = {8, 37, 64, 200, 1003};
        static float fw[9][1024], fa[7][1024];
        static uint16_t hw[9][1024];
        for (int fi = 0; fi < 3; fi++) {
            const int t = ftypes[fi];
            CHECK(pyllm_kernel_provided(ISA_NEON, 1, t) && pyllm_kernel_provided(ISA_NEON, 4, t), "float provided %d", t);
            for (int li = 0; li < 5; li++) {
                const int n = flens[li];
                for (int r = 0; r < 9; r++)
                    for (int i = 0; i < n; i++) {
                        uint32_t u;
                        fw[r][i] = frnd();
                        memcpy(&u, &fw[r][i], 4);
                        hw[r][i] = t == T_F16 ? fp32_to_fp16(fw[r][i]) : (uint16_t)(u >> 16);
                    }
                for (int c = 0; c < 7; c++)
                    for (int i = 0; i < n; i++) fa[c][i] = frnd();
                const char *wp = t == T_F32 ? (const char *)fw : (const char *)hw;
                const size_t rb = t == T_F32 ? sizeof fw[0] : sizeof hw[0];
                float gout[7 * 11];
                for (int i = 0; i < 7 * 11; i++) gout[i] = NAN;
                CHECK(pyllm_kernel_gemm(ISA_NEON, t, n, wp, rb, 9, fa, sizeof fa[0], 7, gout, 11) == 0, "float gemm rc");
                for (int c = 0; c < 7; c++) {
                    for (int r = 0; r < 9; r++) {
                        float v, ref;
                        double mag = 0;
                        pyllm_kernel_vec_dot(ISA_NEON, t, n, wp + r * rb, fa[c], &v);
                        pyllm_kernel_vec_dot(0, t, n, wp + r * rb, fa[c], &ref);
                        for (int i = 0; i < n; i++)
                            mag += fabs((t == T_F32 ? fw[r][i] : t == T_F16 ? fp16_to_fp32(hw[r][i]) : bf16_to_fp32(hw[r][i])) * fa[c][i]);
                        CHECK(memcmp(&v, &gout[c * 11 + r], 4) == 0, "float gemm != vec_dot type %d n %d row %d col %d", t, n, r, c);
                        CHECK(fabs(v - ref) <= 2e-6 * mag, "float vec_dot type %d n %d: %g vs %g", t, n, v, ref);
                    }
                    CHECK(isnan(gout[c * 11 + 9]) && isnan(gout[c * 11 + 10]), "float gemm wrote past its rows");
                }
            }
        }
    }
    /* fp16: every half, and float32 values of all exponents */
    static f16_t h[65536], h1[65536];
    static float f[65536], f1[65536];
    for (int i = 0; i < 65536; i++) h[i] = (f16_t)i;
    pyllm_kernel_float(ISA_NEON, 1, 65536, h, NULL, 0, f1);
    int bad = 0;
    for (int i = 0; i < 65536; i++) {
        const float r = fp16_to_fp32(h[i]);
        if (isnan(r) ? !isnan(f1[i]) : memcmp(&r, &f1[i], 4) != 0) bad++;
    }
    CHECK(bad == 0, "f16_to_f32: %d bad", bad);
    {   /* the K/V block form: 7 rows of 33, 37 apart (finite halves 0..258) */
        static float r0[7 * 33], r1[7 * 33];
        CHECK(pyllm_kernel_f16_rows(0, h, 37, 7, r0, 33) == 0 && pyllm_kernel_f16_rows(ISA_NEON, h, 37, 7, r1, 33) == 0,
              "f16 rows rc");
        CHECK(memcmp(r0, r1, sizeof r0) == 0 && r1[33] == fp16_to_fp32(h[37]), "f16 rows");
    }
    for (int i = 0; i < 65536; i++) { uint32_t u = rnd(); memcpy(&f[i], &u, 4); }
    for (int i = 0; i < 4096; i++) f[i] = fp16_to_fp32((f16_t)i) * 1.00048828125f; /* near-ties, subnormals */
    pyllm_kernel_float(ISA_NEON, 0, 65536, f, NULL, 0, h1);
    bad = 0;
    for (int i = 0; i < 65536; i++) {
        const f16_t r = fp32_to_fp16(f[i]);
        if (isnan(f[i]) ? (h1[i] & 0x7fff) <= 0x7c00 : r != h1[i]) bad++;
    }
    CHECK(bad == 0, "f32_to_f16: %d bad", bad);
    /* float helpers */
    for (int n = 1; n < 300; n += 37) {
        for (int i = 0; i < n; i++) { h[i] = fp32_to_fp16(frnd()); f[i] = frnd(); f1[i] = frnd(); }
        float r0, r1;
        double mag = 0;
        for (int i = 0; i < n; i++) mag += fabs(fp16_to_fp32(h[i]) * f[i]);
        pyllm_kernel_float(0, 2, n, h, f, 0, &r0);
        pyllm_kernel_float(ISA_NEON, 2, n, h, f, 0, &r1);
        CHECK(fabs(r0 - r1) <= 2e-6 * mag, "dot_f16_f32 n %d", n);
        mag = 0;
        for (int i = 0; i < n; i++) mag += fabs(f1[i] * f[i]);
        pyllm_kernel_float(0, 4, n, f1, f, 0, &r0);
        pyllm_kernel_float(ISA_NEON, 4, n, f1, f, 0, &r1);
        CHECK(fabs(r0 - r1) <= 2e-6 * mag, "dot_f32 n %d", n);
        memcpy(o0, f1, n * 4);
        memcpy(o1, f1, n * 4);
        pyllm_kernel_float(0, 3, n, h, NULL, 0.37f, o0);
        pyllm_kernel_float(ISA_NEON, 3, n, h, NULL, 0.37f, o1);
        for (int i = 0; i < n; i++) CHECK(fabs(o0[i] - o1[i]) <= 1.2e-7 * (fabs(f1[i]) + fabs(0.37f * fp16_to_fp32(h[i]))), "axpy");
    }
    /* vector math: against the scalar reference (both meet the bounds of
     * quants.c, so they are within twice them of each other), and exactly
     * position-independent */
    {
        static float g[1000], u[1000], r0[1000], r1[1000], r2[1000];
        for (int i = 0; i < 1000; i++) { g[i] = frnd() * ((i % 3) ? 4.0f : 30.0f); u[i] = frnd(); }
        g[0] = 100, g[1] = -100, g[2] = 0, g[3] = -3e38f, g[4] = 89.0f, g[5] = -89.0f, g[6] = -87.5f;
        for (int which = 0; which < 2; which++) {
            CHECK(pyllm_kernel_vmath(0, which, 1000, g, u, 0, r0, NULL) == 0, "vmath rc");
            CHECK(pyllm_kernel_vmath(ISA_NEON, which, 1000, g, u, 0, r1, NULL) == 0, "vmath rc");
            int bad = 0;
            for (int i = 0; i < 1000; i++) {
                const double b = which == 0 ? 2e-6 * fabs(r0[i]) + 1e-30 : 2e-6 * fmax(1, fabs(g[i])) * fabs(u[i]);
                if (!(fabs((double)r1[i] - r0[i]) <= b)) bad++;
            }
            CHECK(bad == 0, "glu %d: %d bad", which, bad);
            for (int off = 1; off < 8; off++) {
                pyllm_kernel_vmath(ISA_NEON, which, 13, g + off, u + off, 0, r2, NULL);
                CHECK(memcmp(r2, r1 + off, 13 * 4) == 0, "glu %d at offset %d", which, off);
            }
        }
        for (int i = 0; i < 1000; i++) g[i] = 0.5f - fabsf(frnd()) * ((i % 3) ? 5.0f : 100.0f);
        g[7] = -__builtin_inff();
        float s0, s1, s2;
        pyllm_kernel_vmath(0, 2, 1000, g, NULL, 0.5f, r0, &s0);
        pyllm_kernel_vmath(ISA_NEON, 2, 1000, g, NULL, 0.5f, r1, &s1);
        int bad = 0;
        for (int i = 0; i < 1000; i++)
            if (!(fabs((double)r1[i] - r0[i]) <= 8e-7 * r0[i] + 1.2e-38)) bad++;
        CHECK(bad == 0 && r1[7] == 0.0f, "exp_sum: %d bad", bad);
        CHECK(fabs((double)s1 - s0) <= 2e-6 * s0, "exp_sum sum %g vs %g", s1, s0);
        for (int off = 1; off < 6; off++) {
            pyllm_kernel_vmath(ISA_NEON, 2, 21, g + off, NULL, 0.5f, r2, &s2);
            CHECK(memcmp(r2, r1 + off, 21 * 4) == 0, "exp_sum at offset %d", off);
        }
        {   /* wsum_many_f32 / _f16: each output exactly wsum_f32's (rows contiguous for it) */
            static float xs[37 * 70], xc[37 * 70], wq[5 * 40], y0[5 * 80], y1[5 * 80], y2[5 * 80];
            static f16_t xh[37 * 70];
            const int ns[5] = {5, 16, 20, 64, 67}, nqs[4] = {1, 2, 3, 5}, rows = 37, ld = 70, ws = 40, ys = 80;
            CHECK(pyllm_kernel_provided(ISA_NEON, 5, 5) && pyllm_kernel_provided(ISA_NEON, 5, 6), "wsum_many provided");
            for (int a = 0; a < 5; a++)
                for (int b = 0; b < 4; b++) {
                    const int n = ns[a], nq = nqs[b];
                    for (int i = 0; i < rows * ld; i++) { xh[i] = fp32_to_fp16(frnd()); xs[i] = fp16_to_fp32(xh[i]); }
                    for (int i = 0; i < 5 * 40; i++) wq[i] = frnd();
                    for (int i = 0; i < 5 * 80; i++) y0[i] = y1[i] = y2[i] = frnd();
                    CHECK(pyllm_kernel_wsum(ISA_NEON, n, rows, nq, wq, ws, xs, ld, y1, ys) == 0, "wsum rc");
                    CHECK(pyllm_kernel_wsum_f16(ISA_NEON, n, rows, nq, wq, ws, xh, ld, y2, ys) == 0, "wsum f16 rc");
                    for (int r = 0; r < rows; r++) memcpy(xc + r * n, xs + r * ld, (size_t)n * 4);
                    for (int q = 0; q < nq; q++)
                        pyllm_kernel_vmath(ISA_NEON, 4, n, xc, wq + q * ws, (float)rows, y0 + q * ys, NULL);
                    CHECK(memcmp(y0, y1, sizeof y0) == 0, "wsum_many_f32 n %d nq %d", n, nq);
                    CHECK(memcmp(y0, y2, sizeof y0) == 0, "wsum_many_f16 n %d nq %d", n, nq);
                }
        }
        {   /* softcap: within twice the bound of the scalar reference, position-independent */
            const float cap[1] = {30.0f};
            for (int i = 0; i < 1000; i++) g[i] = frnd() * ((i % 4) ? 40.0f : 0.5f);
            g[0] = 0.3f, g[1] = -0.3f, g[2] = 9.0f, g[3] = -1e-30f, g[4] = 3e38f, g[5] = -3e38f;
            pyllm_kernel_vmath(0, 7, 1000, g, cap, 0.5f, r0, NULL);
            pyllm_kernel_vmath(ISA_NEON, 7, 1000, g, cap, 0.5f, r1, NULL);
            int bad = 0;
            for (int i = 0; i < 1000; i++)
                if (!(fabs((double)r1[i] - r0[i]) <= 2e-6 * fabs(r0[i]) + 2e-12 * cap[0])) bad++;
            CHECK(bad == 0, "softcap: %d bad", bad);
            for (int off = 1; off < 6; off++) {
                pyllm_kernel_vmath(ISA_NEON, 7, 11, g + off, cap, 0.5f, r2, NULL);
                CHECK(memcmp(r2, r1 + off, 11 * 4) == 0, "softcap at offset %d", off);
            }
        }
        for (int i = 0; i < 1000; i++) r0[i] = r1[i] = frnd();
        pyllm_kernel_vmath(0, 3, 999, u, NULL, 0.37f, r0, NULL);
        pyllm_kernel_vmath(ISA_NEON, 3, 999, u, NULL, 0.37f, r1, NULL);
        bad = 0;
        for (int i = 0; i < 999; i++)
            if (!(fabs((double)r1[i] - r0[i]) <= 2.4e-7 * (fabs(r0[i]) + fabs(0.37f * u[i])))) bad++;
        CHECK(bad == 0, "axpy_f32: %d bad", bad);
        for (int i = 0; i < 1000; i++) g[i] = frnd();
        for (int n = 1; n < 70; n += 9) {
            const int rows = 1 + n % 6;
            for (int i = 0; i < n; i++) r0[i] = r1[i] = frnd();
            pyllm_kernel_vmath(0, 4, n, g, u, (float)rows, r0, NULL);
            pyllm_kernel_vmath(ISA_NEON, 4, n, g, u, (float)rows, r1, NULL);
            bad = 0;
            for (int j = 0; j < n; j++) {
                double mag = fabs(r0[j]);
                for (int i = 0; i < rows; i++) mag += fabs(u[i] * g[i * n + j]);
                if (!(fabs((double)r1[j] - r0[j]) <= 2.4e-7 * (rows + 1) * mag)) bad++;
            }
            CHECK(bad == 0, "wsum_f32 n %d: %d bad", n, bad);
        }
    }
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}
"""

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def neon_harness(tmp_path_factory):
    """the harness, built as setup.py builds the core on aarch64: neon.c with the
    baseline flags, neon_dotprod.c with +dotprod"""
    d = tmp_path_factory.mktemp("neon")
    (d / "harness.c").write_text(NEON_HARNESS)
    c = os.path.join(ROOT, "csrc")
    objs = []
    for src, flags in [("arm/neon_dotprod.c", ["-march=armv8.2-a+dotprod"])] + [
            (f, []) for f in ["quants.c", "dispatch.c", "kernel_api.c", "arm/neon.c", str(d / "harness.c")]]:
        obj = d / (os.path.basename(src) + ".o")
        r = subprocess.run(["aarch64-linux-gnu-gcc", "-O2", "-std=c11", "-Wall", "-Wno-unused-function", "-pthread",
                            *flags, "-I" + c, "-c", "-o", str(obj), os.path.join(c, src)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        objs.append(str(obj))
    exe = d / "harness"
    r = subprocess.run(["aarch64-linux-gnu-gcc", "-static", "-pthread", "-o", str(exe), *objs, "-lm"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return exe


# -cpu max has SDOT; PYLLM_NEON_DOTPROD=0 turns it off; a Cortex-A53 lacks it
# (dispatch must see that from HWCAP and never run an SDOT)
@pytest.mark.parametrize("cpu,env,level", [pytest.param("max", {}, "neon+dotprod", id="dotprod"),
                                           pytest.param("max", {"PYLLM_NEON_DOTPROD": "0"}, "neon", id="dotprod_off"),
                                           pytest.param("cortex-a53", {}, "neon", id="armv8")])
@pytest.mark.skipif(not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")),
                    reason="needs aarch64-linux-gnu-gcc and qemu-aarch64")
def test_neon_under_qemu(neon_harness, cpu, env, level):
    r = subprocess.run(["qemu-aarch64", "-cpu", cpu, str(neon_harness)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, **env})
    assert r.returncode == 0, r.stdout[-3000:]
    assert f"level {level}\n" in r.stdout
    assert "checks, 0 failed" in r.stdout and int(r.stdout.split()[-4]) > 1000

