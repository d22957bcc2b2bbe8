"""Gemma 4 Unified's encoder-free embedders (vision.py "gemma4uv", audio.py "gemma4ua") against
slow float64 numpy written here the way transformers' Gemma4UnifiedVisionEmbedder and
Gemma4UnifiedMultimodalEmbedder compute them (a patch's values a pixel's R G B together, the
file's converted order undone index by index), the prompt's markers, the image's rows seeing
each other, a whole prompt against the numpy reference, and the model's suppressed tokens.
benchmarks/compare_hf_gemma4_unified.py compares the same with transformers itself.
"""
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from pyllm import Model
from pyllm.audio import AudioEncoder, Gemma4UnifiedAudio, open_audio_encoder, wav_bytes
from pyllm.errors import InvalidArgumentError, ModelFileError, UnsupportedModelError
from pyllm.vision import VisionEncoder
from test_audio import assert_prompt_matches_the_reference, sound
from test_vision import picture, reference_logits


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4u")
    return {"lm": synth.write_gemma4(d / "lm.gguf", QT.F32, image_tokens="gemma4"),
            "f32": synth.write_gemma4_unified_mmproj(d / "f32.gguf", qtype=QT.F32),
            "f16": synth.write_gemma4_unified_mmproj(d / "f16.gguf", patch=5, n_embd=64, n_positions=24),
            "dir": d}


def tensors(path: str) -> dict:
    """The file's tensors in float64, read by gguf's own reader (numpy shapes: GGUF's dims reversed)."""
    import gguf
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(t.shape[::-1])
            for t in gguf.GGUFReader(path).tensors}


def layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + eps) * w + b


