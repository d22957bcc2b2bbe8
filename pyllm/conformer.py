"""Gemma 4's audio encoder (llama.cpp's mtmd "gemma4a", transformers' Gemma4AudioModel): a
Universal Speech Model conformer turning a sound into rows the language model reads.

    samples = the file decoded to mono 16 kHz floats; each 30 s of them a chunk (as mtmd cuts):
    mel = log(mel_filters |rfft(frame * hann, 512)| + 0.001): 320-sample frames (20 ms) every 160
          (10 ms), 160 zeros before the sound, a frame only where all its samples are sound;
          n_mel HTK mel bins over 0..8 kHz, not area-normalized                   # [frames, n_mel]
    x = relu(layernorm_c(conv2d(x, 3 x 3, stride 2))), twice, over (frames, mel bins)  # [T, F, c]
    x = each row's F x c values (c innermost) Win                                # [T, n_embd]
    each layer, a conformer block (every norm an RMS norm with its weight):
        x = x + ffn1(x) / 2,   ffn(x) = postnorm(Wdown silu(Wup prenorm(x)))
        x = x + postnorm(Wo attention(prenorm(x)))
        x = x + Wend silu(norm2(depthwise_conv(a sigmoid(b), k taps of the past)))   [a | b] = Wstart norm1(x)
        x = x + ffn2(x) / 2;   x = norm_out(x)
    rows = Wproj rmsnorm(Wout x + bout)                                           # [T, n_lm]

The attention is local and causal: a row sees itself and the 11 rows before it (chunks of 12
with a past of 12, the masked layout both transformers and mtmd compute, come to that window):
    score(t, t - d) = 50 tanh((q_t . k_(t-d) + q_t . r_d) / 50),  d = 0..11, per head
    q = Wq h / sqrt(head_dim) / ln 2 * softplus(per_dim_scale),  k = Wk h * ln(1 + e) / ln 2
    r_d = Wrel [sin(d w_i) | cos(d w_i)],  w_i = 10000^(-i / (n_embd / 2 - 1))
The file holds softplus(per_dim_scale) (llama.cpp's converter applies it). Matrices clip their
inputs and outputs where the file gives bounds (ClippableLinear). The spectrogram's floor is
added before the log, as transformers' Gemma4AudioFeatureExtractor does (mtmd takes the larger of
the two instead: the same but where a bin's energy is near 0.001).
"""
from __future__ import annotations

import math

import numpy as np
from threadpoolctl import threadpool_limits

from .encoder import Tower
from .errors import InvalidArgumentError, ModelFileError, UnsupportedModelError
from .model_file import ModelFile

SAMPLE_RATE = 16000
FRAME = 320             # samples a frame (20 ms), Hann-windowed ...
HOP = 160               # ... every 10 ms ...
N_FFT = 512             # ... zero-padded to the FFT's length
MEL_FLOOR = 1e-3        # added to each mel value before its log
CHUNK_SAMPLES = 30 * SAMPLE_RATE    # mtmd encodes a sound 30 s at a time
WINDOW = 12             # rows an attention row sees: itself and 11 before (attention_context_left - 1)
SOFT_CAP = 50.0
RESIDUAL = 0.5          # the half-step feed-forward blocks' weight


