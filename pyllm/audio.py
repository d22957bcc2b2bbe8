"""Audio encoders: the Whisper encoder and projector of an mmproj file (llama.cpp's mtmd,
audio) turn a sound into rows of embeddings that the language model reads in place of tokens.

    samples = the file decoded to mono 16 kHz floats (miniaudio, as mtmd's helper decodes it)
    mel = log10(max(mel_filters |STFT(samples)|^2, 2^-24)): 400-sample periodic Hann windows
          every 160 samples (10 ms), the sound reflected 200 samples at its start and followed
          by 30 s of silence; mel = (max(mel, max(mel) - 8) + 4) / 4               # [n_mel, frames]
    each whole 3000 frames (30 s) of mel, a chunk:
        x = gelu(conv1d(mel, W1, k=3, pad 1) + b1)                                  # [3000, n_embd]
        x = gelu(conv1d(x, W2, k=3, stride 2, pad 1) + b2) + position_embd[:1500]   # [1500, n_embd]
        x = the Tower's layers (layer norms, k without bias, exact GELU); x = post_ln(x)
        projector "qwen2a" (Qwen2-Audio, Qwen2.5-Omni): x = avg_pool(x, 2) before post_ln;
            rows = x Wfc + bfc                                                       # 750 rows
        projector "ultravox": x = each 8 rows side by side (zeros after the last);
            rows = W2 rmsnorm(silu(b) a) w_mid, [a | b] = W1 rmsnorm(x) w_pre        # 188 rows
        projector "voxtral": x = each 4 rows side by side; rows = W2 gelu(W1 x)       # 375 rows
        projector "musicflamingo" (Audio Flamingo 3): x = avg_pool(x, 2) before post_ln;
            rows = W2 gelu(W1 x + b1) + b2                                           # 750 rows
        projector "glma" (GLM-ASR): x = each k rows of layernorm(x) side by side;
            rows = [boi, W2 gelu(W1 x + b1) + b2, eoi]                               # 377 rows at k = 4
        projector "meralion" (MERaLiON): x = each k rows side by side; h = silu(W0 layernorm(x) + b0);
            rows = W3 (silu(W1 h + b1) (W2 h + b2)) + b3                             # 100 rows at k = 15
    projector "gemma4ua" (Gemma 4 Unified): no spectrogram and no encoder: each 640 samples a row,
        rows = rmsnorm(samples) Wproj                                                # 25 rows a second
    projector "qwen3a" (Qwen3-ASR, Qwen3-Omni): the spectrogram centred (reflected at both ends,
    no silence after), read in windows of 800 frames (8 s); each 100 frames of a window:
        x = gelu(conv2d(x, 3 x 3, stride 2) + b), three times, over (mel bins, frames)  # [c, h, 13]
        x = each column's c x h values, c outermost, Wout + position_embd[0..12]      # 13 rows
    the window's rows through the layers together; rows = W2 gelu(W1 post_ln(x) + b1) + b2

The filters are Slaney's mel scale with area normalization (librosa's default, Whisper's), as
mtmd computes them. Voxtral's rows are read as transformers' Voxtral reads them (not averaged
two by two first, as mtmd does); Ultravox keeps the last, zero-padded stack of rows, as
transformers' StackAudioFrames does (mtmd, counting it out, aborts on both).
"""
from __future__ import annotations

import hashlib
import io
import wave

import numpy as np

from .encoder import LayerWork, Tower
from .errors import InvalidArgumentError, ModelFileError, UnsupportedModelError
from .model_file import ModelFile

CONFORMERS = ("gemma4a", "granite_speech", "lfm2a")    # read by pyllm/conformer.py
AUDIO_PROJECTORS = ("gemma4a", "gemma4ua", "glma", "granite_speech", "lfm2a", "meralion", "musicflamingo", "qwen2a", "qwen3a",
                    "ultravox", "voxtral")
