"""Tests of the dense float row kernels (csrc/dense.c: the vision encoder's softmax,
activation and layer norm), every level this CPU has (scalar always) against float64
numpy, at sizes around the vector widths (1, 15, 16, 17, 255, 256, 257 ...), and
each SIMD level against the scalar one."""
import numpy as np
import pytest

from pyllm._native import ffi, lib

LEVELS = [i for i in range(4) if lib.pyllm_level_available(i)]
SIZES = [1, 7, 15, 16, 17, 31, 33, 255, 256, 257, 1000, 4099]


def fptr(a):
    return ffi.cast("float *", a.ctypes.data)


def softmax(isa, x, n, ld):
    rows = x.size // ld
    sums = np.zeros(max(rows, 1), np.float32)
    assert lib.pyllm_dense_softmax_rows(isa, fptr(x), rows, n, ld, fptr(sums)) == 0
    return x, sums[:rows]


@pytest.mark.parametrize("isa", LEVELS)
@pytest.mark.parametrize("n", SIZES)
def test_softmax_rows(isa, n):
    rng = np.random.default_rng(n)
    ld = n + 3                                     # rows ld floats apart: the padding stays as it was
    x = (rng.standard_normal((5, ld)) * rng.choice([0.1, 3, 30], (5, 1))).astype(np.float32)
    masked = n > 1 and n // 2                      # a masked score gives 0 (a row of one: not masked)
    if masked:
        x[1, masked] = -np.inf
    x[2, :n] = 7.0                                 # a flat row: all ones
    # the kernel's differences are float32, like its input: exp of those, exactly
    want = np.exp((x[:, :n] - x[:, :n].max(axis=1, keepdims=True)).astype(np.float64))
    pad = x[:, n:].copy()
    got, sums = softmax(isa, x.reshape(-1), n, ld)
    got = got.reshape(5, ld)
    np.testing.assert_allclose(got[:, :n], want, rtol=4e-7, atol=1.2e-38)
    np.testing.assert_allclose(sums, want.sum(axis=1), rtol=4e-6)      # float32 sums of up to 4099
    np.testing.assert_array_equal(got[:, n:], pad)
    assert (not masked or got[1, masked] == 0) and np.all(got[2, :n] == 1.0)


def gelu64(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf64(x):
    from math import erf
    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


def quick_gelu64(x):
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-1.702 * x))


@pytest.mark.parametrize("isa", LEVELS)
@pytest.mark.parametrize("act, want", [(lib.DENSE_GELU_TANH, gelu64), (lib.DENSE_QUICK_GELU, quick_gelu64),
                                       (lib.DENSE_GELU_ERF, gelu_erf64)])
@pytest.mark.parametrize("n", SIZES)
def test_activation(isa, act, want, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * rng.choice([0.1, 1, 3, 10], n)).astype(np.float32)
    x[:min(n, 6)] = np.array([0, -0.0, 5, -5, 30, -30], np.float32)[:min(n, 6)]
    ref = want(x.astype(np.float64))
    got = x.copy()
    assert lib.pyllm_dense_activation(isa, act, fptr(got), 1, n, ffi.NULL) == 0
    # the GLU kernels' bound (quants.c): 1e-6 max(1, |x|)
    assert np.all(np.abs(got - ref) <= 1e-6 * np.maximum(1, np.abs(x)))
    rows = (x[None, :] * np.array([[1.0], [0.5], [-2.0]], np.float32))        # 3 rows and a bias added first
    bias = rng.standard_normal(n).astype(np.float32)
    pre = (rows + bias).astype(np.float32)
    got = rows.copy()
    assert lib.pyllm_dense_activation(isa, act, fptr(got), 3, n, fptr(bias)) == 0
    assert np.all(np.abs(got - want(pre.astype(np.float64))) <= 1e-6 * np.maximum(1, np.abs(pre)))


def silu64(x):
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-x))


@pytest.mark.parametrize("isa", LEVELS)
@pytest.mark.parametrize("act, want", [(lib.DENSE_GELU_TANH, gelu64), (lib.DENSE_QUICK_GELU, quick_gelu64),
                                       (lib.DENSE_SILU, silu64)])
