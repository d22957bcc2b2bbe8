"""LFM2-Audio's FastConformer (pyllm/conformer.py, projector "lfm2a") against slow float64 numpy
written here as NeMo's encoder (and mtmd's graph) computes it: the spectrogram by a DFT from its
definition (pre-emphasis, a symmetric Hann window, per-bin standardization), the sub-sampling
convolutions loop by loop, the relative attention with Transformer-XL's shift done as written
(pad a column, reshape, drop a row), the prompt (the rows alone), and a whole prompt against the
numpy reference given the same rows. benchmarks/compare_audio.py compares with llama.cpp's mtmd.
"""
import math

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from pyllm import Model
from pyllm.audio import open_audio_encoder, wav_bytes
from pyllm.conformer import Lfm2AudioEncoder, nemo_log_mel
from pyllm.errors import InvalidArgumentError, ModelFileError
from test_audio import assert_prompt_matches_the_reference, slow_filters, sound

N_MEL = 32


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("lfm2a")
    return {"lm": synth.write_llama(d / "lm.gguf", QT.F32, n_vocab=512, context_length=4096),
            "f32": synth.write_lfm2_audio_mmproj(d / "f32.gguf", n_mel=N_MEL, qtype=QT.F32),
            "f16": synth.write_lfm2_audio_mmproj(d / "f16.gguf", n_mel=N_MEL, n_layer=1, taps=5),
            "dir": d}


def slow_log_mel(x: np.ndarray, n_mel: int) -> np.ndarray:
    """NeMo's log-mel, float64 [samples / 160 + 1, n_mel]: pre-emphasis 0.97, 256 zeros either
    side, a symmetric Hann of 400 centred in a 512-point DFT (its definition), power through
    Slaney's filters, ln(v + 2^-24), each bin standardized over the sound's own frames
    (unbiased, std + 1e-5), the frame after them zero."""
    x = np.asarray(x, np.float64)
    y = x.copy()
    y[1:] = x[1:] - 0.97 * x[:-1]
    padded = np.concatenate([np.zeros(256), y, np.zeros(256)])
    n = np.arange(512)
    dft = np.exp(-2j * np.pi * np.outer(np.arange(257), n) / 512)
    window = np.zeros(512)
    window[56:456] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 399)
    frames = np.stack([padded[i:i + 512] for i in range(0, len(padded) - 511, 160)])
    mel = np.log(np.abs((frames * window) @ dft.T) ** 2 @ slow_filters(n_mel, n_fft=512).T + 2.0 ** -24)
    k = len(x) // 160
    out = np.zeros_like(mel)
    out[:k] = (mel[:k] - mel[:k].mean(0)) / (mel[:k].std(0, ddof=1) + 1e-5)
    return out