def htk_mel_filters(n_mel: int, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE,
                    f_max: float = 8000.0) -> np.ndarray:
    """Triangular filters on the HTK mel scale, 2595 log10(1 + f / 700), peak 1 (no area
    normalization): float64 [n_mel, n_fft / 2 + 1] over the FFT's bins."""
    mel = 2595.0 * np.log10(1.0 + np.array([0.0, f_max]) / 700.0)
    edges = 700.0 * (10.0 ** (np.linspace(mel[0], mel[1], n_mel + 2) / 2595.0) - 1.0)
    f = np.arange(n_fft // 2 + 1) * sample_rate / n_fft
    left, centre, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising, falling = (f - left) / (centre - left), (right - f) / (right - centre)
    return np.maximum(0.0, np.minimum(rising, falling))


def gemma4_log_mel(samples: np.ndarray, n_mel: int) -> list[np.ndarray]:
    """The spectrogram of each 30 s of the sound: float32 [frames, n_mel] each (1 frame for a
    piece shorter than a frame's 10 ms)."""
    x = np.asarray(samples, np.float32).reshape(-1)
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(FRAME) / FRAME)).astype(np.float32)   # periodic Hann
    filters = htk_mel_filters(n_mel)
    out = []
    for a in range(0, len(x), CHUNK_SAMPLES):
        part = x[a:a + CHUNK_SAMPLES]
        n_frames = max(1, (len(part) - FRAME // 2 - 1) // HOP + 1)     # frames whose samples are all sound
        padded = np.zeros((n_frames - 1) * HOP + FRAME, np.float32)
        padded[FRAME // 2:FRAME // 2 + len(part)] = part[:len(padded) - FRAME // 2]
        frames = np.lib.stride_tricks.sliding_window_view(padded, FRAME)[::HOP][:n_frames]
        magnitude = np.abs(np.fft.rfft(frames * window, n=N_FFT, axis=1))
        out.append(np.log(magnitude @ filters.T + MEL_FLOOR).astype(np.float32))
    return out


def rows_for_frames(n_frames: int) -> int:
    """A chunk's rows: its frames after two convolutions of stride 2."""
    return ((n_frames - 1) // 2) // 2 + 1


class Gemma4AudioEncoder(Tower):
    """An mmproj file's Gemma 4 audio conformer and projector. encode(sound) -> float32
    [rows, n_out]: each 30 s chunk's rows (750 for a whole one), in order."""

    section, prefix = "audio", "a"
    begin, end = "<|audio>", "<audio|>"
    rows_per_chunk = rows_for_frames((CHUNK_SAMPLES - FRAME // 2 - 1) // HOP + 1)

    def _read(self, mf: ModelFile) -> None:
        """The hyperparameters and tensors, every shape checked."""
        if not mf.get("clip.has_audio_encoder", False):
            raise UnsupportedModelError(f"{self.path} has no audio encoder (a vision projector: give it images)")
        self.projector = str(mf.get("clip.audio.projector_type") or mf.get("clip.projector_type") or "")
        if self.projector != "gemma4a":
            raise UnsupportedModelError(f"{self.path}: audio projector {self.projector!r} is not Gemma 4's")
        self.n_embd, self.n_head = self._int("embedding_length"), self._int("attention.head_count")
        self.n_ff, self.n_layer = self._int("feed_forward_length"), self._int("block_count")
        self.n_mel = self._int("num_mel_bins")
        # every Gemma 4 audio encoder's; llama.cpp's converter wrote another value (mtmd ignores it too)
        self.eps, self.rms = 1e-6, True
        n, f, d = self.n_embd, self.n_ff, self.n_embd // self.n_head
        if n % self.n_head or d % 2 or self.n_mel > 256 or n > 16384:
            raise ModelFileError(f"{self.path}: {self.n_head} heads do not divide {n} into even widths, or "
                                 f"{self.n_mel} mel bins are too many; the file is corrupt")
        # the sub-sampling: two 3 x 3 convolutions (1 -> c0 -> c1 channels), each a layer norm of its channels
        c0, c1 = (self._channels(f"a.conv1d.{i}.weight") for i in (0, 1))
        self.check_shape("a.conv1d.0.weight", (3, 3, 1, c0))
        self.check_shape("a.conv1d.1.weight", (3, 3, c0, c1))
        self.subsample = [(f"a.conv1d.{i}.weight", self._pair(f"a.conv1d.{i}.norm", (c,))[0])
                          for i, c in ((0, c0), (1, c1))]
        self.freq = rows_for_frames(self.n_mel)          # mel bins after the two strides
        self.inp = self._pair("a.input_projection", (self.freq * c1, n))
        n_proj = self._projection("a.pre_encode.out.weight", n, inputs_first=True)
        self.out = self._pair("a.pre_encode.out", (n, n_proj))
        self.soft_norm = self._pair("mm.a.soft_emb_norm", (n_proj,))[0] \
            if mf.has_tensor("mm.a.soft_emb_norm.weight") else None
        self.n_out = self._projection("mm.a.input_projection.weight", n_proj, inputs_first=True)
        self.proj = self._pair("mm.a.input_projection", (n_proj, self.n_out))
        self.layers = [self._block(i, n, f, d) for i in range(self.n_layer)]
        self.read_clamps()

    def _channels(self, name: str) -> int:
        t = self.mf.tensor(name) if self.mf.has_tensor(name) else None
        if t is None or len(t.shape) != 4 or not 0 < int(t.shape[3]) <= 4096:
            raise ModelFileError(f"{self.path}: tensor {name} is missing or not a 3 x 3 convolution; the file is "
                                 f"corrupt")
        return int(t.shape[3])

    def _block(self, i: int, n: int, f: int, d: int) -> dict:
        """Layer i's tensor names (weights, or (weight, bias or None) of a matrix), shapes checked."""
        p = f"a.blk.{i}."
        L = {}
        for key, name, shape in (("ffn1_norm", "ffn_norm", (n,)), ("ffn1_post", "ffn_post_norm", (n,)),
                                 ("ffn2_norm", "ffn_norm_1", (n,)), ("ffn2_post", "ffn_post_norm_1", (n,)),
                                 ("attn_norm", "attn_pre_norm", (n,)), ("attn_post", "attn_post_norm", (n,)),
                                 ("q_scale", "per_dim_scale", (d,)), ("conv_norm", "conv_norm", (n,)),
                                 ("conv_out_norm", "norm_conv", (n,)), ("out_norm", "ln2", (n,))):
            self.check_shape(p + name + ".weight", shape)
            L[key] = p + name + ".weight"
        L["k_scale"] = p + "per_dim_k_scale.weight" if self.mf.has_tensor(p + "per_dim_k_scale.weight") else None
        if L["k_scale"] is not None:
            self.check_shape(L["k_scale"], (d,))
        for key, name, shape in (("up1", "ffn_up", (n, f)), ("down1", "ffn_down", (f, n)),
                                 ("up2", "ffn_up_1", (n, f)), ("down2", "ffn_down_1", (f, n)),
                                 ("q", "attn_q", (n, n)), ("k", "attn_k", (n, n)), ("v", "attn_v", (n, n)),
                                 ("o", "attn_out", (n, n)), ("rel", "attn_k_rel", (n, n)),
                                 ("start", "conv_pw1", (n, 2 * n)), ("end", "conv_pw2", (n, n))):
            L[key] = self._pair(p + name, shape)
        t = self.mf.tensor(p + "conv_dw.weight") if self.mf.has_tensor(p + "conv_dw.weight") else None
        if t is None or len(t.shape) != 2 or int(t.shape[1]) != n or not 0 < int(t.shape[0]) <= 64:
            raise ModelFileError(f"{self.path}: tensor {p}conv_dw.weight is missing or not [taps, {n}]; the file is "
                                 f"corrupt")
        L["dw"] = self._pair(p + "conv_dw", (int(t.shape[0]), n))
        return L

    def describe(self) -> dict:
        """What `pyllm info` says of a projector file."""
        return {"path": self.path, "kind": "multimodal projector (mmproj), audio", "projector": self.projector,
                "sample_rate": SAMPLE_RATE, "n_mel": self.n_mel, "window_s": CHUNK_SAMPLES / SAMPLE_RATE,
                "window_tokens": self.rows_per_chunk, "n_layer": self.n_layer, "n_embd": self.n_embd,
                "n_head": self.n_head, "n_ff": self.n_ff, "n_embd_out": self.n_out, "n_params": self.mf.n_params,
                "tensor_types": self.mf.type_histogram(), "activation": "silu (conformer)"}

    def layout(self, ids: list[int]) -> list:
        """A sound's part of the prompt: its rows between <|audio> and <audio|> (mtmd's markers)."""
        return [self.begin, ids, self.end]

    # -- running ------------------------------------------------------------------------------------
    def encode(self, sound) -> np.ndarray:
        """A sound (a file's bytes, or float32 samples at 16 kHz) -> float32 [rows, n_out]."""
        from .audio import load_audio
        samples = load_audio(sound) if isinstance(sound, (bytes, bytearray, memoryview)) else \
            np.asarray(sound, np.float32)
        return self.encode_mel(self.log_mel(samples))

    def log_mel(self, samples: np.ndarray) -> list[np.ndarray]:
        return gemma4_log_mel(samples, self.n_mel)

    def encode_mel(self, chunks: list[np.ndarray]) -> np.ndarray:
        """Spectrogram chunks, float32 [frames, n_mel] each (at most 30 s of frames) -> their rows."""
        for c in chunks:
            if c.ndim != 2 or c.shape[1] != self.n_mel or not 0 < c.shape[0] <= CHUNK_SAMPLES // HOP:
                raise InvalidArgumentError(f"a mel chunk must be [frames, {self.n_mel}] with 1 to "
                                           f"{CHUNK_SAMPLES // HOP} frames, not {list(c.shape)}")
        with self._lock, threadpool_limits(limits=1, user_api="blas"):
            try:
                return np.concatenate([self._encode(c) for c in chunks]) if chunks else \
                    np.empty((0, self.n_out), np.float32)
            finally:
                self._buffers.clear()

    def _encode(self, mel: np.ndarray) -> np.ndarray:
        """One chunk [frames, n_mel] -> its rows [rows_for_frames(frames), n_out]."""
        x = np.ascontiguousarray(mel, np.float32)[None, :, :, None]        # one image (frames, bins), 1 channel
        for weight, norm in self.subsample:
            x = self.conv3x3(x, weight)
            flat = x.reshape(-1, x.shape[-1])
            mu = flat.mean(axis=1, keepdims=True)
            var = np.square(flat - mu).mean(axis=1, keepdims=True)
            flat[:] = np.maximum((flat - mu) / np.sqrt(var + self.eps) * self.floats(norm), 0)
        x = self.linear(np.ascontiguousarray(x.reshape(x.shape[1], -1)), self.inp)
        for L in self.layers:
            self.block(x, L, self.relative(L))
        x = self.linear(x, self.out)
        x = self.rms_norm(x, self.soft_norm)
        return self.linear(x, self.proj)

    def rms_norm(self, x: np.ndarray, weight: str | None, out: np.ndarray | None = None) -> np.ndarray:
        """x / rms(x) (* weight), each row."""
        if weight is not None:
            return self.norm(x, (weight, None), out=out)
        out = np.empty_like(x) if out is None else out
        np.multiply(x, (1 / np.sqrt(np.einsum("ij,ij->i", x, x) / x.shape[1] + self.eps))[:, None], out=out)
        return out

    def relative(self, L: dict) -> np.ndarray:
        """The relative positions' keys r_d, d = 0..WINDOW - 1: [WINDOW, n_embd]."""
        half = self.n_embd // 2
        inv = np.exp(-np.arange(half) * math.log(10000.0) / max(half - 1, 1))
        angle = np.arange(WINDOW)[:, None] * inv[None]
        return self.linear(np.concatenate([np.sin(angle), np.cos(angle)], axis=1).astype(np.float32), L["rel"])

    def block(self, x: np.ndarray, L: dict, rel: np.ndarray) -> None:
        """One conformer block on the rows x [T, n_embd], in place."""
        x += RESIDUAL * self.feed_forward(x, L["ffn1_norm"], L["up1"], L["down1"], L["ffn1_post"])
        a = self.attention_local(self.rms_norm(x, L["attn_norm"]), L, rel)
        x += self.rms_norm(a, L["attn_post"], out=a)
        x += self.convolution(x, L)
        x += RESIDUAL * self.feed_forward(x, L["ffn2_norm"], L["up2"], L["down2"], L["ffn2_post"])
        self.rms_norm(x, L["out_norm"], out=x)

    def feed_forward(self, x: np.ndarray, norm: str, up: tuple, down: tuple, post: str) -> np.ndarray:
        u = self.linear(self.rms_norm(x, norm), up)
        self.parallel(len(u), lambda a, b: silu_(u[a:b]))
        y = self.linear(u, down)
        return self.rms_norm(y, post, out=y)

    def convolution(self, x: np.ndarray, L: dict) -> np.ndarray:
        """The light convolution: GLU, then each channel over its last `taps` rows (zeros before
        the first), RMS norm, SiLU, a matrix."""
        n = self.n_embd
        ab = self.linear(self.rms_norm(x, L["conv_norm"]), L["start"])
        g = ab[:, :n] * (1 / (1 + np.exp(-ab[:, n:])))
        w = self.floats(L["dw"][0]).T                                # [taps, n]: tap j reads row t - (taps - 1) + j
        taps, T = len(w), len(g)
        gp = np.concatenate([np.zeros((taps - 1, n), np.float32), g])
        y = sum(gp[j:j + T] * w[j] for j in range(taps)).astype(np.float32)
        if L["dw"][1] is not None:
            y += self.floats(L["dw"][1])
        self.rms_norm(y, L["conv_out_norm"], out=y)
        silu_(y)
        return self.linear(y, L["end"])

    def attention_local(self, h: np.ndarray, L: dict, rel: np.ndarray) -> np.ndarray:
        """Each row attends to itself and the WINDOW - 1 rows before it (see the module's note)."""
        T, H, n = len(h), self.n_head, self.n_embd
        d = n // H
        q, k, v = (self.linear(h, L[m]) for m in ("q", "k", "v"))
        q *= np.tile(self.floats(L["q_scale"]), H) / (math.sqrt(d) * math.log(2))
        k *= math.log(1 + math.e) / math.log(2)
        if L["k_scale"] is not None:
            k *= np.tile(self.floats(L["k_scale"]), H)
        past = np.zeros((WINDOW - 1, n), np.float32)
        # window slot j holds row t - (WINDOW - 1) + j: distance WINDOW - 1 - j
        keys = np.lib.stride_tricks.sliding_window_view(np.concatenate([past, k]), WINDOW, axis=0)   # [T, n, W]
        values = np.lib.stride_tricks.sliding_window_view(np.concatenate([past, v]), WINDOW, axis=0)
        qh = q.reshape(T, H, d)
        s = np.einsum("thd,thdj->thj", qh, keys.reshape(T, H, d, WINDOW))
        s += np.einsum("thd,jhd->thj", qh, rel[::-1].reshape(WINDOW, H, d))
        s = SOFT_CAP * np.tanh(s / SOFT_CAP)
        before = np.arange(WINDOW)[None, :] < (WINDOW - 1 - np.arange(T))[:, None]    # slots before row 0
        s[before[:, None, :].repeat(H, axis=1)] = -np.inf
        p = np.exp(s - s.max(axis=2, keepdims=True))
        p /= p.sum(axis=2, keepdims=True)
        heads = np.einsum("thj,thdj->thd", p, values.reshape(T, H, d, WINDOW)).reshape(T, n)
        return self.linear(np.ascontiguousarray(heads, np.float32), L["o"])


def silu_(x: np.ndarray) -> None:
    """x sigmoid(x), in place."""
    with np.errstate(over="ignore"):
        x /= 1 + np.exp(-x)
