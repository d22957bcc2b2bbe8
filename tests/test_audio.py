"""Sounds in prompts: the log-mel spectrogram and the Whisper encoders of audio mmproj files
(pyllm/audio.py) against slow float64 numpy versions written here (a DFT by its definition, the
mel filters bin by bin, the encoder layer by layer), sound files decoded and resampled, the
prompt layout (llama.cpp's mtmd: Qwen2-Audio's <|audio_bos|> rows <|audio_eos|>, Voxtral's
[BEGIN_AUDIO] rows, Ultravox's rows alone), and a whole prompt with a sound against the numpy
reference given the same rows. benchmarks/compare_audio.py compares the same files with
llama.cpp's mtmd.
"""
import base64
import io
import math
import wave

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from pyllm import Model
from pyllm.audio import AudioEncoder, centred_log_mel, is_audio, load_audio, log_mel, mel_filters, wav_bytes
from pyllm.chat_template import normalize_messages
from pyllm.errors import InvalidArgumentError, ModelFileError, UnsupportedModelError

N_MEL = 16


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("audio")
    out = {"lm": synth.write_llama(d / "lm.gguf", QT.F32, n_vocab=512, image_tokens="audio",
                                 context_length=4096),
           "dir": d}
    for name, kw in (("qwen2a", dict(projector="qwen2a", qtype=QT.F32)),
                     ("ultravox", dict(projector="ultravox", stack=8)),
                     ("voxtral", dict(projector="voxtral", stack=4)),
                     ("musicflamingo", dict(projector="musicflamingo")), ("glma", dict(projector="glma", stack=4)),
                     ("qwen3a", dict(projector="qwen3a")), ("meralion", dict(projector="meralion", stack=15))):
        out[name] = synth.write_audio_mmproj(d / f"{name}.gguf", n_mel=N_MEL, **kw)
    return out