@pytest.mark.parametrize("seconds", [0.02, 0.37, 1.0])
def test_log_mel_matches_the_definition(seconds):
    x = sound(seconds)
    got, want = nemo_log_mel(x, N_MEL), slow_log_mel(x, N_MEL)
    assert got.shape == want.shape == (len(x) // 160 + 1, N_MEL)
    np.testing.assert_allclose(got, want, atol=5e-5)
    with pytest.raises(InvalidArgumentError, match="too short for LFM2-Audio"):
        nemo_log_mel(x[:300], N_MEL)


def slow_lfm2_encode(enc: Lfm2AudioEncoder, mel: np.ndarray) -> np.ndarray:
    def f(name):
        return enc.floats(name).astype(np.float64)

    def lin(v, name, bias=True):
        out = v @ f(name + ".weight").T
        return out + f(name + ".bias") if bias and enc.mf.has_tensor(name + ".bias") else out

    def ln(v, name):
        return (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + 1e-5) * f(name + ".weight") \
            + f(name + ".bias")

    def silu(v):
        return v / (1 + np.exp(-v))

    def conv(img, w, b, groups):      # [c, H, W] by [out, c / groups, 3, 3], stride 2, a zero all round
        p = np.pad(img, ((0, 0), (1, 1), (1, 1)))
        h, w_ = (img.shape[1] - 1) // 2 + 1, (img.shape[2] - 1) // 2 + 1
        out = np.empty((len(w), h, w_))
        for y in range(h):
            for x in range(w_):
                patch = p[:, 2 * y:2 * y + 3, 2 * x:2 * x + 3]
                out[:, y, x] = np.einsum("ocij,cij->o", w, patch) if groups == 1 else \
                    np.einsum("cij,cij->c", w[:, 0], patch)
        return out + b.reshape(-1, 1, 1)

    x = mel.astype(np.float64)[None]
    x = np.maximum(conv(x, f("a.conv1d.0.weight"), f("a.conv1d.0.bias"), 1), 0)
    for dw, pw in ((2, 3), (5, 6)):
        x = conv(x, f(f"a.conv1d.{dw}.weight"), f(f"a.conv1d.{dw}.bias"), "depthwise")
        x = np.einsum("oc,chw->ohw", f(f"a.conv1d.{pw}.weight")[:, :, 0, 0], x) + f(f"a.conv1d.{pw}.bias").reshape(-1, 1, 1)
        x = np.maximum(x, 0)
    T = x.shape[1]
    x = lin(x.transpose(1, 0, 2).reshape(T, -1), "a.pre_encode.out")         # [T, c F]
    n, H = enc.n_embd, enc.n_head
    d = n // H
    inv = np.exp(-(math.log(10000) / n) * np.arange(0, n, 2))
    pe = np.zeros((2 * T - 1, n))
    for pos in range(2 * T - 1):
        pe[pos, 0::2] = np.sin((T - 1 - pos) * inv)
        pe[pos, 1::2] = np.cos((T - 1 - pos) * inv)
    for i in range(enc.n_layer):
        p = f"a.blk.{i}."
        x = x + 0.5 * lin(silu(lin(ln(x, p + "ffn_norm"), p + "ffn_up")), p + "ffn_down")
        h = ln(x, p + "ln1")
        q, k, v = (lin(h, p + m).reshape(T, H, d) for m in ("attn_q", "attn_k", "attn_v"))
        pos = (pe @ f(p + "linear_pos.weight").T).reshape(2 * T - 1, H, d)
        u, w = f(p + "pos_bias_u"), f(p + "pos_bias_v")                         # [H, d]
        heads = []
        for j in range(H):
            ac = (q[:, j] + u[j]) @ k[:, j].T
            bd = (q[:, j] + w[j]) @ pos[:, j].T                                 # [T, 2T - 1]
            bd = np.pad(bd, ((0, 0), (1, 0))).reshape(2 * T, T)[1:].reshape(T, 2 * T - 1)[:, :T]   # the shift
            s = (ac + bd) / math.sqrt(d)
            e = np.exp(s - s.max(axis=1, keepdims=True))
            heads.append((e / e.sum(axis=1, keepdims=True)) @ v[:, j])
        x = x + lin(np.concatenate(heads, axis=1), p + "attn_out")
        g = lin(ln(x, p + "norm_conv"), p + "conv_pw1")
        g = g[:, :n] / (1 + np.exp(-g[:, n:]))
        wd = f(p + "conv_dw.weight")
        taps = wd.shape[1]
        gp = np.concatenate([np.zeros((taps // 2, n)), g, np.zeros((taps - 1 - taps // 2, n))])
        y = np.stack([(gp[t:t + taps] * wd.T).sum(axis=0) for t in range(T)]) + f(p + "conv_dw.bias")
        y = y * f(p + "conv_norm.weight") + f(p + "conv_norm.bias")
        x = x + lin(silu(y), p + "conv_pw2")
        x = x + 0.5 * lin(silu(lin(ln(x, p + "ffn_norm_1"), p + "ffn_up_1")), p + "ffn_down_1")
        x = ln(x, p + "ln2")
    u = lin(ln(x, "mm.a.mlp.0"), "mm.a.mlp.1")
    return lin(0.5 * u * (1 + np.vectorize(math.erf)(u / math.sqrt(2))), "mm.a.mlp.3")


@pytest.mark.parametrize("kind, seconds", [("f32", 1.0), ("f32", 0.25), ("f16", 0.6)])
def test_the_encoder_matches_the_slow_one(files, kind, seconds):
    enc = open_audio_encoder(files[kind], n_threads=3)
    assert isinstance(enc, Lfm2AudioEncoder) and enc.n_out == 256
    mel = enc.log_mel(sound(seconds))
    got = enc.encode_mel(mel)
    want = slow_lfm2_encode(enc, mel[0])
    assert got.shape == want.shape == (enc.rows_for(len(mel[0])), 256)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    enc.close()


def test_bad_lfm2_audio_files(tmp_path):
    for drop, said in (("a.blk.1.pos_bias_v", "pos_bias_v is missing"),
                       ("a.conv1d.5.bias", "conv1d.5.bias is missing"),
                       ("a.blk.0.conv_norm.bias", "conv_norm.bias is missing"),
                       ("mm.a.mlp.3.weight", "mm.a.mlp.3.weight is missing")):
        broken = synth.write_lfm2_audio_mmproj(tmp_path / "broken.gguf", drop_tensor=drop)
        with pytest.raises(ModelFileError, match=said):
            open_audio_encoder(broken)


def test_a_prompt_with_an_lfm2_sound(files):
    m = Model(files["lm"], mmproj=files["f32"], n_ctx=2048)
    assert isinstance(m.audio, Lfm2AudioEncoder)
    data = wav_bytes(sound(1.0))
    ids = m.media_prompt("hear: <__media__> now", [data])
    rows = [t for t in ids if t < 0]
    assert len(rows) == 13                                  # 101 frames -> 51 -> 26 -> 13
    first = next(i for i, t in enumerate(ids) if t < 0)
    assert ids[:first] == m.tokenize("hear: ", special=True)
    ids = assert_prompt_matches_the_reference(m, files["lm"], data)
    np.testing.assert_array_equal(m.engine.media.rows([t for t in ids if t < 0]), m.audio.encode(data))
    m.close()
