"""Gemma 4's audio conformer (pyllm/conformer.py) against slow float64 numpy written here the way
transformers' Gemma4AudioModel computes it (the spectrogram by a DFT from its definition; the
attention in blocks of 12 rows with 12 rows of past, relative keys put in place by the
Transformer-XL shift, a mask), sounds cut into 30 s chunks as mtmd cuts them, the prompt's
<|audio> rows <audio|>, and a whole prompt against the numpy reference given the same rows.
benchmarks/compare_audio.py compares the same files with llama.cpp's mtmd, and
benchmarks/compare_hf_gemma4_audio.py with transformers itself.
"""
import math

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from pyllm import Model
from pyllm.audio import AudioEncoder, open_audio_encoder, wav_bytes
from pyllm.conformer import Gemma4AudioEncoder, gemma4_log_mel, htk_mel_filters
from pyllm.errors import InvalidArgumentError, ModelFileError, UnsupportedModelError
from test_audio import assert_prompt_matches_the_reference, sound

N_MEL = 32


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4a")
    return {"lm": synth.write_llama(d / "lm.gguf", QT.F32, n_vocab=512, image_tokens="audio", context_length=4096),
            "f32": synth.write_gemma4_audio_mmproj(d / "f32.gguf", n_mel=N_MEL, qtype=QT.F32),
            "f16": synth.write_gemma4_audio_mmproj(d / "f16.gguf", n_mel=N_MEL, n_layer=1, taps=3, clamp=1.0),
            "dir": d}


# -- the spectrogram, slowly ---------------------------------------------------------------------------

