"""Tests of pyllm.iquants, the numpy IQ4_NL / IQ4_XS quantizers.

gguf.quants.dequantize is the ground truth for the byte layout. For each format: decoding
lands close to the input on normal and heavy-tailed data; zeros encode to scale 0 and decode
to zeros; the importance matrix moves the error to the unimportant columns; passes of a few
rows give the same bytes; and the bytes equal llama.cpp's: the digests were made by
llama.cpp's quantize_iq4_nl / quantize_iq4_xs (ggml_quantize_chunk of libggml-base,
llama-cpp-python 0.3.36) on test_kquants' golden_input(), with and without its
golden_importance(), once, by hand (on 64 rows of 4096 normal and Student-t(3) values, with
and without importances, every block agreed too).
"""
import hashlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize

from pyllm import iquants as iq
from test_kquants import golden_importance, golden_input, rel_rms

FORMATS = {"iq4_nl": (iq.quantize_iq4_nl, GT.IQ4_NL, 32, 18), "iq4_xs": (iq.quantize_iq4_xs, GT.IQ4_XS, 256, 136)}
GOLDEN = {
    "iq4_nl": "db488a1a750959ab663771008afc12cbec3f1c938a8126662ad72b13601c5025",
    "iq4_xs": "e76cac6880ab54026d86db0353d69951e028130d956f98d050189cb8256fad1f",
}
GOLDEN_IMATRIX = {
    "iq4_nl": "a762f66873182bb3a870843b269127a11c27ceb584f30ff9ba34d9036f1fd79c",
    "iq4_xs": "97bbda21409dcdfacc740aac5aab537a69ca0e2455d0dd15e48c04a055f1762b",
}


def roundtrip(fmt, x, qw=None):
    quant, gtype, block, bb = FORMATS[fmt]
    q = quant(x, qw)
    assert q.dtype == np.uint8 and q.shape == (x.shape[0], x.shape[1] // block * bb)
    return q, dequantize(q, gtype).reshape(x.shape)


@pytest.mark.parametrize("fmt", FORMATS)
def test_bit_identical_to_llama_cpp(fmt):
    q = FORMATS[fmt][0](golden_input())
    assert hashlib.sha256(q.tobytes()).hexdigest() == GOLDEN[fmt]
    q = FORMATS[fmt][0](golden_input(), golden_importance())
    assert hashlib.sha256(q.tobytes()).hexdigest() == GOLDEN_IMATRIX[fmt]


@pytest.mark.parametrize("fmt", FORMATS)
def test_decodes_close_to_the_input(fmt):
    """The worst row's relative RMS error over 20 seeds (measured: IQ4_NL 0.080 normal, 0.120
    Student-t(3); IQ4_XS 0.081, 0.121), with a margin."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        for x, bound in ((rng.standard_normal((6, 1024)), 0.1), (rng.standard_t(3, (6, 1024)), 0.135)):
            x = x.astype(np.float32)
            assert rel_rms(x, roundtrip(fmt, x)[1]).max() < bound


@pytest.mark.parametrize("fmt", FORMATS)
def test_zeros_and_chunking(fmt, monkeypatch):
    x = np.zeros((2, 512), np.float32)
    x[1, 40:300] = np.linspace(-1, 1, 260)
    q, y = roundtrip(fmt, x)
    assert not y[0].any() and q[0, :2].view(np.float16)[0] == 0   # a zero block: d = 0 (IQ4_XS: -0, as llama.cpp's)
    assert np.abs(y[1] - x[1]).max() < 0.15
    rng = np.random.default_rng(5)
    x = rng.standard_normal((5, 768)).astype(np.float32)
    whole = FORMATS[fmt][0](x, golden_importance()[:768])
    monkeypatch.setattr(iq, "CHUNK_VALUES", 1)           # a row per pass
    assert np.array_equal(FORMATS[fmt][0](x, golden_importance()[:768]), whole)
    with pytest.raises(ValueError, match="multiple"):
        FORMATS[fmt][0](x[:, :700])
    with pytest.raises(ValueError, match="importances"):
        FORMATS[fmt][0](x, golden_importance()[:512])


@pytest.mark.parametrize("fmt", FORMATS)
def test_importance_moves_the_error_to_unimportant_columns(fmt):
    x = np.random.default_rng(11).standard_normal((32, 1024)).astype(np.float32)
    qw = np.where(np.arange(1024) % 2 == 0, 100.0, 1.0).astype(np.float32)
    important = np.arange(1024) % 2 == 0
    err = [((roundtrip(fmt, x, w)[1] - x)[:, important] ** 2).mean() for w in (None, qw)]
    assert err[1] < 0.9 * err[0], err


def test_best_index_is_the_nearest_book_value():
    al = np.concatenate([np.linspace(-140, 130, 2001), iq.VALUES.astype(np.float64),
                         (iq.VALUES[:-1].astype(np.float64) + iq.VALUES[1:]) / 2]).astype(np.float32)
    got = iq.best_index(al)
    dist = np.abs(al[:, None] - iq.VALUES[None, :].astype(np.float32))
    nearest = np.where(dist == dist.min(axis=1, keepdims=True), np.arange(16), -1).max(axis=1)   # ties go up
    np.testing.assert_array_equal(got, nearest)
    edges = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 127.4, 127.5, -127.9], np.float32)
    np.testing.assert_array_equal(iq.best_index(edges), [15, 15, 0, 15, 0, 15, 15, 0])   # C's answers


def test_c_grids_header_is_generated_from_gguf():
    """csrc/iq_grids.h is what c_grids_header() makes of gguf-py's grids (regenerate it with
    python -c "from pyllm import iquants; open('csrc/iq_grids.h', 'w').write(iquants.c_grids_header())")"""
    from pathlib import Path
    header = Path(__file__).resolve().parent.parent / "csrc" / "iq_grids.h"
    assert header.read_text() == iq.c_grids_header()
    g = iq.grid("IQ3_S")
    assert g.shape == (512, 4) and set(np.unique(g)) == set(range(1, 16, 2))
    assert "0x0101010fu" in header.read_text().split("\n")[9]   # point 4 = (15, 1, 1, 1), byte 0 first
    g1 = iq.grid("IQ1_S")   # -1, 0, 1 stored as 0, 1, 2: ggml's point 0 is all -1, point 1 ends in +1
    assert g1.shape == (2048, 8) and set(np.unique(g1)) == {0, 1, 2}
    assert (g1[0] == 0).all() and list(g1[1]) == [2, 0, 0, 0, 0, 0, 0, 0]