def slow_vision_rows(path: str, pixels: np.ndarray, P: int) -> np.ndarray:
    """transformers' embedder on one image [3, H, W] in [0, 1], patches of P pixels, in float64."""
    t = tensors(path)
    _, H, W = pixels.shape
    gh, gw = H // P, W // P
    n_in = 3 * P * P
    # the file's value i is channel i // P^2, pixel (row, col) of i % P^2; transformers' is pixel-major
    hf_of_file = np.array([((i % (P * P)) // P) * P * 3 + (i % P) * 3 + i // (P * P) for i in range(n_in)])
    ln1_w, ln1_b, dense = np.empty(n_in), np.empty(n_in), np.empty((t["v.patch_embd.weight"].shape[0], n_in))
    ln1_w[hf_of_file], ln1_b[hf_of_file] = t["v.patch_norm.1.weight"], t["v.patch_norm.1.bias"]
    dense[:, hf_of_file] = t["v.patch_embd.weight"]
    rows = []
    for r in range(gh):
        for c in range(gw):
            patch = pixels[:, r * P:(r + 1) * P, c * P:(c + 1) * P].transpose(1, 2, 0).reshape(1, -1)   # R G B together
            x = layer_norm(layer_norm(patch, ln1_w, ln1_b) @ dense.T + t["v.patch_embd.bias"],
                           t["v.patch_norm.2.weight"], t["v.patch_norm.2.bias"])
            x = x + t["v.position_embd.weight"][0, c] + t["v.position_embd.weight"][1, r]
            x = layer_norm(x, t["v.patch_norm.3.weight"], t["v.patch_norm.3.bias"])
            x = x / np.sqrt((x * x).mean() + 1e-6)
            rows.append((x @ t["mm.input_projection.weight"].T)[0])
    return np.array(rows)


def slow_audio_rows(path: str, samples: np.ndarray) -> np.ndarray:
    t = tensors(path)
    frame = t["mm.a.input_projection.weight"].shape[1]
    x = np.zeros(-(-len(samples) // frame) * frame)
    x[:len(samples)] = samples
    rows = []
    for f in x.reshape(-1, frame):
        rows.append((f / np.sqrt((f * f).mean() + 1e-6)) @ t["mm.a.input_projection.weight"].T)
    return np.array(rows)


@pytest.mark.parametrize("kind, shape", [("f32", (60, 48, 3)), ("f32", (37, 95, 3)), ("f16", (90, 40, 3))])
def test_the_vision_embedder_matches_the_slow_one(files, kind, shape):
    enc = VisionEncoder(files[kind], n_threads=2)
    P = enc.patch
    assert P == (12 if kind == "f32" else 15)                   # patch_size x the pooling of 3
    img = picture(3, shape)
    tile = enc.tiles(img)[0]
    assert tile.shape[0] % P == 0 and tile.shape[1] % P == 0
    pixels = enc.normalize(tile)                                # mean 0, std 1: v / 255
    got, want = enc.encode(img), slow_vision_rows(files[kind], pixels.astype(np.float64), P)
    assert got.shape == want.shape == ((tile.shape[0] // P) * (tile.shape[1] // P), 256)
    assert 70 <= len(got) <= 1120
    tol = 2e-5 if kind == "f32" else 3e-3
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())
    enc.close()


@pytest.mark.parametrize("kind", ["f32", "f16"])
@pytest.mark.parametrize("seconds", [0.02, 1.0, 2.5173])
def test_the_audio_frames_match_the_slow_ones(files, kind, seconds):
    enc = open_audio_encoder(files[kind], n_threads=2)
    assert isinstance(enc, Gemma4UnifiedAudio)
    x = sound(seconds).astype(np.float32)
    got, want = enc.encode(x), slow_audio_rows(files[kind], x.astype(np.float64))
    assert got.shape == want.shape == (-(-len(x) // 640), 256)     # 25 rows a second, the last frame padded
    tol = 2e-6 if kind == "f32" else 2e-3
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())
    assert np.array_equal(enc.encode(np.zeros(1300, np.float32)), np.zeros((3, 256), np.float32))   # silence: zeros
    with pytest.raises(InvalidArgumentError, match="holds no samples"):
        enc.encode(np.zeros(0, np.float32))
    enc.close()


def test_an_image_prompt_matches_the_reference(files):
    """The image's rows between <|image> and <image|>, seeing each other (at any width: the
    unified projector's images are never read causally), as the numpy reference reads them."""
    wide = synth.write_gemma4(files["dir"] / "e2b.gguf", QT.F32, image_tokens="gemma4", n_embd=1536, n_ff=128)
    m = Model(wide, mmproj=synth.write_gemma4_unified_mmproj(files["dir"] / "wide.gguf", n_out=1536, audio=False))
    assert m.engine.media_bidirectional and m.audio is None
    m.close()
    sound_only = synth.write_gemma4_unified_mmproj(files["dir"] / "sound.gguf", vision=False)
    m = Model(files["lm"], mmproj=sound_only, n_batch=16)    # a sound's rows are read causally: any batch
    assert m.engine.n_batch == 16 and m.vision is None
    m.close()
    # a step holds a whole image whose rows see each other, whatever the batch asked for (up to 1120
    # rows here, the most mtmd's sizing gives); an image of 80 rows with a batch of 16
    m = Model(files["lm"], mmproj=files["f32"], n_ctx=2048, n_batch=16)
    assert m.engine.n_batch == 1120
    img = picture(5, (50, 70, 3))
    enc = m.vision
    assert enc.plan(70, 50).whole == (120, 96) and enc.rows_of(120, 96) == 80    # scaled up to 70 rows or more
    ids = m.media_prompt("what is <__media__> this", [img])
    start = next(i for i, t in enumerate(ids) if t < 0)
    n = sum(t < 0 for t in ids)
    assert n == 80
    assert ids[:start] == m.tokenize("what is <|image>", special=True)
    assert ids[start + n:] == m.tokenize("<image|> this", special=True, add_bos=False)
    rows = m.engine.media.rows(ids[start:start + n])
    np.testing.assert_array_equal(rows, enc.encode(img))
    logits, _ = m.engine.prefill(m.engine.new_sequence(), ids)
    want = reference_logits(files["lm"], ids, rows, (start, start + n))[-1]
    assert np.abs(logits - want).max() < 2e-4 * (want.max() - want.min())
    m.close()


def test_a_sound_prompt_matches_the_reference(files):
    m = Model(files["lm"], mmproj=files["f32"], n_ctx=2048)
    assert isinstance(m.audio, Gemma4UnifiedAudio) and m.vision is not None
    data = wav_bytes(sound(0.5))
    ids = m.media_prompt("hear: <__media__> now", [data])
    first = next(i for i, t in enumerate(ids) if t < 0)
    assert sum(t < 0 for t in ids) == 13                       # 8000 samples: 12.5 frames of 640
    assert ids[:first] == m.tokenize("hear: <|audio>", special=True)
    assert ids[first + 13:] == m.tokenize("<audio|> now", special=True, add_bos=False)
    assert_prompt_matches_the_reference(m, files["lm"], data)
    m.close()


def test_bad_gemma4_unified_files(files, tmp_path):
    for drop, said in (("v.patch_norm.1.bias", "patch norm's bias is missing"),
                       ("v.patch_embd.weight", "v.patch_embd.weight is missing"),
                       ("v.position_embd.weight", "position_embd.weight is missing"),
                       ("mm.input_projection.weight", "mm.input_projection.weight is missing")):
        with pytest.raises(ModelFileError, match=said):
            VisionEncoder(synth.write_gemma4_unified_mmproj(tmp_path / "broken.gguf", drop_tensor=drop))
    with pytest.raises(ModelFileError, match="mm.a.input_projection.weight is missing"):
        open_audio_encoder(synth.write_gemma4_unified_mmproj(tmp_path / "broken.gguf",
                                                             drop_tensor="mm.a.input_projection.weight"))
    with pytest.raises(UnsupportedModelError, match="'gemma4ua' is not supported"):   # the Whisper reader refuses it
        AudioEncoder(files["f32"])
    with pytest.raises(UnsupportedModelError, match="is not Gemma 4 Unified's"):
        Gemma4UnifiedAudio(synth.write_audio_mmproj(tmp_path / "qwen.gguf", projector="qwen2a"))
    small = VisionEncoder(synth.write_gemma4_unified_mmproj(tmp_path / "small.gguf", n_positions=8, audio=False))
    with pytest.raises(InvalidArgumentError, match="patches is beyond the projector.s 8 positions a side: crop"):
        small.encode(picture(30, (100, 1200, 3)))
    small.close()
    lm = synth.write_gemma4(tmp_path / "narrow.gguf", QT.F32, image_tokens="gemma4", n_embd=128, n_ff=128)
    with pytest.raises(InvalidArgumentError, match="makes image rows of 256 values"):
        Model(lm, mmproj=files["f32"])


def test_info_on_a_gemma4_unified_projector(files):
    import json

    from test_cli import pyllm
    r = pyllm("info", files["f32"], "--json")
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    assert (facts["vision projector"], facts["vision patch_size"], facts["vision n_layer"],
            facts["audio projector"], facts["audio frame_samples"], facts["audio rows_per_s"]) == \
        ("gemma4uv", 12, 0, "gemma4ua", 640, 25.0)


def test_suppressed_tokens_are_never_written(tmp_path):
    """tokenizer.ggml.suppress_tokens (Gemma 4 Unified's soft tokens): as llama.cpp, each biased
    to -inf in every sampler, greedy or not; ids outside the vocabulary dropped."""
    plain = synth.write_llama(tmp_path / "plain.gguf", QT.F32)
    m = Model(plain, n_ctx=256)
    ids = m.tokenize("the")
    logits, _ = m.engine.prefill(m.engine.new_sequence(), ids)
    top = [int(t) for t in np.argsort(-logits)[:3]]
    m.close()
    path = synth.write_llama(tmp_path / "suppress.gguf", QT.F32, int_arrays={"tokenizer.ggml.suppress_tokens": top[:2] + [99999, -1]})
    m = Model(path, n_ctx=256)
    assert m.tokenizer.suppress_ids == frozenset(top[:2])
    first = m.generate(ids, max_tokens=1, temperature=0, ignore_eos=True)
    assert first.tokens[0] == top[2]                           # the best token not suppressed
    for seed in range(5):
        out = m.generate(ids, max_tokens=8, temperature=5.0, seed=seed, ignore_eos=True)
        assert not set(out.tokens) & set(top[:2])
    m.close()
    bad = synth.write_llama(tmp_path / "bad.gguf", QT.F32, float_arrays={"tokenizer.ggml.suppress_tokens": [1.5]})
    with pytest.raises(ModelFileError, match="suppress_tokens is not a list of token ids"):
        Model(bad)