@pytest.mark.parametrize("n", SIZES)
def test_gated(isa, act, want, n):
    """Rows of [gate | up]: act(gate) * up in the gate half, the up half as it was."""
    rng = np.random.default_rng(n + 2)
    x = (rng.standard_normal((3, 2 * n)) * rng.choice([0.1, 1, 3, 10], (3, 2 * n))).astype(np.float32)
    x[0, :min(n, 6)] = np.array([0, -0.0, 5, -5, 30, -30], np.float32)[:min(n, 6)]
    gate, up = x[:, :n].astype(np.float64), x[:, n:].copy()
    ref = want(gate) * up
    got = x.copy()
    assert lib.pyllm_dense_gated(isa, act, fptr(got), 3, n) == 0
    np.testing.assert_array_equal(got[:, n:], up)
    assert np.all(np.abs(got[:, :n] - ref) <= 1e-6 * np.maximum(1, np.abs(gate)) * np.maximum(1, np.abs(up)))
    scalar = x.copy()
    assert lib.pyllm_dense_gated(0, act, fptr(scalar), 3, n) == 0
    assert np.all(np.abs(got - scalar) <= 2e-6 * np.maximum(1, np.abs(x)) * np.maximum(1, np.abs(np.tile(up, 2))))


@pytest.mark.parametrize("n", SIZES)
def test_levels_agree_with_scalar(n):
    rng = np.random.default_rng(n + 1)
    x = (rng.standard_normal((3, n)) * 4).astype(np.float32)
    scalar_s, scalar_sum = softmax(0, x.copy().reshape(-1), n, n)
    for isa in LEVELS[1:]:
        s, total = softmax(isa, x.copy().reshape(-1), n, n)
        np.testing.assert_allclose(s, scalar_s, rtol=8e-7, atol=1e-38)
        np.testing.assert_allclose(total, scalar_sum, rtol=8e-6)
        for act in (lib.DENSE_GELU_TANH, lib.DENSE_QUICK_GELU, lib.DENSE_GELU_ERF):
            a, b = x.copy(), x.copy()
            assert lib.pyllm_dense_activation(0, act, fptr(a), 3, n, ffi.NULL) == 0
            assert lib.pyllm_dense_activation(isa, act, fptr(b), 3, n, ffi.NULL) == 0
            assert np.all(np.abs(b - a) <= 2e-6 * np.maximum(1, np.abs(x)))


@pytest.mark.parametrize("n", [1, 2, 17, 1152])
@pytest.mark.parametrize("affine", [False, True])
def test_layernorm(n, affine):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((6, n)) * 3 + 5).astype(np.float32)
    w, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-6)
    if affine:
        want = want * w + b
    y = np.zeros_like(x)
    wp, bp = (fptr(w), fptr(b)) if affine else (ffi.NULL, ffi.NULL)
    assert lib.pyllm_dense_layernorm(fptr(x), fptr(y), 6, n, wp, bp, 1e-6) == 0
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-6 * max(1.0, np.abs(want).max()))
    assert lib.pyllm_dense_layernorm(fptr(x), fptr(x), 6, n, wp, bp, 1e-6) == 0   # in place
    np.testing.assert_array_equal(x, y)


def test_bad_arguments_are_refused():
    x, s = np.zeros(16, np.float32), np.zeros(4, np.float32)
    assert lib.pyllm_dense_softmax_rows(0, fptr(x), 2, 8, 7, fptr(s)) == -1         # ld < n
    assert lib.pyllm_dense_softmax_rows(0, fptr(x), 2, 0, 8, fptr(s)) == -1         # empty rows
    assert lib.pyllm_dense_softmax_rows(0, ffi.NULL, 2, 8, 8, fptr(s)) == -1
    assert lib.pyllm_dense_softmax_rows(9, fptr(x), 2, 8, 8, fptr(s)) == -1         # no such level
    assert lib.pyllm_dense_softmax_rows(0, fptr(x), 0, 8, 8, fptr(s)) == 0          # no rows: nothing to do
    assert lib.pyllm_dense_activation(0, 7, fptr(x), 1, 16, ffi.NULL) == -1         # no such activation
    assert lib.pyllm_dense_activation(0, 0, fptr(x), 1, 0, ffi.NULL) == -1
    assert lib.pyllm_dense_activation(0, 0, fptr(x), -1, 16, ffi.NULL) == -1
    assert lib.pyllm_dense_gated(0, 7, fptr(x), 1, 8) == -1                           # no such activation
    assert lib.pyllm_dense_gated(0, lib.DENSE_SILU, fptr(x), 1, 0) == -1
    assert lib.pyllm_dense_gated(9, lib.DENSE_SILU, fptr(x), 1, 8) == -1
    assert lib.pyllm_dense_gated(0, lib.DENSE_SILU, ffi.NULL, 1, 8) == -1
    assert lib.pyllm_dense_layernorm(fptr(x), fptr(x), 2, 8, ffi.NULL, ffi.NULL, 0.0) == -1   # eps 0
    assert lib.pyllm_dense_layernorm(fptr(x), fptr(x), -1, 8, ffi.NULL, ffi.NULL, 1e-6) == -1