SAMPLE_RATE = 16000     # Whisper's: samples a second
N_FFT = 400             # samples a window (25 ms)
HOP = 160               # samples between windows (10 ms)
CHUNK_FRAMES = 3000     # frames a Whisper encoder reads at a time (30 s)
QWEN3A_WINDOW = 800     # frames Qwen3-ASR's encoder reads at a time (8 s; mtmd's n_window_infer) ...
QWEN3A_CHUNK = 100      # ... in chunks of this many, each through the convolutions on its own
MEL_FLOOR = 2.0 ** -24  # mtmd's floor of a mel value before its log
# the tokens that open and close a sound's rows (mtmd's), by projector
MARKERS = {"qwen2a": ("<|audio_bos|>", "<|audio_eos|>"), "voxtral": ("[BEGIN_AUDIO]", ""), "ultravox": ("", ""),
           "musicflamingo": ("<sound>", ""), "glma": ("", ""), "qwen3a": ("<|audio_start|>", "<|audio_end|>"),
           "meralion": ("", "")}


# -- sound files --------------------------------------------------------------------------------------

def is_audio(data: bytes) -> bool:
    """Whether bytes are a sound file (WAV, MP3 or FLAC), by their first bytes, as mtmd tells
    them from images."""
    head = bytes(data[:12])
    return (head[:4] == b"RIFF" and head[8:12] == b"WAVE") or head[:3] == b"ID3" or head[:4] == b"fLaC" or \
        (len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0)