def slow_htk_filters(n_mel: int, n_fft: int = 512, rate: int = 16000, top: float = 8000.0) -> np.ndarray:
    """Triangles between corners evenly spaced on the HTK mel scale from 0 to 8 kHz, peak 1."""
    def to_mel(f):
        return 2595 * math.log10(1 + f / 700)
    corners = [700 * (10 ** (to_mel(top) * i / (n_mel + 1) / 2595) - 1) for i in range(n_mel + 2)]
    out = np.zeros((n_mel, n_fft // 2 + 1))
    for m in range(n_mel):
        lo, mid, hi = corners[m:m + 3]
        for k in range(n_fft // 2 + 1):
            f = k * rate / n_fft
            if lo <= f <= mid:
                out[m, k] = (f - lo) / (mid - lo)
            elif mid < f <= hi:
                out[m, k] = (hi - f) / (hi - mid)
    return out


def slow_log_mel(x: np.ndarray, n_mel: int) -> np.ndarray:
    """transformers' Gemma4AudioFeatureExtractor on one sound, float64 [frames, n_mel]: 160 zeros
    before it, frames of 320 samples every 160 (each kept only if its last sample is sound), a
    periodic Hann window, a 512-point DFT by its definition, magnitudes through the filters, log
    of value + 0.001."""
    x = np.concatenate([np.zeros(160), np.asarray(x, np.float64)])
    n = np.arange(320)
    dft = np.exp(-2j * np.pi * np.outer(np.arange(257), n) / 512)        # the 512-point DFT of 320 samples
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * n / 320)
    frames = [x[i:i + 320] for i in range(0, len(x) - 320, 160)]
    spectrum = np.abs((np.stack(frames) * hann) @ dft.T)
    return np.log(spectrum @ slow_htk_filters(n_mel).T + 1e-3)


def test_htk_filters_are_the_definition():
    np.testing.assert_allclose(htk_mel_filters(N_MEL), slow_htk_filters(N_MEL), atol=1e-12)
    assert htk_mel_filters(128).shape == (128, 257)


@pytest.mark.parametrize("seconds", [0.005, 0.0101, 0.0201, 0.37, 2.0])
def test_log_mel_matches_the_definition(seconds):
    x = sound(seconds)
    got = gemma4_log_mel(x, N_MEL)
    assert len(got) == 1
    if len(x) < 161:     # shorter than a frame's last sample: one frame of the sound and zeros (mtmd's)
        assert got[0].shape == (1, N_MEL)
        x = np.concatenate([x, np.zeros(161 - len(x), np.float32)])
    want = slow_log_mel(x, N_MEL)
    assert got[0].shape == want.shape == ((len(x) - 161) // 160 + 1, N_MEL)
    np.testing.assert_allclose(got[0], want, atol=2e-5)


def test_a_long_sound_is_cut_every_30_s():
    x = sound(41.0)
    chunks = gemma4_log_mel(x, N_MEL)
    assert [len(c) for c in chunks] == [2999, 1099]       # 30 s, then 11 s
    np.testing.assert_allclose(chunks[1], gemma4_log_mel(x[480000:], N_MEL)[0])


# -- the encoder, slowly ------------------------------------------------------------------------------

def slow_gemma4_encode(enc: Gemma4AudioEncoder, mel: np.ndarray) -> np.ndarray:
    """One chunk [frames, n_mel] through the conformer and projector, float64, as transformers'
    Gemma4AudioModel computes it: attention in blocks of 12 query rows against 24 rows (12 of
    past), relative keys for positions 12..0 shifted into place, softcapped, masked."""
    def f(name):
        return enc.floats(name).astype(np.float64)

    def clip(v, lo, hi):
        return np.clip(v, lo, hi)

    def lin(v, name, bias=False):
        lo, hi, out_lo, out_hi = enc.clamps.get(name + ".weight", (-np.inf, np.inf, -np.inf, np.inf))
        out = clip(v, lo, hi) @ f(name + ".weight").T
        return clip(out, out_lo, out_hi) + (f(name + ".bias") if bias else 0)

    def rms(v, name=None):
        v = v / np.sqrt((v * v).mean(-1, keepdims=True) + 1e-6)
        return v * f(name + ".weight") if name else v

    def silu(v):
        return v / (1 + np.exp(-v))

    x = mel.astype(np.float64)[None]                                  # [1 channel, frames, bins]
    for i in range(2):
        w = f(f"a.conv1d.{i}.weight")                                 # [out, in, 3, 3]
        p = np.pad(x, ((0, 0), (1, 1), (1, 1)))
        T, F = (x.shape[1] - 1) // 2 + 1, (x.shape[2] - 1) // 2 + 1
        y = np.stack([[np.einsum("ocij,cij->o", w, p[:, 2 * t:2 * t + 3, 2 * b:2 * b + 3]) for b in range(F)]
                      for t in range(T)])                              # [T, F, out]
        y = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-6) * f(f"a.conv1d.{i}.norm.weight")
        x = np.maximum(y, 0).transpose(2, 0, 1)
    x = lin(x.transpose(1, 2, 0).reshape(x.shape[1], -1), "a.input_projection")
    n, H = enc.n_embd, enc.n_head
    d, T = n // H, len(x)
    C, P = 12, 12
    S, B = C + P, -(-T // C)
    half = n // 2
    inv = np.exp(-np.arange(half) * math.log(10000) / (half - 1))
    pos = np.arange(P, -1, -1)[:, None] * inv                         # positions 12, 11, ..., 0
    pos_emb = np.concatenate([np.sin(pos), np.cos(pos)], axis=1)
    for i in range(enc.n_layer):
        p = f"a.blk.{i}."
        x = x + 0.5 * rms(lin(silu(lin(rms(x, p + "ffn_norm"), p + "ffn_up")), p + "ffn_down"), p + "ffn_post_norm")
        h = rms(x, p + "attn_pre_norm")
        q = lin(h, p + "attn_q").reshape(T, H, d) / math.sqrt(d) / math.log(2) * f(p + "per_dim_scale.weight")
        k = lin(h, p + "attn_k").reshape(T, H, d) * math.log(1 + math.e) / math.log(2)
        v = lin(h, p + "attn_v").reshape(T, H, d)
        rel = (pos_emb @ f(p + "attn_k_rel.weight").T).reshape(P + 1, H, d)
        qb = np.concatenate([q, np.zeros((B * C - T, H, d))]).reshape(B, C, H, d)
        kp = np.concatenate([np.zeros((P, H, d)), k, np.zeros((S * B, H, d))])
        vp = np.concatenate([np.zeros((P, H, d)), v, np.zeros((S * B, H, d))])
        out = np.zeros((B * C, H, d))
        for b in range(B):
            kb, vb = kp[b * C:b * C + S], vp[b * C:b * C + S]          # rows b C - 12 .. b C + 11
            for head in range(H):
                ac = qb[b, :, head] @ kb[:, head].T                    # [C, S]
                bd = qb[b, :, head] @ rel[:, head].T                   # [C, 13]
                bd = np.pad(bd, ((0, 0), (0, S + 1 - (P + 1)))).reshape(-1)[:C * S].reshape(C, S)   # the shift
                s = 50 * np.tanh((ac + bd) / 50)
                for c in range(C):
                    for j in range(S):
                        gq, gk = b * C + c, b * C - P + j
                        if not (0 <= gk < T and 0 <= gq - gk < P):
                            s[c, j] = -1e9
                e = np.exp(s - s.max(axis=1, keepdims=True))
                out[b * C:(b + 1) * C, head] = (e / e.sum(axis=1, keepdims=True)) @ vb[:, head]
        x = x + rms(lin(out[:T].reshape(T, n), p + "attn_out"), p + "attn_post_norm")
        ab = lin(rms(x, p + "conv_norm"), p + "conv_pw1")
        g = ab[:, :n] / (1 + np.exp(-ab[:, n:]))
        w = f(p + "conv_dw.weight")                                    # [n, taps]
        taps = w.shape[1]
        gp = np.concatenate([np.zeros((taps - 1, n)), g])
        y = np.stack([(gp[t:t + taps] * w.T).sum(axis=0) for t in range(T)])
        x = x + lin(silu(rms(y, p + "norm_conv")), p + "conv_pw2")
        x = x + 0.5 * rms(lin(silu(lin(rms(x, p + "ffn_norm_1"), p + "ffn_up_1")), p + "ffn_down_1"),
                          p + "ffn_post_norm_1")
        x = rms(x, p + "ln2")
    x = rms(lin(x, "a.pre_encode.out", bias=True))
    return lin(x, "mm.a.input_projection")


@pytest.mark.parametrize("kind, seconds", [("f32", 0.6), ("f16", 0.3), ("f32", 0.05)])
def test_the_encoder_matches_the_slow_one(files, kind, seconds):
    """Rows as transformers computes them (0.6 s: 15 rows, two blocks of 12; 0.05 s: 2 rows)."""
    enc = open_audio_encoder(files[kind], n_threads=3)
    assert isinstance(enc, Gemma4AudioEncoder) and enc.n_out == 256 and enc.rows_per_chunk == 750
    assert len(enc.clamps) == enc.n_layer * 10     # every matrix of a block but the relative keys'
    mel = enc.log_mel(sound(seconds))
    got = enc.encode_mel(mel)
    want = slow_gemma4_encode(enc, mel[0])
    n_rows = ((len(mel[0]) - 1) // 2) // 2 + 1
    assert got.shape == want.shape == (n_rows, 256)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    enc.close()


def test_chunks_are_encoded_each_on_its_own(files):
    enc = open_audio_encoder(files["f16"], n_threads=2)
    x = sound(31.0)
    rows = enc.encode(x)
    assert rows.shape == (750 + 25, 256)
    np.testing.assert_allclose(rows[750:], enc.encode(x[480000:]), rtol=0, atol=1e-6)
    with pytest.raises(InvalidArgumentError, match="a mel chunk must be"):
        enc.encode_mel([np.zeros((10, N_MEL + 1), np.float32)])
    enc.close()


def test_bad_gemma4_audio_files(files, tmp_path):
    for drop, said in (("a.blk.1.attn_k_rel.weight", "attn_k_rel.weight is missing"),
                       ("a.blk.0.conv_dw.weight", "conv_dw.weight is missing"),
                       ("a.conv1d.1.norm.weight", "conv1d.1.norm.weight is missing"),
                       ("mm.a.input_projection.weight", "mm.a.input_projection.weight is missing")):
        broken = synth.write_gemma4_audio_mmproj(tmp_path / "broken.gguf", drop_tensor=drop)
        with pytest.raises(ModelFileError, match=said):
            open_audio_encoder(broken)
    with pytest.raises(UnsupportedModelError, match="not Gemma 4's"):
        Gemma4AudioEncoder(synth.write_audio_mmproj(tmp_path / "qwen.gguf", projector="qwen2a"))
    with pytest.raises(UnsupportedModelError, match="'gemma4a' is not supported"):   # the Whisper reader refuses it
        AudioEncoder(files["f32"])


def test_a_prompt_with_a_gemma4_sound(files):
    m = Model(files["lm"], mmproj=files["f32"], n_ctx=2048)
    assert isinstance(m.audio, Gemma4AudioEncoder) and m.vision is None
    data = wav_bytes(sound(1.0))
    ids = m.media_prompt("hear: <__media__> now", [data])
    first = next(i for i, t in enumerate(ids) if t < 0)
    rows = [t for t in ids if t < 0]
    assert len(rows) == 25                                      # 1 s: 99 frames -> 50 -> 25 rows
    assert ids[:first] == m.tokenize("hear: <|audio>", special=True)
    assert ids[first + len(rows):] == m.tokenize("<audio|> now", special=True, add_bos=False)
    ids = assert_prompt_matches_the_reference(m, files["lm"], data)
    np.testing.assert_array_equal(m.engine.media.rows([t for t in ids if t < 0]), m.audio.encode(data))
    m.close()


def test_info_on_a_gemma4_audio_projector(files):
    import json

    from test_cli import pyllm
    r = pyllm("info", files["f32"], "--json")
    facts = json.loads(r.stdout)
    assert r.returncode == 0, r.stderr
    assert (facts["projector"], facts["window_s"], facts["window_tokens"], facts["n_mel"], facts["n_embd_out"]) == \
        ("gemma4a", 30.0, 750, N_MEL, 256)


def test_a_sound_in_a_gemma4_model_matches_the_reference(files):
    """Gemma 4's language model (its embeddings scaled, rows as they are) reading a sound's rows."""
    lm = synth.write_gemma4(files["dir"] / "gemma4.gguf", QT.F32, image_tokens="gemma4")
    mm = synth.write_gemma4_audio_mmproj(files["dir"] / "g4a.gguf", n_mel=N_MEL, qtype=QT.F32)
    m = Model(lm, mmproj=mm, n_ctx=1024)
    assert_prompt_matches_the_reference(m, lm, wav_bytes(sound(0.5)))
    m.close()
