"""Granite Speech's conformer and Q-Former (pyllm/conformer.py, projector "granite_speech")
against slow float64 numpy written here the way transformers' GraniteSpeechCTCEncoder and
GraniteSpeechEncoderProjector compute them (the spectrogram by a DFT from its definition, as
torchaudio's MelSpectrogram sets it up; attention in padded, masked blocks with a Shaw table; the
Q-Former's windows zero-padded), Granite Speech 4.1 plus's feature layers, the prompt (the rows
alone, no markers), and a whole prompt against the numpy reference given the same rows.
benchmarks/compare_audio.py compares the same files with llama.cpp's mtmd.
"""
import math

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from pyllm import Model
from pyllm.audio import open_audio_encoder, wav_bytes
from pyllm.conformer import GraniteSpeechEncoder, granite_log_mel
from pyllm.errors import InvalidArgumentError, ModelFileError
from test_audio import assert_prompt_matches_the_reference, sound
from test_gemma4_audio import slow_htk_filters

N_MEL = 32      # features: two frames of 16 mel bins


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("granite")
    return {"lm": synth.write_llama(d / "lm.gguf", QT.F32, n_vocab=512, context_length=4096),
            "f32": synth.write_granite_speech_mmproj(d / "f32.gguf", n_mel=N_MEL, qtype=QT.F32),
            "plus": synth.write_granite_speech_mmproj(d / "plus.gguf", n_mel=N_MEL, qtype=QT.F32,
                                                      feature_layers=(0, 2), n_query_layers=1),
            "f16": synth.write_granite_speech_mmproj(d / "f16.gguf", n_mel=N_MEL, n_layer=2, taps=4,
                                                     folded_name="conv_norm_var"),
            "dir": d}