def load_audio(data: bytes, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """A WAV, MP3 or FLAC file's bytes -> its sound as float32 mono samples at sample_rate:
    channels averaged, resampled by miniaudio (the decoder llama.cpp's mtmd uses)."""
    import miniaudio
    try:
        sound = miniaudio.decode(bytes(data), output_format=miniaudio.SampleFormat.FLOAT32, nchannels=1,
                                 sample_rate=sample_rate)
    except miniaudio.MiniaudioError as e:
        said = e.args[0] if e.args else "not a sound it knows"
        raise InvalidArgumentError(f"cannot decode the sound ({len(data)} bytes): {said}; give a WAV, MP3 or FLAC "
                                   f"file") from None
    samples = np.frombuffer(sound.samples, dtype=np.float32).copy()
    if not len(samples):
        raise InvalidArgumentError("the sound file holds no samples")
    return samples


def wav_bytes(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> bytes:
    """Mono float samples in [-1, 1] as a 16-bit PCM WAV file's bytes."""
    pcm = np.round(np.clip(np.asarray(samples, np.float64), -1, 1) * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm.tobytes())
    return out.getvalue()


# -- the log-mel spectrogram ----------------------------------------------------------------------------

def mel_filters(n_mel: int, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Triangular filters on Slaney's mel scale (linear below 1 kHz, logarithmic above), each
    scaled to unit area: float32 [n_mel, n_fft / 2 + 1], over the FFT's bins 0 .. sample_rate / 2."""
    def mel(hz):
        return np.where(hz < 1000, hz * 3 / 200, 15 + np.log(np.maximum(hz, 1e-9) / 1000) / (np.log(6.4) / 27))

    def hz(m):
        return np.where(m < 15, m * 200 / 3, 1000 * np.exp((m - 15) * np.log(6.4) / 27))
    edges = hz(np.linspace(mel(0.0), mel(sample_rate / 2), n_mel + 2))           # the triangles' corners
    f = np.arange(n_fft // 2 + 1) * sample_rate / n_fft                          # each bin's frequency
    left, centre, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (f - left) / np.maximum(centre - left, 1e-30)
    falling = (right - f) / np.maximum(right - centre, 1e-30)
    w = np.where((f >= left) & (f <= centre), rising, np.where((f > centre) & (f <= right), falling, 0.0))
    return (w * 2 / (right - left)).astype(np.float32)


def log_mel(samples: np.ndarray, n_mel: int, block: int = 4096) -> list[np.ndarray]:
    """Whisper's log-mel spectrogram of float samples at 16 kHz, cut into whole chunks of 3000
    frames (30 s; the last, partial one, only silence and the sound's last frames, dropped as
    mtmd drops it): float32 [n_mel, 3000] each. Frames are computed `block` at a time."""
    x = np.asarray(samples, np.float32).reshape(-1)
    if len(x) < N_FFT // 2 + 1:      # the reflection needs 201 samples: silence after a shorter sound
        x = np.concatenate([x, np.zeros(N_FFT // 2 + 1 - len(x), np.float32)])
    half = N_FFT // 2
    padded = np.concatenate([x[1:half + 1][::-1], x, np.zeros(30 * SAMPLE_RATE + 2 * half, np.float32)])
    n_frames = (len(padded) - N_FFT) // HOP + 1
    window = (0.5 * (1 - np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT))).astype(np.float32)    # periodic Hann
    filters = mel_filters(n_mel).astype(np.float64)
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:n_frames]
    mel = np.empty((n_mel, n_frames), np.float32)
    for a in range(0, n_frames, block):
        spectrum = np.fft.rfft(frames[a:a + block] * window, axis=1)
        power = spectrum.real ** 2 + spectrum.imag ** 2                           # [frames, 201]
        mel[:, a:a + block] = np.log10(np.maximum(filters @ power.T, MEL_FLOOR))
    mel = (np.maximum(mel, mel.max() - 8.0) + 4.0) / 4.0
    return [np.ascontiguousarray(mel[:, c:c + CHUNK_FRAMES]) for c in range(0, n_frames - CHUNK_FRAMES + 1,
                                                                              CHUNK_FRAMES)]


def centred_log_mel(samples: np.ndarray, n_mel: int) -> list[np.ndarray]:
    """Qwen3-ASR's spectrogram (WhisperFeatureExtractor's with center=True, as mtmd computes it):
    the sound reflected 200 samples at both ends, no silence after it, one frame every 160
    samples; floored and scaled as Whisper's over the whole sound; cut into windows of 800
    frames, each made a whole number of 100-frame chunks with zeros: [n_mel, 100 k] each."""
    x = np.asarray(samples, np.float32).reshape(-1)
    half = N_FFT // 2
    ends = np.zeros(2 * half, np.float32)        # a sound too short to reflect: zeros where it has none
    head = x[1:half + 1][::-1]
    tail = x[max(len(x) - half - 1, 0):len(x) - 1][::-1]
    padded = np.concatenate([ends[:half - len(head)], head, x, tail, ends[:half - len(tail)]])
    n_frames = (len(padded) - N_FFT) // HOP + 1
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:n_frames]
    window = (0.5 * (1 - np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT))).astype(np.float32)
    spectrum = np.fft.rfft(frames * window, axis=1)
    mel = np.log10(np.maximum(mel_filters(n_mel).astype(np.float64) @ (spectrum.real ** 2 + spectrum.imag ** 2).T,
                              MEL_FLOOR)).astype(np.float32)
    mel = (np.maximum(mel, mel.max() - 8.0) + 4.0) / 4.0
    n_eff = min(n_frames, len(x) // HOP + 1)
    out = []
    for a in range(0, n_eff, QWEN3A_WINDOW):
        part = mel[:, a:min(a + QWEN3A_WINDOW, n_eff)]
        out.append(np.pad(part, ((0, 0), (0, -part.shape[1] % QWEN3A_CHUNK))))
    return out


# -- the encoder ------------------------------------------------------------------------------------

def open_audio_encoder(path: str, n_threads: int | None = None):
    """An mmproj file's audio encoder: a conformer (pyllm.conformer: Gemma 4's, Granite Speech's,
    LFM2-Audio's), Gemma 4 Unified's frames, else the Whisper encoder and projector below."""
    with ModelFile(path) as mf:
        kind = mf.get("clip.audio.projector_type") or mf.get("clip.projector_type")
    if kind in CONFORMERS:
        from . import conformer
        kinds = {"gemma4a": conformer.Gemma4AudioEncoder, "granite_speech": conformer.GraniteSpeechEncoder,
                 "lfm2a": conformer.Lfm2AudioEncoder}
        return kinds[kind](path, n_threads=n_threads)
    if kind == "gemma4ua":
        return Gemma4UnifiedAudio(path, n_threads=n_threads)
    return AudioEncoder(path, n_threads=n_threads)


class Gemma4UnifiedAudio(Tower):
    """Gemma 4 Unified's sound, no encoder: each `frame` samples (640: 40 ms; the file's
    embedding length) a row, the last frame filled with zeros:
        rows = rmsnorm(frame) Wproj      (an RMS norm without a scale)
    between <|audio> and <audio|>, as transformers' Gemma4UnifiedModel and llama.cpp's mtmd read it."""

    section, prefix = "audio", "a"
    begin, end = "<|audio>", "<audio|>"

    def _read(self, mf: ModelFile) -> None:
        if not mf.get("clip.has_audio_encoder", False):
            raise UnsupportedModelError(f"{self.path} has no audio encoder (a vision projector: give it images)")
        self.projector = str(mf.get("clip.audio.projector_type") or mf.get("clip.projector_type") or "")
        if self.projector != "gemma4ua":
            raise UnsupportedModelError(f"{self.path}: audio projector {self.projector!r} is not Gemma 4 Unified's")
        self.frame = self._int("embedding_length")     # samples a row
        eps = mf.get("clip.audio.attention.layer_norm_epsilon", 1e-6)
        if not isinstance(eps, (int, float)) or not 0 < eps < 1 or self.frame > 1 << 16:
            raise ModelFileError(f"{self.path}: an epsilon of {eps!r} or frames of {self.frame} samples are beyond "
                                 f"Gemma 4 Unified's; the file is corrupt")
        self.eps, self.n_embd, self.n_layer = float(eps), self.frame, 0
        self.n_out = self._projection("mm.a.input_projection.weight", self.frame, inputs_first=True)

    def encode(self, sound) -> np.ndarray:
        """A sound (a file's bytes, or float32 samples at 16 kHz) -> float32 [rows, n_out]."""
        x = load_audio(sound) if isinstance(sound, (bytes, bytearray, memoryview)) else \
            np.asarray(sound, np.float32).reshape(-1)
        if not len(x):
            raise InvalidArgumentError("the sound holds no samples")
        frames = np.concatenate([x, np.zeros(-len(x) % self.frame, np.float32)]).reshape(-1, self.frame)
        return self.rows_of_each([frames], self._encode)

    def _encode(self, frames: np.ndarray) -> np.ndarray:
        x = frames.astype(np.float64)
        x = (x / np.sqrt((x * x).mean(axis=1, keepdims=True) + self.eps)).astype(np.float32)
        return self.linear(x, ("mm.a.input_projection.weight", None))

    def layout(self, ids: list[int]) -> list:
        """A sound's part of the prompt: its rows between <|audio> and <audio|> (mtmd's)."""
        return [self.begin, ids, self.end]

    def describe(self) -> dict:
        """What `pyllm info` says of a projector file."""
        return {"path": self.path, "kind": "multimodal projector (mmproj), audio", "projector": self.projector,
                "sample_rate": SAMPLE_RATE, "frame_samples": self.frame,
                "rows_per_s": SAMPLE_RATE / self.frame, "n_layer": 0, "n_embd_out": self.n_out,
                "n_params": self.mf.n_params, "tensor_types": self.mf.type_histogram(),
                "activation": "none (no encoder)"}


class AudioEncoder(Tower):
    """An mmproj file's audio tower and projector. encode(sound) -> float32 [rows, n_out]: each
    30 s chunk's rows, in order."""

    section, prefix = "audio", "a"

    def _read(self, mf: ModelFile) -> None:
        """The hyperparameters and tensors, every shape checked."""
        if not mf.get("clip.has_audio_encoder", False):
            raise UnsupportedModelError(f"{self.path} has no audio encoder (a vision projector: give it images)")
        kind = mf.get("clip.audio.projector_type") or mf.get("clip.projector_type") or ""
        self.projector = "qwen2a" if kind == "qwen2.5o" else str(kind)    # Qwen2.5-Omni's sound: Qwen2-Audio's
        if self.projector not in AUDIO_PROJECTORS or self.projector in CONFORMERS + ("gemma4ua",):   # read elsewhere
            raise UnsupportedModelError(f"{self.path}: audio projector type {kind!r} is not supported yet "
                                        f"(supported: {', '.join(AUDIO_PROJECTORS)}: Gemma 4's and Gemma 4 Unified's, Qwen2-Audio's and "
                                        f"Qwen2.5-Omni's, Ultravox's, Voxtral's, Audio Flamingo 3's, GLM-ASR's, "
                                        f"Qwen3-ASR's, Granite Speech's, LFM2-Audio's, MERaLiON's)")
        self.n_embd, self.n_head = self._int("embedding_length"), self._int("attention.head_count")
        self.n_ff, self.n_layer = self._int("feed_forward_length"), self._int("block_count")
        self.n_mel = self._int("num_mel_bins")
        eps = mf.get("clip.audio.attention.layer_norm_epsilon", 1e-5)
        if not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ModelFileError(f"{self.path}: clip.audio.attention.layer_norm_epsilon is {eps!r}; the file is "
                                 f"corrupt")
        if self.n_embd % self.n_head or self.n_mel > 256 or self.n_embd > 16384:
            raise ModelFileError(f"{self.path}: {self.n_head} heads do not divide {self.n_embd}, or {self.n_mel} mel "
                                 f"bins are beyond Whisper's; the file is corrupt")
        self.eps, self.gelu = float(eps), "erf"
        n = self.n_embd
        if self.projector == "qwen3a":   # three 2D convolutions over each chunk of (mel bins, frames)
            c = int(mf.tensor("a.conv2d.1.weight").shape[3]) if mf.has_tensor("a.conv2d.1.weight") else 0
            self.convs = [self._conv(f"a.conv2d.{i}", ins, (3, 3, ins, c), c) for i, ins in ((1, 1), (2, c), (3, c))]
            self.conv_height = (((self.n_mel - 1) // 2) // 2) // 2 + 1      # mel bins after three strides of 2
            self.check_shape("a.conv_out.weight", (c * self.conv_height, n))
            self.n_positions = (((QWEN3A_CHUNK - 1) // 2) // 2) // 2 + 1    # rows a chunk: 13
        else:
            self.conv1 = self._conv("a.conv1d.1", self.n_mel, (3, self.n_mel, n), n)
            self.conv2 = self._conv("a.conv1d.2", n, (3, n, n), n)
            self.n_positions = CHUNK_FRAMES // 2
        t = mf.tensor("a.position_embd.weight") if mf.has_tensor("a.position_embd.weight") else None
        if t is None or len(t.shape) != 2 or int(t.shape[0]) != n or int(t.shape[1]) < self.n_positions:
            raise ModelFileError(f"{self.path}: a.position_embd.weight is missing or has fewer than "
                                 f"{self.n_positions} positions of {n}; the file is corrupt")
        # Qwen2-Audio and Audio Flamingo average each two rows; Ultravox, Voxtral and GLM-ASR stack k rows
        self.pool = self.projector in ("qwen2a", "musicflamingo")
        self.stack = 1 if self.pool or self.projector == "qwen3a" else self._int("projector.stack_factor")
        if self.stack > 64:
            raise ModelFileError(f"{self.path}: a stack of {self.stack} rows is beyond any projector's")
        n_in = n * self.stack
        if self.projector == "qwen2a":
            self.n_out = self._projection("mm.a.fc.weight", n, inputs_first=True)
            self.fc = self._pair("mm.a.fc", (n, self.n_out))
        elif self.projector == "meralion":   # a layer norm, Linear + SiLU, a SiLU-gated pair, Linear
            self.norm_pre = self._pair("mm.a.norm_pre", (n_in,))
            m0 = self._projection("mm.a.mlp.0.weight", n_in, inputs_first=True)
            m1 = self._projection("mm.a.mlp.1.weight", m0, inputs_first=True)
            self.n_out = self._projection("mm.a.mlp.3.weight", m1, inputs_first=True)
            self.mlp = tuple(self._pair(f"mm.a.mlp.{i}", shape) for i, shape in
                             ((0, (n_in, m0)), (1, (m0, m1)), (2, (m0, m1)), (3, (m1, self.n_out))))
        else:
            n_mid = self._projection("mm.a.mlp.1.weight", n_in, inputs_first=True)
            if self.projector == "ultravox":    # SwiGLU halves the width
                if n_mid % 2:
                    raise ModelFileError(f"{self.path}: mm.a.mlp.1 is {n_mid} wide, not two halves; the file is corrupt")
                self.check_shape("mm.a.norm_pre.weight", (n_in,))
                self.check_shape("mm.a.norm_mid.weight", (n_mid // 2,))
            self.n_out = self._projection("mm.a.mlp.2.weight", n_mid // (2 if self.projector == "ultravox" else 1),
                                          inputs_first=True)
            self.mlp = (self._pair("mm.a.mlp.1", (n_in, n_mid)), self._pair("mm.a.mlp.2", (self.mlp_width(n_mid),
                                                                                          self.n_out)))
        if self.projector == "glma":    # a layer norm before the stacking; rows of its own around the sound's
            self.norm_pre = self._pair("mm.a.norm_pre", (n,))
            self.check_shape("v.boi", (self.n_out,))
            self.check_shape("v.eoi", (self.n_out,))
        self.begin, self.end = MARKERS[self.projector]
        self.layers = self._layers()

    def mlp_width(self, n_mid: int) -> int:
        """The width between the projector's two matrices (Ultravox's SwiGLU halves the first's)."""
        return n_mid // 2 if self.projector == "ultravox" else n_mid

    def _conv(self, name: str, n_in: int, shape: tuple, n_out: int) -> tuple:
        """A convolution's (weight of `shape` in the file, bias of n_out values (stored [1, n_out]
        or [1, 1, n_out]))."""
        self.check_shape(name + ".weight", shape)
        bias = self.mf.tensor(name + ".bias") if self.mf.has_tensor(name + ".bias") else None
        if n_out <= 0 or bias is None or [int(v) for v in bias.shape if v != 1] != [n_out]:
            raise ModelFileError(f"{self.path}: tensor {name}.bias is missing or not {n_out} values; the file is "
                                 f"corrupt")
        return name + ".weight", name + ".bias"

    def describe(self) -> dict:
        """What `pyllm info` says of a projector file."""
        window = QWEN3A_WINDOW if self.projector == "qwen3a" else CHUNK_FRAMES
        return {"path": self.path, "kind": "multimodal projector (mmproj), audio", "projector": self.projector,
                "sample_rate": SAMPLE_RATE, "n_mel": self.n_mel, "window_s": window * HOP / SAMPLE_RATE,
                "window_tokens": self.rows_per_chunk,
                "n_layer": self.n_layer, "n_embd": self.n_embd, "n_head": self.n_head, "n_ff": self.n_ff,
                "n_embd_out": self.n_out, "n_params": self.mf.n_params, "tensor_types": self.mf.type_histogram(),
                "activation": "gelu (erf)"}

    @property
    def rows_per_chunk(self) -> int:
        """The rows of each 30 s chunk (Qwen3-ASR: of each whole 8 s window)."""
        if self.projector == "qwen3a":
            return self.n_positions * QWEN3A_WINDOW // QWEN3A_CHUNK
        n = self.n_positions // 2 if self.pool else self.n_positions
        return -(-n // self.stack) + 2 * (self.projector == "glma")

    def encode(self, sound) -> np.ndarray:
        """A sound (a file's bytes, or float32 samples at 16 kHz) -> float32 [rows, n_out]."""
        samples = load_audio(sound) if isinstance(sound, (bytes, bytearray, memoryview)) else \
            np.asarray(sound, np.float32)
        return self.encode_mel(self.log_mel(samples))

    def log_mel(self, samples: np.ndarray) -> list[np.ndarray]:
        """The sound's spectrogram as the encoder reads it, in its chunks (or windows)."""
        return centred_log_mel(samples, self.n_mel) if self.projector == "qwen3a" else log_mel(samples, self.n_mel)

    def encode_mel(self, chunks: list[np.ndarray]) -> np.ndarray:
        """Log-mel chunks, float32 [n_mel, 3000] each (Qwen3-ASR: windows [n_mel, 100 k], k <= 8)
        -> their rows, in order."""
        qwen3 = self.projector == "qwen3a"
        for c in chunks:
            T = c.shape[1] if c.ndim == 2 and c.shape[0] == self.n_mel else -1
            if not (T % QWEN3A_CHUNK == 0 and 0 < T <= QWEN3A_WINDOW if qwen3 else T == CHUNK_FRAMES):
                raise InvalidArgumentError(f"a mel chunk must be [{self.n_mel}, " +
                                           ("100 k] (k up to 8)" if qwen3 else f"{CHUNK_FRAMES}]") +
                                           f", not {list(c.shape)}")
        return self.rows_of_each(chunks, self._encode)

    def conv1d(self, x: np.ndarray, wb: tuple, stride: int) -> np.ndarray:
        """gelu(x * W + b) along time, x [channels, T] -> [T / stride, out channels]: a kernel of
        3 with a zero either side, as one matrix product over each output's 3 columns of x."""
        c, T = x.shape
        xp = np.pad(x, ((0, 0), (1, 1)))
        n_out = (T - 1) // stride + 1
        cols = np.lib.stride_tricks.sliding_window_view(xp, 3, axis=1)[:, ::stride][:, :n_out]   # [c, n_out, 3]
        cols = np.ascontiguousarray(cols.transpose(1, 0, 2).reshape(n_out, c * 3))
        w = self.floats(wb[0]).reshape(-1, c * 3)                 # [out, c, 3] as the file stores it
        y = np.empty((n_out, len(w)), np.float32)

        def rows(r0: int, r1: int) -> None:
            np.matmul(cols[r0:r1], w.T, out=y[r0:r1])
        self.parallel(n_out, rows)
        return self.activation(y, np.ascontiguousarray(self.floats(wb[1]).reshape(-1)))

    def conv2d(self, x: np.ndarray, wb: tuple) -> np.ndarray:
        """gelu(x * W + b) of m images, channels last, x [m, H, W, c] -> [m, H / 2, W / 2, out]."""
        y = self.conv3x3(x, wb[0])
        self.activation(y.reshape(-1, y.shape[-1]), np.ascontiguousarray(self.floats(wb[1]).reshape(-1)))
        return y

    def stem(self, mel: np.ndarray) -> np.ndarray:
        """The convolutions' rows of one chunk or window, with their positions: [rows, n_embd]."""
        if self.projector != "qwen3a":    # Whisper's: two 1D convolutions along time
            x = self.conv1d(self.conv1d(mel, self.conv1, 1).T, self.conv2, 2)   # [1500, n_embd]
            return x + self.floats("a.position_embd.weight")[:len(x)]
        # Qwen3-ASR's: each 100 frames an image of (mel bins, frames) through three 2D convolutions;
        # a row for each of its 13 columns (their c x h values, c outermost), positions 0..12 each chunk
        k = mel.shape[1] // QWEN3A_CHUNK
        x = np.ascontiguousarray(mel.reshape(self.n_mel, k, QWEN3A_CHUNK).transpose(1, 0, 2))[..., None]
        for wb in self.convs:
            x = self.conv2d(x, wb)                                                 # [k, h, 13, c]
        cols = np.ascontiguousarray(x.transpose(0, 2, 3, 1).reshape(k * x.shape[2], -1))   # [k 13, c h]
        x = self.linear(cols, ("a.conv_out.weight", None))
        x.reshape(k, -1, self.n_embd)[:] += self.floats("a.position_embd.weight")[:self.n_positions]
        return x

    def _encode(self, mel: np.ndarray) -> np.ndarray:
        """One chunk [n_mel, 3000] (Qwen3-ASR: one window) -> its rows."""
        x = np.ascontiguousarray(self.stem(mel), dtype=np.float32)
        work = LayerWork(len(x), self.n_embd, self.n_ff, gated=self.layers[0].gate is not None)
        for L in self.layers:
            self.layer(x, L, work)
        if self.pool:     # Qwen2-Audio, Audio Flamingo: the average of each two rows
            x = np.ascontiguousarray(x.reshape(-1, 2, self.n_embd).mean(axis=1, dtype=np.float32))
        x = self.optional_norm(x, "a.post_ln")
        return self.project(x)

    def project(self, x: np.ndarray) -> np.ndarray:
        """The encoder's rows into the language model's."""
        if self.projector == "qwen2a":
            return self.linear(x, self.fc)
        if self.projector == "glma":
            x = self.norm(np.ascontiguousarray(x), self.norm_pre)
        k = self.stack     # k rows side by side, zeros after the last
        x = np.concatenate([x, np.zeros((-len(x) % k, self.n_embd), np.float32)]).reshape(-1, k * self.n_embd)
        if self.projector == "meralion":    # rows = W3 (silu(W1 h + b1) (W2 h + b2)) + b3, h = silu(W0 ln(x) + b0)
            h = silu(self.linear(self.norm(x, self.norm_pre), self.mlp[0]))
            return self.linear(np.ascontiguousarray(silu(self.linear(h, self.mlp[1])) * self.linear(h, self.mlp[2]),
                                                    np.float32), self.mlp[3])
        if self.projector != "ultravox":    # Linear, GELU, Linear (Qwen3-ASR's over each row, k = 1)
            rows = self.linear(self.activation(self.linear(x, self.mlp[0]), gelu="erf"), self.mlp[1])
            if self.projector == "glma":
                rows = np.concatenate([self.floats("v.boi")[None], rows, self.floats("v.eoi")[None]])
            return rows
        x = rms_norm(x, self.floats("mm.a.norm_pre.weight"))
        ab = self.linear(x, self.mlp[0])
        half = ab.shape[1] // 2
        x = ab[:, :half] * silu(ab[:, half:])     # SwiGLU with the second half through SiLU (Ultravox's)
        x = rms_norm(x, self.floats("mm.a.norm_mid.weight"))
        return self.linear(np.ascontiguousarray(x, np.float32), self.mlp[1])

    def layout(self, ids: list[int]) -> list:
        """A sound's part of the prompt: text pieces and runs of its row ids (mtmd's markers)."""
        return [p for p in (self.begin, ids, self.end) if len(p)]


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return (x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * w).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-x))


def audio_key(encoder: AudioEncoder, data: bytes) -> bytes:
    """A key naming this sound for this projector (the media store's)."""
    return hashlib.sha256(encoder.path.encode() + b"\0audio\0" + bytes(data)).digest()