def sound(seconds: float, seed: int = 3, rate: int = 16000) -> np.ndarray:
    """Two tones that come and go, and some noise, in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * 440 * t) * np.sin(2 * np.pi * 0.7 * t) + 0.2 * np.sin(2 * np.pi * 1250 * t + 1)
    return np.clip(x + 0.05 * rng.standard_normal(len(t)), -1, 1).astype(np.float32)


# -- the spectrogram, slowly ---------------------------------------------------------------------------

def slow_filters(n_mel: int, n_fft: int = 400, rate: int = 16000) -> np.ndarray:
    """Slaney's mel filters bin by bin: triangles between mel-spaced corners, each of area one."""
    def to_mel(f):
        return 3 * f / 200 if f < 1000 else 15 + 27 * math.log(f / 1000) / math.log(6.4)

    def to_hz(m):
        return 200 * m / 3 if m < 15 else 1000 * math.exp((m - 15) * math.log(6.4) / 27)
    top = to_mel(rate / 2)
    corners = [to_hz(top * i / (n_mel + 1)) for i in range(n_mel + 2)]
    out = np.zeros((n_mel, n_fft // 2 + 1))
    for m in range(n_mel):
        lo, mid, hi = corners[m:m + 3]
        for k in range(n_fft // 2 + 1):
            f = k * rate / n_fft
            if lo <= f <= mid:
                out[m, k] = (f - lo) / (mid - lo)
            elif mid < f <= hi:
                out[m, k] = (hi - f) / (hi - mid)
        out[m] *= 2 / (hi - lo)
    return out


def slow_log_mel(x: np.ndarray, n_mel: int) -> np.ndarray:
    """The whole spectrogram [n_mel, frames], float64: the sound reflected 200 samples at its start,
    30 s of silence after it, a DFT of 400 samples (periodic Hann) every 160, power through the
    filters, log10 floored at 2^-24, then floored at its max - 8 and mapped by (v + 4) / 4. A sound
    shorter than 201 samples is made 201 with silence first."""
    x = np.asarray(x, np.float64)
    if len(x) < 201:     # too short to reflect: silence after it first (mtmd's)
        x = np.concatenate([x, np.zeros(201 - len(x))])
    padded = np.concatenate([x[1:201][::-1], x, np.zeros(30 * 16000 + 400)])
    n = np.arange(400)
    dft = np.exp(-2j * np.pi * np.outer(np.arange(201), n) / 400)          # the definition
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * n / 400)
    frames = np.stack([padded[i * 160:i * 160 + 400] for i in range((len(padded) - 400) // 160 + 1)])
    power = np.abs((frames * hann) @ dft.T) ** 2
    mel = np.log10(np.maximum(power @ slow_filters(n_mel).T, 2.0 ** -24)).T
    return (np.maximum(mel, mel.max() - 8) + 4) / 4


def test_mel_filters_are_slaney_s():
    np.testing.assert_allclose(mel_filters(80), slow_filters(80), rtol=1e-5, atol=1e-9)
    f = slow_filters(80)
    assert np.all((f > 0).sum(axis=1) >= 1)          # every filter sees some bin
    # unit area: the wide filters (many bins of 40 Hz) sum to 1 / 40 Hz, nearly
    assert np.all(np.abs(f[44:].sum(axis=1) * 40 - 1) < 0.03)


@pytest.mark.parametrize("seconds", [0.005, 2.5, 31.0])
def test_log_mel_matches_the_definition(seconds):
    """Whole chunks of 3000 frames, the partial last one dropped (a short sound: one chunk, its
    silence included; 31 s: two)."""
    x = sound(seconds)
    got = log_mel(x, N_MEL)
    want = slow_log_mel(x, N_MEL)
    assert len(got) == want.shape[1] // 3000 == (2 if seconds > 30 else 1)
    for i, chunk in enumerate(got):
        assert chunk.shape == (N_MEL, 3000) and chunk.dtype == np.float32
        np.testing.assert_allclose(chunk, want[:, i * 3000:(i + 1) * 3000], atol=2e-5)


def slow_centred_log_mel(x: np.ndarray, n_mel: int) -> list:
    """Qwen3-ASR's: the sound reflected 200 samples at both ends (nothing after it), the same
    frames, filters, floor and scale over the whole sound; the first len / 160 + 1 frames in
    windows of 800, each padded with zero columns to a multiple of 100."""
    x = np.asarray(x, np.float64)
    padded = np.concatenate([x[1:201][::-1], x, x[-201:-1][::-1]])
    n = np.arange(400)
    dft = np.exp(-2j * np.pi * np.outer(np.arange(201), n) / 400)
    frames = np.stack([padded[i * 160:i * 160 + 400] for i in range((len(padded) - 400) // 160 + 1)])
    power = np.abs((frames * (0.5 - 0.5 * np.cos(2 * np.pi * n / 400))) @ dft.T) ** 2
    mel = np.log10(np.maximum(power @ slow_filters(n_mel).T, 2.0 ** -24)).T
    mel = (np.maximum(mel, mel.max() - 8) + 4) / 4
    mel = mel[:, :len(x) // 160 + 1]
    out = []
    for a in range(0, mel.shape[1], 800):
        part = mel[:, a:a + 800]
        out.append(np.concatenate([part, np.zeros((n_mel, -part.shape[1] % 100))], axis=1))
    return out


@pytest.mark.parametrize("seconds", [0.5, 9.3])
def test_qwen3_asr_s_log_mel_matches_the_definition(seconds):
    x = sound(seconds)
    got, want = centred_log_mel(x, N_MEL), slow_centred_log_mel(x, N_MEL)
    assert [g.shape for g in got] == [w.shape for w in want] == \
        ([(N_MEL, 100)] if seconds < 1 else [(N_MEL, 800), (N_MEL, 200)])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=2e-5)


def test_a_sound_of_silence_is_flat():
    got = log_mel(np.zeros(16000, np.float32), N_MEL)[0]
    np.testing.assert_array_equal(got, np.full_like(got, (math.log10(2.0 ** -24) + 4) / 4))


# -- sound files -----------------------------------------------------------------------------------------

def wav(samples: np.ndarray, rate: int, width: int = 2) -> bytes:
    """samples [n] (mono) or [n, channels] as a PCM WAV file of `width` bytes a sample."""
    frames = samples if samples.ndim == 2 else samples[:, None]
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(frames.shape[1])
        w.setsampwidth(width)
        w.setframerate(rate)
        scale = {1: 127, 2: 32767, 4: 2 ** 31 - 1}[width]
        ints = np.round(frames.reshape(-1) * scale).astype(np.int64)
        if width == 1:
            w.writeframes((ints + 128).astype(np.uint8).tobytes())
        else:
            w.writeframes(ints.astype({2: "<i2", 4: "<i4"}[width]).tobytes())
    return out.getvalue()


def test_sound_files_are_decoded_to_mono_16khz():
    x = sound(1.0)
    data = wav_bytes(x)
    assert is_audio(data) and not is_audio(b"\x89PNG\r\n\x1a\n" + bytes(8))
    got = load_audio(data)
    np.testing.assert_array_equal(got, np.frombuffer(data[44:], "<i2") / np.float32(32768))    # 16 kHz: as it is
    stereo = load_audio(wav(np.stack([x, -0.5 * x], axis=1), 16000, width=4))     # channels averaged
    np.testing.assert_allclose(stereo, 0.25 * x, atol=1e-6)
    coarse = load_audio(wav(x, 16000, width=1))
    assert np.abs(coarse - x).max() < 1.5 / 127
    fast = sound(1.0, rate=44100)
    resampled = load_audio(wav(fast, 44100))
    assert abs(len(resampled) - 16000) <= 2
    # the tones survive the resampling, where they were: 1 s of sound, bins of 1 Hz
    spec = np.abs(np.fft.rfft(resampled[:16000]))
    assert abs(int(spec.argmax()) - 1250) <= 1 and spec[438:443].max() > 20 * np.median(spec)


def test_bad_sounds_are_refused():
    with pytest.raises(InvalidArgumentError, match=r"cannot decode the sound \(\d+ bytes\): failed to decode data;"):
        load_audio(b"RIFF\x00\x00\x00\x00WAVEjunk" + bytes(40))
    with pytest.raises(InvalidArgumentError, match="no samples"):
        load_audio(wav(np.zeros(0, np.float32), 16000))


# -- the encoder, slowly -----------------------------------------------------------------------------------

def erf_gelu(u):
    return 0.5 * u * (1 + np.vectorize(math.erf)(u / math.sqrt(2)))


def conv2d(img: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """gelu(img * w + b): [c, H, W] by 3 x 3 kernels [out, c, 3, 3], stride 2, a zero all round."""
    c, H, W = img.shape
    p = np.pad(img, ((0, 0), (1, 1), (1, 1)))
    h, w_ = (H - 1) // 2 + 1, (W - 1) // 2 + 1
    out = np.empty((len(w), h, w_))
    for y in range(h):
        for x in range(w_):
            out[:, y, x] = np.einsum("ocij,cij->o", w, p[:, 2 * y:2 * y + 3, 2 * x:2 * x + 3])
    return erf_gelu(out + b[:, None, None])


def slow_audio_encode(enc: AudioEncoder, mel: np.ndarray) -> np.ndarray:
    """One chunk [n_mel, 3000] through the encoder and projector, float64, step by step."""
    def f(name):
        return enc.floats(name).astype(np.float64)

    def conv(x, name, stride):
        w, b = f(name + ".weight"), f(name + ".bias").reshape(-1)      # [out, in, 3]
        xp = np.pad(x, ((0, 0), (1, 1)))
        T = (x.shape[1] - 1) // stride + 1
        return erf_gelu(np.stack([sum(w[:, :, k] @ xp[:, t * stride + k] for k in range(3)) for t in range(T)]) + b)

    def ln(v, name):
        return (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + enc.eps) * f(name + ".weight") \
            + f(name + ".bias")

    def lin(v, name, bias=True):
        out = v @ f(name + ".weight").T
        return out + f(name + ".bias") if bias and enc.mf.has_tensor(name + ".bias") else out

    def rms(v, name):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + 1e-6) * f(name + ".weight")
    if enc.projector == "qwen3a":     # each 100 frames an image (mel, time) through three 2D convolutions
        rows = []
        for c0 in range(0, mel.shape[1], 100):
            img = mel[None, :, c0:c0 + 100].astype(np.float64)
            for i in (1, 2, 3):
                img = conv2d(img, f(f"a.conv2d.{i}.weight"), f(f"a.conv2d.{i}.bias").reshape(-1))
            cols = img.transpose(2, 0, 1).reshape(img.shape[2], -1)      # [time, c h]: c outermost
            rows.append(cols @ f("a.conv_out.weight").T + f("a.position_embd.weight")[:len(cols)])
        x = np.concatenate(rows)
    else:
        x = conv(conv(mel.astype(np.float64), "a.conv1d.1", 1).T, "a.conv1d.2", 2)
        x = x + f("a.position_embd.weight")[:len(x)]
    H, d = enc.n_head, enc.n_embd // enc.n_head
    for i in range(enc.n_layer):
        p = f"a.blk.{i}."
        h = ln(x, p + "ln1")
        q, k, v = lin(h, p + "attn_q"), lin(h, p + "attn_k"), lin(h, p + "attn_v")
        heads = []
        for j in range(H):
            s = q[:, j * d:(j + 1) * d] @ k[:, j * d:(j + 1) * d].T / math.sqrt(d)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            heads.append((s / s.sum(axis=1, keepdims=True)) @ v[:, j * d:(j + 1) * d])
        x = x + lin(np.concatenate(heads, axis=1), p + "attn_out")
        x = x + lin(erf_gelu(lin(ln(x, p + "ln2"), p + "ffn_up")), p + "ffn_down")
    if enc.projector in ("qwen2a", "musicflamingo"):
        x = np.stack([x[2 * t:2 * t + 2].mean(axis=0) for t in range(len(x) // 2)])
    x = ln(x, "a.post_ln")
    if enc.projector == "qwen2a":
        return lin(x, "mm.a.fc")
    if enc.projector in ("musicflamingo", "qwen3a"):
        return lin(erf_gelu(lin(x, "mm.a.mlp.1")), "mm.a.mlp.2")
    if enc.projector == "glma":
        x = ln(x, "mm.a.norm_pre")
    k = enc.stack
    while len(x) % k:
        x = np.concatenate([x, np.zeros((1, x.shape[1]))])
    x = np.stack([np.concatenate(x[r * k:(r + 1) * k]) for r in range(len(x) // k)])
    if enc.projector == "voxtral":
        return lin(erf_gelu(lin(x, "mm.a.mlp.1")), "mm.a.mlp.2")
    if enc.projector == "glma":
        return np.concatenate([f("v.boi")[None], lin(erf_gelu(lin(x, "mm.a.mlp.1")), "mm.a.mlp.2"), f("v.eoi")[None]])
    if enc.projector == "meralion":
        def silu(v):
            return v / (1 + np.exp(-v))
        h = silu(lin(ln(x, "mm.a.norm_pre"), "mm.a.mlp.0"))
        return lin(silu(lin(h, "mm.a.mlp.1")) * lin(h, "mm.a.mlp.2"), "mm.a.mlp.3")
    h = lin(rms(x, "mm.a.norm_pre"), "mm.a.mlp.1")
    a, b = h[:, :h.shape[1] // 2], h[:, h.shape[1] // 2:]
    return lin(rms(a * b / (1 + np.exp(-b)), "mm.a.norm_mid"), "mm.a.mlp.2")


@pytest.mark.parametrize("name, rows", [("qwen2a", 750), ("ultravox", 188), ("voxtral", 375), ("musicflamingo", 750),
                                        ("glma", 377), ("qwen3a", 104), ("meralion", 100)])
def test_the_encoder_matches_the_slow_one(files, name, rows):
    """One chunk (Qwen3-ASR: one window of 8 s) against the slow loops; two chunks (a window and
    the rest) each on its own, in order."""
    enc = AudioEncoder(files[name], n_threads=3)
    assert enc.rows_per_chunk == rows and enc.n_out == 256
    mel = enc.log_mel(sound(8.0 if name == "qwen3a" else 1.5))
    got = enc.encode_mel(mel[:1])
    want = slow_audio_encode(enc, mel[0])
    assert got.shape == want.shape == (rows, 256)
    assert np.abs(got - want).max() < 2e-4 * np.abs(want).max()
    longer = sound(9.3 if name == "qwen3a" else 33.0)
    two = enc.encode(longer)
    assert two.shape == ((104 + 26 if name == "qwen3a" else 2 * rows), 256)
    np.testing.assert_allclose(two[:rows], enc.encode_mel(enc.log_mel(longer)[:1]), rtol=0, atol=1e-6)
    enc.close()


def test_bad_audio_projector_files(files, tmp_path):
    broken = synth.write_audio_mmproj(tmp_path / "broken.gguf", drop_tensor="a.blk.1.attn_k.weight")
    with pytest.raises(ModelFileError, match="attn_k.weight is missing"):
        AudioEncoder(broken)
    no_bias = synth.write_audio_mmproj(tmp_path / "nobias.gguf", drop_tensor="a.conv1d.2.bias")
    with pytest.raises(ModelFileError, match="conv1d.2.bias is missing"):
        AudioEncoder(no_bias)
    other = synth.write_audio_mmproj(tmp_path / "other.gguf", projector="mimo_audio")     # MiMo-Audio's
    with pytest.raises(UnsupportedModelError, match="'mimo_audio' is not supported"):
        AudioEncoder(other)
    with pytest.raises(UnsupportedModelError, match="has no vision encoder"):
        from pyllm.vision import VisionEncoder
        VisionEncoder(files["qwen2a"])
    with pytest.raises(InvalidArgumentError, match="belongs to another model"):
        Model(synth.write_llama(tmp_path / "wide.gguf", QT.F32, n_embd=128, n_vocab=512), mmproj=files["qwen2a"],
              n_ctx=128)


# -- prompts -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, begin, end", [("qwen2a", "<|audio_bos|>", "<|audio_eos|>"),
                                              ("voxtral", "[BEGIN_AUDIO]", ""), ("ultravox", "", ""),
                                              ("musicflamingo", "<sound>", ""), ("glma", "", ""),
                                              ("qwen3a", "<|audio_start|>", "<|audio_end|>"), ("meralion", "", "")])
def test_prompt_layout(files, name, begin, end):
    m = Model(files["lm"], mmproj=files[name], n_ctx=2048)
    assert m.audio is not None and m.vision is None
    ids = m.media_prompt("hear: <__media__> now", [wav_bytes(sound(2.0))])
    first = next(i for i, t in enumerate(ids) if t < 0)
    rows = [t for t in ids if t < 0]
    want = 39 if name == "qwen3a" else m.audio.rows_per_chunk     # Qwen3-ASR: 201 frames, 3 chunks of 13 rows
    assert len(rows) == want and rows == list(range(rows[0], rows[0] - len(rows), -1))
    assert ids[:first] == m.tokenize("hear: " + begin, special=True)
    assert ids[first + len(rows):] == m.tokenize(end + " now", special=True, add_bos=False)
    again = m.media_prompt("now", [base64.b64encode(wav_bytes(sound(2.0))).decode()])   # the same sound: its rows
    assert [t for t in again if t < 0] == rows
    from PIL import Image
    with pytest.raises(InvalidArgumentError, match="reads sounds only"):    # a picture to a sound's projector
        m.media_prompt("<__media__>", [Image.new("RGB", (8, 8))])
    m.close()


def test_a_prompt_with_a_sound_matches_the_reference(files):
    m = Model(files["lm"], mmproj=files["qwen2a"], n_ctx=2048)
    data = wav_bytes(sound(1.0))
    ids = assert_prompt_matches_the_reference(m, files["lm"], data)
    np.testing.assert_array_equal(m.engine.media.rows([t for t in ids if t < 0]), m.audio.encode(data))
    m.close()


def assert_prompt_matches_the_reference(m, lm: str, data: bytes) -> list:
    """The logits after "what is <sound> this" against the numpy reference given the same rows;
    returns the prompt's ids."""
    ids = m.media_prompt("what is <__media__> this", [data])
    rows = m.engine.media.rows([t for t in ids if t < 0])
    seq = m.engine.new_sequence()
    logits, _ = m.engine.prefill(seq, ids)
    seq.release()
    local, j = [], 0
    for t in ids:
        local.append(t if t >= 0 else -1 - j)
        j += t < 0
    from pyllm.arch import load_architecture
    from pyllm.model_file import ModelFile
    from pyllm.reference import Reference
    with ModelFile(lm) as mf:
        want = Reference(load_architecture(mf)).forward(np.array(local), media=rows)[-1]
    assert np.abs(logits - want).max() < 2e-4 * (want.max() - want.min())
    return ids


def test_chat_messages_take_input_audio_parts(files):
    data = base64.b64encode(wav_bytes(sound(1.0))).decode()
    msgs = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
                                         {"type": "text", "text": "what is it?"}]}]
    media: list = []
    out = normalize_messages(msgs, media)
    assert out[0]["content"] == "<__media__>what is it?" and media == [data]
    with pytest.raises(InvalidArgumentError, match="multimodal projector"):
        normalize_messages(msgs)
    with pytest.raises(InvalidArgumentError, match="input_audio part needs"):
        normalize_messages([{"role": "user", "content": [{"type": "input_audio", "input_audio": "x"}]}], [])
    m = Model(files["lm"], mmproj=files["voxtral"], n_ctx=2048)
    reply = m.chat(msgs, max_tokens=3, temperature=0)
    assert reply.metrics.prompt_tokens > m.audio.rows_per_chunk
    text_only = Model(files["lm"], n_ctx=256)
    with pytest.raises(InvalidArgumentError, match="multimodal projector"):
        text_only.chat(msgs, max_tokens=1)
    text_only.close()
    m.close()


def test_served_sounds(files):
    from test_server import call, served
    m = Model(files["lm"], mmproj=files["qwen2a"], n_ctx=2048)
    b64 = base64.b64encode(wav_bytes(sound(1.0))).decode()
    parts = [{"type": "text", "text": "what is it"}, {"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}}]
    want = m.chat([{"role": "user", "content": parts}], max_tokens=4, temperature=0)
    assert want.metrics.prompt_tokens > 750
    with served(m, name="audio") as server:
        status, body = call(server.url, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": parts}], "max_tokens": 4, "temperature": 0})
        assert status == 200 and body["choices"][0]["message"]["content"] == want.text
        assert body["usage"]["prompt_tokens"] == want.metrics.prompt_tokens
        props = call(server.url, "/props")[1]["modalities"]
        assert props == {"vision": False, "audio": True}
        assert "audio" in call(server.url, "/api/show", {"model": "audio"})[1]["capabilities"]
        bad = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "bm90IGEgc291bmQ="}}]}]
        status, body = call(server.url, "/v1/chat/completions", {"messages": bad, "max_tokens": 1})
        assert status == 400 and "no sound file (WAV, MP3 or FLAC)" in body["error"]["message"]
    m.close()


def test_command_line(files):
    import json

    from test_cli import one_error_line, pyllm
    path = files["dir"] / "speech.wav"
    path.write_bytes(wav_bytes(sound(1.0)))
    m = Model(files["lm"], mmproj=files["voxtral"], n_ctx=2048)
    want = m.generate("describe", images=[str(path)], max_tokens=3, temperature=0)
    m.close()
    r = pyllm("run", "-m", files["lm"], "--mmproj", files["voxtral"], "--audio", str(path), "-p", "describe", "-n",
              "3", "--temp", "0", "--json", "-c", "2048")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tokens"] == want.tokens and out["prompt_tokens"] == want.metrics.prompt_tokens
    assert "note: sound encoded in " in r.stderr and ": 375 rows" in r.stderr
    r = pyllm("info", files["voxtral"], "--json")
    facts = json.loads(r.stdout)
    assert r.returncode == 0 and (facts["projector"], facts["window_s"], facts["window_tokens"],
                                  facts["n_embd_out"]) == ("voxtral", 30.0, 375, 256)
    one_error_line(pyllm("run", "-m", files["lm"], "--audio", str(path), "-p", "x"), "--mmproj")
    one_error_line(pyllm("run", "-m", files["lm"], "--mmproj", files["voxtral"], "--audio", "/nonexistent.wav",
                         "-p", "x"), "cannot read the sound /nonexistent.wav")
    script = f"/audio {path}\n/set parameter temperature 0\n/set parameter num_predict 3\ndescribe\n/audio /nope.wav\n"
    r = pyllm("chat", "-m", files["lm"], "--mmproj", files["voxtral"], "-c", "2048", input=script)
    assert r.returncode == 0, r.stderr
    assert "1.0 s, attached to the next message" in r.stderr and "cannot read the sound /nope.wav" in r.stderr


def test_a_sound_s_mrope_positions_run_as_text_s():
    """mtmd's 1-D positions for a sound in an M-RoPE model (Qwen2.5-Omni): after an image of 3 x 2
    rows from p = 1 (the text after it from 1 + 3 = 4), a sound's 3 rows at 5, 6, 7 in all three."""
    from pyllm.engine import Engine
    from pyllm.vision import LINE, MediaStore
    store = MediaStore()
    img = store.ids(b"a", lambda: np.zeros((6, 4), np.float32), (3, 2))
    snd = store.ids(b"s", lambda: np.zeros((3, 4), np.float32), LINE)
    engine = Engine.__new__(Engine)
    engine.media = store
    got = engine.mrope_positions([10] + img + [11] + snd + [12], 0)
    assert got.tolist() == [[0, 1, 1, 1, 1, 1, 1, 4, 5, 6, 7, 8], [0, 1, 1, 1, 2, 2, 2, 4, 5, 6, 7, 8],
                            [0, 1, 2, 3, 1, 2, 3, 4, 5, 6, 7, 8]]


def test_a_sound_in_an_mrope_model_matches_the_reference(files, tmp_path):
    lm = synth.write_qwen2vl(tmp_path / "lm.gguf", QT.F32, image_tokens="audio", context_length=4096)
    m = Model(lm, mmproj=files["qwen2a"], n_ctx=2048)
    assert_prompt_matches_the_reference(m, lm, wav_bytes(sound(1.0)))
    m.close()


def test_a_sound_in_a_deepstack_model_adds_nothing_after_the_first_layers(files, tmp_path):
    """Qwen3-Omni: media rows carry DeepStack slices; a sound's are zero, so the logits are the
    reference's given the sound's rows alone (the reference adds a slice only where it has one)."""
    lm = synth.write_qwen3vl(tmp_path / "lm.gguf", QT.F32, image_tokens="audio", context_length=4096,
                             keys={"num_deepstack_layers": 1})
    m = Model(lm, mmproj=files["qwen3a"], n_ctx=2048)
    assert m.arch.deepstack == 1
    ids = assert_prompt_matches_the_reference(m, lm, wav_bytes(sound(1.0)))
    rows = m.engine.media.rows([t for t in ids if t < 0])
    assert rows.shape == (26, 512) and not rows[:, 256:].any()     # 101 frames: two chunks of 13 rows
    m.close()