def slow_log_mel(x: np.ndarray, n_mel: int) -> np.ndarray:
    """torchaudio's MelSpectrogram(n_fft=512, win_length=400, hop_length=160) as Granite Speech's
    extractor uses it, float64: the sound reflected 256 samples at both ends, a periodic Hann of
    400 centred in the 512-point DFT (by its definition), power through HTK filters; then log10
    floored at 1e-10, at the max - 8, v / 4 + 1; an even number of frames, two side by side."""
    x = np.asarray(x, np.float64)
    padded = np.concatenate([x[1:257][::-1], x, x[-257:-1][::-1]])
    n = np.arange(512)
    dft = np.exp(-2j * np.pi * np.outer(np.arange(257), n) / 512)
    window = np.zeros(512)
    window[56:456] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)
    frames = np.stack([padded[i:i + 512] for i in range(0, len(padded) - 511, 160)])
    power = np.abs((frames * window) @ dft.T) ** 2
    mel = np.log10(np.maximum(power @ slow_htk_filters(n_mel).T, 1e-10))
    mel = np.maximum(mel, mel.max() - 8) / 4 + 1
    mel = mel[:len(mel) - len(mel) % 2]
    return mel.reshape(len(mel) // 2, 2 * n_mel)


@pytest.mark.parametrize("seconds", [0.02, 0.37, 1.0])
def test_log_mel_matches_the_definition(seconds):
    x = sound(seconds)
    got, want = granite_log_mel(x, N_MEL // 2), slow_log_mel(x, N_MEL // 2)
    assert got.shape == want.shape == ((len(x) // 160 + 1) // 2, N_MEL)
    np.testing.assert_allclose(got, want, atol=2e-5)


def slow_granite_encode(enc: GraniteSpeechEncoder, mel: np.ndarray) -> np.ndarray:
    """The stacked spectrogram through the conformer and Q-Former, float64, as transformers does:
    each attention block padded to `context` rows with zeros and its padding masked."""
    def f(name):
        return enc.floats(name).astype(np.float64)

    def lin(v, name, bias=True):
        out = v @ f(name + ".weight").T
        return out + f(name + ".bias") if bias and enc.mf.has_tensor(name + ".bias") else out

    def ln(v, name, eps=1e-5):
        return (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + eps) * f(name + ".weight") \
            + f(name + ".bias")

    def silu(v):
        return v / (1 + np.exp(-v))

    def softmax(s):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def ffn(v, p, ffn):
        return lin(silu(lin(ln(v, p + "ffn_norm" + ffn), p + "ffn_up" + ffn)), p + "ffn_down" + ffn)

    x = lin(mel.astype(np.float64), "a.input_projection")
    T, n, H, C = len(x), enc.n_embd, enc.n_head, enc.context
    d = n // H
    kept = [x] if 0 in enc.feature_layers else []
    for i in range(enc.n_layer):
        p = f"a.blk.{i}."
        x = x + 0.5 * ffn(x, p, "")
        h = ln(x, p + "ln1")
        B = -(-T // C)
        hp = np.concatenate([h, np.zeros((B * C - T, n))])
        q, k, v = (lin(hp, p + m, bias=False).reshape(B, C, H, d) for m in ("attn_q", "attn_k", "attn_v"))
        E = f(p + "attn_rel_pos_emb")                                  # [2 max_pos + 1, d]
        dists = np.clip(np.arange(C)[:, None] - np.arange(C)[None], -C, C) + enc.max_pos
        out = np.zeros((B, C, H, d))
        for b in range(B):
            for head in range(H):
                qh = q[b, :, head]
                pos = np.einsum("cd,crd->cr", qh, E[dists]) / math.sqrt(d)
                if b == B - 1 and T % C:               # the padded block: its padding masked
                    mask = np.ones((C, C), bool)
                    mask[:T % C, :T % C] = False
                    pos[mask] = -np.finfo(np.float64).max
                s = qh @ k[b, :, head].T / math.sqrt(d) + pos
                out[b, :, head] = softmax(s) @ v[b, :, head]
        x = x + lin(out.reshape(B * C, n)[:T], p + "attn_out")
        g = lin(ln(x, p + "norm_conv"), p + "conv_pw1")
        m = g.shape[1] // 2
        g = g[:, :m] / (1 + np.exp(-g[:, m:]))
        w = f(p + "conv_dw.weight")                                    # [m, taps]
        taps = w.shape[1]
        left, right = taps // 2, taps // 2 - (taps + 1) % 2
        gp = np.concatenate([np.zeros((left, m)), g, np.zeros((right, m))])
        y = np.stack([(gp[t:t + taps] * w.T).sum(axis=0) for t in range(T)])
        folded = "conv_norm" if enc.mf.has_tensor(p + "conv_norm.weight") else "conv_norm_var"
        y = y * f(p + folded + ".weight") + f(p + folded + ".bias")
        x = x + lin(silu(y), p + "conv_pw2")
        x = x + 0.5 * ffn(x, p, "_1")
        x = ln(x, p + "ln2")
        if i + 1 in enc.feature_layers:
            kept.append(x)
        if i + 1 == enc.n_layer // 2:
            x = x + lin(softmax(lin(x, "a.enc_ctc_out")), "a.enc_ctc_out_mid")
    x = np.concatenate(kept + [x], axis=1)
    W, win = -(-T // enc.window), enc.window
    x = np.concatenate([x, np.zeros((W * win - T, x.shape[1]))])
    qs0 = ln(f("a.proj_query").reshape(-1, enc.n_query), "a.proj_norm", eps=1e-12)
    Hq = enc.proj_heads
    dq = enc.n_query // Hq
    rows = []
    for w_ in range(W):
        src = x[w_ * win:(w_ + 1) * win]
        qs = qs0
        for j in range(len(enc.qformer)):
            p = f"a.proj_blk.{j}."
            for kind, keys in (("self_attn", qs), ("cross_attn", src)):
                a = []
                qq, kk, vv = lin(qs, p + kind + "_q"), lin(keys, p + kind + "_k"), lin(keys, p + kind + "_v")
                for head in range(Hq):
                    c = slice(head * dq, (head + 1) * dq)
                    a.append(softmax(qq[:, c] @ kk[:, c].T / math.sqrt(dq)) @ vv[:, c])
                qs = ln(lin(np.concatenate(a, axis=1), p + kind + "_out") + qs, p + kind + "_norm", eps=1e-12)
            u = lin(qs, p + "ffn_up")
            u = 0.5 * u * (1 + np.vectorize(math.erf)(u / math.sqrt(2)))
            qs = ln(lin(u, p + "ffn_down") + qs, p + "ffn_norm", eps=1e-12)
        rows.append(qs)
    return lin(np.concatenate(rows), "a.proj_linear")


@pytest.mark.parametrize("kind, seconds", [("f32", 1.0), ("f32", 0.4), ("plus", 0.9), ("f16", 0.6)])
def test_the_encoder_matches_the_slow_one(files, kind, seconds):
    """1.0 s: 50 rows, blocks of 20 (the last of 10), 4 windows of 15 (the last of 5)."""
    enc = open_audio_encoder(files[kind], n_threads=3)
    assert isinstance(enc, GraniteSpeechEncoder) and enc.n_out == 256
    mel = enc.log_mel(sound(seconds))
    got = enc.encode_mel(mel)
    want = slow_granite_encode(enc, mel[0])
    assert got.shape == want.shape == (enc.rows_for(len(mel[0])), 256)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    enc.close()


def test_rows_of_a_sound():
    assert [GraniteSpeechEncoder.rows_for(type("E", (), {"window": 15, "n_queries": 3})(), n)
            for n in (1, 15, 16, 30, 1500)] == [3, 3, 6, 6, 300]


def test_bad_granite_speech_files(tmp_path):
    for drop, said in (("a.blk.1.attn_rel_pos_emb", "attn_rel_pos_emb is missing"),
                       ("a.blk.0.conv_norm.bias", "conv_norm.bias is missing"),
                       ("a.proj_query", "a.proj_query is missing"),
                       ("a.proj_blk.0.self_attn_q.weight", "proj_blk.0.self_attn_q.weight is missing"),
                       ("a.enc_ctc_out_mid.weight", "enc_ctc_out_mid.weight is missing")):
        broken = synth.write_granite_speech_mmproj(tmp_path / "broken.gguf", drop_tensor=drop)
        with pytest.raises(ModelFileError, match=said):
            open_audio_encoder(broken)
    wide = synth.write_granite_speech_mmproj(tmp_path / "wide.gguf", context=40, max_pos=32)
    with pytest.raises(ModelFileError, match="blocks of 40 rows beyond 32 positions"):
        open_audio_encoder(wide)
    layers = synth.write_granite_speech_mmproj(tmp_path / "layers.gguf", feature_layers=(9,))
    with pytest.raises(ModelFileError, match="feature_layer"):
        open_audio_encoder(layers)


def test_a_prompt_with_a_granite_sound(files):
    m = Model(files["lm"], mmproj=files["f32"], n_ctx=2048)
    assert isinstance(m.audio, GraniteSpeechEncoder)
    data = wav_bytes(sound(1.0))
    ids = m.media_prompt("hear: <__media__> now", [data])
    first = next(i for i, t in enumerate(ids) if t < 0)
    rows = [t for t in ids if t < 0]
    assert len(rows) == 12                                  # 1 s: 101 frames, 50 stacked, 4 windows of 3 rows
    assert ids[:first] == m.tokenize("hear: ", special=True)
    assert ids[first + len(rows):] == m.tokenize(" now", special=True, add_bos=False)
    ids = assert_prompt_matches_the_reference(m, files["lm"], data)
    np.testing.assert_array_equal(m.engine.media.rows([t for t in ids if t < 0]), m.audio.encode(data))
    with pytest.raises(InvalidArgumentError, match="a mel chunk must be"):
        m.audio.encode_mel([np.zeros((5, N_MEL - 2), np.float32)])
    m.close()


def test_info_on_a_granite_projector(files):
    import json

    from test_cli import pyllm
    r = pyllm("info", files["plus"], "--json")
    facts = json.loads(r.stdout)
    assert r.returncode == 0, r.stderr
    assert (facts["projector"], facts["window_s"], facts["window_tokens"], facts["n_mel"]) == \
        ("granite_speech", 0.3, 3, N_MEL)
